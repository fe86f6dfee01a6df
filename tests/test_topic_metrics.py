"""Topic coherence (NPMI presets) and topic diversity, checked against an independent brute force."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topic_lm_hf.evaluation.topics import (
    PRESETS,
    CoherenceResult,
    _count_windows,
    load_reference_corpus,
    topic_coherence,
    topic_diversity,
)

from conftest import DATA, requires_data
from topic_lm_hf.data import corpus_path

WIKI = DATA / "wiki" / "articles.jsonl.gz"


# ----------------------------------------------------------------------------------------------
# naive reference: enumerate every window explicitly (a port of the counting rules, slow on purpose)
# ----------------------------------------------------------------------------------------------


def naive_windows(docs: list[list[str]], window: int | None, edge: str) -> list[set[str]]:
    windows = []
    for doc in docs:
        L = len(doc)
        if window is None:                      # whole document
            windows.append(set(doc))
        elif edge == "partial":                 # Lau toolkit: tail_id = 1 .. L + w - 1
            for end in range(1, L + window):
                windows.append(set(doc[max(0, end - window):end]))
        elif L <= window:                       # gensim: a short document is one window
            windows.append(set(doc))
        else:                                   # gensim: full windows only
            for start in range(L - window + 1):
                windows.append(set(doc[start:start + window]))
    return windows


def naive_npmi(w1: str, w2: str, windows: list[set[str]], unseen: str) -> float:
    n = len(windows)
    c1 = sum(w1 in win for win in windows)
    c2 = sum(w2 in win for win in windows)
    c12 = sum(w1 in win and w2 in win for win in windows)
    if unseen == "epsilon":
        if c1 == 0 or c2 == 0:
            return -1.0
        eps = 1e-12
        return math.log((c12 / n + eps) / ((c1 / n) * (c2 / n))) / -math.log(c12 / n + eps)
    if c1 == 0 or c2 == 0 or c12 == 0:
        return 0.0 if unseen == "zero" else -1.0
    if c12 == n:
        return 1.0
    return math.log(c12 * n / (c1 * c2)) / -math.log(c12 / n)


def naive_coherence(topics, docs, window, edge, unseen, top_n) -> list[dict[int, float]]:
    windows = naive_windows(docs, window, edge)
    out = []
    for topic in topics:
        per_n = {}
        for n in top_n:
            n = min(n, len(topic))  # a short topic: its own length, once
            words = topic[:n]
            scores = [naive_npmi(words[i], words[j], windows, unseen)
                      for i in range(len(words)) for j in range(i + 1, len(words)) if words[i] != words[j]]
            per_n[n] = sum(scores) / len(scores)
        out.append(per_n)
    return out


def assert_matches_naive(result: CoherenceResult, topics, docs, tol: float = 1e-9) -> None:
    expected = naive_coherence(topics, docs, result.window, result.edge_windows, result.unseen_pair, result.top_n)
    assert result.n_windows == len(naive_windows(docs, result.window, result.edge_windows))
    for got, want in zip(result.per_topic_per_n, expected):
        assert got.keys() == want.keys()
        for n in want:
            assert got[n] == pytest.approx(want[n], abs=tol), (n, got, want)
    per_topic = [float(np.mean(list(d.values()))) for d in expected]
    assert result.per_topic == pytest.approx(per_topic, abs=tol)
    assert result.score == pytest.approx(float(np.mean(per_topic)), abs=tol)
    assert result.median == pytest.approx(float(np.median(per_topic)), abs=tol)


TOY_DOCS = [["a", "b", "c", "a"], ["b", "x", "a"], ["c", "c"]]


# ----------------------------------------------------------------------------------------------
# 1. lau2014
# ----------------------------------------------------------------------------------------------


def test_lau2014_by_hand():
    # window 3, partial edges. Windows (end = 1 .. L + 2):
    #   doc 1 "a b c a": [a] [a b] [a b c] [b c a] [c a] [a]   -> 6
    #   doc 2 "b x a":   [b] [b x] [b x a] [x a] [a]           -> 5
    #   doc 3 "c c":     [c] [c c] [c c] [c]                   -> 4      N = 15
    # c_a = 6 + 3 = 9, c_b = 3 + 3 = 6, c_ab = 3 + 1 = 4
    # NPMI(a, b) = log(4 * 15 / (9 * 6)) / -log(4 / 15) = log(1.1111) / log(3.75)
    #            = 0.105361 / 1.321756 = 0.079713
    result = topic_coherence([["a", "b"]], TOY_DOCS, preset="lau2014", window=3, top_n=(2,))
    assert result.n_windows == 15
    assert result.score == pytest.approx(0.079713, abs=1e-6)
    assert result.score == pytest.approx(math.log(60 / 54) / math.log(15 / 4), abs=1e-12)
    # a pair never seen together scores 0 (c_bc: doc 1 [a b c] [b c a] -> 2, so use "x" and "c")
    zero = topic_coherence([["x", "c"]], TOY_DOCS, preset="lau2014", window=3, top_n=(2,))
    assert zero.score == 0.0


def test_lau2014_matches_naive_and_records_protocol():
    topics = [["a", "b", "c", "x", "a"], ["c", "x", "b", "zzz"]]
    result = topic_coherence(topics, TOY_DOCS, preset="lau2014", window=3, top_n=(2, 3, 5))
    assert_matches_naive(result, topics, TOY_DOCS)
    assert (result.preset, result.window, result.top_n, result.unseen_pair, result.edge_windows) == (
        "custom", 3, (2, 3, 5), "zero", "partial")
    assert result.reference.startswith("in-memory documents: 3 documents, 9 tokens, sha1 ")

    default = topic_coherence(topics, TOY_DOCS)  # the preset as is keeps its name
    assert (default.preset, default.window, default.top_n) == ("lau2014", 20, (5, 10, 15, 20))
    assert_matches_naive(default, topics, TOY_DOCS)
    same = topic_coherence(topics, TOY_DOCS, window=20, unseen_pair="zero")  # overrides equal to the preset
    assert same.preset == "lau2014"
    d = default.as_dict()
    assert d["top_n"] == [5, 10, 15, 20] and d["preset"] == "lau2014" and d["n_windows"] == default.n_windows


# ----------------------------------------------------------------------------------------------
# 2. gensim_c_npmi
# ----------------------------------------------------------------------------------------------


def test_gensim_preset_matches_naive():
    topics = [["a", "b", "c"], ["c", "x", "zzz"]]
    result = topic_coherence(topics, TOY_DOCS, preset="gensim_c_npmi", window=2, top_n=(3,))
    assert (result.preset, result.edge_windows, result.unseen_pair) == ("custom", "full", "epsilon")
    # full windows of 2: doc 1 -> 3, doc 2 -> 2, doc 3 -> 1  => N = 6
    assert result.n_windows == 6
    assert_matches_naive(result, topics, TOY_DOCS)
    # unseen pair (a, c)? doc 1 windows [a b] [b c] [c a]: seen. (x, c) is unseen:
    # c_x = 2, c_c = 3 (doc 1: [b c] [c a]; doc 3: [c c]) -> log(1e-12 / (2/6 * 3/6)) / -log(1e-12)
    unseen = topic_coherence([["x", "c"]], TOY_DOCS, preset="gensim_c_npmi", window=2)
    assert unseen.score == pytest.approx(math.log(1e-12 / (2 / 6 * 3 / 6)) / -math.log(1e-12), abs=1e-12)
    assert unseen.score == pytest.approx(-1 + math.log(6) / 27.631, abs=1e-4)


def _corpus_without_close_repeats(topic_words, seed=0, n_docs=60, window=10):
    """Random documents in which no topic word repeats within `window` tokens: there gensim's
    incremental window update is exact, so gensim must agree with us to rounding."""
    rng = random.Random(seed)
    filler = [f"f{i}" for i in range(15)]
    vocab = list(topic_words) + filler
    docs = []
    for d in range(n_docs):
        doc: list[str] = []
        for _ in range(rng.randint(1 if d else 0, 40)):
            word = rng.choice(vocab)
            while word in topic_words and word in doc[-(window - 1):]:
                word = rng.choice(vocab)
            doc.append(word)
        docs.append(doc)
    return docs


def test_gensim_parity():
    gensim = pytest.importorskip(
        "gensim", reason="gensim is not installed (optional oracle; the naive brute force tests still run)")
    from gensim.corpora import Dictionary
    from gensim.models.coherencemodel import CoherenceModel

    words = [f"w{i}" for i in range(12)]
    topics = [words[:6], words[4:10], [words[0], words[11], words[7], words[2], words[9], words[5]]]
    docs = _corpus_without_close_repeats(set(words), window=5)
    docs = [doc for doc in docs if doc]  # gensim counts an empty text as a window too; keep it simple
    ours = topic_coherence(topics, docs, preset="gensim_c_npmi", window=5, top_n=(6,))
    assert_matches_naive(ours, topics, docs)
    cm = CoherenceModel(topics=topics, texts=docs, dictionary=Dictionary(docs), coherence="c_npmi",
                        window_size=5, topn=6, processes=1)
    assert ours.per_topic == pytest.approx(cm.get_coherence_per_topic(), abs=1e-3)
    assert ours.score == pytest.approx(cm.get_coherence(), abs=1e-3)
    print(f"gensim {gensim.__version__} parity: max |diff| per topic = "
          f"{max(abs(a - b) for a, b in zip(ours.per_topic, cm.get_coherence_per_topic())):.2e}")


# ----------------------------------------------------------------------------------------------
# 3. etm
# ----------------------------------------------------------------------------------------------


def test_etm_document_cooccurrence_and_minus_one():
    docs = [["a", "b", "a"], ["a", "c"], ["b", "c", "a"], ["d"]]
    result = topic_coherence([["a", "b", "zzz"]], docs, preset="etm", top_n=(3,))
    assert (result.window, result.edge_windows, result.unseen_pair) == (None, "full", "minus_one")
    assert result.n_windows == 4  # D documents
    # D_a = 3, D_b = 2, D_ab = 2: NPMI = log(2 * 4 / (3 * 2)) / -log(2 / 4) = log(4/3) / log 2 = 0.415037
    # ETM writes it as -1 + (log D_a + log D_b - 2 log D) / (log D_ab - log D): the same number.
    npmi_ab = math.log(4 / 3) / math.log(2)
    assert npmi_ab == pytest.approx(-1 + (math.log(3) + math.log(2) - 2 * math.log(4)) / (math.log(2) - math.log(4)))
    assert result.score == pytest.approx((npmi_ab - 1 - 1) / 3, abs=1e-12)  # (a, zzz), (b, zzz) -> -1
    assert_matches_naive(result, [["a", "b", "zzz"]], docs)
    # (c, d) are both present but never in one document: -1 as well
    assert topic_coherence([["c", "d"]], docs, preset="etm").score == -1.0


# ----------------------------------------------------------------------------------------------
# 4. property test: fast counting == brute force, for every preset
# ----------------------------------------------------------------------------------------------

ALPHABET = list("abcdef")
word = st.sampled_from(ALPHABET + ["zz"])
topic = st.lists(word, min_size=2, max_size=6, unique=True).flatmap(
    lambda t: st.just(t) | st.just(t + [t[0]]))  # sometimes a repeated word (skipped as a pair)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.lists(st.sampled_from(ALPHABET), max_size=14), min_size=1, max_size=5),
       topics=st.lists(topic, min_size=1, max_size=3),
       top_n=st.lists(st.integers(2, 7), min_size=1, max_size=3, unique=True).map(tuple),
       window=st.integers(1, 6),
       preset=st.sampled_from(sorted(PRESETS)))
def test_fast_equals_naive(docs, topics, top_n, window, preset):
    kwargs = {"top_n": top_n}
    if preset != "etm":
        kwargs["window"] = window
    if not any(docs):  # a reference without a token is refused (NPMI of no counts would read 0)
        with pytest.raises(ValueError, match="has no tokens"):
            topic_coherence(topics, docs, preset=preset, **kwargs)
        return
    result = topic_coherence(topics, docs, preset=preset, **kwargs)
    assert_matches_naive(result, topics, docs)


def test_pair_batching_gives_same_counts():
    rng = np.random.default_rng(0)
    docs = [list(rng.choice(list("abcdefgh"), size=rng.integers(0, 30))) for _ in range(40)]
    corpus = load_reference_corpus(docs)
    ids = np.array(sorted(corpus.vocab.values()))
    pairs = np.array([(i, j) for i in range(len(ids)) for j in range(i + 1, len(ids))])
    for window, edge in [(4, "partial"), (4, "full"), (None, "full")]:
        full = _count_windows(corpus, ids, pairs, window, edge)
        batched = _count_windows(corpus, ids, pairs, window, edge, max_queries=3)
        for x, y in zip(full, batched):
            np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------------------------
# reference corpus loading
# ----------------------------------------------------------------------------------------------


def test_reference_formats_give_the_same_token_stream(tmp_path):
    sentences = [[["The", "war", "began"], ["army", "marched"]], [["Peace", "came"]], []]
    flat = [["the", "war", "began", "army", "marched"], ["peace", "came"], []]
    (tmp_path / "lau").mkdir()
    lau = tmp_path / "lau" / "ref.txt"
    lau.write_text("the war began\tarmy marched\npeace came\n\n", encoding="utf-8")
    jsonl = tmp_path / "ref.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        for text in ["The war began. Army marched!", "Peace came (1945)", ""]:
            f.write(json.dumps({"id": "x", "title": "t", "text": text}) + "\n")

    corpora = [load_reference_corpus(x) for x in (sentences, flat, lau, jsonl, tmp_path / "lau")]
    assert len({c.sha1 for c in corpora}) == 1
    for c in corpora:
        assert c.n_documents == 3 and c.n_tokens == 7
        np.testing.assert_array_equal(c.document_lengths, [5, 2, 0])
    assert "ref.jsonl.gz" in corpora[3].description and corpora[3].sha1[:12] in corpora[3].description
    assert load_reference_corpus(jsonl, max_documents=1).n_tokens == 5
    assert load_reference_corpus(corpora[0]) is corpora[0]
    assert load_reference_corpus(sentences, lowercase=False).words[0] == "The"
    # passing a path to topic_coherence tokenizes it on the fly
    r1 = topic_coherence([["war", "army", "peace"]], jsonl, window=3, top_n=(3,))
    r2 = topic_coherence([["war", "army", "peace"]], corpora[0], window=3, top_n=(3,))
    assert r1.per_topic == r2.per_topic and r1.reference.endswith(r2.reference[-12:])


def test_reference_from_datasets():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"sentences": [[["a", "b"], ["c"]], [["b", "a"]]]})
    corpus = load_reference_corpus(ds)
    assert corpus.sha1 == load_reference_corpus([["a", "b", "c"], ["b", "a"]]).sha1
    assert load_reference_corpus(ds, max_documents=1).n_tokens == 3


def test_empty_documents_count_windows_like_the_tools():
    docs = [["a", "b"], []]
    lau = topic_coherence([["a", "b"]], docs, preset="lau2014", window=3)
    assert lau.n_windows == (2 + 2) + 2  # the toolkit counts L + w - 1 windows, also for L = 0
    gensim = topic_coherence([["a", "b"]], docs, preset="gensim_c_npmi", window=3)
    assert gensim.n_windows == 2  # one window per short (or empty) text


def test_bad_input():
    with pytest.raises(ValueError, match="empty"):
        topic_coherence([], TOY_DOCS)
    with pytest.raises(ValueError, match="fewer than 2 distinct"):
        topic_coherence([["a", "b"], ["c"]], TOY_DOCS)
    with pytest.raises(ValueError, match="fewer than 2 distinct"):
        topic_coherence([["a", "a", "b"]], TOY_DOCS, top_n=(2,))
    with pytest.raises(ValueError, match="list of words"):
        topic_coherence(["a b c"], TOY_DOCS)
    with pytest.raises(ValueError, match="'nope'"):
        topic_coherence([["a", "b"]], TOY_DOCS, preset="nope")
    with pytest.raises(ValueError, match="window must be .* got 0"):
        topic_coherence([["a", "b"]], TOY_DOCS, window=0)
    with pytest.raises(ValueError, match="got 1"):
        topic_coherence([["a", "b"]], TOY_DOCS, top_n=1)
    with pytest.raises(ValueError, match="repeated"):
        topic_coherence([["a", "b"]], TOY_DOCS, top_n=(5, 5))
    with pytest.raises(ValueError, match="'never'"):
        topic_coherence([["a", "b"]], TOY_DOCS, unseen_pair="never")
    with pytest.raises(ValueError, match="'half'"):
        topic_coherence([["a", "b"]], TOY_DOCS, edge_windows="half")
    with pytest.raises(ValueError, match="partial"):
        topic_coherence([["a", "b"]], TOY_DOCS, window=None, edge_windows="partial")
    with pytest.raises(ValueError, match="missing"):
        topic_coherence([["a", "b"]], TOY_DOCS, preset="custom", window=3)
    with pytest.raises(FileNotFoundError):
        load_reference_corpus("/nonexistent/ref.jsonl")
    with pytest.raises(ValueError, match="format"):
        load_reference_corpus(Path(__file__))
    # window=None on the Lau preset is the toolkit's "window_size = 0": allowed, recorded as full
    r = topic_coherence([["a", "b"]], TOY_DOCS, window=None, top_n=(2,))
    assert (r.preset, r.window, r.edge_windows, r.n_windows) == ("custom", None, "full", 3)
    custom = topic_coherence([["a", "b"]], TOY_DOCS, preset="custom", window=3, top_n=2,
                             unseen_pair="zero", edge_windows="partial")
    assert custom.score == pytest.approx(math.log(60 / 54) / math.log(15 / 4))


# ----------------------------------------------------------------------------------------------
# 5. real data
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reference", ["wikipedia-sample/npmi-reference",
                                       pytest.param(WIKI, marks=requires_data("wiki", "articles.jsonl.gz"))],
                         ids=["shipped", "full"])
def test_wikipedia_coherent_topic_beats_random_words(reference):
    corpus = load_reference_corpus(reference, max_documents=300)
    assert corpus.n_documents == 300 and corpus.n_tokens > 100_000
    coherent = ["war", "army", "military", "soldiers", "battle"]
    random_words = ["banana", "theorem", "saxophone", "parliament", "glacier"]
    result = topic_coherence([coherent, random_words], corpus, preset="lau2014")
    assert result.per_topic[0] > 0.1
    assert result.per_topic[0] > result.per_topic[1] + 0.1
    assert corpus_path(reference).name in result.reference and "first 300 documents" in result.reference


# ----------------------------------------------------------------------------------------------
# 6. diversity
# ----------------------------------------------------------------------------------------------


def test_topic_diversity():
    topics = [["a", "b", "c", "x"], ["a", "d", "e", "y"], ["f", "g", "b", "z"]]
    # top-3: a b c | a d e | f g b -> 7 distinct of 9 slots; exclusive words: c d e f g -> 5 of 9
    assert topic_diversity(topics, k=3) == pytest.approx(7 / 9)
    assert topic_diversity(topics, k=3, variant="exclusive") == pytest.approx(5 / 9)
    assert topic_diversity(topics, k=4) == pytest.approx(10 / 12)
    assert topic_diversity(topics, k=4, variant="exclusive") == pytest.approx(8 / 12)
    assert topic_diversity([["a", "b"], ["c", "d"]], k=2, variant="exclusive") == 1.0
    assert topic_diversity([["a", "a"]], k=2) == 0.5  # a repeated word is one unique word...
    assert topic_diversity([["a", "a"]], k=2, variant="exclusive") == 0.0  # ...and not exclusive
    with pytest.raises(ValueError, match="got 0"):
        topic_diversity(topics, k=0)
    with pytest.raises(ValueError, match="fewer than k=25"):
        topic_diversity(topics)
    with pytest.raises(ValueError, match="empty"):
        topic_diversity([], k=3)
    with pytest.raises(ValueError, match="'other'"):
        topic_diversity(topics, k=3, variant="other")
