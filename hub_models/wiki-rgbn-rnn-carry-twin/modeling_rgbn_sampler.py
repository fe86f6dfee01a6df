"""rGBN-RNN's probability machinery: the Weibull posterior and its KL to a gamma prior, the augmentation of the
topic counts (CRT draws and multinomial splits, up the layers and back through the sentences) and one TLASGR-MCMC
step of a matrix whose columns lie on the simplex (see ``modeling_rgbn_rnn``'s module docstring).

Copied next to the weights with the family's other files when a model is shared with remote code, so it imports
only torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .configuration_rgbn_rnn import RGBNRNNConfig
from .modeling_recurrent import read_on_host

EULER_GAMMA = 0.5772156649015329
_EPS_UNIFORM = 1e-6  # Weibull noise in [eps, 1 - eps]
LAMBDA_MIN = 1e-6
ALPHA_MIN = 1e-10  # gamma prior shapes (a sampled theta can underflow to 0)
RATE_MIN = 1e-10  # Poisson rates
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
    """KL(Weibull(k, lambda) || Gamma(alpha, rate beta)), elementwise (closed form, as in WHAI, Zhang et al. 2018):

    gamma alpha / k - alpha ln lambda + ln k + beta lambda Gamma(1 + 1/k) - gamma - 1 - alpha ln beta
    + ln Gamma(alpha)."""
    beta = torch.as_tensor(beta, dtype=lam.dtype, device=lam.device)
    return (EULER_GAMMA * alpha / k - alpha * torch.log(lam) + torch.log(k) + beta * weibull_mean(k, lam)
            - EULER_GAMMA - 1 - alpha * torch.log(beta) + torch.lgamma(alpha))


def poisson_nll(counts: torch.Tensor, theta: torch.Tensor, phi: torch.Tensor, rows: torch.Tensor,
                total: Optional[int] = None) -> torch.Tensor:
    """-sum over rows of log Pois(d | Phi theta), each row weighted by ``rows``: counts d (..., V_c), theta (..., K),
    phi (V_c, K), rows (...).

    Read from the words that occur, not from the whole topic vocabulary: sum_v (Phi theta)_v = theta . colsum(Phi),
    sum_v d_v log (Phi theta)_v is a sum over the word units (each occurrence once: ``total``, a bound on the
    counts' sum known to the host, or None: read, one host synchronisation), and log Gamma(d_v + 1) = sum_{i < d_v}
    log(i + 1) over the same units. The rates are floored at 1e-10 inside the logarithm."""
    V, K = phi.shape
    theta = theta.reshape(-1, K)
    rows = rows.reshape(-1).to(theta.dtype)
    phi = phi.to(theta.dtype)
    owner, index, _ = _units(counts.reshape(-1).round(), total)  # (counts: checked non-negative by the callers)
    real = owner < theta.shape[0] * V
    owner = owner.clamp(max=theta.shape[0] * V - 1)
    row, word = owner // V, owner % V
    rate = (theta[row] * phi[word]).sum(-1).clamp_min(RATE_MIN)
    weight = rows[row] * real.to(theta.dtype)
    expected = (theta @ phi.sum(0)) * rows  # sum_v (Phi theta)_v per row
    return expected.sum() - (weight * (torch.log(rate) - torch.log1p(index.to(theta.dtype)))).sum()


# ----------------------------------------------------------------------------------------------
# count augmentation: CRT and multinomial splits (exact, vectorised)
# ----------------------------------------------------------------------------------------------


def _units(counts: torch.Tensor, total: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Expand integer ``counts`` (n,) into units without a host synchronisation: (owner (size,) of every unit, its index
    within its cell (size,), size). ``total`` is a bound on ``counts.sum()`` known to the host (None: read it, one
    synchronisation); the units past the real ones belong to a padding cell ``n`` (its owner is ``n``). A search of
    each unit in the running counts: its cost grows with the units, not with the (dense) cells."""
    if total is None:
        total = int(counts.sum())
    ends = torch.cumsum(counts, 0)
    units = torch.arange(total, device=counts.device, dtype=ends.dtype)
    owner = torch.searchsorted(ends, units, right=True)
    cell = owner.clamp(max=max(counts.numel() - 1, 0))  # a padding unit counts from the last cell's end
    return owner, (units - ends[cell] + counts[cell]).long(), total


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
    layer's counts exceed it: sum_j ell^Phi_j <= sum_j a_j at every layer. Each layer's walk backward over the
    sentences (:func:`backward_walk`) stays a loop, since n_j needs the counts routed back from sentence j + 1, but
    its draws are made before it and each of its steps is a few operations.

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
    d = counts.reshape(-1).round()  # (b J V): every cell of the dense bags (non-negative counts)
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
        first = 1 if (l == L - 1) else 0  # the top layer's first sentence: its prior shape is fixed, no tables
        n_all, ell_all, ell_pi_all, z_all, pi_stat = backward_walk(a, rate, share, route, total, first)
        if pi_stat is not None:
            pi_stats.append(pi_stat)
        record.update(n=n_all, ell=ell_all, ell_pi=ell_pi_all, ell_phi=ell_all - ell_pi_all, z=z_all)
    return AugmentedCounts(phi_stats, pi_stats, info if details else None)


def _with_padding_cell(x: torch.Tensor, pad: float) -> torch.Tensor:
    """``x`` flattened, then one more cell holding ``pad``: the value the padding units of a buffer read."""
    return torch.cat([x.reshape(-1), x.new_full((1,), pad)])


def _seat_customers(index, uniforms, rate, share, cdf):
    """The fate of customers of CRT restaurants (cells), each from one uniform u: a customer opens a table when
    u < p = r / (r + i) (i its index in its cell; i = 0 always does); the table goes to Pi when u / p (uniform given
    the table) is below the share; then u / (p share) (uniform given that) picks its source topic by the inverse CDF
    of its cell's route.

    ``index``, ``uniforms``: (cells, m) customers (m per cell); ``rate``, ``share``: (cells, 1); ``cdf``: (cells, K)
    each cell's normalised CDF over the sources, or None (no transitions). Returns (opens, to_pi or None, source or
    None), each (cells, m)."""
    p = rate / (rate + index)
    opens = uniforms < p
    if cdf is None:
        return opens, None, None
    u = uniforms / p
    to_pi = opens & (u < share)
    source = torch.searchsorted(cdf, u / share).clamp(max=cdf.shape[-1] - 1)
    return opens, to_pi, source


def _route_cdf(route: torch.Tensor) -> torch.Tensor:
    """(..., K) non-negative weights -> each row's normalised CDF (a row of zeros: uniform)."""
    cdf = torch.cumsum(route + 1e-300, -1)
    return cdf / cdf[..., -1:]


WALK_GRID = 32  # seats per cell and sentence drawn before the walk for the customers routed back (more: exact too)
WALK_GRID_BUDGET = 1 << 23  # the most seats (cells x grid) a grown grid may hold; past it, the exact pass


def backward_walk(a: torch.Tensor, rate: torch.Tensor, share: torch.Tensor, route: Optional[torch.Tensor],
                  total: int, first: int = 0, grid: int = WALK_GRID, budget: int = WALK_GRID_BUDGET):
    """One layer's walk backward over the sentences (eqs. 14-16), j = J - 1, ..., ``first``:

        n_j = a_j + z_{j+1};  ell_j ~ CRT(n_j, rate_j);  ell^Pi_j ~ Bin(ell_j, share_j);
        Z_j[k, :] ~ Mult(ell^Pi_j[k]; route_j[k, :]),  z_j = sum_k Z_j[k, :].

    Exact, with one uniform per customer (:func:`_seat_customers`): customer i of cell (b, j, k) is seated by the
    i-th uniform of that cell whatever the walk did before it, so the draws can be made before the walk:

    1. a CRT's tables are a sum over its customers in any order, so each cell's first a_j customers (known
       before the walk) are seated for every sentence at once;
    2. the next ``grid`` seats of every cell (indices a_j, ..., a_j + grid - 1) are also drawn at once, and the walk
       only takes, sentence by sentence, the first z_{j+1}[k] of them: a mask and a sum, a few operations a step;
    3. where some cell had more than ``grid`` customers routed back (the host reads the most any cell had), the
       grid grows to 1.25 times that (rounded up to a multiple of 32) with new seats drawn after the old ones (each
       cell keeps its uniforms, so its i-th customer is still seated by its i-th uniform) and the walk is run again,
       until no cell overflows: long documents (Brown's, a hundred sentences and more) route back more than 32
       customers to some cells;
    4. where the grid would hold more than ``budget`` seats, the walk is run instead with the same draws plus the
       seats past the grid, expanded into buffers bounded by the tables after j of the first part (z_{j+1} <=
       ell_{j+1} <= its tables there + z_{j+2}; one more read).

    Args:
        a: (b, J, K) counts from below; rate, share: (b, J, K), the CRT concentration and the Pi side's share of
            the tables (0 where there is no previous sentence); route: (b, J, K, K') or None (no transitions).
        total: a bound on ``a.sum()`` known to the host; first: the first sentence walked (1 at the top layer,
            whose first sentence's prior is fixed); grid: the seats per cell drawn before the walk; budget: the most
            seats (cells x grid) the grid may grow to.

    Returns:
        (n, ell, ell_pi, z) each (b, J, K) (zero at sentences before ``first``), and the Pi statistics S[k, k'] =
        sum_{b, j} Z_j[k, k'] (None without transitions).
    """
    b, J, K = a.shape
    dtype, device = a.dtype, a.device
    cells = b * J * K
    rate = rate.clamp_min(1e-30)
    counts = torch.cat([a.new_zeros(b, first, K), a[:, first:]], 1) if first else a  # none before ``first``
    # 1. the first a_j customers of every cell (b, j, k), all sentences at once
    owner, index, _ = _units(counts.reshape(-1).long(), total)
    rates = _with_padding_cell(rate, 1.0).unsqueeze(1)  # (cells + 1, 1), the padding cell last
    shares = _with_padding_cell(share, 0.0).unsqueeze(1)
    cdf = _route_cdf(route.reshape(cells, K)) if route is not None else None
    opens, to_pi, source = _seat_customers(index.unsqueeze(1), torch.rand(total, 1, dtype=dtype, device=device),
                                           rates[owner], shares[owner],
                                           torch.cat([cdf, cdf[:1]])[owner] if cdf is not None else None)
    opens = opens.squeeze(1)
    ell = torch.zeros(cells + 1, dtype=dtype, device=device).index_add_(0, owner, opens.to(dtype))[:cells]
    ell = ell.view(b, J, K)
    if route is None:  # no transitions: nothing is routed back, the walk has nothing to do
        zeros = torch.zeros_like(a)
        return a, ell, zeros, zeros, None
    routed, source = to_pi.squeeze(1).to(dtype), source.squeeze(1)
    ell_pi = torch.zeros(cells + 1, dtype=dtype, device=device).index_add_(0, owner, routed)[:cells].view(b, J, K)
    z_first = torch.zeros(cells + K, dtype=dtype, device=device).index_add_(0, owner // K * K + source, routed)
    z_first = z_first[:cells].view(b, J, K)  # Z summed over k: (b, J, K'); the padding cell is never routed
    pi_stat = torch.zeros(K * K + K, dtype=dtype, device=device).index_add_(0, owner % K * K + source, routed)
    # 2. the grid: seats a_j .. a_j + grid - 1 of every cell, all sentences at once
    g_owner = torch.arange(cells, device=device).unsqueeze(1)

    def seats(seat: torch.Tensor):  # seats a_j + seat of every cell, each with a new uniform
        return _seat_customers(a.reshape(cells, 1) + seat, torch.rand(cells, seat.numel(), dtype=dtype, device=device),
                               rates[:cells], shares[:cells], cdf)

    seat = torch.arange(grid, device=device, dtype=dtype)
    g_opens, g_pi, g_source = seats(seat)
    while True:
        g_dest = (g_owner // (J * K) * K + g_source).view(b, J, K * grid)  # where each seat's table routes back to
        walked_pi = g_pi.view(b, J, K, grid)
        z_more, extra, most = _walk(z_first, walked_pi, g_dest, seat, first, None)
        most = int(read_on_host(most.reshape(1))[0])
        if most <= grid:
            break
        grown = math.ceil(most * 1.25 / WALK_GRID) * WALK_GRID  # 1.25 times the most, a multiple of 32
        if cells * grown > budget:  # 4. too many seats for a grid: the exact pass past it
            after = ell.sum((0, 2)).flip(0).cumsum(0).flip(0)  # sum_{i >= j} tables of the first part
            bounds = [int(v) for v in read_on_host(torch.cat([after[1:], after.new_zeros(1)]))]
            beyond = dict(a=a, rate=rate, share=share, route=route, bounds=bounds, grid=grid)
            z_more, extra, _ = _walk(z_first, walked_pi, g_dest, seat, first, beyond)
            break
        # 3. some cell had more customers than the grid: grow it, its next seats drawn after (and beside) its old ones
        more = torch.arange(grid, grown, device=device, dtype=dtype)
        g_opens, g_pi, g_source = (torch.cat(pair, 1) for pair in zip((g_opens, g_pi, g_source), seats(more)))
        seat, grid = torch.cat([seat, more]), grown
    g_opens, g_pi = g_opens.view(b, J, K, grid), walked_pi
    # the walk's seats: the first ``extra`` of every cell's grid (and the seats beyond it, counted by _walk)
    taken = seat < extra.unsqueeze(-1)  # (b, J, K, grid)
    ell = ell + (g_opens & taken).sum(-1).to(dtype)
    taken_pi = (g_pi & taken).to(dtype)
    ell_pi = ell_pi + taken_pi.sum(-1)
    pi_stat.index_add_(0, (g_owner % K * K + g_source).reshape(-1), taken_pi.reshape(-1))
    if isinstance(z_more, tuple):  # the seats beyond the grid
        z_more, beyond_ell, beyond_pi, beyond_stat = z_more
        ell, ell_pi, pi_stat = ell + beyond_ell, ell_pi + beyond_pi, pi_stat + beyond_stat
    z = z_first + z_more
    n = a + torch.cat([z[:, 1:], z.new_zeros(b, 1, K)], 1)  # n_j = a_j + z_{j+1}
    return n, ell, ell_pi, z, pi_stat[:K * K].view(K, K)


def _walk(z_first, g_pi, g_dest, seat, first: int, beyond: Optional[dict]):
    """The sequential part of :func:`backward_walk`: z_{j+1} (the counts routed back) customers at sentence j, from
    j = J - 1 down to ``first``, seated on the grid's seats (``beyond``: and past them, exactly).

    Returns (z routed back by the walk's seats (b, J, K'), or with ``beyond`` a tuple (that, the extra tables,
    Pi tables and Pi statistics past the grid); the walk's customers per cell (b, J, K); the most any cell had (the
    grid overflowed where it is more than the grid))."""
    b, J, K, grid = g_pi.shape
    dtype, device = z_first.dtype, z_first.device
    g_pi_j = g_pi.to(dtype).reshape(b, J, K * grid).unbind(1)
    g_dest_j = g_dest.unbind(1)
    z_first_j = z_first.unbind(1)
    zero = z_first.new_zeros(b, K)
    z_next, extras, routed_backs = zero, [zero] * J, [zero] * J
    if beyond is not None:
        step_cells = b * K
        rate, share, route, a = beyond["rate"], beyond["share"], beyond["route"], beyond["a"]
        flat_rows = lambda x: torch.cat([x, x[:1]])  # noqa: E731  the padding cell's row (never routed)
        more_ell, more_pi = torch.zeros_like(z_first), torch.zeros_like(z_first)
        more_stat = torch.zeros(K * K + K, dtype=dtype, device=device)
    for j in range(J - 1, first - 1, -1):
        extras[j] = z_next
        taken = (seat < z_next.unsqueeze(-1)).reshape(b, K * grid)
        back = torch.zeros(b * K, dtype=dtype, device=device).index_add_(0, g_dest_j[j].reshape(-1),
                                                                         (g_pi_j[j] * taken).reshape(-1))
        back = back.view(b, K)
        if beyond is not None and beyond["bounds"][j] > 0:
            past = (z_next - grid).clamp_min(0).reshape(-1).long()
            owner, index, size = _units(past, beyond["bounds"][j])
            index = index + _with_padding_cell(a[:, j], 0.0).long()[owner] + grid
            opens, to_pi, source = _seat_customers(
                index.unsqueeze(1), torch.rand(size, 1, dtype=dtype, device=device),
                _with_padding_cell(rate[:, j], 1.0)[owner, None], _with_padding_cell(share[:, j], 0.0)[owner, None],
                _route_cdf(flat_rows(route[:, j].reshape(step_cells, K)))[owner])
            opens, to_pi, source = opens.squeeze(1), to_pi.squeeze(1), source.squeeze(1)
            to_pi = to_pi.to(dtype)
            back = back + torch.zeros(step_cells + K, dtype=dtype, device=device).index_add_(
                0, owner // K * K + source, to_pi)[:step_cells].view(b, K)
            more_ell[:, j] = torch.zeros(step_cells + 1, dtype=dtype, device=device).index_add_(
                0, owner, opens.to(dtype))[:step_cells].view(b, K)
            more_pi[:, j] = torch.zeros(step_cells + 1, dtype=dtype, device=device).index_add_(
                0, owner, to_pi)[:step_cells].view(b, K)
            more_stat.index_add_(0, owner % K * K + source, to_pi)
        routed_backs[j] = back
        z_next = z_first_j[j] + back
    extra = torch.stack(extras, 1)
    z_more = torch.stack(routed_backs, 1)
    return ((z_more, more_ell, more_pi, more_stat) if beyond is not None else z_more), extra, extra.max()


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


__all__ = ["ALPHA_MIN", "AugmentedCounts", "CRT_EXACT_LIMIT", "EULER_GAMMA", "LAMBDA_MIN", "RATE_MIN", "WALK_GRID",
           "WALK_GRID_BUDGET", "augment_counts", "backward_walk", "kl_weibull_gamma", "multinomial_split",
           "poisson_nll", "sample_crt", "tlasgr_update", "weibull_mean", "weibull_sample"]
