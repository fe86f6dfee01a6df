"""GBN-RNN / rGBN-RNN: the Weibull/gamma maths against Monte Carlo, the count augmentation's samplers against
exact moments and conservation laws, TLASGR-MCMC on the simplex and recovering known Phi and Pi, the sentence
recurrence against sentence-by-sentence runs, topics of any layer steering generation, Trainer with a resumed
sampler, and a short real-data run (rgbn.md §9). The contract of every family (save / load, padding, state
equivalence, cached generation, remote code) is checked on GBN-RNN and rGBN-RNN in test_model_contract.py."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback, TrainingArguments

from topic_lm_hf import (RGBNRNNConfig, RGBNRNNForCausalLM, RGBNRNNModel, TopicContextCollator, TopicLMTrainer,
                         evaluate_perplexity)
from topic_lm_hf.models import modeling_rgbn_sampler as sampler
from topic_lm_hf.models.modeling_rgbn_rnn import format_topic_tree
from topic_lm_hf.models.modeling_rgbn_sampler import (EULER_GAMMA, WALK_GRID_BUDGET, augment_counts, backward_walk,
                                                      kl_weibull_gamma, multinomial_split, poisson_nll, sample_crt,
                                                      tlasgr_update, weibull_mean, weibull_sample)


pytestmark = pytest.mark.usefixtures("one_thread")


def make(wiki, seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"topic_sizes": [8, 6, 4], "hidden_sizes": [16, 12, 8], "embedding_size": 12, "dropout": 0.0,
          "initializer_range": 0.3, **kw}
    return RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], **kw)).eval()


def documents_batch(wiki, docs=(0, 1, 2), context="preceding", max_sentence_length=10, split="valid"):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context=context, layout="documents",
                                    max_sentence_length=max_sentence_length)
    rows = collator.prepare(wiki[split].select(list(docs)))
    return collator, collator([rows[i] for i in range(len(rows))])


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, match", [
    (dict(topic_sizes=[]), "1 to 3 layers"),
    (dict(topic_sizes=[5, 4, 3, 2], hidden_sizes=[4, 4, 4, 4]), "1 to 3 layers"),
    (dict(topic_sizes=[5, 8], hidden_sizes=[4, 4]), "non-increasing"),
    (dict(topic_sizes=[5, 4], hidden_sizes=[4]), "one LSTM size per topic layer"),
    (dict(topic_sizes=[5, 0], hidden_sizes=[4, 4]), r"topic_sizes\[1\] must be a positive integer, got 0"),
    (dict(coupling="crossed"), "coupling must be one of"),
    (dict(gate="gru"), "gate must be one of"),
    (dict(topic_learning="em"), "topic_learning must be one of"),
    (dict(loss_preset="paper"), "loss_preset must be one of"),
    (dict(tau0=0), "tau0 must be a positive number"),
    (dict(k_min=2.0, k_max=1.0), "k_max must exceed k_min"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings is not supported"),
    (dict(hidden_size=600), "no hidden_size .*give hidden_sizes"),
    (dict(num_topics=50), "no num_topics .*give topic_sizes"),
    (dict(topic_sizes=8), r"topic_sizes takes one size per layer, bottom first \(a list such as \[8\]\), got 8"),
    (dict(hidden_sizes=16), r"hidden_sizes takes one size per layer"),
])
def test_config_rejects_bad_values_naming_them(bad, match):
    kw = {"vocab_size": 50, "topic_vocab_size": 20, "topic_sizes": [5, 4], "hidden_sizes": [8, 6], **bad}
    with pytest.raises(ValueError, match=match):
        RGBNRNNConfig(**kw)


def test_config_defaults_are_the_papers_and_gbn_has_no_transitions():
    config = RGBNRNNConfig()
    assert config.topic_sizes == [100, 80, 50] and config.hidden_sizes == [600, 512, 256]
    assert config.recurrent and config.recurrent_encoder and config.coupling == "same" and config.tau0 == 1.0
    assert config.loss_weights == (1.0, (1.0, 1.0, 1.0))
    assert RGBNRNNConfig(loss_preset="official").loss_weights == (1e-3, (1e-4, 1e-5, 1e-6))
    assert [RGBNRNNConfig(coupling="reversed").topic_layer_of_lstm(i) for i in range(3)] == [2, 1, 0]
    gbn = RGBNRNNModel(RGBNRNNConfig(vocab_size=30, topic_vocab_size=20, topic_sizes=[5, 3], hidden_sizes=[6, 4],
                                     embedding_size=4, recurrent=False))
    assert gbn.pi(1) is None and not gbn.config.recurrent_encoder
    assert not any(name.startswith("pi_") for name, _ in gbn.named_buffers())


# ----------------------------------------------------------------------------------------------
# Weibull posterior, KL to the gamma prior
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k, lam, alpha, beta", [(0.5, 2.0, 0.7, 1.0), (2.0, 0.3, 3.0, 1.0), (1.3, 1.7, 0.2, 2.5),
                                                 (5.0, 1.0, 1.0, 1.0)])
def test_kl_closed_form_matches_monte_carlo(k, lam, alpha, beta):
    torch.manual_seed(1)
    k_, lam_, alpha_ = (torch.tensor(x, dtype=torch.float64) for x in (k, lam, alpha))
    x = weibull_sample(k_, lam_.expand(1_000_000))
    log_q = torch.log(k_ / lam_) + (k_ - 1) * torch.log(x / lam_) - (x / lam_) ** k_
    log_p = alpha_ * math.log(beta) - torch.lgamma(alpha_) + (alpha_ - 1) * torch.log(x) - beta * x
    samples = log_q - log_p
    closed = kl_weibull_gamma(k_, lam_, alpha_, beta)
    assert closed >= 0
    assert abs(closed - samples.mean()) < 4 * samples.std() / 1000  # 4 standard errors
    assert abs(EULER_GAMMA - 0.5772156649015329) < 1e-15  # not the code's truncated 0.5772


def test_weibull_sampler_distribution_mean_and_gradients():
    torch.manual_seed(2)
    k, lam = torch.tensor(1.7, dtype=torch.float64), torch.tensor(2.5, dtype=torch.float64)
    x = weibull_sample(k, lam.expand(200_000)).sort().values
    cdf = 1 - torch.exp(-(x / lam) ** k)
    ks = (cdf - torch.arange(1, x.numel() + 1, dtype=torch.float64) / x.numel()).abs().max()
    assert ks < 1.63 / math.sqrt(x.numel())  # Kolmogorov-Smirnov at the 1 % level
    assert abs(x.mean() - weibull_mean(k, lam)) < 4 * x.std() / math.sqrt(x.numel())
    for k_value in (0.1, 10.0):
        k = torch.tensor([k_value], requires_grad=True)
        lam = torch.tensor([0.5], requires_grad=True)
        theta = weibull_sample(k, lam.expand(1000))
        (theta.sum() + kl_weibull_gamma(k, lam, torch.tensor(0.3), 1.0).sum()).backward()
        assert torch.isfinite(theta).all() and torch.isfinite(k.grad).all() and torch.isfinite(lam.grad).all()


# ----------------------------------------------------------------------------------------------
# CRT and multinomial samplers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, r", [(1, 1e-8), (10, 0.5), (300, 2.0), (2400, 0.05), (100_000, 3.0)])
def test_crt_mean_and_variance_match_the_exact_moments(n, r):
    torch.manual_seed(3)
    draws = 4000 if n < 100_000 else 800
    ell = sample_crt(torch.full((draws,), float(n)), torch.full((draws,), r))
    r_, n_ = torch.tensor(r, dtype=torch.float64), torch.tensor(float(n), dtype=torch.float64)
    mean = r_ * (torch.digamma(r_ + n_) - torch.digamma(r_))
    var = mean - r_ ** 2 * (torch.polygamma(1, r_) - torch.polygamma(1, r_ + n_))
    assert ((ell >= 1) & (ell <= n) & (ell == ell.round())).all()
    assert abs(ell.mean() - mean) < 5 * math.sqrt(max(var.item(), 1e-12) / draws) + 1e-9
    if var > 0.1:
        assert abs(ell.var() / var - 1) < 0.15


def test_crt_edge_cases():
    n = torch.tensor([0.0, 1.0, 1.0, 50.0, 7.0])
    r = torch.tensor([3.0, 0.0, 5.0, 1e12, 0.0])
    ell = sample_crt(n, r)
    assert ell.tolist() == [0.0, 1.0, 1.0, 50.0, 1.0]  # n = 0 -> 0; n >= 1 -> >= 1; r -> inf gives n


def test_multinomial_split_conserves_counts_and_has_the_right_mean():
    torch.manual_seed(4)
    counts = torch.tensor([0.0, 1.0, 7.0, 300.0])
    weights = torch.tensor([[1.0, 1.0, 1.0], [0.0, 2.0, 0.0], [1.0, 2.0, 3.0], [0.2, 0.3, 0.5]])
    split = multinomial_split(counts, weights)
    assert split.sum(1).tolist() == counts.tolist() and (split >= 0).all()
    assert split[1].tolist() == [0.0, 1.0, 0.0]
    total = sum(multinomial_split(counts, weights) for _ in range(400)) / 400
    expected = counts.unsqueeze(1).double() * weights.double() / weights.double().sum(1, keepdim=True)
    assert torch.allclose(total, expected, atol=1.5)
    assert torch.allclose(total[3], expected[3], rtol=0.03)


@pytest.mark.parametrize("shape, total", [((3, 4), None), ((3, 4), 500), ((5,), None)])
def test_the_poisson_term_read_from_the_words_that_occur_equals_the_dense_one(shape, total):
    """-log Pois(d | Phi theta) over the occurring words against the dense sum over the whole vocabulary (the
    naive formula), value and gradients, with padding rows masked out and a buffer larger than needed."""
    torch.manual_seed(14)
    V, K = 30, 5
    counts = torch.poisson(torch.full((*shape, V), 0.4))
    phi = torch.rand(V, K, dtype=torch.float64)
    phi = phi / phi.sum(0)
    rows = torch.rand(shape) > 0.3
    results = []
    for fn in ("dense", "sparse"):
        theta = (torch.rand(*shape, K, generator=torch.Generator().manual_seed(1)) * 3).requires_grad_()
        if fn == "dense":
            rate = (theta @ phi.float().T).clamp_min(1e-10)
            value = (-(counts * rate.log() - rate - torch.lgamma(counts + 1)).sum(-1) * rows.float()).sum()
        else:
            value = poisson_nll(counts, theta, phi, rows, total)
        value.backward()
        results.append((value.detach(), theta.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sampler", ["crt", "multinomial"])
def test_the_fixed_size_unit_buffer_leaves_the_draws_unchanged(sampler):
    """Units and customers are expanded into a buffer of a size the host knows (no synchronisation): the real ones
    come first and draw the same uniforms, so a larger buffer than needed gives the very same draws."""
    counts = torch.tensor([0.0, 3.0, 1.0, 12.0, 5.0])
    draw = {"crt": lambda total: sample_crt(counts, torch.tensor([1.0, 0.5, 2.0, 0.3, 7.0]), total=total),
            "multinomial": lambda total: multinomial_split(counts, torch.rand(5, 4, generator=torch.Generator()
                                                                                .manual_seed(1)), total)}[sampler]
    results = []
    for total in (None, 21, 60):
        torch.manual_seed(9)
        results.append(draw(total))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@pytest.mark.parametrize("recurrent", [True, False])
def test_the_fused_sentence_encoder_equals_one_sentence_at_a_time(recurrent):
    """The encoder's fused recurrence over all sentences against the cell stepped sentence by sentence (the naive
    loop): k, lambda, the last hidden state and the gradients of every weight, from a given hidden state too."""
    torch.manual_seed(10)
    config = RGBNRNNConfig(vocab_size=30, topic_vocab_size=40, topic_sizes=[7, 5], hidden_sizes=[6, 4],
                           recurrent=recurrent, recurrent_encoder=recurrent)
    encoder = RGBNRNNModel(config).encoder
    bows = torch.poisson(torch.full((3, 6, 40), 0.7))
    hidden = [torch.randn(3, 7), torch.randn(3, 5)] if recurrent else None

    def naive():
        shapes, scales, h = [[], []], [[], []], hidden
        for j in range(bows.shape[1]):
            x, new = torch.log1p(bows[:, j]), []
            for l, cell in enumerate(encoder.cells):
                x = cell(x, h[l] if (h is not None and recurrent) else None)
                new.append(x)
                shapes[l].append(torch.nn.functional.softplus(encoder.shape[l](x)).clamp(config.k_min, config.k_max))
                scales[l].append(torch.nn.functional.softplus(encoder.scale[l](x)) + 1e-6)
            h = new
        return [torch.stack(x, 1) for x in shapes], [torch.stack(x, 1) for x in scales], h

    results = []
    for run in (naive, lambda: encoder(bows, hidden)):
        encoder.zero_grad()
        shapes, scales, last = run()
        (sum(k.sum() for k in shapes) + sum((lam * torch.arange(lam.shape[-1])).sum() for lam in scales)
         + sum(h.pow(2).sum() for h in last)).backward()
        results.append(([*shapes, *scales, *last], [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                                    for p in encoder.parameters()]))
    (want, want_grads), (got, got_grads) = results
    for g, w in zip(got + got_grads, want + want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_document_thetas_draw_the_uniforms_sentence_by_sentence(wiki):
    """The samples of all sentences come from one draw of uniforms taken in the order the sentence-by-sentence
    encoder drew them (sentence, then layer): the same random numbers give the same theta."""
    model = make(wiki).train()
    _, batch = documents_batch(wiki)
    b, c = batch["chunk_mask"].shape
    slots = model.model.sentence_slots(batch["input_ids"], batch["chunk_mask"].bool(), batch["sentence_index"],
                                       batch["context_bow"], b, c)
    torch.manual_seed(11)
    tp = model.model.encode_documents(slots.bows, slots.slot_mask, sample=True)
    torch.manual_seed(11)
    for j in range(slots.bows.shape[1]):
        for l in range(3):
            want = weibull_sample(tp.shapes[l][:, j], tp.scales[l][:, j])
            torch.testing.assert_close(tp.thetas[l][:, j], want, rtol=1e-6, atol=0)


def test_the_backward_walk_draws_the_exact_moments_of_crt_binomial_and_multinomial():
    """The walk's one uniform per customer (table, side, source) against the exact laws of one step: 3,000 documents
    of two sentences whose last sentence has n customers in each of 3 topics; E and Var of ell ~ CRT(n, r) from the
    digamma / trigamma formulas, E[ell^Pi] = s E[ell], E[z_k'] = sum_k E[ell^Pi_k] route[k, k'] / sum route[k, :],
    and the Pi statistics' total."""
    torch.manual_seed(12)
    docs, K = 3000, 3
    n = torch.tensor([1.0, 6.0, 40.0], dtype=torch.float64)
    r = torch.tensor([0.3, 2.0, 9.0], dtype=torch.float64)
    s = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    route_row = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, 0.5], [4.0, 1.0, 1.0]], dtype=torch.float64)
    a = torch.zeros(docs, 2, K, dtype=torch.float64)
    a[:, 1] = n
    rate, share = torch.ones(docs, 2, K, dtype=torch.float64), torch.zeros(docs, 2, K, dtype=torch.float64)
    rate[:, 1], share[:, 1] = r, s
    route = route_row.expand(docs, 2, K, K).clone()
    total = int(a.sum()) + 11
    walked_n, ell, ell_pi, z, pi_stat = backward_walk(a, rate, share, route, total)
    mean = r * (torch.digamma(r + n) - torch.digamma(r))
    var = mean - r ** 2 * (torch.polygamma(1, r) - torch.polygamma(1, r + n))
    se = (var / docs).sqrt()
    assert ((ell[:, 1].mean(0) - mean).abs() < 4 * se).all()
    assert ((ell[:, 1].var(0) / var)[1:] - 1).abs().max() < 0.12 and (ell[:, 1, 0] == 1).all()  # n = 1: one table
    assert ((ell_pi[:, 1].mean(0) - s * mean).abs() < 4 * (var / docs).sqrt() + 0.05).all()
    expected_z = (s * mean) @ (route_row / route_row.sum(1, keepdim=True))
    assert ((z[:, 1].mean(0) - expected_z).abs() < 0.06 * expected_z + 0.03).all()
    # the counts routed back reach sentence 1: n_1 = a_1 + z_2 there, and every count is conserved
    assert torch.equal(walked_n[:, 0], z[:, 1]) and torch.equal(z.sum(-1), ell_pi.sum(-1))
    assert pi_stat.sum() == ell_pi.sum() and ((ell <= walked_n) & ((ell > 0) == (walked_n > 0))).all()


