"""The package's metrics as ``evaluate`` modules: each loads offline from the installed package and gives the
numbers of the package's function on the reference cases of the function's own tests (NLTK's BLEU, the
hand-counted scorer cases, the naive NPMI counter, the hand-counted diversity)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

evaluate = pytest.importorskip("evaluate", reason="the evaluate modules need the evaluate library (a dependency)")

from test_bleu import ORDERS, SENTENCE, nltk_bleu, nltk_self_bleu  # noqa: E402
from test_topic_metrics import TOY_DOCS, assert_matches_naive  # noqa: E402

from topic_lm_hf import METRICS, load_metric, metric_path, topic_coherence  # noqa: E402
from topic_lm_hf.tasks import majority_baseline, score_wsd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-12


@pytest.fixture(scope="module")
def modules():
    return {name: load_metric(name) for name in METRICS}


def test_every_module_loads_offline_in_a_fresh_interpreter_and_combines(tmp_path):
    script = f"""
import json, evaluate, topic_lm_hf
results = {{name: type(topic_lm_hf.load_metric(name)).__name__ for name in topic_lm_hf.METRICS}}
texts = evaluate.combine([topic_lm_hf.load_metric("texygen_bleu"), topic_lm_hf.load_metric("texygen_self_bleu"),
                          evaluate.load({str(metric_path("distinct_n"))!r})])
results["combined"] = texts.compute(predictions=["the court ruled", "the court said", "police said"],
                                    reference_texts=["the court ruled on the case"], max_n=2, n=1)
print(json.dumps(results))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "m"),
           "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {*METRICS, "combined"}
    combined = results.pop("combined")
    assert set(combined) >= {"bleu_1", "bleu_2", "self_bleu_1", "self_bleu_2", "distinct_1"}  # each module's own
    assert combined["distinct_1"] == pytest.approx(5 / 8)  # the, court, ruled, said, police of 8 tokens


def test_every_module_ships_with_the_package():
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["topic_lm_hf"]
    package = ROOT / "src" / "topic_lm_hf"
    shipped = {p for pattern in globs for p in package.glob(pattern)}
    for name in METRICS:
        assert metric_path(name) / f"{name}.py" in shipped, name
    with pytest.raises(ValueError, match="unknown metric 'bleu'.*npmi"):
        metric_path("bleu")


# ----------------------------------------------------------------------------------------------
# the same numbers as the package's functions, on their reference cases
# ----------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(hyps=st.lists(SENTENCE.filter(len), min_size=1, max_size=5),
       refs=st.lists(SENTENCE.filter(len), min_size=1, max_size=5))
def test_texygen_bleu_module_equals_nltk(modules, hyps, refs):
    result = modules["texygen_bleu"].compute(predictions=hyps, reference_texts=refs, max_n=max(ORDERS))
    for n in ORDERS:
        assert abs(result[f"bleu_{n}"] - nltk_bleu(hyps, refs, n)) <= TOL
    assert (result["num_hypotheses"], result["num_references"]) == (len(hyps), len(refs))
    as_strings = modules["texygen_bleu"].compute(predictions=[" ".join(h) for h in hyps],
                                                 reference_texts=[" ".join(r) for r in refs], max_n=max(ORDERS))
    assert as_strings == result  # strings are split on whitespace


@settings(max_examples=40, deadline=None)
@given(sents=st.lists(SENTENCE.filter(len), min_size=2, max_size=6))
def test_texygen_self_bleu_module_equals_nltk(modules, sents):
    result = modules["texygen_self_bleu"].compute(predictions=sents, max_n=max(ORDERS))
    for n in ORDERS:
        assert abs(result[f"self_bleu_{n}"] - nltk_self_bleu(sents, n)) <= TOL


def test_wsd_module_gives_the_hand_counted_scorer_cases(modules):
    wsd = modules["wsd"]
    # a right; b half right (y of {y, q}); c wrong; d abstained; e is not a gold id (empty gold: ignored)
    result = wsd.compute(predictions=[["x"], ["y", "q"], ["u"], [], ["x"]],
                         references=[["x"], ["y", "z"], ["w"], ["v"], []])
    assert (result["P"], result["R"], result["F1"]) == ("50.0", "37.5", "42.9")
    assert (result["correct"], result["wrong"], result["num_gold"], result["num_scored"]) == (1.5, 1.5, 4, 3)
    expected = score_wsd({"a": "x", "b": ["y", "q"], "c": "u", "e": "x"},
                         {"a": "x", "b": {"y", "z"}, "c": ["w"], "d": "v"})
    assert (result["precision"], result["recall"], result["f1"]) == (expected.precision, expected.recall, expected.f1)
    # any one gold key is enough; an abstention lowers recall only
    result = wsd.compute(predictions=[["x"], ["z"], []], references=[["x"], ["y", "z"], ["w"]])
    assert (result["P"], result["R"], result["F1"]) == ("100.0", "66.7", "80.0")
    # an empty-string answer is wrong: a earns 1/2 (the scorer's double space)
    assert wsd.compute(predictions=[["", "x"], ["y"]], references=[["x"], ["y"]])["P"] == "75.0"
    # Java's rounding and NaN: all wrong gives F1 NaN; 1 right of 400 is 0.3 %
    assert wsd.compute(predictions=[["y"]], references=[["x"]])["F1"] == "NaN"
    assert wsd.compute(predictions=[["x"]] + [[]] * 399, references=[["x"]] * 400)["R"] == "0.3"


