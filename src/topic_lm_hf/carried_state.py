"""The carried-state loop: the documents of a batch read in parallel, chunk after chunk, the recurrent state
carried from each chunk of a document to its next.

Shapes: b documents, c chunks of a document, l tokens of a chunk, V_c topic vocabulary.

``evaluate_perplexity(protocol="causal-carry")``, the sliding-window protocol and training with
``TopicLMTrainer(carry_state=True)`` (:func:`carried_state_loss`) all read a documents batch
this way, so the chunks they run, their rows and their order are the same by construction: training optimises
what ``causal-carry`` measures. What each does with a chunk (the NLL sums, the window of predicted tokens, the loss
weighting and truncated back-propagation) is its own, in the ``step`` it gives :func:`run_carried_chunks`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from .models.modeling_recurrent import (RecurrentPreTrainedModel, TopicLMOutput, document_layout, leaky_modes_of,
                                       select_state_rows)
from .models.modeling_topic_family import TopicFamilyForCausalLM

# Keys of a documents batch (TopicContextCollator(layout="documents")) that hold one entry per chunk (b, c, ...),
# and the layout keys that the loop reads itself. Any other tensor has one entry per document (b, ...).
CHUNK_KEYS = ("input_ids", "attention_mask", "labels", "context_bow", "sentence_prefix_bow")
LAYOUT_KEYS = ("chunk_mask", "sentence_index")

State = Optional[tuple[torch.Tensor, ...]]


def run_carried_chunks(batch: Mapping[str, Any], step: Callable[[int, dict[str, torch.Tensor], State], State]) -> None:
    """Run ``step`` on chunk k = 0, 1, ... of every document of ``batch`` that has one, carrying the state.

    The rows are taken in the order of their number of chunks, descending (a stable sort: rows with as many chunks
    keep their order), so that the documents that still have a k-th chunk are the first rows: chunk k runs only
    those rows, and the state is cut to them (:func:`~topic_lm_hf.models.modeling_recurrent.select_state_rows`),
    so a padding chunk is never run. Rows already in that order (evaluation sorts its documents before collating
    them, so that a batch groups documents of similar lengths) are not copied.

    ``step(k, chunk, state)`` gets the chunk's index k, the chunk's tensors cut to its b_k rows (each key of
    :data:`CHUNK_KEYS` in the batch at chunk k, e.g. ``input_ids`` (b_k, l) and ``context_bow`` (b_k, V_c), and
    every tensor with one entry per document cut to its first b_k rows) and the state the previous chunk's ``step``
    returned, cut to the same rows (None before the first chunk). It returns the state to carry to chunk k + 1
    (None: start it afresh). The tensors stay on the batch's device; what to run on them, and whether to detach
    the state, is the step's.

    Args:
        batch: a documents batch of :class:`~topic_lm_hf.collator.TopicContextCollator` (``layout="documents"``):
            ``input_ids``, ``attention_mask`` (b, c, l) and ``chunk_mask`` (b, c) that marks each document's chunks
            as a prefix (1 ... 1 0 ... 0), and optionally ``labels`` (b, c, l), ``context_bow`` and
            ``sentence_prefix_bow`` (b, c, V_c).
        step: called once per chunk, in order, as described above.

    Raises:
        ValueError: a value of ``batch`` other than the layout keys is not a tensor with one entry per document.
    """
    chunk_mask = batch["chunk_mask"].bool()
    b, c = chunk_mask.shape
    order = torch.argsort(chunk_mask.sum(1), descending=True, stable=True)
    sorted_already = torch.equal(order, torch.arange(b, device=order.device))
    per_chunk, per_row = {}, {}
    for key, value in batch.items():
        if key in LAYOUT_KEYS or value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != b:
            raise ValueError(f"The carried-state loop cannot cut {key!r} to a chunk's rows: a documents batch holds "
                             "tensors with one entry per document")
        if not sorted_already:
            value = value.index_select(0, order.to(value.device))
        if key in CHUNK_KEYS:
            per_chunk[key] = value
        else:
            per_row[key] = value
    active = chunk_mask.index_select(0, order).sum(0).tolist()  # documents with a k-th chunk: a prefix of the rows
    state = None
    for k in range(c):
        rows = active[k]
        if rows == 0:
            break
        chunk = {key: value[:rows, k] for key, value in per_chunk.items()}
        chunk.update({key: value[:rows] for key, value in per_row.items()})
        state = step(k, chunk, select_state_rows(state, rows))


def document_sequences(batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A documents batch as one token sequence per document: what :func:`run_carried_chunks` reads, where nothing
    but the state passes from a chunk to the next.

    Consecutive chunks share a token (the last input of chunk k is the first of chunk k + 1, see the collator),
    and a carried chunk feeds its tokens but its last. So the document's sequence is every chunk's tokens but its
    last, then the last chunk's last token; its labels are every chunk's targets (positions 1 .. of each chunk) in
    order, after one ignored position. A model whose call on a chunk depends on nothing but the chunk's tokens and
    the state it continues from gives, on this sequence, the same predictions as chunk after chunk with the state
    carried, in one call (one recurrent kernel over the document instead of one call per chunk).

    Args:
        batch: a documents batch with ``input_ids``, ``attention_mask`` and ``labels`` (b, c, l) and
            ``chunk_mask`` (b, c), each document's chunks a prefix and each chunk right-padded.

    Returns:
        ``input_ids``, ``attention_mask`` and ``labels`` (b, n), right-padded (labels -100 there), n the longest
        document's tokens.
    """
    return _document_sequences(batch)[0]


