"""Perplexity under labelled context protocols.

The protocols (``paper``, ``causal``, ``causal-carry``: which sentences form the context of sentence j, whether
the state is carried across a document, whether the context leaks later sentences) are the records of
:data:`topic_lm_hf.protocols.PROTOCOLS`; its module docstring tabulates them.

A model with a recurrence over the sentences of a document (``chunk_mask`` in ``forward``: rGBN-RNN) reads
whole documents under ``paper`` and ``causal`` (one call per batch of documents, the token state restarting at
every chunk, the sentence recurrence carried inside the model), and chunk by chunk with the carried ``state``
under ``causal-carry`` (the state then also carries the sentence recurrence).

Every predicted token counts, ``<eos>`` and ``<unk>`` included, ``<bos>`` never (it is only an
input). Perplexity is ``exp(total NLL / tokens)`` with natural logarithms.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import datasets
import torch

from ..carried_state import run_carried_chunks
from ..collator import TopicContextCollator
from ..data import check_vocabularies, documents_from_lists, load_vocabularies
from ..models.modeling_recurrent import leaky_modes_of, read_on_host
from ..protocols import PROTOCOLS


def token_nll(logits: torch.Tensor, targets: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """The NLL sum of the targets where ``target_mask`` is set, under ``log_softmax(logits)``, as a float64 scalar
    tensor on the logits' device: each token's NLL in float32 (``cross_entropy``, the padding ignored), their sum in
    float64. A third of the time of a float64 ``log_softmax`` over the whole vocabulary, for a difference below 1e-7
    of the sum."""
    flat_targets = targets.masked_fill(~target_mask, -100).reshape(-1)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat_targets,
                                            ignore_index=-100, reduction="none")
    return nll.double().sum()


class NLLTotal:
    """An evaluation's NLL sum (float64) and predicted-token count, kept on the model's device: adding a batch's
    makes the host wait for nothing (on a GPU the next batch is queued while this one runs); :meth:`read` reads
    both once, at the end."""

    def __init__(self, device):
        self.nll = torch.zeros((), dtype=torch.float64, device=device)
        self.tokens = torch.zeros((), dtype=torch.long, device=device)

    def add(self, nll: torch.Tensor, tokens: torch.Tensor) -> None:
        self.nll, self.tokens = self.nll + nll, self.tokens + tokens

    def read(self) -> tuple[float, int]:
        """``(NLL sum, tokens)`` on the host: one synchronisation."""
        nll, tokens = read_on_host(torch.stack([self.nll, self.tokens.double()]))
        return nll, int(tokens)


def chunk_nll(model, input_ids, attention_mask, context_bow, state, use_cache, sentence_prefix_bow=None):
    """NLL sum and count of one batch of chunks (scalar tensors on the model's device) and the state after it:
    inputs are chunk[:-1], targets chunk[1:]."""
    inputs, targets = input_ids[:, :-1], input_ids[:, 1:]
    target_mask = attention_mask[:, 1:].bool()  # right padding: a real target has a real input
    kwargs = {"context_bow": context_bow} if context_bow is not None else {}
    if sentence_prefix_bow is not None:
        kwargs["sentence_prefix_bow"] = sentence_prefix_bow
    out = model(input_ids=inputs, attention_mask=target_mask.long(), state=state, use_cache=use_cache,
                return_dict=True, **kwargs)
    return token_nll(out.logits, targets, target_mask), target_mask.sum(), out.state


def _document_nll(model, batch, device, context_bow):
    """NLL sum and count (scalar tensors on ``device``) of a documents batch (b, c, l) read by a model with a
    recurrence over sentences (``chunk_mask`` in ``forward``): one call, every chunk from a fresh token state, as
    ``paper`` and ``causal`` define it (also for a model trained with its token state carried, rGBN-RNN's
    ``carry_token_state``)."""
    input_ids, attention_mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    inputs, targets = input_ids[..., :-1], input_ids[..., 1:]
    chunk_mask = batch["chunk_mask"].to(device).bool()
    target_mask = attention_mask[..., 1:].bool() & chunk_mask.unsqueeze(-1)
    kwargs = {"context_bow": context_bow} if context_bow is not None else {}
    out = model(input_ids=inputs, attention_mask=target_mask.long(), chunk_mask=chunk_mask.long(),
                sentence_index=batch["sentence_index"].to(device), use_cache=False, return_dict=True,
                carry_token_state=False, **kwargs)
    return token_nll(out.logits, targets, target_mask), target_mask.sum()


def _chunk_budget_batches(order, n_chunks, chunks_per_batch):
    """Consecutive documents of ``order`` in groups of about ``chunks_per_batch`` chunks (at least one document)."""
    group, size = [], 0
    for i in order:
        if group and size + n_chunks[i] > chunks_per_batch:
            yield group
            group, size = [], 0
        group.append(i)
        size += n_chunks[i]
    if group:
        yield group


def mismatched_rows(rows: datasets.Dataset, document_rows: bool) -> datasets.Dataset:
    """The mismatched-context ablation's rows: every chunk reads the context of a chunk of another document.

    The documents are taken in the order of their first row; document p reads document p + D/2 (mod D) of
    the D documents, chunk j its chunk j (mod its number of chunks), whether the rows are chunks or
    (``document_rows``) whole documents whose columns are lists over their chunks; all but ``context_ids``
    is kept. Taken over the whole evaluation set, not within a batch, so a batch that holds the chunks of
    one document (long documents) is no exception."""
    doc_of = rows["doc_index"]
    contexts = rows["context_ids"]
    documents: dict[Any, list[int]] = {}
    for i, d in enumerate(doc_of):
        documents.setdefault(d, []).append(i)
    order = list(documents)
    if len(order) < 2:
        raise ValueError("The mismatched-context ablation needs at least two documents (each reads another's "
                         "context)")
    donor_of = {d: order[(p + len(order) // 2) % len(order)] for p, d in enumerate(order)}
    new_contexts = [None] * len(contexts)
    for d, members in documents.items():
        donor = documents[donor_of[d]]
        for j, i in enumerate(members):
            theirs = contexts[donor[j % len(donor)]]
            if document_rows:  # a document's row: its context is a list over its chunks
                theirs = [theirs[k % len(theirs)] if theirs else [] for k in range(len(contexts[i]))]
            new_contexts[i] = theirs
    feature = rows.features["context_ids"]
    return rows.remove_columns("context_ids").add_column("context_ids", new_contexts, feature=feature)


def empty_context_rows(rows: datasets.Dataset) -> datasets.Dataset:
    """Rows whose every chunk reads an empty context (a documents row: every chunk of it), all but ``context_ids``
    kept: the input of a topic model held at uninformative topics, the same for every document (the matched
    topic-free baseline of a topic model: its architecture and training, without its document's topics)."""
    empty = [[[] for _ in chunks] if chunks and isinstance(chunks[0], list) else [] for chunks in rows["context_ids"]]
    feature = rows.features["context_ids"]
    return rows.remove_columns("context_ids").add_column("context_ids", empty, feature=feature)


def prepare_evaluation(model, documents, tokenizer=None, topic_tokenizer=None):
    """Shared set-up of every perplexity protocol: a documents dataset, whether the model reads a
    context, and the tokenizers (by default the ones saved with the model), checked against it."""
    if not isinstance(documents, datasets.Dataset):
        documents = documents_from_lists(documents)
    if len(documents) == 0:
        raise ValueError("No documents to evaluate")
    uses_context = "context_bow" in model.conditioning_inputs
    tokenizer, topic_tokenizer = model_vocabularies(model, tokenizer, topic_tokenizer, uses_context)
    return documents, uses_context, tokenizer, topic_tokenizer


def model_vocabularies(model, tokenizer=None, topic_tokenizer=None, needs_topic_tokenizer: bool = True):
    """The tokenizers to evaluate ``model`` with: the ones given, else the ones saved with the model
    (``model.name_or_path``), checked against its config."""
    if tokenizer is None or (needs_topic_tokenizer and topic_tokenizer is None):
        source = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
        if not source:
            raise ValueError("Pass tokenizer= (and topic_tokenizer= for topic models): the model was not "
                             "loaded from a folder that holds them")
        loaded_tok, loaded_topic = load_vocabularies(source)
        tokenizer = tokenizer or loaded_tok
        topic_tokenizer = topic_tokenizer or loaded_topic
    check_vocabularies(tokenizer, topic_tokenizer if needs_topic_tokenizer else None, model.config)
    return tokenizer, topic_tokenizer


@torch.no_grad()
def evaluate_perplexity(model, documents: datasets.Dataset | Sequence, protocol: str = "causal",
                        tokenizer=None, topic_tokenizer=None, batch_size: int = 64,
                        max_sentence_length: int = 30, max_context_tokens: int | None = 300,
                        mismatched_context: bool = False, empty_context: bool = False) -> dict[str, Any]:
    """Perplexity of ``model`` on documents under a named protocol.

    Args:
        model: any causal LM of the package (a model without ``context_bow`` ignores the context).
        documents: a documents dataset (column ``sentences``) or a list of documents.
        protocol: ``"paper"``, ``"causal"`` or ``"causal-carry"`` (:data:`~topic_lm_hf.protocols.PROTOCOLS`).
        tokenizer, topic_tokenizer: default to the ones saved with the model
            (``model.name_or_path`` and its ``topic_tokenizer/`` subfolder).
        mismatched_context: the ablation that measures what the document's own topics are worth:
            every chunk reads the context bag of words of a chunk of another document
            (:func:`mismatched_rows`: the document half-way round the evaluation set, over the whole set,
            so long documents that fill a batch alone are no exception), so the topic representation
            describes some other document. The gap to the same protocol with the
            real context is the part of the perplexity that the document's topics explain, as
            opposed to the extra capacity of a topic model's LM.
        empty_context: every chunk reads an empty context (:func:`empty_context_rows`): the topics are the same,
            uninformative ones for every document. How a topic model trained this way (a matched topic-free
            baseline) is evaluated.

    Models with sentence-level topics (NCLM's SDT, ``sentence_prefix_bow`` in ``forward``) also get each
    chunk's sentence prefix, so a chunk that continues a sentence sees its earlier words. A model whose
    options let it read the words it predicts (``model.leaky_modes()``, e.g. NCLM's
    ``sdt_mode="minus_target"``) is only evaluated under ``paper``, and the result's ``protocol`` names
    those modes (``"paper+sdt_mode=minus_target"``); ``causal`` and ``causal-carry`` refuse it.

    Returns:
        ``{"perplexity", "nll", "tokens", "protocol", "context", "carry_state", "documents",
        "max_sentence_length", "max_context_tokens", "leaky_modes"}``.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    if mismatched_context and empty_context:
        raise ValueError("Give mismatched_context or empty_context, not both: each replaces the context")
    leaky = leaky_modes_of(model)
    if leaky and not PROTOCOLS[protocol].leaky:
        allowed = " or ".join(f"protocol={name!r}" for name, p in PROTOCOLS.items() if p.leaky)
        raise ValueError(f"The model reads words it predicts ({', '.join(leaky)}): its perplexity is not "
                         f"{protocol!r}. Evaluate it under {allowed} (labelled leaky), or turn those options off")
    documents, uses_context, tokenizer, topic_tokenizer = prepare_evaluation(model, documents, tokenizer,
                                                                             topic_tokenizer)
    context_mode, carry = PROTOCOLS[protocol].context, PROTOCOLS[protocol].carry_state
    collator = TopicContextCollator.for_model(model, tokenizer, topic_tokenizer, protocol=protocol,
                                              max_sentence_length=max_sentence_length,
                                              max_context_tokens=max_context_tokens)
    sentence_prefix = collator.sentence_prefix
    # A model with a recurrence over sentences (rGBN-RNN) reads whole documents (b, chunks, tokens) at once.
    reads_documents = model.reads_documents
    rows = collator.prepare(documents)
    if mismatched_context and uses_context:
        rows = mismatched_rows(rows, document_rows=collator.layout == "documents")
    if empty_context and uses_context:
        rows = empty_context_rows(rows)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = NLLTotal(device)

    def add_chunks(chunks, state, use_cache):
        """The NLL of a batch of chunks (a collator batch, or the carried loop's chunk k), added to the sums; returns
        the state after them."""
        bow = chunks["context_bow"].to(device) if uses_context else None
        prefix = chunks["sentence_prefix_bow"].to(device) if sentence_prefix else None
        nll, n, state = chunk_nll(model, chunks["input_ids"].to(device), chunks["attention_mask"].to(device), bow,
                                   state, use_cache=use_cache, sentence_prefix_bow=prefix)
        total.add(nll, n)
        return state

    try:
        if not carry and reads_documents:
            # Whole documents, about batch_size chunks per call; the token state restarts at every chunk.
            n_chunks = [len(x) for x in rows["input_ids"]]
            for group in _chunk_budget_batches(range(len(rows)), n_chunks, batch_size):
                batch = collator([rows[i] for i in group])
                bow = batch["context_bow"].to(device) if uses_context else None
                total.add(*_document_nll(model, batch, device, bow))
        elif not carry:
            # Sort chunks by length so that batches carry little padding; the sum does not depend on order.
            lengths = [len(x) for x in rows["input_ids"]]
            order = sorted(range(len(rows)), key=lambda i: lengths[i])
            for start in range(0, len(order), batch_size):
                add_chunks(collator([rows[i] for i in order[start:start + batch_size]]), None, use_cache=False)
        else:
            # Documents in parallel, chunk after chunk, the state carried (run_carried_chunks, as in training with
            # carry_state). Sorted by their number of chunks, a batch's documents have similar lengths.
            def step(k, chunk, state):
                return add_chunks(chunk, state, use_cache=True)

            n_chunks = [len(x) for x in rows["input_ids"]]
            order = sorted(range(len(rows)), key=lambda i: -n_chunks[i])
            for start in range(0, len(order), batch_size):
                run_carried_chunks(collator([rows[i] for i in order[start:start + batch_size]]), step)
    finally:
        model.train(was_training)
    total_nll, total_tokens = total.read()
    if total_tokens == 0:
        raise ValueError("No token to predict in these documents")
    return {"perplexity": math.exp(total_nll / total_tokens), "nll": total_nll, "tokens": total_tokens,
            "protocol": "+".join([protocol, *leaky]), "leaky_modes": leaky,
            "context": (context_mode + (", mismatched: another document's" if mismatched_context else "")
                        + (", empty: uninformative topics" if empty_context else "")
                        if uses_context else "none (model ignores context)"),
            "mismatched_context": mismatched_context, "empty_context": empty_context,
            "carry_state": carry, "documents": len(documents), "max_sentence_length": max_sentence_length,
            "max_context_tokens": max_context_tokens}
