"""Naive per-token reference of TopicRNN (Dieng et al. 2017), for parity tests.

Everything is recomputed from the model's parameters with Python loops in float64: the recurrent
cells from their textbook equations, the word distribution word by word from
p(y = i | h, theta, l) ∝ exp(v_i^T h + c_i + (1 - l) b_i^T theta), the indicator likelihood from
sigmoid(Gamma^T h), and the Gaussian KL term by term. Nothing here calls the model's forward.
"""

from __future__ import annotations

import math

import torch


def _params(model):
    return {k: v.detach().double() for k, v in model.state_dict().items()}


def cell_step(cell: str, p: dict, layer: int, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
    """One step of torch's RNN / GRU / LSTM equations for one layer; x (E,), h and c (H,)."""
    w_ih, w_hh = p[f"model.rnn.weight_ih_l{layer}"], p[f"model.rnn.weight_hh_l{layer}"]
    b_ih, b_hh = p[f"model.rnn.bias_ih_l{layer}"], p[f"model.rnn.bias_hh_l{layer}"]
    gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
    if cell == "rnn":
        return torch.tanh(gi + gh), c
    if cell == "gru":
        i_r, i_z, i_n = gi.chunk(3)
        h_r, h_z, h_n = gh.chunk(3)
        r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * h, c
    i, f, g, o = (gi + gh).chunk(4)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def hidden_states(model, input_ids: list[int]) -> list[torch.Tensor]:
    """Top-layer h_t after reading x_1..x_t, from a zero state."""
    cfg, p = model.config, _params(model)
    hs = [torch.zeros(cfg.hidden_size, dtype=torch.float64) for _ in range(cfg.num_hidden_layers)]
    cs = [torch.zeros(cfg.hidden_size, dtype=torch.float64) for _ in range(cfg.num_hidden_layers)]
    out = []
    for token in input_ids:
        x = p["model.embed_tokens.weight"][token]
        for layer in range(cfg.num_hidden_layers):
            hs[layer], cs[layer] = cell_step(cfg.cell, p, layer, x, hs[layer], cs[layer])
            x = hs[layer]
        out.append(x.clone())
    return out


def inference(model, bow: list[float]) -> tuple[list[float], list[float]]:
    """mu and log sigma of q(theta | bow) (ReLU MLP, raw counts, log sigma clamped)."""
    cfg, p = model.config, _params(model)
    x = torch.tensor(bow, dtype=torch.float64)
    for layer in range(cfg.inference_num_layers):
        name = f"model.inference_net.layers.{layer}"
        x = torch.relu(p[f"{name}.weight"] @ x + p[f"{name}.bias"])
    mu = p["model.inference_net.mean.weight"] @ x + p["model.inference_net.mean.bias"]
    ls = (p["model.inference_net.log_sigma.weight"] @ x + p["model.inference_net.log_sigma.bias"]).clamp(
        -cfg.max_log_sigma, cfg.max_log_sigma)
    return mu.tolist(), ls.tolist()


def kl_term(mu: list[float], log_sigma: list[float]) -> float:
    """KL(N(mu, sigma^2) || N(0, I)) = 1/2 sum_k (mu_k^2 + sigma_k^2 - 1 - 2 log sigma_k)."""
    return sum(0.5 * (m * m + math.exp(2 * s) - 1 - 2 * s) for m, s in zip(mu, log_sigma))


def word_log_probs(model, h: torch.Tensor, theta: list[float], indicator: int) -> list[float]:
    """log p(y = i | h, theta, l) for every word i, one word at a time."""
    cfg, p = model.config, _params(model)
    topic_of = {lm: t for t, lm in enumerate(cfg.topic_word_ids) if lm >= 0}
    scores = []
    for i in range(cfg.vocab_size):
        s = float(p["lm_head.weight"][i] @ h + p["lm_head.bias"][i])
        if indicator == 0 and i in topic_of:
            s += sum(float(p["topic_head.weight"][topic_of[i], k]) * theta[k] for k in range(cfg.num_topics))
        scores.append(s)
    top = max(scores)
    log_z = top + math.log(sum(math.exp(s - top) for s in scores))
    return [s - log_z for s in scores]


def sentence_terms(model, input_ids: list[int], indicators: list[int], theta: list[float]) -> dict:
    """Per-token terms of one sentence: input t predicts input_ids[t + 1] with indicator indicators[t].

    Returns log p(y_t | h_t, theta, l_t), log p(l_t | h_t) and the marginal log p(y_t) of every
    predicted token, and the marginal distribution at every position.
    """
    p = _params(model)
    hs = hidden_states(model, input_ids)
    out = {"log_p_word": [], "log_p_indicator": [], "log_marginal": [], "marginal": []}
    for t in range(len(input_ids)):
        z = float(p["stop_head.weight"][0] @ hs[t] + p["stop_head.bias"][0])
        p_stop = 1.0 / (1.0 + math.exp(-z))
        lp1 = word_log_probs(model, hs[t], theta, 1)
        lp0 = word_log_probs(model, hs[t], theta, 0)
        marginal = [p_stop * math.exp(a) + (1 - p_stop) * math.exp(b) for a, b in zip(lp1, lp0)]
        out["marginal"].append(marginal)
        if t + 1 < len(input_ids):
            y, l = input_ids[t + 1], indicators[t]
            out["log_p_word"].append(lp1[y] if l else lp0[y])
            out["log_p_indicator"].append(math.log(p_stop) if l else math.log(1 - p_stop))
            out["log_marginal"].append(math.log(marginal[y]))
    return out


def elbo(model, rows: list[tuple[list[int], list[int], list[float]]]) -> dict:
    """ELBO of a batch evaluated at theta = mu: rows of (input_ids, indicators, context bow).

    Returns the sums over the batch of the word and indicator log-likelihoods, the KL terms, the
    number of predicted tokens and the ELBO.
    """
    word = indicator = kl = 0.0
    n = 0
    for ids, indicators, bow in rows:
        mu, ls = inference(model, bow)
        terms = sentence_terms(model, ids, indicators, mu)
        word += sum(terms["log_p_word"])
        indicator += sum(terms["log_p_indicator"])
        kl += kl_term(mu, ls)
        n += len(ids) - 1
    return {"word": word, "indicator": indicator, "kl": kl, "tokens": n, "elbo": word + indicator - kl}
