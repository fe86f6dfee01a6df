"""Word sense disambiguation foundations: the scorer (hand-counted cases of docs/nclm.md §6 items
13-15, checked there against the real Scorer.java), Raganato-format corpora, the sense inventory
and the WN-1st / SemCor-MFS baselines (item 16) on the sets of ../shared/data/wsd."""

import gzip
import math

import pytest

from conftest import DATA, requires_data
from topic_lm_hf.tasks import (SenseInventory, first_sense_baseline, iter_wsd_instances, load_sense_inventory,
                               load_wsd_corpus, most_frequent_sense_baseline, read_key_file, score_wsd, wordnet_pos,
                               wsd_gold, write_key_file)

WSD = DATA / "wsd"
SENSES = DATA / "wordnet" / "senses.tsv.gz"
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
# corpus and inventory on hand-made files
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
TOY_SENSES = """sense_key\tlemma\tpos\tsynset\trank\tgloss
bass%1:07:01::\tbass\tn-1\t04994045-n\t1\tthe lowest part
bass%1:13:02::\tbass\tn-2\t07793921-n\t1\tthe lean flesh of a saltwater fish
bass%1:10:01::\tbass\tn-1\t07045779-n\t2\tthe lowest part in polyphonic music
fit%3:00:02::\tfit\ta\t01016002-a\t1\tmeeting adequate standards
fit%5:00:00:ready:00\tfit\ts-1\t01018352-s\t1\tphysically and mentally sound
fit%2:42:00::\tfit\tv\t02700104-v\t1\tbe the right size or shape
be%2:42:03::\tbe\tv\t02604760-v\t1\thave the quality of being
be%2:42:00::\tbe\tv\t02617567-v\t2\tbe identical to
"""


@pytest.fixture
def toy_set(tmp_path):
    folder = tmp_path / "toy"
    folder.mkdir()
    with gzip.open(folder / "toy.data.xml.gz", "wt", encoding="utf-8") as f:
        f.write(TOY_XML)
    (folder / "toy.gold.key.txt").write_text(TOY_GOLD, encoding="utf-8")
    with gzip.open(tmp_path / "senses.tsv.gz", "wt", encoding="utf-8") as f:
        f.write(TOY_SENSES)
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