def _walk_by_the_exact_samplers(a, rate, share, route):
    """The backward walk as the note writes it, one sentence at a time with the exact samplers (the reference)."""
    b, J, K = a.shape
    z_next, ell, ell_pi, z = torch.zeros(b, K, dtype=a.dtype), *(torch.zeros_like(a) for _ in range(3))
    pi_stat = torch.zeros(K, K, dtype=a.dtype)
    for j in range(J - 1, -1, -1):
        ell[:, j] = sample_crt(a[:, j] + z_next, rate[:, j])
        ell_pi[:, j] = torch.binomial(ell[:, j], share[:, j])
        Z = multinomial_split(ell_pi[:, j].reshape(-1), route[:, j].reshape(-1, K)).view(b, K, K)
        pi_stat += Z.sum(0)
        z_next = z[:, j] = Z.sum(1)
    return ell, ell_pi, z, pi_stat


@pytest.mark.parametrize("grid, budget", [(32, WALK_GRID_BUDGET), (1, WALK_GRID_BUDGET), (1, 0)])
def test_the_backward_walk_over_sentences_matches_the_exact_samplers_in_the_mean(grid, budget, monkeypatch):
    """Four sentences whose tables are mostly routed back (share 0.9), 2,000 copies of one document: the mean of
    every count of the walk (seats drawn before it; ``grid=1``: most customers past the grid, which grows; with no
    ``budget`` for that, the exact pass past it) against the sentence-by-sentence exact samplers, within 4.5
    standard errors."""
    torch.manual_seed(13)
    docs, J, K = 2000, 4, 3
    a = torch.tensor([[2.0, 0.0, 5.0], [1.0, 3.0, 0.0], [4.0, 4.0, 1.0], [6.0, 2.0, 3.0]],
                     dtype=torch.float64).expand(docs, J, K)
    rate = torch.tensor([0.5, 3.0, 8.0], dtype=torch.float64).expand(docs, J, K)
    share = torch.full((docs, J, K), 0.9, dtype=torch.float64)
    share[:, 0] = 0
    route = torch.tensor([[5.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 5.0]], dtype=torch.float64).expand(docs, J, K, K)
    walks = []  # the grids walked, and whether past them
    walk = sampler._walk
    monkeypatch.setattr(sampler, "_walk", lambda z, g_pi, *args: walks.append((g_pi.shape[-1], args[-1] is not None))
                        or walk(z, g_pi, *args))
    n, *walked = backward_walk(a, rate, share, route, total=int(a.sum()), grid=grid, budget=budget)
    # 32 seats hold every customer here; a grid of 1 overflows and grows (to multiples of 32) until no cell
    # overflows, or with no budget for that, the exact pass past it
    assert walks[0] == (grid, False) and (grid == 32) == (len(walks) == 1)
    assert walks[1:] == [(grid, True)] if budget == 0 else all(g % 32 == 0 and not past for g, past in walks[1:])
    reference = _walk_by_the_exact_samplers(a, rate, share, route)
    for got, want in zip(walked[:3], reference[:3]):
        se = ((got.var(0) + want.var(0)) / docs).sqrt().clamp_min(1e-3)
        assert ((got.mean(0) - want.mean(0)).abs() / se).max() < 4.5
    torch.testing.assert_close(walked[3] / docs, reference[3] / docs, rtol=0.06, atol=0.1)  # Pi counts per document
    assert torch.equal(n[:, :-1], a[:, :-1] + walked[2][:, 1:]) and (walked[0] <= n).all()


