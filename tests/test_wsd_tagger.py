"""The BiLSTM sense tagger (docs/nclm.md §5 and §6 item 17): the HF model, training on a SemCor slice,
candidate restriction and back-off, document topics from a real topic model of the package, and
the ``topic-lm wsd`` commands."""

import math
import re

import pytest
import torch
from transformers import AutoModelForTokenClassification, TrainingArguments

from conftest import DATA, requires_data, tiny_model
from topic_lm_hf import SenseTaggerConfig, SenseTaggerForTokenClassification
from topic_lm_hf.tasks import load_sense_inventory, load_wsd_corpus, read_key_file, score_wsd, wsd_gold
from topic_lm_hf.tasks.wsd_tagger import (SenseTaggingCollator, build_sense_vocabulary, disambiguate,
                                          document_topic_representations, encode_corpus, load_frozen_topic_model,
                                          train_sense_tagger)

WSD = DATA / "wsd"
SENSES = DATA / "wordnet" / "senses.tsv.gz"
SLICE_DOCUMENTS = 25  # SemCor documents d000..d024: ~2,600 sentences


def tiny_tagger(topic_size=0, **kwargs):
    config = SenseTaggerConfig(word_vocabulary=["<pad>", "<unk>", "the", "bank", "river", "money"],
                               id2label={0: "bank%1:14:00::", 1: "bank%1:17:01::", 2: "river%1:17:00::"},
                               embedding_size=8, hidden_size=6, dropout=0.0, topic_representation_size=topic_size,
                               topic_model_name_or_path="some/topic-model" if topic_size else None, **kwargs)
    torch.manual_seed(0)
    return SenseTaggerForTokenClassification(config)


def training_args(tmp_path, **overrides):
    kwargs = dict(output_dir=str(tmp_path), learning_rate=1e-3, per_device_train_batch_size=32, num_train_epochs=1,
                  save_strategy="no", report_to="none", use_cpu=True, logging_steps=1000, disable_tqdm=True,
                  dataloader_pin_memory=False, seed=0)
    return TrainingArguments(**{**kwargs, **overrides})


# ----------------------------------------------------------------------------------------------
# the model (no data needed)
# ----------------------------------------------------------------------------------------------


