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


def _units(counts: torch.Tensor, total: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Expand integer ``counts`` (n,) into units without a host synchronisation: (owner (size,) of every unit, its index
    within its cell (size,), size). ``total`` is a bound on ``counts.sum()`` known to the host (None: read it, one
    synchronisation); the units past the real ones belong to a padding cell ``n`` (its owner is ``n``)."""
    if total is None:
        total = int(counts.sum())
    repeats = torch.cat([counts, (total - counts.sum()).clamp_min(0).reshape(1)])
    owner = torch.repeat_interleave(torch.arange(repeats.numel(), device=counts.device), repeats, output_size=total)
    starts = torch.cumsum(repeats, 0) - repeats
    return owner, torch.arange(total, device=counts.device) - starts[owner], total


def sample_crt(counts: torch.Tensor, concentration: torch.Tensor, exact_limit: int = CRT_EXACT_LIMIT,
               total: Optional[int] = None) -> torch.Tensor:
    """Chinese restaurant table counts l ~ CRT(n, r) = sum_{i<n} Bernoulli(r / (r + i)), elementwise.

    Exact Bernoulli draws for i < ``exact_limit`` (one uniform per customer); beyond it, the remaining tables are
    Poisson with mean r [psi(r + n) - psi(r + n0)] (float64), clamped to the customers left. n = 0 gives 0; n >= 1
    gives >= 1 (the first customer always opens a table, even when r underflows). Fixed shapes and no host
    synchronisation when ``total``, a bound on the exactly drawn customers (sum of min(n, exact_limit)), is given.
    Returns float counts of ``counts``' shape."""
    n = counts.round().clamp_min(0).to(torch.float64).reshape(-1)
    r = concentration.to(torch.float64).reshape(-1).clamp_min(1e-30)
    exact = n.clamp(max=exact_limit).long()
    owner, i, size = _units(exact, total)
    r_tok = torch.cat([r, r.new_ones(1)])[owner]
    opens = (torch.rand(size, dtype=torch.float64, device=n.device) * (r_tok + i) < r_tok) | (i == 0)
    tables = torch.zeros(n.numel() + 1, dtype=torch.float64, device=n.device).index_add_(0, owner, opens.double())[:-1]
    if total is not None and total <= exact_limit:  # no cell can have more customers than the limit
        return tables.view(counts.shape).to(counts.dtype if counts.is_floating_point() else torch.float64)
    # the Poisson tail past exact_limit customers (a mean of 0 where there are none)
    past = n.clamp_min(exact_limit)
    mu = r * (torch.digamma(r + past) - torch.digamma(r + exact_limit))
    tables = tables + torch.minimum(torch.poisson(mu), past - exact_limit)
    return tables.view(counts.shape).to(counts.dtype if counts.is_floating_point() else torch.float64)


def multinomial_split(counts: torch.Tensor, weights: torch.Tensor, total: Optional[int] = None) -> torch.Tensor:
    """Split each cell's integer count over K categories: row i ~ Mult(counts[i]; weights[i] / sum weights[i]).

    counts (n,), weights (n, K) non-negative -> (n, K) float64 counts whose rows sum to ``counts`` exactly.
    One uniform per unit, inverse-CDF by ``searchsorted``; a row of zero weights is split uniformly. Fixed shapes
    and no host synchronisation when ``total``, a bound on ``counts.sum()``, is given."""
    n = counts.round().clamp_min(0).long().reshape(-1)
    K = weights.shape[-1]
    owner, _, size = _units(n, total)
    w = weights.to(torch.float64).clamp_min(0) + 1e-300
    cdf = torch.cumsum(w, -1)
    # every cell's CDF shifted by its index, the padding cell's last: one sorted vector, searched for owner + u (no
    # (units, K) gather of each unit's CDF)
    cdf = torch.cat([cdf / cdf[:, -1:], cdf.new_ones(1, K)]) + torch.arange(n.numel() + 1, device=w.device,
                                                                          dtype=torch.float64).unsqueeze(1)
    u = torch.rand(size, dtype=torch.float64, device=weights.device)
    position = torch.searchsorted(cdf.view(-1), owner + u)
    topic = (position - owner * K).clamp(0, K - 1)  # (a rounding at a cell's edge stays in the cell)
    flat = torch.zeros((n.numel() + 1) * K, dtype=torch.float64, device=weights.device)
    flat.index_add_(0, owner * K + topic, torch.ones(size, dtype=torch.float64, device=weights.device))
    return flat.view(-1, K)[:-1]


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
                   details: bool = False, total: Optional[int] = None) -> AugmentedCounts:
    """The latent-count augmentation of rGBN (eqs. 13-16): upward in l, backward in j.

    Every draw has a fixed shape: the units of a split and the customers of a CRT are expanded into buffers of
    ``total`` entries, a bound on ``counts.sum()`` known to the host (None: read it, one host synchronisation). No
    count at any layer or sentence exceeds it: sum_j ell^Phi_j <= sum_j a_j at every layer, and n_j <= sum_{i >= j}
    a_i. The walk backward over the sentences stays a loop (n_j needs the counts routed back from sentence j + 1).

    Args:
        counts: (b, J, V_c) integer-valued word counts d_j (zero rows for padding slots and empty contexts).
        thetas: per layer (b, J, K_l) the raw theta samples the model used (float64 recommended).
        phis: per layer Phi^l, (V_c, K_1) then (K_{l-1}, K_l).
        pis: per layer Pi^l (K_l, K_l), or ``None`` (GBN: no transitions).
        tau0: the gamma rate.
        total: a bound on ``counts.sum()`` (e.g. from the collator's data), or None.
    """
    L = len(phis)
    b, J, V = counts.shape
    dtype = torch.float64
    device = counts.device
    thetas = [t.to(dtype) for t in thetas]
    d = counts.round().clamp_min(0).long().reshape(-1)  # (b J V): every cell of the dense bags
    if total is None:
        total = int(d.sum())
    phi_stats, pi_stats, info = [], ([] if pis is not None else None), []
    # layer 1: each word unit of cell (bj, v) goes to topic k with probability prop. to phi[v, k] theta[bj, k]
    owner, _, _ = _units(d, total)
    real = owner < d.numel()
    owner = owner.clamp(max=d.numel() - 1)
    bj, v = owner // V, owner % V
    phi1, theta1 = phis[0].to(dtype), thetas[0].reshape(b * J, -1)
    K = phi1.shape[1]
    cdf = torch.cumsum(phi1[v] * theta1[bj] + 1e-300, -1)
    u = torch.rand(total, 1, dtype=dtype, device=device)
    topic = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1).clamp(max=K - 1)
    one = real.to(dtype)
    phi_stats.append(torch.zeros(V * K, dtype=dtype, device=device).index_add_(0, v * K + topic, one).view(V, K))
    a = torch.zeros(b * J * K, dtype=dtype, device=device).index_add_(0, bj * K + topic, one).view(b, J, K)
    for l in range(L):
        theta = thetas[l]
        K = theta.shape[-1]
        if l > 0:  # split m^l = ell^Phi of the layer below over this layer's topics (eq. 13 one layer up)
            phi = phis[l].to(dtype)
            below = info[-1]["ell_phi"]  # (b, J, K_{l-1})
            weights = (phi.unsqueeze(0) * theta.reshape(b * J, 1, K)).reshape(-1, K)  # (b J K_{l-1}, K)
            split = multinomial_split(below.reshape(-1), weights, total).view(b * J, phi.shape[0], K)
            phi_stats.append(split.sum(0))
            a = split.sum(1).view(b, J, K)
        record = {"a": a}
        info.append(record)
        if l == L - 1 and pis is None:
            break
        pi = pis[l].to(dtype) if pis is not None else None
        # the prior shapes of every sentence at once: q1 from the previous sentence (0 at j = 1), q2 from above
        q1 = torch.zeros_like(theta)
        if pi is not None:
            q1[:, 1:] = tau0 * theta[:, :-1] @ pi.T
        q2 = tau0 * thetas[l + 1] @ phis[l + 1].to(dtype).T if l < L - 1 else torch.zeros_like(theta)
        rate, share = q1 + q2, (q1 / (q1 + q2).clamp_min(1e-300)).clamp(0, 1)
        # route[b, j, k, k']: pi[k, k'] theta[b, j - 1, k'] (where the Pi counts of sentence j go)
        route = pi.unsqueeze(0).unsqueeze(0) * _previous_sentence(theta).unsqueeze(2) if pi is not None else None
        zero = torch.zeros(b, K, dtype=dtype, device=device)
        ns, ells, ell_pis, zs, Zs = [zero] * J, [zero] * J, [zero] * J, [zero] * J, []
        z_next = zero
        a_j, rate_j, share_j = a.unbind(1), rate.unbind(1), share.unbind(1)
        route_j = route.unbind(1) if route is not None else None
        first = 1 if (l == L - 1) else 0  # the top layer's first sentence: its prior shape is fixed, no tables
        for j in range(J - 1, first - 1, -1):
            n = ns[j] = a_j[j] + z_next
            ell = ells[j] = sample_crt(n, rate_j[j], total=total)
            if pi is None or j == 0:
                z_next = zero
                continue
            ell_pi = ell_pis[j] = torch.binomial(ell, share_j[j])
            # route each of the ell_pi[b, k] counts to a source topic k' of sentence j - 1
            Z = multinomial_split(ell_pi.reshape(-1), route_j[j].reshape(-1, K), total).view(b, K, K)
            Zs.append(Z)
            z_next = zs[j] = Z.sum(1)
        if first == 1:
            ns[0] = a_j[0] + z_next
        if pi is not None:
            pi_stats.append(torch.stack(Zs).sum((0, 1)) if Zs else torch.zeros(K, K, dtype=dtype, device=device))
        n_all, ell_all, ell_pi_all, z_all = (torch.stack(x, 1) for x in (ns, ells, ell_pis, zs))
        record.update(n=n_all, ell=ell_all, ell_pi=ell_pi_all, ell_phi=ell_all - ell_pi_all, z=z_all)
    return AugmentedCounts(phi_stats, pi_stats, info if details else None)


def _previous_sentence(theta: torch.Tensor) -> torch.Tensor:
    """theta_{j-1} for every sentence j (zero at j = 1): (b, J, K)."""
    return torch.cat([torch.zeros_like(theta[:, :1]), theta[:, :-1]], 1)


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