def _random_hierarchy(V=25, K=(6, 4, 3), b=3, J=5, recurrent=True, seed=5):
    g = torch.Generator().manual_seed(seed)
    rows = [V, *K[:-1]]
    phis = [torch.rand(R, k, generator=g, dtype=torch.float64) for R, k in zip(rows, K)]
    phis = [p / p.sum(0) for p in phis]
    pis = [torch.rand(k, k, generator=g, dtype=torch.float64) for k in K] if recurrent else None
    pis = [p / p.sum(0) for p in pis] if recurrent else None
    thetas = [torch.rand(b, J, k, generator=g, dtype=torch.float64) * 3 for k in K]
    counts = torch.poisson(torch.full((b, J, V), 2.0, dtype=torch.float64), generator=g)
    counts[-1, -2:] = 0  # a shorter document: padding slots
    return counts, thetas, phis, pis


@pytest.mark.parametrize("recurrent", [True, False])
def test_augmentation_conserves_counts_layer_to_layer(recurrent):
    torch.manual_seed(6)
    counts, thetas, phis, pis = _random_hierarchy(recurrent=recurrent)
    aug = augment_counts(counts, thetas, phis, pis, tau0=1.0, details=True)
    L = len(phis)
    assert torch.equal(aug.details[0]["a"].sum(-1), counts.sum(-1))  # sum_v d_vj = sum_k a^1_kj
    assert torch.equal(aug.phi[0].sum(), counts.sum())
    for l, d in enumerate(aug.details):
        if "ell" not in d:
            break
        n, ell, ell_pi, ell_phi, z = d["n"], d["ell"], d["ell_pi"], d["ell_phi"], d["z"]
        assert ((ell >= 0) & (ell <= n)).all()
        checked = torch.ones_like(n, dtype=torch.bool)
        if l == L - 1:
            checked[:, 0] = False  # the top layer's first sentence has a fixed prior: no tables
        assert torch.equal((ell > 0)[checked], (n > 0)[checked])
        assert torch.equal(ell_pi + ell_phi, ell)
        assert torch.equal(z.sum(-1), ell_pi.sum(-1))  # every Pi count is routed to theta_{j-1}
        assert (ell_pi[:, 0] == 0).all()  # no Pi counts at j = 1
        if not recurrent:
            assert (ell_pi == 0).all() and (z == 0).all()
        assert torch.equal(n[:, :-1], d["a"][:, :-1] + z[:, 1:])  # n at j includes z from j + 1
        if l + 1 < L:
            assert torch.equal(aug.details[l + 1]["a"].sum(-1), ell_phi.sum(-1))  # m^{l+1} = ell^Phi, split up
            assert torch.equal(aug.phi[l + 1].sum(), ell_phi.sum())
        if recurrent:
            assert torch.equal(aug.pi[l].sum(), ell_pi.sum())
    assert (aug.details[0]["a"][-1, -2:] == 0).all()  # padding slots get no counts