def test_auto_round_trip_gives_identical_logits(tmp_path):
    model = tiny_tagger(topic_size=3).eval()
    ids = torch.tensor([[2, 3, 4, 0], [5, 3, 1, 2]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    c = torch.randn(2, 3)
    before = model(input_ids=ids, attention_mask=mask, topic_representation=c).logits
    assert before.shape == (2, 4, 3)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path)
    assert type(loaded) is SenseTaggerForTokenClassification
    assert loaded.config.id2label == model.config.id2label and loaded.config.word_vocabulary == model.config.word_vocabulary
    torch.testing.assert_close(loaded(input_ids=ids, attention_mask=mask, topic_representation=c).logits, before,
                               rtol=0, atol=0)
    # the tagger sees the word itself: changing only the target word changes its scores
    changed = ids.clone()
    changed[0, 1] = 4
    assert not torch.equal(loaded(input_ids=changed, attention_mask=mask, topic_representation=c).logits[0, 1],
                           before[0, 1])


def test_a_saved_tagger_loads_as_remote_code_without_the_package(tmp_path):
    from conftest import run_without_package

    model = tiny_tagger(topic_size=3).eval()
    model.save_pretrained(tmp_path / "tagger")
    ids, c = [[2, 3, 4]], [[0.5, -1.0, 2.0]]
    expected = model(input_ids=torch.tensor(ids), topic_representation=torch.tensor(c)).logits
    result = run_without_package(f"""
        import torch
        from transformers import AutoModelForTokenClassification
        model = AutoModelForTokenClassification.from_pretrained("{tmp_path / 'tagger'}", trust_remote_code=True).eval()
        logits = model(input_ids=torch.tensor({ids}), topic_representation=torch.tensor({c})).logits
        print(json.dumps({{"cls": type(model).__name__, "logits": logits.tolist()}}))
    """, tmp_path)
    assert result["cls"] == "SenseTaggerForTokenClassification"
    torch.testing.assert_close(torch.tensor(result["logits"]), expected)


def test_training_loss_is_on_instances_only():
    model = tiny_tagger()
    ids = torch.tensor([[2, 3, 4]])
    labels = torch.tensor([[-100, 1, -100]])
    out = model.eval()(input_ids=ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[0, 1:2], labels[0, 1:2])
    torch.testing.assert_close(out.loss, expected)
    train_out = model.train()(input_ids=ids, labels=labels)  # dropout 0: the same loss, logits skipped
    assert train_out.logits is None
    torch.testing.assert_close(train_out.loss, expected)


def test_candidate_loss_equals_a_softmax_over_each_instances_candidates():
    """training_objective="candidates": the vectorised loss (gathered rows of U, -1 padding) against a naive
    per-instance loop over the full logits; the collator's candidate rows follow the labelled positions."""
    model = tiny_tagger(training_objective="candidates").eval()
    rows = [{"input_ids": [2, 3, 4], "labels": [-100, 0, 2], "sense_candidates": [[0, 2], [2]]},
            {"input_ids": [5, 3], "labels": [2, 0], "sense_candidates": [[2, 0], [0]]}]
    batch = SenseTaggingCollator()(rows)
    assert batch["sense_candidates"].tolist() == [[0, 2], [2, -1], [2, 0], [0, -1]]
    out = model(**batch)
    naive = []
    for row, position, ids in [(0, 1, [0, 2]), (0, 2, [2]), (1, 0, [2, 0]), (1, 1, [0])]:
        gold = int(batch["labels"][row, position])
        naive.append(-torch.log_softmax(out.logits[row, position, ids].double(), 0)[ids.index(gold)])
    torch.testing.assert_close(out.loss.double(), torch.stack(naive).mean())
    full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
    assert not torch.isclose(out.loss, full)  # not the softmax over every sense
    train_out = model.train()(**batch)  # dropout 0: the same loss, logits skipped
    assert train_out.logits is None
    torch.testing.assert_close(train_out.loss, out.loss)
    train_out.loss.backward()
    touched = model.classifier.weight.grad.abs().sum(1) > 0
    assert touched.tolist() == [True, False, True]  # sense 1 is no instance's candidate: no push-down
    with pytest.raises(ValueError, match="not among its instance's sense_candidates"):
        model(**{**batch, "sense_candidates": torch.tensor([[1, 2], [2, -1], [2, 0], [0, -1]])})
    with pytest.raises(ValueError, match="one row per labelled position"):
        model(**{**batch, "sense_candidates": batch["sense_candidates"][:3]})
    with pytest.raises(ValueError, match="training_objective"):
        SenseTaggerConfig(training_objective="mfs")


def test_bad_input_gets_a_clear_error(tmp_path):
    model = tiny_tagger(topic_size=3)
    with pytest.raises(ValueError, match="empty sentence"):
        model(input_ids=torch.zeros((1, 0), dtype=torch.long), topic_representation=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="mismatched vocabulary"):
        model(input_ids=torch.tensor([[2, 17]]), topic_representation=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="needs the document topic representation"):
        model(input_ids=torch.tensor([[2, 3]]))
    with pytest.raises(ValueError, match=r"shape \(1, 3\)"):
        model(input_ids=torch.tensor([[2, 3]]), topic_representation=torch.zeros(1, 5))
    with pytest.raises(ValueError, match="has no topics"):
        tiny_tagger()(input_ids=torch.tensor([[2, 3]]), topic_representation=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="empty sentence"):
        SenseTaggingCollator()([{"input_ids": [], "labels": []}])
    with pytest.raises(ValueError, match="output_mode"):
        SenseTaggerConfig(output_mode="mfs")
    with pytest.raises(ValueError, match="needs topic_model_name_or_path"):
        SenseTaggerConfig(topic_representation_size=4)
    with pytest.raises(ValueError, match="must start with '<pad>', '<unk>'"):
        SenseTaggerConfig(word_vocabulary=["bank", "river"])
    with pytest.raises(FileNotFoundError, match="topic model folder .*missing-model does not exist"):
        load_frozen_topic_model(tmp_path / "missing-model")


def test_a_corpus_without_gold_senses_is_refused(tmp_path):
    (tmp_path / "plain.data.xml").write_text(
        '<corpus lang="en"><text id="d0"><sentence id="d0.s0"><wf lemma="the" pos="DET">the</wf>'
        '<instance id="d0.s0.t0" lemma="bank" pos="NOUN">bank</instance></sentence></text></corpus>',
        encoding="utf-8")
    (tmp_path / "plain.gold.key.txt").write_text("", encoding="utf-8")
    corpus = load_wsd_corpus(tmp_path)  # loads (with a warning): it can still be tagged
    with pytest.raises(ValueError, match="the training corpus has no gold sense key"):
        train_sense_tagger(corpus, tmp_path / "tagger", training_args=training_args(tmp_path, max_steps=1))


# ----------------------------------------------------------------------------------------------
# on SemCor (skipped without ../shared/data)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data():
    for path in (WSD / "semcor", WSD / "semeval2007", SENSES):
        if not path.exists():
            pytest.skip(f"{path} is absent; set TOPIC_LM_DATA to the folder of the corpora")
    semcor = load_wsd_corpus(WSD / "semcor")
    documents = list(dict.fromkeys(semcor["document_id"]))[:SLICE_DOCUMENTS]
    train = semcor.filter(lambda d: d in set(documents), input_columns="document_id")
    se07 = load_wsd_corpus(WSD / "semeval2007")
    return {"semcor": semcor, "train": train, "se07": se07,
            "inventory": load_sense_inventory(SENSES, training=train)}


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("tagger")
    model = train_sense_tagger(data["train"], out / "trained", training_args=training_args(out, num_train_epochs=3, learning_rate=1e-2),
                               sense_inventory=SENSES, embedding_size=32, hidden_size=32)
    torch.manual_seed(0)
    untrained = SenseTaggerForTokenClassification(model.config)  # the same tagger at its initialisation
    return {"model": model, "untrained": untrained, "folder": out / "trained"}


def test_a_trained_tagger_runs_in_the_token_classification_pipeline(data, trained):
    from transformers import pipeline

    tagger = pipeline("token-classification", model=str(trained["folder"]), device="cpu")
    sentence = data["se07"][0]
    text = " ".join(sentence["tokens"])
    tagged = tagger(text)
    tokenizer, model = tagger.tokenizer, trained["model"].eval()
    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        expected = model(**encoded).logits[0].argmax(-1)
    assert [t["entity"] for t in tagged] == [model.config.id2label[int(i)] for i in expected]  # what the model says
    words = [w for w, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text.lower())]
    assert [t["word"].lower() for t in tagged] == words
    known = encoded["input_ids"][0] != model.config.word_vocabulary.index("<unk>")
    assert known.float().mean() > 0.5  # the saved tokenizer is the tagger's own vocabulary
    topic_tagger = tiny_tagger(topic_size=3)
    topic_tagger.save_pretrained(trained["folder"].parent / "topic-tagger")
    with pytest.raises(ValueError, match="a text pipeline cannot; tag with topic_lm_hf.tasks.disambiguate"):
        pipeline("token-classification", model=str(trained["folder"].parent / "topic-tagger"), device="cpu")("the bank")