def test_gold_key_that_does_not_match_the_data_is_refused(toy_set):
    # an id the XML lacks would count in the key file's recall denominator but not in the dataset's
    gold = toy_set / "toy.gold.key.txt"
    gold.write_text(TOY_GOLD + "d009.s000.t000 bass%1:07:01::\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"toy.gold.key.txt has 1 id\(s\) that are no instance.*'d009.s000.t000'"):
        load_wsd_corpus(toy_set)


def test_truncated_xml_names_the_file(toy_set):
    xml = toy_set / "toy.data.xml.gz"
    with gzip.open(xml, "wt", encoding="utf-8") as f:
        f.write(TOY_XML[: len(TOY_XML) // 2])
    with pytest.raises(ValueError, match=r"toy.data.xml.gz is not well-formed XML .*truncated"):
        load_wsd_corpus(toy_set)


def test_sense_inventory_rules(toy_set):
    # the training key bank%1:14:00:: of a "bass" instance is another lemma's sense: never a candidate
    inventory = load_sense_inventory(toy_set.parent / "senses.tsv.gz", training=toy_set)
    assert inventory.candidates("bass", "NOUN") == ["bass%1:13:02::", "bass%1:07:01::", "bass%1:10:01::"]
    assert "bank%1:14:00::" not in inventory.training_sense_keys()
    # homographs n-1 / n-2 both have rank 1: the training count breaks the tie ...
    assert inventory.first_sense("bass", "NOUN") == "bass%1:13:02::"
    # ... and the key without counts; ADJ covers OEWN a and s, and not the verb
    no_counts = load_sense_inventory(toy_set.parent / "senses.tsv.gz")
    assert no_counts.first_sense("bass", "NOUN") == "bass%1:07:01::"
    assert no_counts.candidates("fit", "ADJ") == ["fit%3:00:02::", "fit%5:00:00:ready:00"]
    assert no_counts.candidates("Fit", "a") == no_counts.candidates("fit", "ADJ")
    assert no_counts.candidates("fit", "DET") == [] and no_counts.candidates("unknown", "NOUN") == []
    with pytest.raises(ValueError, match="without a training corpus"):
        no_counts.most_frequent_sense("bass", "NOUN")
    assert inventory.most_frequent_sense("be", "VERB") == "be%2:42:03::"  # tie (1, 1): lower rank
    assert inventory.most_frequent_sense("bass", "VERB") is None
    assert [wordnet_pos(p) for p in ("NOUN", "VERB", "ADJ", "ADV", "n-2", "s", "s-1", "DET")] == \
        ["n", "v", "a", "r", "n", "a", "a", None]


def test_most_frequent_sense_ties():
    inventory = SenseInventory(
        {("fit", "a"): [("fit%3:00:02::", 1), ("fit%5:00:00:ready:00", 1), ("fit%5:00:00:able:00", 2)]},
        {("fit", "a"): {"fit%3:00:02::": 2, "fit%5:00:00:ready:00": 2, "fit%5:00:00:able:00": 2,
                        "fit%5:00:00:new:00": 1}})
    # equal counts: lower rank first, then the larger key (the satellite), as docs/nclm.md's MFS figures need
    assert inventory.most_frequent_sense("fit", "ADJ") == "fit%5:00:00:ready:00"
    # WN-1st: lowest rank, equal counts, then the smaller key; a key missing from WordNet comes last
    assert inventory.candidates("fit", "ADJ") == ["fit%3:00:02::", "fit%5:00:00:ready:00", "fit%5:00:00:able:00",
                                                  "fit%5:00:00:new:00"]
    assert inventory.wordnet_senses("fit", "ADJ") == inventory.candidates("fit", "ADJ")[:3]
    assert inventory.training_sense_keys() == sorted(inventory.candidates("fit", "ADJ"))


# ----------------------------------------------------------------------------------------------
# the real sets of ../shared/data (docs/nclm.md §5 "Data here")
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def semcor():
    if not (WSD / "semcor").exists():
        pytest.skip(f"real corpus {WSD / 'semcor'} is absent; set TOPIC_LM_DATA to its folder")
    return load_wsd_corpus(WSD / "semcor")


@pytest.fixture(scope="session")
def inventory(semcor):
    if not SENSES.exists():
        pytest.skip(f"sense inventory {SENSES} is absent; set TOPIC_LM_DATA to its folder")
    return load_sense_inventory(SENSES, training=semcor)


@pytest.fixture(scope="session")
def test_sets():
    return {name: load_wsd_corpus(WSD / name) for name in TEST_SETS if (WSD / name).exists()}


def key_lemma_pos(key):
    """(lemma, WordNet POS) written in a sense key: lemma%ss_type:..., ss_type 5 = satellite."""
    lemma, rest = key.split("%")
    return lemma, {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}[rest[0]]


def corpus_counts(corpus):
    instances = list(iter_wsd_instances(corpus))
    return {"instances": len(instances), "documents": len(set(corpus["document_id"])), "sentences": len(corpus),
            "multi_key": sum(len(i["gold"]) > 1 for i in instances)}


@requires_data("wsd", "semcor")
def test_semcor_counts(semcor, inventory):
    assert corpus_counts(semcor) == {"instances": 234_136, "documents": 352, "sentences": 37_176, "multi_key": 0}
    row = semcor[0]
    assert (row["document_id"], row["sentence_id"]) == ("d000", "d000.s000")
    assert [(i["position"], row["tokens"][i["position"]], i["gold"]) for i in row["instances"][:2]] == \
        [(1, "Fulton_County_Grand_Jury", ["group%1:03:00::"]), (2, "said", ["say%2:32:00::"])]
    keys = inventory.training_sense_keys()
    assert len(keys) == 35_399  # the output size of a softmax over all SemCor senses
    assert len(set(keys) - inventory.wordnet_sense_keys()) == 2_329


@pytest.mark.parametrize("name, instances, sentences, multi_key", [
    on_set("senseval2", 2_282, 242, 103), on_set("senseval3", 1_850, 352, 37), on_set("semeval2007", 455, 135, 4)])
def test_test_set_counts(test_sets, name, instances, sentences, multi_key):
    counts = corpus_counts(test_sets[name])
    assert counts == {"instances": instances, "documents": 3, "sentences": sentences, "multi_key": multi_key}
    # the dataset's gold is the gold file, as the scorer reads it
    assert wsd_gold(test_sets[name]) == read_key_file(WSD / name / f"{name}.gold.key.txt")


@pytest.mark.parametrize("name, gold_in_wordnet, unseen", [
    on_set("senseval2", "99.6", 236), on_set("senseval3", "99.6", 99), on_set("semeval2007", "99.8", 19)])
def test_candidates_are_the_lemmas_own_senses(inventory, test_sets, name, gold_in_wordnet, unseen):
    instances = list(iter_wsd_instances(test_sets[name]))
    mfs = most_frequent_sense_baseline(test_sets[name], inventory)
    in_wordnet = num_unseen = 0
    for instance in instances:
        lemma, pos = instance["lemma"], instance["pos"]
        candidates = inventory.candidates(lemma, pos)
        assert candidates, instance
        # every candidate is a sense of this lemma and POS (as written in the key itself)
        assert {key_lemma_pos(key) for key in candidates} == {(lemma, wordnet_pos(pos))}, instance
        assert inventory.first_sense(lemma, pos) == candidates[0]
        assert mfs[instance["id"]] in candidates
        in_wordnet += bool(set(instance["gold"]) & set(inventory.wordnet_senses(lemma, pos)))
        if inventory.training_count(lemma, pos) == 0:  # never seen in SemCor: the WN-1st back-off
            num_unseen += 1
            assert mfs[instance["id"]] == candidates[0]
    assert f"{100 * in_wordnet / len(instances):.1f}" == gold_in_wordnet
    assert num_unseen == unseen


@pytest.mark.parametrize("name, wn_first, semcor_mfs", [
    on_set("senseval2", "66.8", "66.0"), on_set("senseval3", "66.0", "64.7"), on_set("semeval2007", "55.2", "55.4")])
def test_baselines_reproduce(inventory, test_sets, name, wn_first, semcor_mfs, tmp_path):
    gold_file = WSD / name / f"{name}.gold.key.txt"
    for baseline, expected in ((first_sense_baseline, wn_first), (most_frequent_sense_baseline, semcor_mfs)):
        predictions = baseline(test_sets[name], inventory)
        assert predictions.keys() == wsd_gold(test_sets[name]).keys()  # no abstention
        # scored through a written key file against the shipped gold file, as the Java scorer would
        write_key_file(predictions, tmp_path / "system.key.txt")
        score = score_wsd(tmp_path / "system.key.txt", gold_file)
        assert score.formatted() == {"P": expected, "R": expected, "F1": expected}, baseline.__name__


def test_an_answer_that_is_not_a_key_is_a_clear_error():
    with pytest.raises(TypeError, match=r"an answer is a sense key \(a string\), several keys or None; got 5"):
        score_wsd({"a": 5}, {"a": "x"})
    with pytest.raises(TypeError, match="got 5"):
        score_wsd({"a": "x"}, {"a": 5})  # the gold's keys too