# ----------------------------------------------------------------------------------------------
# TLASGR-MCMC
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["zero", "huge", "dead_topic", "late"])
def test_tlasgr_keeps_every_column_on_the_simplex(case):
    torch.manual_seed(7)
    config = RGBNRNNConfig(vocab_size=10, topic_vocab_size=30, topic_sizes=[5], hidden_sizes=[4])
    phi = torch.rand(30, 5, dtype=torch.float64)
    phi /= phi.sum(0)
    stats = {"zero": torch.zeros(30, 5), "huge": torch.rand(30, 5) * 1e9,
             "dead_topic": torch.cat([torch.rand(30, 4) * 50, torch.zeros(30, 1)], 1),
             "late": torch.rand(30, 5) * 10}[case].double()
    fisher = torch.zeros(5, dtype=torch.float64)
    for step in ([0, 1, 2] if case != "late" else [0, 500, 10_000]):
        phi, fisher = tlasgr_update(phi, stats, fisher, step, 0.1, config)
        assert torch.isfinite(phi).all() and (phi >= 0).all()
        assert torch.allclose(phi.sum(0), torch.ones(5, dtype=torch.float64), atol=1e-8)


def test_tlasgr_recovers_a_known_phi_and_pi():
    """A one-layer rGBN corpus from known Phi and Pi; TLASGR from a random start, fed the true theta."""
    torch.manual_seed(8)
    V, K, N, B, J, tau = 30, 3, 400, 20, 5, 0.05
    true_phi = torch.distributions.Dirichlet(torch.full((V,), 0.2)).sample((K,)).T.double()
    true_pi = torch.distributions.Dirichlet(torch.full((K,), 0.5)).sample((K,)).T.double()
    theta = [torch.distributions.Gamma(torch.ones(N, K), tau).sample().double()]
    for _ in range(1, J):
        theta.append(torch.distributions.Gamma((tau * theta[-1] @ true_pi.T).clamp_min(1e-10), tau).sample().double())
    theta = torch.stack(theta, 1)  # (N, J, K)
    counts = torch.poisson(theta @ true_phi.T)
    config = RGBNRNNConfig(vocab_size=10, topic_vocab_size=V, topic_sizes=[K], hidden_sizes=[4], tau0=tau)
    phi = torch.rand(V, K, dtype=torch.float64)
    phi /= phi.sum(0)
    pi = torch.distributions.Dirichlet(torch.ones(K)).sample((K,)).T.double()
    error = lambda a, b: (a - b).abs().sum(0).mean().item()  # noqa: E731  mean column L1
    start = (error(phi, true_phi), error(pi, true_pi))
    m_phi, m_pi, step = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.float64), 0
    for _ in range(3):
        for idx in torch.randperm(N).split(B):
            aug = augment_counts(counts[idx], [theta[idx]], [phi], [pi], tau)
            phi, m_phi = tlasgr_update(phi, aug.phi[0] * (N / B), m_phi, step, 0.1, config)
            pi, m_pi = tlasgr_update(pi, aug.pi[0] * (N / B), m_pi, step, 1.0, config)
            step += 1
    assert start[0] > 0.8 and start[1] > 0.4
    assert error(phi, true_phi) < 0.15
    assert error(pi, true_pi) < 0.2  # a transposed Pi (index order) or a sign error stays near the start