def test_the_full_semcor_has_35399_training_senses(data):
    assert len(build_sense_vocabulary(data["semcor"])) == 35_399


def test_all_senses_mode_scores_every_training_sense_of_the_slice(data, trained):
    model = trained["model"]
    senses = build_sense_vocabulary(data["train"])
    assert model.config.num_labels == len(senses) and list(model.config.id2label.values()) == senses
    rows = encode_corpus(data["se07"], model.config, labels=False)
    batch = SenseTaggingCollator()([rows[i] for i in range(4)])
    assert model.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.shape[-1] \
        == len(senses)
    predictions = disambiguate(model, data["se07"], mode="all_senses")
    assert len(predictions) == 455 and set(predictions.values()) <= set(senses)  # no back-off: training senses only


def test_candidates_are_the_lemmas_own_and_unseen_lemmas_back_off(data, trained):
    inventory = data["inventory"]
    predictions = disambiguate(trained["model"], data["se07"], mode="candidates", inventory=inventory)
    unseen = 0
    for instance in (i for row in data["se07"]["instances"] for i in row):
        key = predictions.get(instance["id"])
        candidates = inventory.candidates(instance["lemma"], instance["pos"])
        if not candidates:
            assert key is None  # abstention: nothing to choose from
            continue
        assert key in candidates  # never a sense of another lemma
        if inventory.training_count(instance["lemma"], instance["pos"]) == 0:
            unseen += 1
            assert key == inventory.first_sense(instance["lemma"], instance["pos"])
    assert unseen > 50  # the slice leaves many SE07 lemmas unseen: the back-off is exercised