def test_npmi_module_matches_the_naive_counter_and_returns_its_protocol(modules):
    topics = [["a", "b", "c", "x", "a"], ["c", "x", "b", "zzz"]]
    result = modules["npmi"].compute(predictions=topics, reference=TOY_DOCS, window=3, top_n=[2, 3, 5])
    expected = topic_coherence(topics, TOY_DOCS, window=3, top_n=(2, 3, 5))
    assert_matches_naive(expected, topics, TOY_DOCS)
    assert result["npmi"] == expected.score and result["npmi_per_topic"] == expected.per_topic
    assert result["protocol"] == {"preset": "custom", "window": 3, "top_n": [2, 3, 5], "unseen_pair": "zero",
                                  "edge_windows": "partial", "reference": expected.reference,
                                  "n_windows": expected.n_windows}
    by_hand = modules["npmi"].compute(predictions=[["a", "b"]], reference=TOY_DOCS, window=3, top_n=[2])
    assert by_hand["npmi"] == pytest.approx(0.079713, abs=1e-6)  # test_lau2014_by_hand's count
    assert modules["npmi"].compute(predictions=topics, reference=TOY_DOCS)["protocol"]["preset"] == "lau2014"
    with pytest.raises(ValueError, match="npmi needs reference="):
        modules["npmi"].compute(predictions=topics)


def test_topic_diversity_and_distinct_n_modules_give_the_hand_counts(modules):
    topics = [["a", "b", "c", "x"], ["a", "d", "e", "y"], ["f", "g", "b", "z"]]
    assert modules["topic_diversity"].compute(predictions=topics, k=3)["topic_diversity"] == pytest.approx(7 / 9)
    assert modules["topic_diversity"].compute(predictions=topics, k=4, variant="exclusive")["topic_diversity"] == \
        pytest.approx(8 / 12)
    # "a b a b" + "c d": unigrams a b c d of 6; bigrams (a b) (b a) (c d) of 4
    result = modules["distinct_n"].compute(predictions=["a b a b", "c d"])
    assert result == {"distinct_1": pytest.approx(4 / 6), "distinct_2": pytest.approx(3 / 4)}
    assert modules["distinct_n"].compute(predictions=[["a", "b", "a", "b"]], n=3) == {"distinct_3": 1.0}


def test_classification_module_and_the_majority_baseline(modules):
    result = modules["classification"].compute(predictions=[0, 1, 1, 2], references=[0, 1, 0, 2])
    # accuracy 3/4; F1 per class: 0 -> 2/3, 1 -> 2/3, 2 -> 1
    assert result == {"accuracy": 0.75, "macro_f1": pytest.approx((2 / 3 + 2 / 3 + 1) / 3)}
    # the majority class of the training labels (a tie goes to the smaller label)
    assert majority_baseline([2, 2, 1, 1, 0], [1, 2, 1]) == {"accuracy": pytest.approx(2 / 3),
                                                             "macro_f1": pytest.approx(0.4)}


def test_a_misspelt_argument_is_an_error_and_another_modules_argument_is_left_to_it(modules):
    with pytest.raises(TypeError, match=r"distinct_n got unexpected argument\(s\) \['order'\]; it takes \['n'\]"):
        modules["distinct_n"].compute(predictions=["a b"], order=2)
    assert modules["distinct_n"].compute(predictions=["a b"], max_n=2, n=1) == {"distinct_1": 1.0}  # max_n: BLEU's


@pytest.mark.parametrize("name, kwargs, message", [
    ("classification", dict(predictions=[0, 1], references=None), "classification needs references="),
    ("distinct_n", dict(predictions=["a b"], n=1.5), r"n must be a whole number >= 1 \(an n-gram order\), got 1.5"),
    ("distinct_n", dict(predictions=["a b"], n="2"), "got '2'"),
    ("distinct_n", dict(predictions=["a b"], n=True), "got True"),
    ("distinct_n", dict(predictions=["a b"], n=[]), "distinct_n: n is empty"),
])
def test_a_missing_reference_or_an_order_that_is_not_a_whole_number_is_one_line(modules, name, kwargs, message):
    """references=None was a TypeError on len; n=1.5 and n='2' were TypeErrors, n=True gave 'distinct_True' and
    n=[] an empty result."""
    with pytest.raises(ValueError, match=message):
        modules[name].compute(**kwargs)


def test_a_binary_npmi_reference_is_one_clear_line(modules, tmp_path):
    """A binary file under a text suffix was a bare UnicodeDecodeError from the middle of the reader."""
    import gzip

    for path, write in [(tmp_path / "ref.txt", lambda p, b: p.write_bytes(b)),
                        (tmp_path / "ref.txt.gz", lambda p, b: p.write_bytes(gzip.compress(b)))]:
        write(path, bytes(range(256)) * 8)
        with pytest.raises(ValueError, match=r"is not UTF-8 text \(byte \d+ of a line\): give a text corpus"):
            modules["npmi"].compute(predictions=[["a", "b"]], reference=str(path))