def test_pi_is_not_initialised_to_the_identity(wiki):
    model = make(wiki)
    pi = model.model.pi(1)
    assert torch.allclose(pi.sum(0), torch.ones(pi.shape[0], dtype=pi.dtype))
    assert (pi.diagonal() < 0.99).all() and pi.dtype == torch.float64


# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------


def test_documents_forward_loss_terms_and_shapes(wiki):
    model = make(wiki).train()
    _, batch = documents_batch(wiki)
    out = model(**batch)
    b, c, s = batch["input_ids"].shape
    assert out.logits is None  # training with labels: the output layer only at the predicted positions
    with torch.no_grad():
        assert model.eval()(**batch).logits.shape == (b, c, s, len(wiki["tok"]))
    model.train()
    assert out.theta.shape[:2] == (b, int(batch["sentence_index"].max()) + 1) and out.theta.shape[2] == 18
    tokens = (batch["labels"][..., 1:] != -100).sum()
    assert torch.isclose(out.loss, out.lm_loss + out.bow_loss + out.kl_loss, rtol=1e-5)  # elbo: all weights 1
    assert out.kl_loss > 0 and out.bow_loss > 0 and tokens > 0
    out.loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "embed" not in n)
    official = make(wiki, loss_preset="official").train()
    torch.manual_seed(3)
    o = official(**batch)
    assert o.loss < o.lm_loss + 0.01 * (o.bow_loss + o.kl_loss)


def test_the_sentence_recurrence_equals_running_sentence_by_sentence(wiki):
    """A documents batch (the recurrence inside one call) gives the logits of feeding the chunks one at a time with
    the carried state (encoder hidden and theta), the LSTM part of the state reset at every chunk."""
    model = make(wiki)
    _, batch = documents_batch(wiki, docs=(0, 1), max_sentence_length=8)
    with torch.no_grad():
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     context_bow=batch["context_bow"], chunk_mask=batch["chunk_mask"],
                     sentence_index=batch["sentence_index"]).logits
    L = model.config.num_layers
    continued = 0
    for d in range(2):
        state = None
        for k in range(int(batch["chunk_mask"][d].sum())):
            ids, mask = batch["input_ids"][d, k:k + 1], batch["attention_mask"][d, k:k + 1]
            if state is not None:  # fresh LSTM state, carried sentence recurrence
                state = tuple(torch.zeros_like(x) for x in state[:2 * L]) + state[2 * L:]
                continued += int(ids[0, 0] != model.config.bos_token_id)
            with torch.no_grad():
                out = model(input_ids=ids, attention_mask=mask, context_bow=batch["context_bow"][d, k:k + 1],
                            state=state, use_cache=True)
            state = out.state
            real = mask[0].bool()
            assert torch.allclose(out.logits[0][real], full[d, k][real], atol=1e-5), (d, k)
    assert continued > 0  # some sentence spans chunks: its theta came from the state
    # and the recurrence matters: the second sentence's context read alone (no state) gives another theta
    with torch.no_grad():
        in_document = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "context_bow", "chunk_mask",
                                                     "sentence_index")}).theta[0, 1]
        alone = model(input_ids=batch["input_ids"][0, 1:2], attention_mask=batch["attention_mask"][0, 1:2],
                      context_bow=batch["context_bow"][0, 1:2]).theta[0]
    assert (alone - in_document).abs().max() > 1e-3 * in_document.abs().max()


def test_causal_documents_never_read_later_sentences(wiki):
    """Under the causal context, changing sentence j + 1 onwards leaves the logits of sentences <= j unchanged
    (the encoder's recurrence runs forward only), and changes later ones."""
    model = make(wiki)
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", layout="documents",
                                    max_sentence_length=10)
    sentences = [s for s in wiki["valid"][0]["sentences"] if s][:5]
    vocab = wiki["topic_tok"].get_vocab()  # a dict whose order changes from process to process: sort by id
    topic_words = [w for w in sorted(vocab, key=vocab.get) if w != "<unk>"][:40]
    changed = sentences[:2] + [topic_words[i:i + 8] for i in (0, 8, 16)]

    def logits(doc):
        batch = collator([{"sentences": doc}])
        with torch.no_grad():
            out = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "context_bow", "chunk_mask",
                                                 "sentence_index")})
        return out.logits[0], batch["sentence_index"][0]

    (base, index), (new, new_index) = logits(sentences), logits(changed)
    early = index <= 1
    assert torch.equal(index[early], new_index[:int(early.sum())])
    torch.testing.assert_close(new[:int(early.sum())], base[early])
    # sentence 3's context holds the changed sentence 2: even its first word's distribution (after <bos>) moves
    first = lambda logits, idx: logits[int((idx == 3).nonzero()[0, 0]), 0]  # noqa: E731
    assert (first(new, new_index) - first(base, index)).abs().max() > 1e-3


def test_gbn_without_recurrence_reads_each_sentence_alone(wiki):
    model = make(wiki, recurrent=False)
    _, batch = documents_batch(wiki, docs=(0,), context="others")
    with torch.no_grad():
        full = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "context_bow", "chunk_mask",
                                              "sentence_index")}).logits
        k = int(batch["chunk_mask"][0].sum()) - 1
        alone = model(input_ids=batch["input_ids"][0, k:k + 1], attention_mask=batch["attention_mask"][0, k:k + 1],
                      context_bow=batch["context_bow"][0, k:k + 1]).logits
    if batch["input_ids"][0, k, 0] == model.config.bos_token_id:
        assert torch.allclose(alone[0], full[0, k], atol=1e-5)