def test_a_short_training_run_beats_the_untrained_tagger(data, trained):
    gold = wsd_gold(data["se07"])
    f1 = {name: score_wsd(disambiguate(trained[name], data["se07"], inventory=data["inventory"]), gold).f1
          for name in ("model", "untrained")}
    assert f1["model"] > f1["untrained"] + 0.05, f1
    # and on sentences of the slice (all senses): it has started to learn the training senses
    # (F1 is NaN at P = R = 0, as in Scorer.java, so recall is compared)
    sample = data["train"].select(range(300))
    recall = {name: score_wsd(disambiguate(trained[name], sample, mode="all_senses"), wsd_gold(sample)).recall
              for name in ("model", "untrained")}
    assert recall["model"] > recall["untrained"] + 0.08, recall


def test_training_args_seed_makes_a_run_reproducible(data, tmp_path):
    """The seed of TrainingArguments seeds the initialisation too: the same seed gives the same weights."""
    train = data["train"].select(range(60))
    weights = []
    for run, seed in enumerate((3, 3, 4)):
        model = train_sense_tagger(train, tmp_path / f"run{run}", training_args=training_args(tmp_path, max_steps=2,
                                                                                               seed=seed),
                                   sense_inventory=SENSES, embedding_size=8, hidden_size=8)
        weights.append(model.classifier.weight.detach().clone())
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_the_candidates_objective_trains_on_the_lemmas_own_senses(data, trained, tmp_path):
    """training_objective="candidates" on the SemCor slice: each instance's softmax runs over training
    senses of its own lemma that hold the gold, and the trained tagger beats its initialisation."""
    inventory = data["inventory"]
    model = train_sense_tagger(data["train"], tmp_path / "tagger", training_objective="candidates",
                               training_args=training_args(tmp_path, num_train_epochs=3, learning_rate=1e-2),
                               sense_inventory=SENSES, embedding_size=32, hidden_size=32)
    assert model.config.training_objective == "candidates"
    rows = encode_corpus(data["train"].select(range(200)), model.config, inventory=inventory)
    id2label = model.config.id2label
    instances = [i for row in data["train"].select(range(200))["instances"]
                 for i in sorted(row, key=lambda i: i["position"])]
    lists = [ids for row in rows["sense_candidates"] for ids in row]
    labels = [label for row in rows["labels"] for label in row if label != -100]
    assert len(lists) == len(labels) == sum(1 for i in instances if i["gold"]) > 500
    for ids, label, instance in zip(lists, labels, (i for i in instances if i["gold"])):
        assert label in ids and id2label[label] == instance["gold"][0]
        assert {id2label[i] for i in ids} <= set(inventory.candidates(instance["lemma"], instance["pos"]))
    assert max(len(ids) for ids in lists) > 5 and min(len(ids) for ids in lists) == 1  # polysemous and not
    gold = wsd_gold(data["se07"])
    f1 = {name: score_wsd(disambiguate(m, data["se07"], inventory=inventory), gold).f1
          for name, m in (("model", model), ("untrained", trained["untrained"]))}
    assert f1["model"] > f1["untrained"] + 0.05, f1


