"""Word sense disambiguation foundations: the scorer (hand-counted cases of docs/nclm.md §6 items
13-15, checked there against the real Scorer.java) and Raganato-format corpora, on hand-made
files and on the sets of ../shared/data/wsd."""

import gzip
import math

import pytest

from conftest import DATA, requires_data
from topic_lm_hf.tasks import iter_wsd_instances, load_wsd_corpus, read_key_file, score_wsd, wsd_gold, write_key_file

WSD = DATA / "wsd"
TEST_SETS = ("senseval2", "senseval3", "semeval2007")


def on_set(name, *expected):
    """A parameter of one shipped test set, skipped with the reason when its folder is absent."""
    return pytest.param(name, *expected, marks=requires_data("wsd", name), id=name)


def score_lines(tmp_path, gold_lines, system_lines):
    """Score two key files written verbatim (so the scorer's reading quirks are exercised)."""
    gold, system = tmp_path / "gold.key.txt", tmp_path / "system.key.txt"
    gold.write_text("".join(line + "\n" for line in gold_lines), encoding="utf-8")
    system.write_text("".join(line + "\n" for line in system_lines), encoding="utf-8")
    return score_wsd(system, gold)


# ----------------------------------------------------------------------------------------------
# scorer (no data needed)
# ----------------------------------------------------------------------------------------------


def test_scorer_fractional_credit_and_ignored_ids(tmp_path):
    # item 13: a right; b half right (y of {y, q}); c wrong; e is not a gold id (ignored); d abstained
    gold = ["a x", "b y z", "c w", "d v"]
    score = score_lines(tmp_path, gold, ["a x", "b y q", "c u", "e x"])
    assert score.formatted() == {"P": "50.0", "R": "37.5", "F1": "42.9"}
    assert (score.correct, score.wrong, score.num_gold, score.num_scored, score.num_ignored) == (1.5, 1.5, 4, 3, 1)
    assert str(score) == "P=\t50.0%\nR=\t37.5%\nF1=\t42.9%"
    # the same as mappings: a key, several keys, or a set of gold keys
    from_dicts = score_wsd({"a": "x", "b": ["y", "q"], "c": "u", "e": "x"},
                           {"a": "x", "b": {"y", "z"}, "c": ["w"], "d": "v"})
    assert from_dicts == score


def test_scorer_any_gold_key_and_abstention(tmp_path):
    # item 14: any one of several gold keys gives full credit; abstaining lowers recall only
    score = score_lines(tmp_path, ["a x", "b y z", "c w"], ["a x", "b z"])
    assert score.formatted() == {"P": "100.0", "R": "66.7", "F1": "80.0"}
    assert score_wsd({"a": "x", "b": "z", "c": None}, {"a": "x", "b": ["y", "z"], "c": "w"}) == score


def test_scorer_reading_quirks(tmp_path):
    gold = ["a x", "b y"]
    # item 15: a double space is an empty answer, wrong: a earns 1/2
    assert score_lines(tmp_path, gold, ["a  x", "b y"]).formatted() == {"P": "75.0", "R": "75.0", "F1": "75.0"}
    # repeated lines merge into one set: a {x} right, b {q, y} half right
    assert score_lines(tmp_path, gold, ["a x", "a x", "b q", "b y"]).formatted() == {"P": "75.0", "R": "75.0",
                                                                                      "F1": "75.0"}
    # a TAB-separated line has one field: skipped, an abstention
    assert score_lines(tmp_path, gold, ["a\tx", "b y"]).formatted() == {"P": "100.0", "R": "50.0", "F1": "66.7"}
    # Java's split drops trailing empty fields: a trailing space is not an empty answer
    assert score_lines(tmp_path, gold, ["a x ", "b y"]).formatted()["P"] == "100.0"
    assert read_key_file(tmp_path / "system.key.txt") == {"a": ["x"], "b": ["y"]}


def test_scorer_nan_and_java_rounding():
    nothing = score_wsd({"z": "x"}, {"a": "x"})
    assert math.isnan(nothing.precision) and nothing.recall == 0.0 and math.isnan(nothing.f1)
    assert nothing.formatted() == {"P": "NaN", "R": "0.0", "F1": "NaN"}
    # all wrong: P = R = 0, and Java's F1 = 0/0 = NaN
    assert score_wsd({"a": "y"}, {"a": "x"}).formatted() == {"P": "0.0", "R": "0.0", "F1": "NaN"}
    # 1 right of 400: R = 0.25 %, which Java's %.1f rounds half up (Python's would give 0.2)
    gold = {f"i{n}": "x" for n in range(400)}
    assert score_wsd({"i0": "x"}, gold).formatted()["R"] == "0.3"


def test_write_key_file_round_trip(tmp_path):
    predictions = {"a": "x", "b": ["y", "q"], "c": None, "d": []}
    write_key_file(predictions, tmp_path / "system.key.txt")
    assert (tmp_path / "system.key.txt").read_text() == "a x\nb y q\n"
    gold = {"a": "x", "b": "y", "c": "w"}
    assert score_wsd(tmp_path / "system.key.txt", gold) == score_wsd(predictions, gold)
    for bad in ({"a": "x y"}, {"a": ""}, {"a b": "x"}, {"a": "x\ty"}):
        with pytest.raises(ValueError, match="without whitespace"):
            write_key_file(bad, tmp_path / "bad.key.txt")