@pytest.mark.parametrize("coupling, gate", [("same", "paper"), ("reversed", "official")])
def test_coupling_pairs_layers_and_the_gate_reads_max_normalised_theta(wiki, coupling, gate):
    model = make(wiki, coupling=coupling, gate=gate)
    K = model.config.topic_sizes
    expected = K if coupling == "same" else K[::-1]
    assert [g.theta_proj.in_features for g in model.model.gates] == expected
    assert [g.candidate_proj.in_features for g in model.model.gates] == model.config.hidden_sizes
    theta = torch.rand(2, sum(K)) * 7
    tilde = model.model.gate_inputs(model.model.split_theta(theta))
    assert all(torch.allclose(t.amax(-1), torch.ones(2)) for t in tilde)
    # theta = 0: a finite output that depends on h only; at initialisation about 73 % of h passes the gate
    gate_module, h = model.model.gates[0], torch.randn(2, 3, model.config.hidden_sizes[0])
    zero = gate_module(h, torch.zeros(2, expected[0]))
    assert torch.isfinite(zero).all() and torch.allclose(zero[0], gate_module(h[:1], torch.zeros(1, expected[0]))[0])
    bias = gate_module.bias[:h.shape[-1]]
    assert torch.allclose(torch.sigmoid(bias if gate == "official" else -bias), torch.full_like(bias, 0.7311),
                          atol=1e-4)
    lstm = model.model.lstms[0]
    H = lstm.hidden_size
    assert (lstm.bias_ih_l0[H:2 * H] == 1).all() and (lstm.bias_ih_l0[:H] == 0).all()  # forget-gate bias 1
    bos = torch.tensor([[model.config.bos_token_id]])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=bos, topic_mixture=torch.zeros(1, sum(K))).logits).all()


def test_bad_inputs_are_clear_errors(wiki):
    model = make(wiki)
    _, batch = documents_batch(wiki, docs=(0,))
    bad = batch["context_bow"].clone()
    bad[0, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="finite, non-negative"):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], context_bow=bad,
              chunk_mask=batch["chunk_mask"])
    with pytest.raises(ValueError, match="at least one chunk"):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
              chunk_mask=torch.zeros_like(batch["chunk_mask"]))
    for kwargs, match in [(dict(topic_ids=[4], topic_layer=3), r"topic_ids must be in \[0, 4\)"),
                          (dict(topic_ids=[1], topic_layer=4), r"topic_layer must be an integer in \[1, 3\]"),
                          (dict(topic_ids=[1], topic_layer=0), r"topic_layer must be an integer in \[1, 3\]"),
                          (dict(topic_ids=[1.5]), "integer topic ids"), (dict(topic_layer=2), "goes with topic_ids"),
                          (dict(topic_ids=[1], topic_mixture=torch.ones(18)), "at most one"),
                          (dict(topic_mixture=torch.ones(5)), r"topic_mixture must have shape \(b, 18\)"),
                          (dict(topic_mixture=-torch.ones(18)), "finite and non-negative"),
                          (dict(topic_mixture=[0.5, 0.5]), r"topic_mixture must have shape \(b, 18\)")]:
        with pytest.raises(ValueError, match=match):
            model.generate(max_new_tokens=2, **kwargs)
    with pytest.raises(ValueError, match="Document 0 is empty"):
        TopicContextCollator(wiki["tok"], wiki["topic_tok"], layout="documents")([{"sentences": [[]]}])


# ----------------------------------------------------------------------------------------------
# generation and topics
# ----------------------------------------------------------------------------------------------


def test_topics_of_any_layer_steer_the_next_word(wiki):
    model = make(wiki)
    bos = torch.tensor([[model.config.bos_token_id]])
    for layer, K in zip((1, 2, 3), model.config.topic_sizes):
        with torch.no_grad():
            probs = [torch.softmax(model(input_ids=bos, topic_ids=[k], topic_layer=layer).logits[0, -1], -1)
                     for k in range(K)]
        assert max((p - probs[0]).abs().sum() for p in probs[1:]) > 1e-3, layer
    theta = model.model.theta_from_topics([1], 3)
    t1, t2, t3 = model.model.split_theta(theta)
    assert t3.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert torch.allclose(t2, t3 @ model.model.phi(3).float().T)
    assert torch.allclose(t1, t2 @ model.model.phi(2).float().T)
    chain = model.model.theta_from_topics([1], 3, mode="chain")
    assert [int(x.sum()) for x in model.model.split_theta(chain)] == [1, 1, 1]


def test_topic_mixture_is_rgbns_keyword_and_theta_a_deprecated_alias(wiki):
    """rGBN-RNN takes its raw topic weights as ``topic_mixture`` (b, sum K), like every family; ``theta=`` still
    works, with a FutureWarning, and gives the same scores in forward and generate."""
    model = make(wiki).eval()
    mixture = torch.rand(1, sum(model.config.topic_sizes))
    bos = torch.tensor([[model.config.bos_token_id]])
    assert "topic_mixture" in model.conditioning_inputs and "theta" not in model.conditioning_inputs
    with torch.no_grad():
        expected = model(input_ids=bos, topic_mixture=mixture).logits
        with pytest.warns(FutureWarning, match="theta= is deprecated: give topic_mixture="):
            torch.testing.assert_close(model(input_ids=bos, theta=mixture).logits, expected)
    kw = dict(max_new_tokens=4, do_sample=False, output_scores=True, return_dict_in_generate=True)
    new = model.generate(topic_mixture=mixture, **kw)
    with pytest.warns(FutureWarning):
        old = model.generate(theta=mixture, **kw)
    assert torch.equal(new.sequences, old.sequences)
    torch.testing.assert_close(torch.stack(new.scores), torch.stack(old.scores))
    with pytest.raises(ValueError, match="at most one"), pytest.warns(FutureWarning):
        model(input_ids=bos, theta=mixture, topic_mixture=mixture)