def test_a_real_topic_model_gives_each_document_its_own_c(data, wiki, tmp_path):
    from topic_lm_hf import save_vocabularies

    topic_folder = tmp_path / "tcnlm"
    topic_model = tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"])
    topic_model.save_pretrained(topic_folder)
    save_vocabularies(wiki["tok"], wiki["topic_tok"], topic_folder)
    train = data["train"].select(range(400))  # 4 documents
    model = train_sense_tagger(train, tmp_path / "tagger", topic_model=str(topic_folder),
                               training_args=training_args(tmp_path, max_steps=3), sense_inventory=SENSES,
                               embedding_size=16, hidden_size=16)
    config = model.config
    assert config.topic_model_name_or_path == str(topic_folder) and config.topic_model_type == "tcnlm"
    assert config.topic_representation_size == topic_model.document_topic_size == topic_model.config.num_topics
    c = document_topic_representations(data["se07"], load_frozen_topic_model(topic_folder), wiki["topic_tok"])
    assert len(c) == 3 and not torch.allclose(c["d000"], c["d001"])
    # the same sentences with another document's c get other sense scores
    rows = encode_corpus(data["se07"].select(range(5)), config, c, labels=False)
    batch = SenseTaggingCollator()([rows[i] for i in range(len(rows))])
    other = {**c, "d000": c["d001"]}
    rows_other = encode_corpus(data["se07"].select(range(5)), config, other, labels=False)
    batch_other = SenseTaggingCollator()([rows_other[i] for i in range(len(rows_other))])
    model.eval()
    own = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                topic_representation=batch["topic_representation"]).logits
    swapped = model(input_ids=batch_other["input_ids"], attention_mask=batch_other["attention_mask"],
                    topic_representation=batch_other["topic_representation"]).logits
    assert not torch.allclose(own, swapped)
    # reloaded by the Auto class, the tagger finds its topic model and topic tokenizer by itself
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path / "tagger")
    assert disambiguate(loaded, data["se07"], mode="all_senses") == disambiguate(model, data["se07"],
                                                                                 mode="all_senses",
                                                                                 topic_representations=c)
    # a topic tokenizer of another vocabulary is refused
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        document_topic_representations(data["se07"], topic_model, wiki["tok"])


# ----------------------------------------------------------------------------------------------
# the command line
# ----------------------------------------------------------------------------------------------


@requires_data("wsd", "semeval2007")
@requires_data("wordnet", "senses.tsv.gz")
def test_wsd_train_and_evaluate_commands(tmp_path, capsys):
    from topic_lm_hf.cli import main

    out = tmp_path / "tagger"
    se07 = str(WSD / "semeval2007")
    main(["wsd", "train", "--train", se07, "--output_dir", str(out), "--num_train_epochs", "1",
          "--embedding_size", "16", "--hidden_size", "16", "--use_cpu", "--disable_tqdm", "true"])
    assert "saved to" in capsys.readouterr().out
    main(["wsd", "evaluate", "--model_name_or_path", str(out), "--dataset", se07])
    text = capsys.readouterr().out
    for mode in ("candidates", "all_senses"):
        key_file = out / f"semeval2007.{mode}.key.txt"
        assert f"| {mode} | " in text and key_file.exists()
        f1 = text.split(f"| {mode} | ")[1].split(" | ")[2]
        assert f1 == score_wsd(key_file, WSD / "semeval2007" / "semeval2007.gold.key.txt").formatted()["F1"]
        assert len(read_key_file(key_file)) > 400
    with pytest.raises(SystemExit) as exit_:
        main(["wsd", "train", "--train", se07, "--output_dir", str(tmp_path / "x"), "--topic_model",
              str(tmp_path / "nowhere")])
    assert exit_.value.code == 2
    assert re.match(r"topic-lm wsd train: error: topic model folder .* does not exist", capsys.readouterr().err)


def test_wsd_evaluate_says_why_f1_is_nan(monkeypatch, tmp_path, capsys):
    """When precision and recall are both 0 the scorer's F1 is NaN (as the official Java scorer's); the command now
    says why instead of printing a bare NaN."""
    import types

    import topic_lm_hf.tasks.commands as commands
    import topic_lm_hf.tasks.wsd as wsd
    import topic_lm_hf.tasks.wsd_tagger as wsd_tagger
    from topic_lm_hf.cli import main
    from topic_lm_hf.tasks.wsd import score_wsd

    zero = score_wsd({"d000.s000.t000": ["a%1:00:00::"]}, {"d000.s000.t000": ["b%1:00:00::"]})
    assert math.isnan(zero.f1)
    model = types.SimpleNamespace(config=types.SimpleNamespace(topic_model_name_or_path=None),
                                  to=lambda device: model)
    monkeypatch.setattr(commands, "load_pretrained", lambda auto, path: model)
    monkeypatch.setattr(wsd, "load_wsd_corpus", lambda path: None)
    monkeypatch.setattr(wsd_tagger, "evaluate_sense_tagger", lambda *a, **k: {"all_senses": zero})
    main(["wsd", "evaluate", "--model_name_or_path", str(tmp_path), "--dataset", str(tmp_path / "se07"),
          "--modes", "all_senses"])
    out = capsys.readouterr().out
    assert "| all_senses | 0.0 | 0.0 | NaN |" in out
    assert "F1 NaN, as the official scorer prints it: precision and recall are both 0" in out
