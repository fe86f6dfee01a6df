"""Texygen BLEU and self-BLEU, checked against NLTK's sentence_bleu (method1), the implementation Texygen calls."""

from __future__ import annotations

import math
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topic_lm_hf.evaluation import BleuResult, texygen_bleu, texygen_self_bleu
from topic_lm_hf.evaluation.bleu import TEXYGEN_SAMPLE_SIZE

TOL = 1e-12
ORDERS = (2, 3, 4, 5)


# ----------------------------------------------------------------------------------------------
# reference: Texygen's loop over NLTK, one sentence_bleu call per hypothesis (slow on purpose)
# ----------------------------------------------------------------------------------------------


def _nltk():
    return pytest.importorskip("nltk.translate.bleu_score", reason="nltk is the reference implementation: "
                                                                   "pip install 'topic-lm-hf[test]'")


def nltk_bleu(hypotheses, references, n: int) -> float:
    bleu = _nltk()
    weight = tuple(1.0 / n for _ in range(n))
    smoothing = bleu.SmoothingFunction().method1
    scores = [bleu.sentence_bleu(references, h, weight, smoothing_function=smoothing) for h in hypotheses]
    return sum(scores) / len(scores)


def nltk_self_bleu(sentences, n: int) -> float:
    bleu = _nltk()
    weight = tuple(1.0 / n for _ in range(n))
    smoothing = bleu.SmoothingFunction().method1
    scores = [bleu.sentence_bleu(sentences[:i] + sentences[i + 1:], s, weight, smoothing_function=smoothing)
              for i, s in enumerate(sentences)]
    return sum(scores) / len(scores)


def nltk_orders(references_of, hypotheses, orders) -> dict[int, float]:
    """The same means for several n with one sentence_bleu call per hypothesis (a list of weights;
    NLTK computes the precisions once for the largest order, then each weight's score exactly as a
    separate call would). ``references_of(i)`` gives hypothesis i's references."""
    bleu = _nltk()
    weights = [tuple(1.0 / n for _ in range(n)) for n in orders]
    smoothing = bleu.SmoothingFunction().method1
    scores = [bleu.sentence_bleu(references_of(i), h, weights, smoothing_function=smoothing)
              for i, h in enumerate(hypotheses)]
    return {n: sum(s[j] for s in scores) / len(scores) for j, n in enumerate(orders)}


def assert_matches(result: BleuResult, expected: dict[int, float]):
    for n, value in expected.items():
        assert abs(result[n] - value) <= TOL, (n, result[n], value)


# A 4-word vocabulary makes n-gram matches, repeated n-grams (clipping) and length ties common.
SENTENCE = st.lists(st.sampled_from("abcd"), max_size=9)


# ----------------------------------------------------------------------------------------------
# property-based parity with NLTK
# ----------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(hyps=st.lists(SENTENCE, min_size=1, max_size=6), refs=st.lists(SENTENCE, min_size=1, max_size=6))
def test_bleu_equals_nltk(hyps, refs):
    result = texygen_bleu(hyps, refs, max_n=max(ORDERS))
    assert_matches(result, {n: nltk_bleu(hyps, refs, n) for n in ORDERS})
    assert (result.num_hypotheses, result.num_references) == (len(hyps), len(refs))


@settings(max_examples=200, deadline=None)
@given(sents=st.lists(SENTENCE, min_size=2, max_size=7), copies=st.lists(st.integers(0, 6), max_size=3))
def test_self_bleu_equals_nltk(sents, copies):
    sents = sents + [list(sents[c % len(sents)]) for c in copies]   # duplicates: a sentence equal to another one
    result = texygen_self_bleu(sents, max_n=max(ORDERS))
    assert_matches(result, {n: nltk_self_bleu(sents, n) for n in ORDERS})
    assert (result.num_hypotheses, result.num_references) == (len(sents), len(sents) - 1)


# ----------------------------------------------------------------------------------------------
# the cases that decide exactness, by hand and against NLTK
# ----------------------------------------------------------------------------------------------


