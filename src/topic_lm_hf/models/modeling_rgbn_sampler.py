"""rGBN-RNN's probability machinery: the Weibull posterior and its KL to a gamma prior, the augmentation of the
topic counts (CRT draws and multinomial splits, up the layers and back through the sentences) and one TLASGR-MCMC
step of a matrix whose columns lie on the simplex (see ``modeling_rgbn_rnn``'s module docstring).

Copied next to the weights with the family's other files when a model is shared with remote code, so it imports
only torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .configuration_rgbn_rnn import RGBNRNNConfig

EULER_GAMMA = 0.5772156649015329
_EPS_UNIFORM = 1e-6  # Weibull noise in [eps, 1 - eps]
_LAMBDA_MIN = 1e-6
_ALPHA_MIN = 1e-10  # gamma prior shapes (a sampled theta can underflow to 0)
_RATE_MIN = 1e-10  # Poisson rates
_SIMPLEX_MIN = 1e-10  # entries of Phi, Pi after the TLASGR projection
CRT_EXACT_LIMIT = 2000  # CRT: exact Bernoulli draws up to this many, a Poisson for the rest


# ----------------------------------------------------------------------------------------------
# Weibull posterior and its KL to a gamma prior
# ----------------------------------------------------------------------------------------------


def weibull_sample(k: torch.Tensor, lam: torch.Tensor, uniform: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reparameterised Weibull(k, lambda) draw: lambda (-ln(1 - u))^(1/k), computed as exp(ln(-log1p(-u)) / k)
    so that it stays finite for small k."""
    if uniform is None:
        uniform = torch.rand_like(lam)
    uniform = uniform.clamp(_EPS_UNIFORM, 1 - _EPS_UNIFORM)
    return lam * torch.exp(torch.log(-torch.log1p(-uniform)) / k)