def test_generate_paragraph_links_sentences_by_the_recurrence(wiki):
    model = make(wiki)
    torch.manual_seed(12)
    sentences = model.generate_paragraph(3, topic_ids=[1], topic_layer=3, max_new_tokens=5)
    assert len(sentences) == 3 and all(s.shape[0] == 1 for s in sentences)
    torch.manual_seed(12)
    text = model.generate_paragraph(2, num_paragraphs=2, tokenizer=wiki["tok"], max_new_tokens=5)
    assert len(text) == 2 and all(len(p) == 2 and all(isinstance(s, str) for s in p) for p in text)
    # the next sentence's theta follows eq. 2: its mean given theta_j is Pi theta_j at the top
    previous = model.model.theta_from_topics([1], 3)
    draws = torch.stack([model.model.sample_prior_theta(previous=previous) for _ in range(3000)]).mean(0)
    top = model.model.split_theta(draws)[-1]
    expected = model.model.split_theta(previous)[-1] @ model.model.pi(3).float().T
    assert torch.allclose(top, expected, atol=0.08)
    with pytest.raises(ValueError, match="num_sentences must be a positive integer"):
        model.generate_paragraph(0)
    # conditioned on a given paragraph: sentence j is decoded from the encoder's theta_j
    bows = documents_batch(wiki, docs=(0,))[1]["context_bow"][0, :2]
    calls = []
    original = model.generate
    model.generate = lambda **kw: calls.append(kw["topic_mixture"]) or original(**kw)
    model.generate_paragraph(3, context_bow=bows, max_new_tokens=2)
    del model.generate
    thetas = model.model.encode_documents(bows.unsqueeze(0), torch.ones(1, 2, dtype=torch.bool), sample=False).thetas
    expected = torch.cat(thetas, -1)[0]
    assert torch.allclose(calls[0][0], expected[0]) and torch.allclose(calls[1][0], expected[1])
    assert len(calls) == 3 and calls[2].shape == (1, 18)


def test_get_topics_of_every_layer_and_the_topic_tree(wiki):
    model = make(wiki)
    for layer, K in zip((1, 2, 3), model.config.topic_sizes):
        topics = model.get_topics(layer=layer, top_n=5, topic_tokenizer=wiki["topic_tok"])
        assert len(topics) == K and all(len(t) == 5 and "<unk>" not in t for t in topics)
    dist = model.topic_word_distributions(layer=3)
    assert torch.allclose(dist.sum(1), torch.ones(4), atol=1e-5)
    manual = (model.model.phi(1) @ model.model.phi(2) @ model.model.phi(3)).T.float()
    assert torch.allclose(dist, manual, atol=1e-6)
    tree = model.topic_tree(top_n=3, num_children=2, topic_tokenizer=wiki["topic_tok"])
    assert len(tree) == 4 and all(len(n["children"]) == 2 and n["layer"] == 3 for n in tree)
    child = tree[0]["children"][0]
    assert child["layer"] == 2 and child["weight"] == pytest.approx(float(model.model.phi(3)[:, 0].max()))
    assert len(child["children"][0]["words"]) == 3 and child["children"][0]["children"] == []
    assert format_topic_tree(tree).count("\n") == 4 * (1 + 2 + 4) - 1
    with pytest.raises(ValueError, match="topic_layer must be"):
        model.get_topics(layer=4, topic_tokenizer=wiki["topic_tok"])


# ----------------------------------------------------------------------------------------------
# TLASGR from training steps, saving, resuming
# ----------------------------------------------------------------------------------------------


def test_tlasgr_runs_once_per_optimizer_step_with_accumulated_statistics(wiki):
    model = make(wiki).train()
    _, batch = documents_batch(wiki, split="train")
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    phi_before = model.model.phi(1).clone()
    for _ in range(2):  # two micro-batches, one optimizer step
        model(**batch).loss.backward()
    pending_rows = model.model._tlasgr_pending[1]
    assert pending_rows == 2 * batch["input_ids"].shape[0]
    optimizer.step()
    assert int(model.model.tlasgr_step_count) == 1 and model.model._tlasgr_pending is None
    assert not torch.equal(model.model.phi(1), phi_before)
    for l in (1, 2, 3):
        for m in (model.model.phi(l), model.model.pi(l)):
            assert torch.allclose(m.sum(0), torch.ones(m.shape[1], dtype=m.dtype), atol=1e-8) and (m >= 0).all()
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # another model's optimizer
    model(**batch).loss.backward()
    other.step()
    assert int(model.model.tlasgr_step_count) == 1
    with torch.no_grad():  # evaluation never adds statistics
        model.eval()(**batch)


def test_gradient_alternative_learns_softmax_columns(wiki):
    model = make(wiki, topic_learning="gradient").train()
    assert not any("phi_" in n and "logits" not in n for n, _ in model.named_buffers())
    _, batch = documents_batch(wiki, split="train")
    model(**batch).loss.backward()
    assert model.model.phi_logits_1.grad.abs().sum() > 0 and model.model.pi_logits_2.grad.abs().sum() > 0
    assert torch.allclose(model.model.phi(2).sum(0), torch.ones(6))


class _StopAfter(TrainerCallback):
    def __init__(self, steps):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.steps:
            control.should_training_stop = True


def _trainer(model, wiki, out, steps, rows, **kw):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", layout="documents",
                                    max_sentence_length=15)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=steps, learning_rate=3e-3,
                             logging_steps=1, save_steps=2, report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
                             dataloader_num_workers=0, **kw)
    return TopicLMTrainer(model=model, args=args, data_collator=collator, train_dataset=rows)


@pytest.fixture(scope="module")
def train_rows(wiki):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", layout="documents",
                                    max_sentence_length=15)
    return collator.prepare(wiki["train"].select(range(24)))


def test_a_resumed_run_continues_the_sampler_exactly(wiki, train_rows, tmp_path):
    full = make(wiki)
    _trainer(full, wiki, tmp_path / "full", 4, train_rows).train()
    assert int(full.model.tlasgr_step_count) == 4 and full.config.tlasgr_corpus_size == 24
    part = make(wiki)
    interrupted = _trainer(part, wiki, tmp_path / "part", 4, train_rows)
    interrupted.add_callback(_StopAfter(2))  # as if the run were killed after its step-2 checkpoint
    interrupted.train()
    assert int(part.model.tlasgr_step_count) == 2
    resumed = make(wiki, seed=5)  # other weights: everything must come from the checkpoint
    _trainer(resumed, wiki, tmp_path / "part", 4, train_rows).train(
        resume_from_checkpoint=str(tmp_path / "part" / "checkpoint-2"))
    assert int(resumed.model.tlasgr_step_count) == 4
    for name in ("phi_1", "phi_3", "pi_2", "phi_fisher_2", "pi_fisher_3"):
        assert torch.allclose(getattr(resumed.model, name), getattr(full.model, name), atol=1e-10), name