def test_hypothesis_shorter_than_n_gets_method1_epsilon():
    # p1 = p2 = 1; orders 3 and 4 have no n-gram at all: method1 gives 0.1 / 1 each; r = 3, L = 2
    hyps, refs = [["a", "b"]], [["a", "b", "c"]]
    expected = math.exp(1 - 3 / 2) * math.exp((math.log(0.1) + math.log(0.1)) / 4)
    result = texygen_bleu(hyps, refs, max_n=4)
    assert abs(result[4] - expected) <= TOL
    assert_matches(result, {n: nltk_bleu(hyps, refs, n) for n in (2, 3, 4)})
    # one-token and empty hypotheses among longer ones
    hyps = [["a"], [], ["b", "a"], ["a", "b", "c", "d", "a"]]
    refs = [["a", "b", "c", "d"], ["b", "a"], ["c"]]
    assert_matches(texygen_bleu(hyps, refs, max_n=5), {n: nltk_bleu(hyps, refs, n) for n in ORDERS})
    assert texygen_bleu([[]], refs, max_n=3)[3] == 0.0


def test_brevity_penalty_tie_goes_to_the_shorter_reference():
    # L = 4 is as close to 3 as to 5; NLTK takes 3, so there is no penalty (the 5 would give exp(1 - 5/4))
    hyps, refs = [["a", "b", "c", "d"]], [["a", "b", "c"], ["x", "a", "b", "c", "d"]]
    result = texygen_bleu(hyps, refs, max_n=2)
    assert result[2] == pytest.approx(1.0, abs=TOL)       # every 1- and 2-gram is in the second reference
    assert_matches(result, {2: nltk_bleu(hyps, refs, 2)})


def test_clipping_by_the_largest_count_in_one_reference():
    # "a" occurs 3 times in the hypothesis, at most twice in one reference: clipped to 2, not 1 + 2
    hyps, refs = [["a", "a", "a"]], [["a", "b", "c"], ["a", "a", "d"]]
    result = texygen_bleu(hyps, refs, max_n=2)
    assert result[1] == pytest.approx(2 / 3, abs=TOL)
    assert_matches(result, {1: nltk_bleu(hyps, refs, 1), 2: nltk_bleu(hyps, refs, 2)})


def test_self_bleu_leaves_the_hypothesis_out_exactly():
    # two copies of one sentence: each finds the other, self-BLEU = 1
    assert texygen_self_bleu(["the cat sat", "the cat sat"], max_n=3)[3] == pytest.approx(1.0, abs=TOL)
    # "a a a" owns the maximum count of "a" (3), and of "a a"; the others see it, it sees only the second-largest
    sents = [["a", "a", "a"], ["a", "a", "b"], ["b", "a"], ["a", "a", "a"][:2], ["c", "a", "b", "a"]]
    assert_matches(texygen_self_bleu(sents, max_n=4), {n: nltk_self_bleu(sents, n) for n in (2, 3, 4)})
    # a sentence that shares no word with any other scores 0, as in NLTK
    sents = [["x", "y"], ["a", "b"], ["a", "b", "c"]]
    assert_matches(texygen_self_bleu(sents, max_n=2), {2: nltk_self_bleu(sents, 2)})


def test_strings_are_split_on_whitespace():
    hyps, refs = ["the cat  sat on\tthe mat"], ["the cat sat on a mat", "a dog sat"]
    tokens = texygen_bleu([h.split() for h in hyps], [r.split() for r in refs], max_n=3)
    assert texygen_bleu(hyps, refs, max_n=3).scores == tokens.scores
    assert tokens[2] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), abs=TOL)


# ----------------------------------------------------------------------------------------------
# Texygen's is_fast: the first 500 references / sentences
# ----------------------------------------------------------------------------------------------


def test_fast_keeps_the_first_500_references():
    rng = random.Random(0)
    refs = [[rng.choice("abcdefgh") for _ in range(rng.randint(2, 6))] for _ in range(TEXYGEN_SAMPLE_SIZE)]
    hyps = [["p", "q", "r", "s"], ["q", "r", "s", "t"], refs[3][:3]]
    refs += [list(h) for h in hyps[:2]]                    # exact copies beyond the cut
    fast, full = texygen_bleu(hyps, refs, max_n=4, fast=True), texygen_bleu(hyps, refs, max_n=4)
    assert fast.num_references == TEXYGEN_SAMPLE_SIZE and full.num_references == TEXYGEN_SAMPLE_SIZE + 2
    assert fast.num_hypotheses == full.num_hypotheses == 3     # every hypothesis is still scored
    assert "is_fast" in fast.protocol and "all references" in full.protocol
    assert_matches(fast, {n: nltk_bleu(hyps, refs[:TEXYGEN_SAMPLE_SIZE], n) for n in (2, 3, 4)})
    assert_matches(full, {n: nltk_bleu(hyps, refs, n) for n in (2, 3, 4)})
    assert full[4] > fast[4] + 0.5                         # the copies count only without the cut


