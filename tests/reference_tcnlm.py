"""Slow, literal reference implementations of TCNLM's maths, for tests only.

Each function is written straight from the paper (Wang et al. 2018) with loops instead of batched
products, so that the fast model can be checked against it:

* :func:`naive_tc_lstm_layer`: eq. 13-15, one gate, one row and one time step at a time.
* :func:`explicit_weight_lstm_layer`: the same layer as a standard LSTM whose weights are the
  explicit W_*(t) = W_*a diag(W_*b t) W_*c and U_*(t) = U_*a diag(U_*b t) U_*c (eq. 12), one row at a
  time through ``torch.nn.LSTM``.
* :func:`naive_moe_probs`: eq. 7-8 in probability space, sum_k t_k softmax(V h^(k)).
"""

from __future__ import annotations

import torch
from torch import nn

GATES = ("i", "f", "g", "o")  # g is the candidate cell c~


def gate_blocks(layer, gate: int):
    """The paper's per-gate matrices of a fast layer: W_a (H, n_f), W_b (n_f, T), W_c (n_f, n_x), U_*, b."""
    f, H = layer.num_factors, layer.hidden_size
    rows = slice(gate * f, (gate + 1) * f)
    return {"W_a": layer.W_a[gate], "W_b": layer.W_b[rows], "W_c": layer.W_c[rows],
            "U_a": layer.U_a[gate], "U_b": layer.U_b[rows], "U_c": layer.U_c[rows],
            "b": layer.bias[gate * H:(gate + 1) * H]}


@torch.no_grad()
def naive_tc_lstm_layer(layer, x: torch.Tensor, t: torch.Tensor, state=None):
    """Eq. 13-15 for every row, step and gate separately. x (b, s, n_x), t (b, T) -> (b, s, H), (h, c)."""
    b, s, _ = x.shape
    H = layer.hidden_size
    blocks = [gate_blocks(layer, k) for k in range(4)]
    outputs = torch.zeros(b, s, H, dtype=torch.float64)
    h_last, c_last = torch.zeros(b, H, dtype=torch.float64), torch.zeros(b, H, dtype=torch.float64)
    for row in range(b):
        tr = t[row].double()
        h = torch.zeros(H, dtype=torch.float64) if state is None else state[0][row].double()
        c = torch.zeros(H, dtype=torch.float64) if state is None else state[1][row].double()
        for m in range(s):
            xm = x[row, m].double()
            pre = {}
            for name, p in zip(GATES, blocks):
                x_tilde = (p["W_b"].double() @ tr) * (p["W_c"].double() @ xm)  # eq. 14
                h_tilde = (p["U_b"].double() @ tr) * (p["U_c"].double() @ h)  # eq. 15
                pre[name] = p["W_a"].double() @ x_tilde + p["U_a"].double() @ h_tilde + p["b"].double()
            i, f, o = torch.sigmoid(pre["i"]), torch.sigmoid(pre["f"]), torch.sigmoid(pre["o"])
            c_tilde = torch.tanh(pre["g"])  # tanh for the candidate (eq. 13's sigma read as a typo)
            c = i * c_tilde + f * c
            h = o * torch.tanh(c)
            outputs[row, m] = h
        h_last[row], c_last[row] = h, c
    return outputs, (h_last, c_last)


def explicit_weights(layer, t: torch.Tensor):
    """W(t) (4H, n_x) and U(t) (4H, H) of one row's topic proportions t (T,), gates stacked (i, f, g, o)."""
    W, U = [], []
    for k in range(4):
        p = gate_blocks(layer, k)
        W.append(p["W_a"] @ torch.diag(p["W_b"] @ t) @ p["W_c"])  # eq. 12
        U.append(p["U_a"] @ torch.diag(p["U_b"] @ t) @ p["U_c"])
    return torch.cat(W), torch.cat(U)


@torch.no_grad()
def explicit_weight_lstm_layer(layer, x: torch.Tensor, t: torch.Tensor, state=None):
    """Run each row through an ``nn.LSTM`` whose weights are that row's explicit W(t), U(t)."""
    b, s, n_x = x.shape
    H = layer.hidden_size
    outputs, hs, cs = [], [], []
    for row in range(b):
        lstm = nn.LSTM(n_x, H, batch_first=True)
        W, U = explicit_weights(layer, t[row])
        lstm.weight_ih_l0.copy_(W)
        lstm.weight_hh_l0.copy_(U)
        lstm.bias_ih_l0.copy_(layer.bias)
        lstm.bias_hh_l0.zero_()
        hx = None if state is None else (state[0][row].view(1, 1, H), state[1][row].view(1, 1, H))
        out, (h, c) = lstm(x[row:row + 1], hx)
        outputs.append(out[0])
        hs.append(h[0, 0])
        cs.append(c[0, 0])
    return torch.stack(outputs), (torch.stack(hs), torch.stack(cs))


@torch.no_grad()
def naive_moe_probs(model, input_ids: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Eq. 7-8 literally: p(y_m) = sum_k t_k softmax(V h_m^(k)), each expert an LSTM run on its own.

    ``model`` is a ``TCNLMForCausalLM`` with ``lm_type="naive_moe"`` in eval mode; returns (b, s, V).
    """
    x = model.model.embed_tokens(input_ids)
    probs = 0
    for k, expert in enumerate(model.model.experts.experts):
        h_k, _ = expert(x)  # (b, s, H)
        logits = model.lm_head(h_k if model.proj is None else model.proj(h_k))
        probs = probs + t[:, k, None, None] * torch.softmax(logits.double(), dim=-1)
    return probs