def _document_sequences(batch: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """:func:`document_sequences`, where each token of the batch (b, c * l) is in them (``document_layout``'s
    ``index``: in the flattened sequences, 0 at a token they do not hold), and where each token of the sequences
    comes from (``order`` (b, n): its index in the document's flattened chunks)."""
    ids, labels = batch["input_ids"], batch["labels"]
    b, c, l = ids.shape
    fed_order, mask, _, index = document_layout(batch["attention_mask"], batch["chunk_mask"])
    real = batch["attention_mask"].bool() & batch["chunk_mask"].bool().unsqueeze(-1)
    targets = torch.cat([real.new_zeros(b, c, 1), real[..., 1:]], dim=-1).flatten(1)
    n = mask.shape[1]
    # a stable sort of each row's selected positions to the front keeps them in document order
    target_order = torch.argsort((~targets).to(torch.int8), dim=1, stable=True)[:, :n - 1]
    input_ids = ids.flatten(1).gather(1, fed_order).masked_fill(~mask, 0)
    target_labels = labels.flatten(1).gather(1, target_order)
    out_labels = torch.cat([labels.new_full((b, 1), -100), target_labels], dim=1).masked_fill(~mask, -100)
    out_labels[:, 0] = -100
    return {"input_ids": input_ids, "attention_mask": mask.to(batch["attention_mask"].dtype),
            "labels": out_labels}, index, fed_order


def chunk_rows(batch: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A documents batch as the batch of its chunks (one row per real chunk, as a sentences batch holds them), and
    where each chunk's tokens are in its document's sequence: for a model whose recurrence reads nothing but the
    tokens, while the rest of it reads each chunk's own context.

    Returns:
        ``(rows, document_tokens)``: ``rows`` holds every key of :data:`CHUNK_KEYS` in the batch cut to the R real
        chunks, document after document, (R, l, ...), with ``attention_mask`` as the carried loop feeds a chunk (1
        at the inputs whose target is real), and every tensor with one entry per document repeated for each of its
        chunks; ``document_tokens`` holds the sequences of :func:`document_sequences` (``input_ids``,
        ``attention_mask`` (b, n)), ``positions`` (R, l): the index in the flattened sequences (b * n) of each
        chunk token the recurrence reads (its outputs at the chunk's other positions predict nothing: 0 there), and
        ``rows`` (b, n): the row (0 .. R - 1) of the chunk that feeds each token of the sequences, as the loop feeds
        it (a recurrence that reads its chunk's topics at every step reads that row's; the document's first row at
        padding).
    """
    chunk_mask = batch["chunk_mask"].bool()
    b, c, l = batch["input_ids"].shape
    sequences, index, order = _document_sequences(batch)
    keep = chunk_mask.flatten()
    rows = {}
    for key, value in batch.items():
        if key in LAYOUT_KEYS or value is None:
            continue
        if key in CHUNK_KEYS:
            rows[key] = value.flatten(0, 1)[keep]
        else:
            rows[key] = value.repeat_interleave(chunk_mask.sum(1), dim=0)
    # as the loop feeds a chunk: 1 at the inputs whose target is real (its last real token stays out of the state)
    mask = rows["attention_mask"]
    rows["attention_mask"] = torch.cat([mask[:, 1:], mask.new_zeros(mask.shape[0], 1)], dim=1)
    positions = index.view(b * c, l)[keep]
    chunks = chunk_mask.sum(1)
    first_row = chunks.cumsum(0) - chunks  # (b,): each document's first row
    chunk_of = torch.div(order.masked_fill(~sequences["attention_mask"].bool(), 0), l, rounding_mode="floor")
    return rows, {"input_ids": sequences["input_ids"], "attention_mask": sequences["attention_mask"],
                  "positions": positions, "rows": first_row.unsqueeze(1) + chunk_of}


# ----------------------------------------------------------------------------------------------
# the training loss with the state carried (TopicLMTrainer(carry_state=True))
# ----------------------------------------------------------------------------------------------

LOSS_TERMS = ("lm_loss", "kl_loss", "bow_loss", "aux_loss")


def unwrap_model(model):
    """The model under DDP / DataParallel (``.module``), ``torch.compile`` (``._orig_mod``) and PEFT
    (``get_base_model()``: the model whose layers carry the adapters) wrappers."""
    while True:
        inner = getattr(model, "module", None)
        inner = inner if isinstance(inner, torch.nn.Module) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module) and callable(getattr(model, "get_base_model", None)):
            inner = model.get_base_model()
            inner = inner if inner is not model else None
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def check_bptt_chunks(bptt_chunks) -> None:
    """``bptt_chunks`` is a positive integer or ``None`` (the whole document), else ``ValueError``."""
    if bptt_chunks is not None and (isinstance(bptt_chunks, bool) or not isinstance(bptt_chunks, int)
                                    or bptt_chunks < 1):
        raise ValueError(f"bptt_chunks must be a positive integer or None (the whole document), got {bptt_chunks!r}")


def check_carry_state_model(model) -> None:
    """Raise ``ValueError`` unless ``model`` can be trained with its state carried across a document's chunks,
    from what it declares: it is stateful (``_is_stateful``: ``forward`` takes ``state`` and returns it with
    ``use_cache=True``), it does not read whole documents itself (``reads_documents``: rGBN-RNN runs its
    sentence recurrence inside one call; train it on its documents batches as they are), and none of its
    options reads the words it predicts (``model.leaky_modes()``: such a model cannot be evaluated under
    ``causal-carry``, the protocol this training is for)."""
    model = unwrap_model(model)
    name = type(model).__name__
    if not isinstance(model, RecurrentPreTrainedModel) or not model._is_stateful:
        raise ValueError(f"{name}.forward takes no recurrent state (state): carry_state needs a model that "
                         "continues from one")
    if model.reads_documents:
        raise ValueError(f"{name} reads whole documents (chunk_mask) and carries its recurrences itself: train it "
                         "on its documents batches without carry_state")
    leaky = leaky_modes_of(model)
    if leaky:
        raise ValueError(f"{name} reads words it predicts ({', '.join(leaky)}): carry_state trains for the "
                         "causal-carry protocol, under which such a model is not evaluated; turn those options off")


def check_documents_batch(batch) -> None:
    """Raise ``ValueError`` unless ``batch`` is a documents batch of :class:`TopicContextCollator`
    (``layout="documents"``): ``input_ids``, ``attention_mask``, ``labels`` (b, c, l) and ``chunk_mask`` (b, c)."""
    ids = batch.get("input_ids")
    if batch.get("chunk_mask") is None or ids is None or ids.dim() != 3:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else None
        raise ValueError(f"carry_state needs documents batches (input_ids (b, c, l) and chunk_mask (b, c)), got "
                         f"input_ids of shape {shape}{' without chunk_mask' if 'chunk_mask' not in batch else ''}: "
                         "build the collator with TopicContextCollator.for_model(model, tok, topic_tok, "
                         "protocol='train-carry')")
    if batch.get("labels") is None or batch.get("attention_mask") is None:
        raise ValueError("carry_state needs labels and attention_mask in a documents batch")
    chunk_mask = batch["chunk_mask"].bool()
    if bool((chunk_mask[:, 1:] & ~chunk_mask[:, :-1]).any()):
        raise ValueError("chunk_mask must mark each document's chunks as a prefix (1 ... 1 0 ... 0)")


def _reads_tokens_only(model, batch) -> bool:
    """Whether ``model``'s call on a chunk of ``batch`` depends on the chunk's tokens and its state alone: a model
    that reads no topics (``conditioning_inputs`` empty), on a batch with nothing but tokens, labels and layout."""
    return not model.conditioning_inputs and set(batch) <= {"input_ids", "attention_mask", "labels", *LAYOUT_KEYS}


def carried_state_loss(model, batch, bptt_chunks: int | None = None, chunk_callback=None, *,
                       check_model: bool = True) -> TopicLMOutput:
    """The loss of a documents batch with the model's recurrent state carried from chunk to chunk.

    Chunk k = 0 .. c-1 of every document is run in order, and the ``state`` the model returns after
    chunk k is its initial state for chunk k + 1 of the same document. The batch is read by
    :func:`~topic_lm_hf.carried_state.run_carried_chunks`, the loop ``evaluate_perplexity``'s ``causal-carry``
    reads its batches with: the rows in the order of their number of chunks (descending), each call on only the
    documents that still have a k-th chunk, the state cut to them, so padding chunks are never run.

    The carried state must be the one ``causal-carry`` evaluation continues from. Consecutive chunks of a
    sentence share a token (the last input of chunk k is the first of chunk k + 1, see the collator), and
    evaluation feeds a chunk's tokens but its last; here the chunk is fed whole with ``labels`` (the model
    computes its own loss terms, shifted inside), and the ``attention_mask`` given to the model is 1 only at
    inputs whose next token is real: the last real token, which predicts nothing, then never enters the state.

    A model that reads nothing but its tokens (no topics, and only tokens and labels in the batch) gets each document
    as one sequence instead (:func:`~topic_lm_hf.carried_state.document_sequences`): one call, one recurrent kernel
    over the document, the same predictions and loss as chunk after chunk (without ``chunk_callback``, and unless
    ``bptt_chunks`` cuts the document). A topic model that declares ``carries_documents_in_one_call`` (TopicRNN,
    NCLM without sentence topics, TCNLM) gets one call too: its RNN over each document's sequence (TCNLM's reads each
    token under its own chunk's topics, ``document_tokens["rows"]``), the rest on the batch of the document's chunks
    (:func:`~topic_lm_hf.carried_state.chunk_rows`), the same loss (a term normalised per batch rather than per
    predicted token, such as TopicRNN's free bits and bag-of-words term, over that batch of chunks).

    Gradients flow through the carried state; with ``bptt_chunks`` the state is detached after every
    ``bptt_chunks`` chunks (truncated back-propagation through the document). The graph of the whole batch is
    kept until the backward pass either way: memory grows with the tokens of the batch, as for a sentences
    batch of the same chunks.

    The loss is ``sum_k n_k loss_k / sum_k n_k``, where ``loss_k`` is the model's loss on the batch of the
    documents' k-th chunks (exactly as on a sentences batch of those chunks) and ``n_k`` its number of
    predicted tokens: the same per-token objective as sentence training. For the terms a model normalises per
    predicted token (``lm_loss``, and every term of TopicRNN, NCLM and TCNLM with
    ``topic_loss_normalization="lm_tokens"``), it is the token-weighted mean of every document chunk's own
    loss. ``lm_loss``, ``kl_loss``, ``bow_loss`` and ``aux_loss`` are weighted the same way. A model with a
    KL-annealing counter (``kl_annealing_step``) counts a documents batch as one training forward pass, as a
    sentences batch.

    Args:
        model: a causal LM with ``state`` in ``forward`` (see :func:`check_carry_state_model`).
        batch: a documents batch of :class:`~topic_lm_hf.collator.TopicContextCollator`:
            ``input_ids``, ``attention_mask``, ``labels`` (b, c, l), ``chunk_mask`` (b, c), and with a
            context ``context_bow`` (b, c, V_c) (and ``sentence_prefix_bow`` (b, c, V_c)). Other tensors with
            one entry per document (b, ...) are passed to every call, cut to its rows.
        bptt_chunks: chunks between two detachments of the state (None: the whole document).
        chunk_callback: called as ``chunk_callback(labels, output)`` after each chunk with that chunk's
            labels (b_k, l) and the model's output (evaluation sums).
        check_model: check ``model`` and ``bptt_chunks`` (:func:`check_carry_state_model`,
            :func:`check_bptt_chunks`); False where the caller checked them once (``TopicLMTrainer(carry_state=True)``
            does when it is built). The batch is checked on every call.

    Returns:
        :class:`~topic_lm_hf.models.modeling_recurrent.TopicLMOutput` with ``loss`` and the weighted loss terms.
    """
    if check_model:
        check_bptt_chunks(bptt_chunks)
        check_carry_state_model(model)
    check_documents_batch(batch)
    c = batch["chunk_mask"].shape[1]
    lm = unwrap_model(model)
    if chunk_callback is None and (bptt_chunks is None or bptt_chunks >= c):
        out = None
        if _reads_tokens_only(lm, batch):
            # nothing but the state passes between chunks: the chunks of a document are one sequence
            out = model(**document_sequences(batch), use_cache=False, return_dict=True)
        elif isinstance(lm, TopicFamilyForCausalLM) and lm.carries_documents_in_one_call() \
                and not lm.config.output_hidden_states:  # per-layer states of the chunks: the loop gives them
            # the recurrence over each document's sequence, the rest on the batch of its chunks
            rows, document_tokens = chunk_rows(batch)
            out = model(**rows, document_tokens=document_tokens, use_cache=False, return_dict=True)
        if out is not None:
            return TopicLMOutput(loss=out.loss, **{key: model_output(out, key) for key in LOSS_TERMS
                                                   if model_output(out, key) is not None})
    kl_step = lm._buffers.get("kl_annealing_step") if isinstance(lm, TopicFamilyForCausalLM) else None
    kl_step_before = kl_step.clone() if kl_step is not None and model.training else None
    total, sums, weights = None, {}, {}

    def step(k, chunk, state):
        nonlocal total
        mask = chunk["attention_mask"]
        # 1 at inputs whose target is real (right padding): the last real token stays out of the state.
        chunk["attention_mask"] = torch.cat([mask[:, 1:], mask.new_zeros(mask.shape[0], 1)], dim=1)
        if kl_step_before is not None and k > 0:
            kl_step.copy_(kl_step_before)  # each chunk's pass sees (and counts) the batch's one pass
        out = model(**chunk, state=state, use_cache=True, return_dict=True)
        if chunk_callback is not None:
            chunk_callback(chunk["labels"], out)
        state = model_output(out, "state")
        if state is None and k + 1 < c and model_output(out, "lm_loss") is not None:
            raise ValueError(f"{type(unwrap_model(model)).__name__} returned no state with use_cache=True: its state "
                             "cannot be carried")
        if state is not None and bptt_chunks is not None and (k + 1) % bptt_chunks == 0:
            state = tuple(s.detach() for s in state)
        tokens = (chunk["labels"][:, 1:] != -100).sum()
        loss = model_output(out, "loss")
        if loss is None:
            raise ValueError(f"{type(unwrap_model(model)).__name__} returned no loss for a chunk with labels")
        total = tokens * loss if total is None else total + tokens * loss
        weights["loss"] = weights.get("loss", 0) + tokens
        for key in LOSS_TERMS:
            value = model_output(out, key)
            if value is not None:
                sums[key] = sums.get(key, 0) + tokens * value.detach().float().mean()
                weights[key] = weights.get(key, 0) + tokens
        return state

    run_carried_chunks(batch, step)
    return TopicLMOutput(loss=total / weights["loss"].clamp_min(1),
                         **{key: sums[key] / weights[key].clamp_min(1) for key in sums})


def model_output(outputs, key):
    """``outputs[key]`` of a ``ModelOutput`` or a dict, ``outputs.key`` of another output, None where it has none."""
    return outputs.get(key) if isinstance(outputs, dict) else getattr(outputs, key, None)
