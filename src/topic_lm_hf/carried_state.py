"""The carried-state loop: the documents of a batch read in parallel, chunk after chunk, the recurrent state
carried from each chunk of a document to its next.

Shapes: b documents, c chunks of a document, l tokens of a chunk, V_c topic vocabulary.

``evaluate_perplexity(protocol="causal-carry")``, the sliding-window protocol and training with
``TopicLMTrainer(carry_state=True)`` (:func:`~topic_lm_hf.trainer.carried_state_loss`) all read a documents batch
this way, so the chunks they run, their rows and their order are the same by construction: training optimises
what ``causal-carry`` measures. What each does with a chunk (the NLL sums, the window of predicted tokens, the loss
weighting and truncated back-propagation) is its own, in the ``step`` it gives :func:`run_carried_chunks`.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import torch

from .models.modeling_recurrent import document_layout, select_state_rows

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


def _document_sequences(batch: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """:func:`document_sequences`, and where each token of the batch (b, c * l) is in them (``document_layout``'s
    ``index``: in the flattened sequences, 0 at a token they do not hold)."""
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
            "labels": out_labels}, index


def chunk_rows(batch: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A documents batch as the batch of its chunks (one row per real chunk, as a sentences batch holds them), and
    where each chunk's tokens are in its document's sequence: for a model whose recurrence reads nothing but the
    tokens, while the rest of it reads each chunk's own context.

    Returns:
        ``(rows, document_tokens)``: ``rows`` holds every key of :data:`CHUNK_KEYS` in the batch cut to the R real
        chunks, document after document, (R, l, ...), with ``attention_mask`` as the carried loop feeds a chunk (1
        at the inputs whose target is real), and every tensor with one entry per document repeated for each of its
        chunks; ``document_tokens`` holds the sequences of :func:`document_sequences` (``input_ids``,
        ``attention_mask`` (b, n)) and ``positions`` (R, l): the index in the flattened sequences (b * n) of each
        chunk token the recurrence reads (its outputs at the chunk's other positions predict nothing: 0 there).
    """
    chunk_mask = batch["chunk_mask"].bool()
    b, c, l = batch["input_ids"].shape
    sequences, index = _document_sequences(batch)
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
    return rows, {"input_ids": sequences["input_ids"], "attention_mask": sequences["attention_mask"],
                  "positions": positions}
