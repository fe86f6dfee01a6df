"""A literal, per-example, per-position NCLM (Chaudhary et al. 2020) for the tests: Python loops, the
NVDM re-run on an explicit bag of words at every position, ETR's top-N found by sorting each topic's
words, no cumulative sums, no batching, no masking tricks. Float64 throughout.

It reads the weights of an ``NCLMForCausalLM`` in eval mode (dropout off, h = softmax(mu))."""

from __future__ import annotations

import torch


def _nvdm_proportions(model, bow: torch.Tensor) -> torch.Tensor:
    tm = model.model.topic_model
    pre = tm.encoder.weight.double() @ bow.double() + tm.encoder.bias.double()
    hidden = {"sigmoid": torch.sigmoid, "relu": torch.relu, "tanh": torch.tanh}[model.config.encoder_activation](pre)
    mu = tm.posterior_mean.weight.double() @ hidden + tm.posterior_mean.bias.double()
    return torch.softmax(mu, dim=0)


def _word_vector(model, w: int) -> torch.Tensor | None:
    cfg = model.config
    if cfg.etr_embedding == "decoder":
        return model.model.topic_model.decoder.weight[w].double()
    if cfg.etr_embedding == "frozen":
        return model.model.etr_word_embeddings[w].double()
    lm_id = cfg.topic_word_ids[w]
    return None if lm_id < 0 else model.model.embed_tokens.weight[lm_id].double()


def _topic_vectors(model, present: set[int]) -> list[torch.Tensor]:
    """z_k for every topic: the mean vector of the top-N present words by W[k, w] (masked_topk)."""
    cfg = model.config
    W = model.model.topic_model.decoder.weight.T.detach().double()  # (K, V_c)
    D = cfg.etr_size
    words = [w for w in sorted(present) if w != 0 and _word_vector(model, w) is not None]
    out = []
    for k in range(cfg.num_topics):
        ranked = sorted(words, key=lambda w: -float(W[k, w]))[:cfg.etr_top_n]
        if not ranked:
            out.append(torch.zeros(D, dtype=torch.float64))
        else:
            out.append(torch.stack([_word_vector(model, w) for w in ranked]).mean(0))
    return out


def _representation(model, h: torch.Tensor, z: list[torch.Tensor] | None) -> torch.Tensor:
    cfg = model.config
    parts = []
    if cfg.uses_etr:
        weights = torch.softmax(h, 0) if cfg.etr_weighting == "softmax_of_proportions" else h
        parts.append(sum(weights[k] * z[k] for k in range(cfg.num_topics)))
    if cfg.uses_ltr:
        parts.append(h)
    return torch.cat(parts)


def reference_logits(model, input_ids: list[int], context_bow: torch.Tensor,
                     sentence_prefix: list[int] | None = None) -> torch.Tensor:
    """Logits (s, V) of one chunk ``input_ids`` (one sentence, no padding) with its context bag of words.

    ``sentence_prefix``: the topic ids of the sentence's words before the chunk (prefix mode)."""
    cfg = model.config
    V_c = cfg.topic_vocab_size
    lm_to_topic = {lm: t for t, lm in enumerate(cfg.topic_word_ids) if lm >= 0}
    topic_of = [lm_to_topic.get(i) for i in input_ids]

    h_doc = _nvdm_proportions(model, context_bow)
    present = {w for w in range(V_c) if context_bow[w] > 0}
    z_doc = _topic_vectors(model, present) if cfg.uses_etr else None
    c_doc = _representation(model, h_doc, z_doc)

    with torch.no_grad():
        o = model.model(input_ids=torch.tensor([input_ids])).last_hidden_state[0].double()  # (s, H)
    Wp, bp = model.compose.weight.double(), model.compose.bias.double()
    U, a = model.lm_head.weight.double(), model.lm_head.bias.double()
    rows = []
    for i in range(len(input_ids)):
        c = [c_doc]
        if cfg.sentence_topics:
            bow = torch.zeros(V_c, dtype=torch.float64)
            if cfg.sdt_mode == "prefix":
                for w in (sentence_prefix or []):
                    bow[w] += 1
                for j in range(i + 1):  # the inputs up to i: the words before the target i + 1
                    if topic_of[j] is not None:
                        bow[topic_of[j]] += 1
            else:  # minus_target: every input of the chunk except position i + 1
                for j in range(len(input_ids)):
                    if j != i + 1 and topic_of[j] is not None:
                        bow[topic_of[j]] += 1
            c.append(_representation(model, _nvdm_proportions(model, bow), z_doc))
        composed = torch.sigmoid(Wp @ torch.cat([o[i], *c]) + bp)
        rows.append(U @ composed + a)
    return torch.stack(rows)
