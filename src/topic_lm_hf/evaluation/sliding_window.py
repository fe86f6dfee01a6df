"""TopicRNN's own perplexity protocol: theta from the previous window of words.

Dieng et al. (2017, §4.1): "to compute these perplexity scores for word prediction we use a
sliding window to compute theta as we move along the sequences. The topic vector theta that is
used from the current batch of words is estimated from the previous batch of words" (after
Mikolov & Zweig 2012). Here:

* a document is the same chunk sequence as in :mod:`.perplexity` (each sentence
  ``<bos> w_1 .. w_n <eos>`` in chunks of at most ``max_sentence_length`` predicted tokens), so
  the predicted tokens and their count are identical to the other protocols;
* the context bag of words of a chunk is the topic words among the ``window`` tokens predicted
  just before it in the same document (empty for the first chunk); it never contains a word of
  the chunk itself, so the protocol is causal;
* the recurrent state is carried across the chunks of a document (``carry_state=True``, the
  paper's RNN reads the document as one sequence) or reset at every chunk.

The result is labelled ``protocol="topicrnn-sliding-window"``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

import datasets
import numpy as np
import torch

from ..carried_state import run_carried_chunks
from ..collator import TopicContextCollator
from ..models.modeling_recurrent import leaky_modes_of
from .perplexity import NLLTotal, chunk_nll, prepare_evaluation

PROTOCOL = "topicrnn-sliding-window"


@torch.no_grad()
def evaluate_perplexity_sliding_window(model, documents: datasets.Dataset | Sequence, window: int = 30,
                                       tokenizer=None, topic_tokenizer=None, carry_state: bool = True,
                                       batch_size: int = 64, max_sentence_length: int = 30) -> dict[str, Any]:
    """Perplexity with theta inferred from the previous ``window`` predicted tokens.

    Args:
        model: a causal LM of the package; one without ``context_bow`` is evaluated without context.
        documents: a documents dataset (column ``sentences``) or a list of documents.
        window: how many previously predicted tokens form the context (their topic words count).
        carry_state: carry the recurrent state across the chunks of a document.

    Returns:
        ``{"perplexity", "nll", "tokens", "protocol", "context", "window", "carry_state",
        "documents", "max_sentence_length"}``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    leaky = leaky_modes_of(model)
    if leaky:
        raise ValueError(f"The model reads words it predicts ({', '.join(leaky)}): the sliding-window protocol is "
                         "causal; turn those options off")
    documents, uses_context, tokenizer, topic_tokenizer = prepare_evaluation(model, documents, tokenizer,
                                                                             topic_tokenizer)
    collator = TopicContextCollator.for_model(model, tokenizer, topic_tokenizer, protocol="sliding-window",
                                              max_sentence_length=max_sentence_length)
    sentence_prefix = collator.sentence_prefix
    # LM id -> topic id (-1 outside the topic vocabulary); the topic <unk> is never counted.
    lm_to_topic = collator.lm_to_topic

    rows = collator.prepare(documents)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = NLLTotal(device)
    # Row i of a batch -> the LM ids it has predicted so far. Chunk k runs the first rows of the loop's order, so
    # row i is the same document at every chunk of the batch.
    history: defaultdict[int, list[int]] = defaultdict(list)

    def step(k, chunk, state):
        ids, mask = chunk["input_ids"], chunk["attention_mask"]
        bow = None
        if uses_context:
            topic_ids = [lm_to_topic[np.asarray(history[i][-window:], dtype=np.int64)] for i in range(len(ids))]
            bow = collator.bag_of_words([t[t >= 0] for t in topic_ids]).to(device)
        prefix = chunk["sentence_prefix_bow"].to(device) if sentence_prefix else None
        nll, n, state = chunk_nll(model, ids.to(device), mask.to(device), bow, state, use_cache=carry_state,
                                   sentence_prefix_bow=prefix)
        total.add(nll, n)
        for i in range(len(ids)):
            length = int(mask[i].sum())
            history[i].extend(ids[i, 1:length].tolist())  # this chunk's predicted tokens
        return state if carry_state else None

    try:
        # Documents in parallel, chunk after chunk (run_carried_chunks, as causal-carry); sorted by their number of
        # chunks, a batch's documents have similar lengths.
        n_chunks = [len(x) for x in rows["input_ids"]]
        order = sorted(range(len(rows)), key=lambda i: -n_chunks[i])
        for start in range(0, len(order), batch_size):
            history.clear()
            run_carried_chunks(collator([rows[i] for i in order[start:start + batch_size]]), step)
    finally:
        model.train(was_training)
    total_nll, total_tokens = total.read()
    if total_tokens == 0:
        raise ValueError("No token to predict in these documents")
    context = (f"topic words of the previous {window} predicted tokens" if uses_context
               else "none (model ignores context)")
    return {"perplexity": math.exp(total_nll / total_tokens), "nll": total_nll, "tokens": total_tokens,
            "protocol": PROTOCOL, "context": context, "window": window, "carry_state": carry_state,
            "documents": len(documents), "max_sentence_length": max_sentence_length}