# ----------------------------------------------------------------------------------------------
# corpora on hand-made files
# ----------------------------------------------------------------------------------------------


TOY_XML = """<?xml version="1.0" encoding="UTF-8" ?>
<corpus lang="en" source="toy">
<text id="d000">
<sentence id="d000.s000">
<wf lemma="the" pos="DET">The</wf>
<instance id="d000.s000.t000" lemma="bass" pos="NOUN">bass</instance>
<instance id="d000.s000.t001" lemma="be" pos="VERB">was</instance>
<instance id="d000.s000.t002" lemma="fit" pos="ADJ">fit</instance>
</sentence>
<sentence id="d000.s001">
<wf lemma="ok" pos="X">OK</wf>
</sentence>
</text>
<text id="d001">
<sentence id="d001.s000">
<instance id="d001.s000.t000" lemma="bass" pos="NOUN">Bass</instance>
</sentence>
</text>
</corpus>
"""
TOY_GOLD = """d000.s000.t000 bass%1:13:02::
d000.s000.t001 be%2:42:03:: be%2:42:00::
d000.s000.t002 fit%5:00:00:ready:00
d001.s000.t000 bass%1:13:02:: bank%1:14:00::
"""
@pytest.fixture
def toy_set(tmp_path):
    folder = tmp_path / "toy"
    folder.mkdir()
    with gzip.open(folder / "toy.data.xml.gz", "wt", encoding="utf-8") as f:
        f.write(TOY_XML)
    (folder / "toy.gold.key.txt").write_text(TOY_GOLD, encoding="utf-8")
    return folder


def test_load_wsd_corpus_rows(toy_set):
    corpus = load_wsd_corpus(toy_set)
    assert corpus.column_names == ["document_id", "sentence_id", "tokens", "lemmas", "pos", "instances"]
    assert corpus["document_id"] == ["d000", "d000", "d001"]
    assert corpus["sentence_id"] == ["d000.s000", "d000.s001", "d001.s000"]
    first = corpus[0]
    assert first["tokens"] == ["The", "bass", "was", "fit"] and first["pos"] == ["DET", "NOUN", "VERB", "ADJ"]
    assert first["instances"][1] == {"id": "d000.s000.t001", "position": 2, "lemma": "be", "pos": "VERB",
                                     "gold": ["be%2:42:03::", "be%2:42:00::"]}
    assert corpus[1]["instances"] == []  # a sentence without instances stays: it is context
    assert [i["id"] for i in iter_wsd_instances(corpus)] == ["d000.s000.t000", "d000.s000.t001", "d000.s000.t002",
                                                              "d001.s000.t000"]
    assert wsd_gold(toy_set)["d000.s000.t001"] == ["be%2:42:03::", "be%2:42:00::"]
    # the XML file itself also works, and a missing gold file is an error
    assert load_wsd_corpus(toy_set / "toy.data.xml.gz")["sentence_id"] == corpus["sentence_id"]
    (toy_set / "toy.gold.key.txt").unlink()
    with pytest.raises(FileNotFoundError, match="gold"):
        load_wsd_corpus(toy_set)


# ----------------------------------------------------------------------------------------------
# the real sets of ../shared/data (docs/nclm.md §5 "Data here")
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def semcor():
    if not (WSD / "semcor").exists():
        pytest.skip(f"real corpus {WSD / 'semcor'} is absent; set TOPIC_LM_DATA to its folder")
    return load_wsd_corpus(WSD / "semcor")


@pytest.fixture(scope="session")
def test_sets():
    return {name: load_wsd_corpus(WSD / name) for name in TEST_SETS if (WSD / name).exists()}


def corpus_counts(corpus):
    instances = list(iter_wsd_instances(corpus))
    return {"instances": len(instances), "documents": len(set(corpus["document_id"])), "sentences": len(corpus),
            "multi_key": sum(len(i["gold"]) > 1 for i in instances)}


@requires_data("wsd", "semcor")
def test_semcor_counts(semcor):
    assert corpus_counts(semcor) == {"instances": 234_136, "documents": 352, "sentences": 37_176, "multi_key": 0}
    row = semcor[0]
    assert (row["document_id"], row["sentence_id"]) == ("d000", "d000.s000")
    assert [(i["position"], row["tokens"][i["position"]], i["gold"]) for i in row["instances"][:2]] == \
        [(1, "Fulton_County_Grand_Jury", ["group%1:03:00::"]), (2, "said", ["say%2:32:00::"])]


@pytest.mark.parametrize("name, instances, sentences, multi_key", [
    on_set("senseval2", 2_282, 242, 103), on_set("senseval3", 1_850, 352, 37), on_set("semeval2007", 455, 135, 4)])
def test_test_set_counts(test_sets, name, instances, sentences, multi_key):
    counts = corpus_counts(test_sets[name])
    assert counts == {"instances": instances, "documents": 3, "sentences": sentences, "multi_key": multi_key}
    # the dataset's gold is the gold file, as the scorer reads it
    assert wsd_gold(test_sets[name]) == read_key_file(WSD / name / f"{name}.gold.key.txt")