def weibull_mean(k: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """E[theta] = lambda Gamma(1 + 1/k)."""
    return lam * torch.exp(torch.lgamma(1 + 1 / k))


def kl_weibull_gamma(k: torch.Tensor, lam: torch.Tensor, alpha: torch.Tensor, beta) -> torch.Tensor:
    """KL(Weibull(k, lambda) || Gamma(alpha, rate beta)), elementwise (rgbn.md §2):

    gamma alpha / k - alpha ln lambda + ln k + beta lambda Gamma(1 + 1/k) - gamma - 1 - alpha ln beta
    + ln Gamma(alpha)."""
    beta = torch.as_tensor(beta, dtype=lam.dtype, device=lam.device)
    return (EULER_GAMMA * alpha / k - alpha * torch.log(lam) + torch.log(k) + beta * weibull_mean(k, lam)
            - EULER_GAMMA - 1 - alpha * torch.log(beta) + torch.lgamma(alpha))


# ----------------------------------------------------------------------------------------------
# count augmentation: CRT and multinomial splits (exact, vectorised)
# ----------------------------------------------------------------------------------------------


def sample_crt(counts: torch.Tensor, concentration: torch.Tensor, exact_limit: int = CRT_EXACT_LIMIT) -> torch.Tensor:
    """Chinese restaurant table counts l ~ CRT(n, r) = sum_{i<n} Bernoulli(r / (r + i)), elementwise.

    Exact Bernoulli draws for i < ``exact_limit`` (one uniform per customer, expanded with
    ``repeat_interleave``); beyond it, the remaining tables are Poisson with mean r [psi(r + n) - psi(r + n0)]
    (float64), clamped to the customers left. n = 0 gives 0; n >= 1 gives >= 1 (the first customer always
    opens a table, even when r underflows). Returns float counts of ``counts``' shape."""
    n = counts.round().clamp_min(0).long().reshape(-1)
    r = concentration.to(torch.float64).reshape(-1).clamp_min(1e-30)
    out = torch.zeros(n.shape, dtype=torch.float64, device=n.device)
    cells = (n > 0).nonzero().squeeze(1)
    if cells.numel() == 0:
        return out.view(counts.shape).to(counts.dtype if counts.is_floating_point() else torch.float64)
    nc, rc = n[cells], r[cells]
    exact = nc.clamp(max=exact_limit)
    owner = torch.repeat_interleave(torch.arange(cells.numel(), device=n.device), exact)  # (customers,)
    starts = torch.cumsum(exact, 0) - exact
    i = torch.arange(owner.numel(), device=n.device) - starts[owner]  # index of the customer within its cell
    r_tok = rc[owner]
    opens = (torch.rand(owner.numel(), dtype=torch.float64, device=n.device) * (r_tok + i) < r_tok) | (i == 0)
    tables = torch.zeros(cells.numel(), dtype=torch.float64, device=n.device).index_add_(0, owner, opens.double())
    big = nc > exact_limit
    if bool(big.any()):
        rb, nb = rc[big], nc[big].double()
        mu = rb * (torch.digamma(rb + nb) - torch.digamma(rb + exact_limit))
        tables[big] += torch.poisson(mu).clamp(max=nb - exact_limit)
    out[cells] = tables
    return out.view(counts.shape).to(counts.dtype if counts.is_floating_point() else torch.float64)


def multinomial_split(counts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Split each cell's integer count over K categories: row i ~ Mult(counts[i]; weights[i] / sum weights[i]).

    counts (n,), weights (n, K) non-negative -> (n, K) float64 counts whose rows sum to ``counts`` exactly.
    One uniform per unit, inverse-CDF by ``searchsorted``; a row of zero weights is split uniformly."""
    n = counts.round().clamp_min(0).long()
    K = weights.shape[-1]
    out = torch.zeros(n.shape[0], K, dtype=torch.float64, device=weights.device)
    cells = (n > 0).nonzero().squeeze(1)
    if cells.numel() == 0:
        return out
    w = weights[cells].to(torch.float64).clamp_min(0) + 1e-300
    cdf = torch.cumsum(w, -1)
    cdf = cdf / cdf[:, -1:]
    owner = torch.repeat_interleave(torch.arange(cells.numel(), device=n.device), n[cells])
    u = torch.rand(owner.numel(), 1, dtype=torch.float64, device=n.device)
    topic = torch.searchsorted(cdf[owner], u).squeeze(1).clamp(max=K - 1)
    flat = torch.zeros(cells.numel() * K, dtype=torch.float64, device=n.device)
    flat.index_add_(0, owner * K + topic, torch.ones_like(topic, dtype=torch.float64))
    out[cells] = flat.view(-1, K)
    return out


@dataclass
class AugmentedCounts:
    """Sufficient statistics of one augmentation: ``phi[l]`` (rows_l, K_l), ``pi[l]`` (K_l, K_l) [destination,
    source] (``None`` for GBN), and with ``details`` the per-layer latent counts (each (b, J, K_l)):
    ``a`` (from below), ``n`` (a + counts routed back from the next sentence), ``ell`` (CRT tables),
    ``ell_pi``, ``ell_phi`` (their split), ``z`` (counts routed to theta_{j-1})."""

    phi: list
    pi: Optional[list]
    details: Optional[list] = None


def augment_counts(counts: torch.Tensor, thetas: list, phis: list, pis: Optional[list], tau0: float,
                   details: bool = False) -> AugmentedCounts:
    """The latent-count augmentation of rGBN (eqs. 13-16): upward in l, backward in j.

    Args:
        counts: (b, J, V_c) integer-valued word counts d_j (zero rows for padding slots and empty contexts).
        thetas: per layer (b, J, K_l) the raw theta samples the model used (float64 recommended).
        phis: per layer Phi^l, (V_c, K_1) then (K_{l-1}, K_l).
        pis: per layer Pi^l (K_l, K_l), or ``None`` (GBN: no transitions).
        tau0: the gamma rate.
    """
    L = len(phis)
    b, J, _ = counts.shape
    dtype = torch.float64
    thetas = [t.to(dtype) for t in thetas]
    phi_stats, pi_stats, info = [], ([] if pis is not None else None), []
    below = counts.to(dtype)  # (b, J, R): counts over the units of the layer below
    for l in range(L):
        phi, theta = phis[l].to(dtype), thetas[l]
        R, K = phi.shape
        # split every count of unit r at (b, j) over topics k, in proportion to phi[r, k] theta[b, j, k];
        # only the non-zero cells are expanded (a dense (bJ, V_c, K) tensor would not fit)
        flat = below.reshape(b * J, R)
        bj, r = flat.nonzero(as_tuple=True)
        split = multinomial_split(flat[bj, r], phi[r] * theta.reshape(b * J, K)[bj])  # (cells, K)
        phi_stats.append(torch.zeros(R, K, dtype=dtype, device=phi.device).index_add_(0, r, split))
        a = torch.zeros(b * J, K, dtype=dtype, device=phi.device).index_add_(0, bj, split).view(b, J, K)
        record = {"a": a}
        if l == L - 1 and pis is None:
            info.append(record)
            break
        pi = pis[l].to(dtype) if pis is not None else None
        up = thetas[l + 1] @ phis[l + 1].to(dtype).T * tau0 if l < L - 1 else None  # (b, J, K)
        n_all, ell_all, ell_pi_all, ell_phi_all, z_all = (torch.zeros_like(a) for _ in range(5))
        pi_stat = torch.zeros(K, K, dtype=dtype, device=a.device) if pi is not None else None
        z_next = torch.zeros(b, K, dtype=dtype, device=a.device)
        for j in range(J - 1, -1, -1):
            n = a[:, j] + z_next
            n_all[:, j] = n
            q1 = tau0 * theta[:, j - 1] @ pi.T if (pi is not None and j > 0) else torch.zeros_like(n)
            q2 = up[:, j] if up is not None else torch.zeros_like(n)
            if up is None and j == 0:  # top layer, first sentence: its prior shape is fixed
                z_next = torch.zeros_like(n)
                continue
            ell = sample_crt(n, q1 + q2)
            share = (q1 / (q1 + q2).clamp_min(1e-300)).clamp(0, 1)
            ell_pi = torch.binomial(ell, share) if pi is not None and j > 0 else torch.zeros_like(ell)
            ell_phi = ell - ell_pi
            if pi is not None and j > 0:
                # route each of the ell_pi[b, k] counts to a source topic k' of sentence j - 1: pi[k, k'] theta[k']
                route = pi.unsqueeze(0) * theta[:, j - 1].unsqueeze(1)  # (b, K, K')
                Z = multinomial_split(ell_pi.reshape(-1), route.reshape(-1, K)).view(b, K, K)
                pi_stat += Z.sum(0)
                z_next = Z.sum(1)
            else:
                z_next = torch.zeros_like(n)
            ell_all[:, j], ell_pi_all[:, j], ell_phi_all[:, j], z_all[:, j] = ell, ell_pi, ell_phi, z_next
        if pi_stat is not None:
            pi_stats.append(pi_stat)
        record.update(n=n_all, ell=ell_all, ell_pi=ell_pi_all, ell_phi=ell_phi_all, z=z_all)
        info.append(record)
        below = ell_phi_all
        if l == L - 1:
            break
    return AugmentedCounts(phi_stats, pi_stats, info if details else None)


def tlasgr_update(matrix: torch.Tensor, stats: torch.Tensor, fisher: torch.Tensor, step: int, eta: float,
                  config: RGBNRNNConfig, generator: Optional[torch.Generator] = None):
    """One TLASGR-MCMC step (eqs. 17-18) for a matrix whose columns lie on the simplex.

    ``stats`` are the minibatch statistics already scaled to the corpus. Returns (new matrix, new Fisher
    estimate M). The step is eps_t / M_k per column with M_k floored at rows * eta (a dead topic then relaxes
    to the prior mean instead of taking a huge step); the noise is N(0, (2 eps_t / M_k)(diag phi_k - phi_k
    phi_k^T)), exact and zero-sum; the projection keeps every column on the simplex (entries >= 1e-10)."""
    phi = matrix.to(torch.float64)
    stats = stats.to(torch.float64)
    R = phi.shape[0]
    colsum = stats.sum(0)
    if step == 0:
        fisher = colsum
    else:
        rho = (step + 1.0) ** (-config.tlasgr_fisher_kappa)
        fisher = (1 - rho) * fisher.to(torch.float64) + rho * colsum
    epsilon = config.tlasgr_step_epsilon * ((config.tlasgr_step_tau + step + 1) / (config.tlasgr_step_tau + 1)) \
        ** (-config.tlasgr_step_kappa)
    scale = epsilon / fisher.clamp_min(R * eta)  # (K,)
    G = stats + eta
    drift = scale * (G - G.sum(0) * phi)
    xi = torch.randn(phi.shape, dtype=torch.float64, device=phi.device, generator=generator)
    u = phi.sqrt() * xi
    noise = torch.sqrt(2 * scale) * (u - phi * u.sum(0))
    new = phi + drift + noise
    new = new - (new.sum(0) - 1) * phi
    new = new.clamp_min(_SIMPLEX_MIN)
    return new / new.sum(0), fisher