def test_trainer_on_real_apnews_lowers_the_loss_and_evaluates_under_every_protocol(wiki, train_rows, tmp_path):
    model = make(wiki, topic_sizes=[10, 6], hidden_sizes=[24, 16])
    trainer = _trainer(model, wiki, tmp_path, 12, train_rows, gradient_accumulation_steps=2)
    trainer.args.save_strategy = "no"
    history = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12 and sum(losses[-3:]) < sum(losses[:3])
    assert int(model.model.tlasgr_step_count) == 12  # one TLASGR update per optimizer step, not per micro-batch
    assert all(k in trainer.state.log_history[0] for k in ("lm_loss", "kl_loss", "bow_loss"))
    assert history.training_loss > 0
    docs = wiki["valid"].select(range(4))
    kw = dict(tokenizer=wiki["tok"], topic_tokenizer=wiki["topic_tok"], batch_size=16)
    results = {p: evaluate_perplexity(model, docs, p, **kw) for p in ("paper", "causal", "causal-carry")}
    tokens = {r["tokens"] for r in results.values()}
    expected = sum(len(sentence) + 1 for doc in docs["sentences"] for sentence in doc if sentence)  # words + <eos>
    assert tokens == {expected} and all(math.isfinite(r["perplexity"]) for r in results.values())
    assert results["causal"]["perplexity"] < len(wiki["tok"])
    # the documents path equals the chunk-by-chunk path without a carried LSTM state, by construction above;
    # here: the whole-document evaluation is deterministic (posterior mean)
    again = evaluate_perplexity(model, docs, "causal", **kw)
    assert again["nll"] == pytest.approx(results["causal"]["nll"], rel=1e-9)


def test_gradient_checkpointing_gives_the_same_gradients(wiki, monkeypatch):
    from topic_lm_hf.models import modeling_rgbn_rnn

    model = make(wiki, dropout=0.2).train()
    _, batch = documents_batch(wiki, split="train", docs=(0, 1))

    def loss_and_grads():
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks and theta samples
        loss = model(**batch).loss
        loss.backward()
        model.model._tlasgr_pending = None
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads()
    model.activation_checkpointing_enable()
    calls = []
    original = modeling_rgbn_rnn._run_gated_layer
    monkeypatch.setattr(modeling_rgbn_rnn, "_run_gated_layer", lambda *a: calls.append(1) or original(*a))
    loss_ckpt, grads_ckpt = loss_and_grads()
    assert len(calls) == 2 * 3  # every gated layer ran again in the backward pass
    torch.testing.assert_close(loss_ckpt, loss)
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("size, topics, hidden", [("small", [50, 30, 20], [256, 192, 128]),
                                                  ("paper", [100, 80, 50], [600, 512, 256])])
def test_hub_configs_build_with_the_cli(size, topics, hidden):
    from pathlib import Path

    from topic_lm_hf.arguments import ModelArguments
    from topic_lm_hf.commands import make_config

    path = Path(__file__).resolve().parents[1] / "hub_configs" / f"rgbn-rnn-apnews-{size}.json"
    config = make_config(ModelArguments(config_file=str(path)))
    assert isinstance(config, RGBNRNNConfig) and config.recurrent and config.topic_learning == "tlasgr"
    assert (config.topic_sizes, config.hidden_sizes) == (topics, hidden)


def test_the_steering_evaluation_runs_on_first_layer_topics(wiki):
    from topic_lm_hf import evaluate_steering

    model = make(wiki)
    bows = documents_batch(wiki, docs=(0, 1))[1]["context_bow"][:, 1]
    proportions = model.infer_topics(bows)
    assert proportions.shape == (2, 8) and torch.allclose(proportions.sum(-1), torch.ones(2))
    assert model.infer_topics(bows, layer=3).shape == (2, 4)
    result = evaluate_steering(model, topics=[0, 3], num_samples=2, max_new_tokens=4, tokenizer=wiki["tok"],
                               topic_tokenizer=wiki["topic_tok"])
    assert 0.0 <= result["accuracy_own"] <= 1.0 and len(result["per_topic"]) == 2


def test_two_process_ddp_training_keeps_the_same_phi_and_pi_on_every_process(tmp_path):
    import json
    from pathlib import Path

    from conftest import run_torchrun

    proc = run_torchrun(Path(__file__).parent / "ddp_train_rgbn.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world_size"] == 2
    assert ranks[0]["buffers"]["model.tlasgr_step_count"] == 3
    start = RGBNRNNModel(RGBNRNNConfig(vocab_size=10, topic_vocab_size=len(ranks[0]["buffers"]["model.phi_1"]),
                                       topic_sizes=[6, 4], hidden_sizes=[16, 8], embedding_size=8))
    assert ranks[0]["buffers"]["model.phi_1"] != start.phi_1.tolist()  # the sampler moved
    assert ranks[0]["buffers"] == ranks[1]["buffers"]  # statistics summed over processes, the same noise


def test_bfloat16_loading_keeps_the_sampler_in_float64_and_resizing_the_vocabulary(wiki, tmp_path):
    import copy

    model = make(wiki)
    model.save_pretrained(tmp_path / "m")
    half = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.bfloat16).eval()
    assert all(p.dtype == torch.bfloat16 for p in half.parameters()) and half.model.phi_1.dtype == torch.float64
    _, batch = documents_batch(wiki, docs=(0,))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "context_bow", "chunk_mask", "sentence_index")}
    with torch.no_grad():
        ref, got = (torch.log_softmax(m(**inputs).logits.float(), -1) for m in (model, half))
    real = batch["attention_mask"].bool()
    assert (got - ref)[real].abs().max() < 0.15
    assert half.generate(topic_ids=[0], topic_layer=3, max_new_tokens=3, min_new_tokens=3).shape == (1, 4)
    tok = copy.deepcopy(wiki["tok"])
    old = len(tok)
    with torch.no_grad():
        before = model(**inputs).logits
    tok.add_tokens(["zzyzx"])
    model.resize_token_embeddings(len(tok))
    with torch.no_grad():
        after = model(**inputs).logits
    assert after.shape[-1] == old + 1 and torch.isfinite(after).all()
    torch.testing.assert_close(after[..., :old], before)  # a plain softmax layer: the old words' scores stay