def test_fast_self_bleu_keeps_the_first_500_sentences():
    rng = random.Random(1)
    words = [f"w{i}" for i in range(60)]
    sents = [[rng.choice(words) for _ in range(rng.randint(1, 6))] for _ in range(TEXYGEN_SAMPLE_SIZE)]
    sents += [[f"x{i}", "y", "z"] for i in range(10) for _ in range(2)]   # beyond the cut: 10 pairs of copies
    fast = texygen_self_bleu(sents, max_n=2, fast=True)
    assert (fast.num_hypotheses, fast.num_references) == (TEXYGEN_SAMPLE_SIZE, TEXYGEN_SAMPLE_SIZE - 1)
    assert "is_fast" in fast.protocol
    assert fast.scores == texygen_self_bleu(sents[:TEXYGEN_SAMPLE_SIZE], max_n=2).scores
    assert texygen_self_bleu(sents, max_n=2)[2] > fast[2] + 0.01    # the copies count only without the cut
    assert_matches(fast, {2: nltk_self_bleu(sents[:TEXYGEN_SAMPLE_SIZE], 2)})


# ----------------------------------------------------------------------------------------------
# input checks
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: texygen_bleu([], [["a"]]), "hypotheses is empty"),
    (lambda: texygen_bleu([["a"]], []), "references is empty"),
    (lambda: texygen_bleu([["a"]], [["a"]], max_n=0), "max_n must be an integer >= 1"),
    (lambda: texygen_bleu("a b", [["a"]]), "hypotheses must be a list"),
    (lambda: texygen_bleu([["a"], 3], [["a"]]), r"hypotheses\[1\]"),
    (lambda: texygen_self_bleu([["a"]]), "at least 2 sentences"),
    (lambda: texygen_self_bleu([], max_n=2), "sentences is empty"),
    (lambda: texygen_self_bleu([["a"], ["b"]], max_n=-1), "max_n must be an integer >= 1"),
])
def test_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ----------------------------------------------------------------------------------------------
# real data: Wikipedia sentences (wikipedia-sample, shipped with the package)
# ----------------------------------------------------------------------------------------------


def _sentences(name, count: int) -> list[list[str]]:
    import gzip

    from topic_lm_hf.data import EMBEDDED_CORPORA

    out = []
    with gzip.open(EMBEDDED_CORPORA[name], "rt", encoding="utf-8") as f:
        for line in f:                                   # one document per line, sentences tab-separated
            out += [s.split() for s in line.rstrip("\n").split("\t") if s.strip()]
            if len(out) >= count:
                return out[:count]
    return out


@pytest.mark.slow
def test_real_wikipedia_sentences_match_nltk():
    hyps = _sentences("wikipedia-sample", 300)
    refs = _sentences("wikipedia-sample/validation", 800)
    assert len(hyps) == 300 and len(refs) == 800

    start = time.perf_counter()
    ours = texygen_bleu(hyps, refs, max_n=4)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    expected = nltk_orders(lambda i: refs, hyps, (2, 3, 4))
    nltk_s = time.perf_counter() - start
    assert_matches(ours, expected)
    print(f"\nBLEU-2/3/4, 300 hypotheses vs 800 references: {[round(ours[n], 4) for n in (2, 3, 4)]}; "
          f"ours {ours_s:.3f} s, NLTK {nltk_s:.1f} s")

    sents = hyps[:200]
    start = time.perf_counter()
    ours = texygen_self_bleu(sents, max_n=4)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    expected = nltk_orders(lambda i: sents[:i] + sents[i + 1:], sents, (2, 3, 4))
    nltk_s = time.perf_counter() - start
    assert_matches(ours, expected)
    print(f"self-BLEU-2/3/4 of 200 sentences: {[round(ours[n], 4) for n in (2, 3, 4)]}; "
          f"ours {ours_s:.3f} s, NLTK {nltk_s:.1f} s")
