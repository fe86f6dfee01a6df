"""Downstream tasks: one document representation per family, the sequence classifiers, retrieval, the splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DATA, requires_data, tiny_model, variants
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from topic_lm_hf import TopicContextCollator, documents_from_lists, evaluate_retrieval, extract_document_features
from topic_lm_hf.tasks import (FeatureCollator, add_document_features, classification_accuracy, clean_newsgroups_post,
                               document_collator, fraction_cutoff, lda_retrieval, load_classification_splits,
                               majority_accuracy, normalize_blocks, retrieval_precision, tfidf_retrieval,
                               train_classifier)

CORPUS = [
    [["the", "court", "ruled", "on", "the", "tax", "case"], ["the", "judge", "said", "the", "law", "was", "clear"]],
    [["the", "team", "won", "the", "game"], ["fans", "cheered", "the", "players", "at", "the", "stadium"]],
    [["police", "said", "the", "fire", "spread"], ["the", "court", "heard", "the", "police", "case"]],
    [["the", "players", "lost", "the", "game", "at", "home"]],
]


@pytest.fixture(scope="module")
def toy():
    from topic_lm_hf import build_vocabularies

    docs = documents_from_lists(CORPUS * 3)
    return build_vocabularies(docs, min_freq=1, stopwords=["the", "at", "on", "was"], top_fraction=0.0)


def _batch(tok, topic_tok, n=4, **kwargs):
    collator = TopicContextCollator(tok, topic_tok, context="document", layout="sequence", **kwargs)
    return collator(documents_from_lists(CORPUS[:n], label=[0, 1, 0, 1][:n]).to_list())


# ----------------------------------------------------------------------------------------------
# the representation, for every family
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", variants(reads_documents=False))
def test_document_representation_shapes_determinism_and_parts(toy, family):
    tok, topic_tok = toy
    model = tiny_model(family, tok, topic_tok).eval()
    batch = _batch(tok, topic_tok)
    h, c = model.document_representation_sizes
    reps = model.document_representation(batch)
    assert reps.shape == (4, h + c) and torch.isfinite(reps).all()
    assert torch.equal(reps, model.document_representation(batch))  # eval mode: deterministic
    # o_N is the last real output of the document fed alone (no padding), c its topic vector
    n = int(batch["attention_mask"][3].sum())
    bow = batch.get("context_bow")
    alone = model.document_representation(input_ids=batch["input_ids"][3:, :n],
                                          context_bow=None if bow is None else bow[3:])
    torch.testing.assert_close(reps[3:], alone)
    if c:
        torch.testing.assert_close(reps[:, h:], model.document_topic_representation(bow))
        assert model.document_topic_size == c
    per_token = model.document_representation(batch, per_token=True)
    assert per_token.shape == (4, batch["input_ids"].shape[1], h + c)
    torch.testing.assert_close(per_token[3, n - 1], reps[3])  # o_m at the last real token = o_N
    assert torch.equal(per_token[:, :, h:], per_token[:, :1, h:].expand_as(per_token[:, :, h:]))  # c at every position
    assert per_token[0, int(batch["attention_mask"][0].sum()):, :h].abs().sum() == 0  # zero at padding
    with pytest.raises(ValueError, match="one sequence per document"):
        model.document_representation(input_ids=batch["input_ids"].unsqueeze(1))


def tiny_rgbn(tok, topic_tok, **kw):
    from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM

    torch.manual_seed(0)
    config = RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[4, 3], hidden_sizes=[12, 8],
                                           embedding_size=8, dropout=0.0, **kw)
    return RGBNRNNForCausalLM(config).eval()


@pytest.mark.parametrize("recurrent", [True, False])
def test_rgbn_document_representation_is_every_layers_output_and_theta(toy, tmp_path, recurrent):
    tok, topic_tok = toy
    model = tiny_rgbn(tok, topic_tok, recurrent=recurrent)
    batch = _batch(tok, topic_tok)
    assert model.document_representation_sizes == (12 + 8, 4 + 3)
    reps = model.document_representation(batch)
    assert reps.shape == (4, 27) and torch.equal(reps, model.document_representation(batch))
    n = int(batch["attention_mask"][3].sum())
    with torch.no_grad():
        out = model.model(input_ids=batch["input_ids"][3:, :n], context_bow=batch["context_bow"][3:])
    torch.testing.assert_close(reps[3, :20], out.last_hidden_state[0, -1])  # [a^1; a^2] after the last token
    torch.testing.assert_close(reps[:, 20:], model.document_topic_representation(batch["context_bow"]))
    per_token = model.document_representation(batch, per_token=True)
    torch.testing.assert_close(per_token[3, n - 1], reps[3])
    model.save_pretrained(tmp_path / "lm")
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2, classifier_head="cnn")
    assert type(clf).__name__ == "RGBNRNNForSequenceClassification"
    assert clf.classifier.convs[0].in_channels == 27
    out = clf(**{k: v for k, v in batch.items() if k != "labels"}, labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    assert all(p.grad is None for p in clf.model.parameters()) and clf.classifier.out_proj.weight.grad is not None


def test_the_document_topics_change_c_and_not_the_lstm_for_nclm(toy):
    tok, topic_tok = toy
    model = tiny_model("nclm-leta-sdt", tok, topic_tok).eval()
    batch = _batch(tok, topic_tok)
    other = dict(batch, context_bow=batch["context_bow"].flip(0))
    a, b = model.document_representation(batch), model.document_representation(other)
    h = model.config.hidden_size
    assert torch.equal(a[:, :h], b[:, :h]) and not torch.equal(a[:, h:], b[:, h:])


# ----------------------------------------------------------------------------------------------
# sequence classifiers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", variants(representative=True, reads_documents=False, topic_rnn="topic_rnn-gru"))
@pytest.mark.parametrize("head", ["mlp", "cnn"])
def test_classifier_loads_the_lm_body_and_trains_only_its_head(toy, tmp_path, family, head):
    tok, topic_tok = toy
    lm = tiny_model(family, tok, topic_tok)
    lm.save_pretrained(tmp_path / "lm")
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2, classifier_head=head)
    assert type(clf).__name__.endswith("ForSequenceClassification") and clf.config.classifier_head == head
    for (name, p), (_, q) in zip(clf.model.named_parameters(), lm.model.named_parameters()):
        assert torch.equal(p, q), name
        assert not p.requires_grad, name  # frozen features by default
    h, c = clf.document_representation_sizes
    if head == "cnn":  # the CNN's input width is H + |c| (nclm.md §6.19)
        assert clf.classifier.convs[0].in_channels == h + c
    else:
        assert clf.classifier.dense.in_features == h + c
    docs = documents_from_lists(CORPUS * 2, label=[0, 1, 0, 1] * 2)
    collator = document_collator(clf, tok, topic_tok, max_document_length=20)
    rows = collator.prepare(docs)
    body = {k: v.clone() for k, v in clf.model.state_dict().items()}
    head_before = {k: v.clone() for k, v in clf.classifier.state_dict().items()}
    train_classifier(clf, rows, collator, str(tmp_path / "clf"), epochs=2, learning_rate=1e-2, batch_size=4)
    assert all(torch.equal(v, clf.model.state_dict()[k]) for k, v in body.items())  # the extractor is frozen
    assert any(not torch.equal(v, clf.classifier.state_dict()[k]) for k, v in head_before.items())
    if head == "cnn":  # Kim's max-norm constraint on the output rows
        assert clf.classifier.out_proj.weight.norm(dim=1).max() <= clf.config.classifier_max_norm + 1e-5
    clf.save_pretrained(tmp_path / "clf-saved")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "clf-saved")
    batch = collator([rows[i] for i in range(4)])
    clf.eval()
    torch.testing.assert_close(clf(**batch).logits, again(**batch).logits)
    # fine-tuning: the body gets gradients
    clf.set_backbone_frozen(False)
    clf.train()
    clf(**batch).loss.backward()
    assert clf.get_input_embeddings().weight.grad is not None


def test_frozen_features_give_the_same_logits_as_tokens(toy, tmp_path):
    tok, topic_tok = toy
    lm = tiny_model("tcnlm", tok, topic_tok)
    lm.save_pretrained(tmp_path / "lm")
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2).eval()
    docs = documents_from_lists(CORPUS, label=[0, 1, 0, 1])
    collator = document_collator(clf, tok, topic_tok)
    features = add_document_features(clf, docs, collator)
    from_tokens = clf(**{k: v for k, v in collator(docs.to_list()).items() if k != "labels"}).logits
    from_features = clf(**{k: v for k, v in FeatureCollator()(features.to_list()).items() if k != "labels"}).logits
    torch.testing.assert_close(from_tokens, from_features)
    x, y = extract_document_features(lm, docs, tokenizer=tok, topic_tokenizer=topic_tok)
    assert x.shape == (4, sum(lm.document_representation_sizes)) and y.tolist() == [0, 1, 0, 1]


def test_classifier_heads_reject_the_wrong_feature_shape(toy):
    tok, topic_tok = toy
    from topic_lm_hf import LSTMLMConfig, LSTMLMForSequenceClassification

    clf = LSTMLMForSequenceClassification(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8,
                                                       num_labels=3, classifier_head="cnn"))
    with pytest.raises(ValueError, match=r"one vector per token"):
        clf(document_features=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="classifier_head must be one of"):
        LSTMLMConfig(classifier_head="rnn")
    with pytest.raises(ValueError, match="classifier_kernel_sizes"):
        LSTMLMConfig(classifier_kernel_sizes=[3, 0])
    with pytest.raises(ValueError, match="input_ids .* or precomputed document_features"):
        clf()
    # a document shorter than the widest filter is zero-padded to it
    out = clf(input_ids=torch.tensor([[2, 5, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
    assert out.logits.shape == (1, 3) and torch.isfinite(out.logits).all()


def test_sequence_layout_options_are_checked(toy):
    tok, topic_tok = toy
    with pytest.raises(ValueError, match="layout='sequence'.*context='document' or 'none'"):
        TopicContextCollator(tok, topic_tok, context="others", layout="sequence")
    with pytest.raises(ValueError, match="label_column is an option of layout='sequence'"):
        TopicContextCollator(tok, topic_tok, context="others", label_column="label")
    batch = _batch(tok, topic_tok, max_document_length=6, label_column="label")
    assert batch["input_ids"].shape == (4, 6) and batch["labels"].tolist() == [0, 1, 0, 1]
    no_labels = _batch(tok, topic_tok)  # without label_column: the LM labels
    assert torch.equal(no_labels["labels"][no_labels["attention_mask"].bool()],
                       no_labels["input_ids"][no_labels["attention_mask"].bool()])
    # the bag of words is the whole document's
    first = TopicContextCollator(tok, topic_tok, context="document").contexts(
        [[tok.get_vocab()[w] for w in s] for s in CORPUS[0]], mode="document")[0]
    assert batch["context_bow"][0].sum() == len(first)


# ----------------------------------------------------------------------------------------------
# retrieval (nclm.md §6.18)
# ----------------------------------------------------------------------------------------------

CORPUS_VECTORS = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.7, 0.7], [0.6, -0.8]])
CORPUS_LABELS = ["A", "A", "B", "B", "A"]


def test_retrieval_precision_by_hand():
    queries = np.array([[1, 0.05], [0, 1]])
    result = retrieval_precision(queries, ["A", "B"], CORPUS_VECTORS, CORPUS_LABELS, k=(1, 2, 3, 5))
    # query A ranks c1 c2 c4 c5 c3 -> P@1 1, P@2 1, P@3 2/3, P@5 3/5; query B ranks c3 c4 c2 c1 c5 -> 1, 1, 2/3, 2/5
    assert result["precision@1"] == 1.0 and result["precision@2"] == 1.0
    assert result["precision@3"] == pytest.approx(2 / 3) and result["precision@5"] == pytest.approx(0.5)
    assert result["queries"] == 2 and result["corpus"] == 5
    # an exact tie keeps the corpus order: two copies of c3, the first one labelled A
    tied = retrieval_precision(np.array([[0, 1.0]]), ["A"], np.array([[0, 2.0], [0, 1.0]]), ["A", "B"], k=(1,))
    assert tied["precision@1"] == 1.0
    swapped = retrieval_precision(np.array([[0, 1.0]]), ["A"], np.array([[0, 2.0], [0, 1.0]]), ["B", "A"], k=(1,))
    assert swapped["precision@1"] == 0.0
    # a zero vector has cosine 0 with everything (no NaN)
    zero = retrieval_precision(np.zeros((1, 2)), ["A"], CORPUS_VECTORS, CORPUS_LABELS, k=(5,))
    assert zero["precision@5"] == pytest.approx(0.6)
    # sparse input gives the same numbers
    import scipy.sparse as sp

    sparse = retrieval_precision(sp.csr_matrix(queries), ["A", "B"], sp.csr_matrix(CORPUS_VECTORS), CORPUS_LABELS,
                                 k=(1, 2, 3, 5))
    assert sparse == result
    # a single cut-off may be a number (it was "'int' object is not iterable")
    single = retrieval_precision(queries, ["A", "B"], CORPUS_VECTORS, CORPUS_LABELS, k=3, fractions=0.4)
    assert single["precision@3"] == result["precision@3"] and "precision@fraction=0.4" in single


def test_retrieval_multi_label_relevance_and_fraction_rounding():
    corpus = np.eye(3)
    labels = [["x", "y"], ["x"], ["z"]]
    query = np.array([[1.0, 0.5, 0.0]])  # ranks document 0, then 1, then 2
    relaxed = retrieval_precision(query, [["x", "y"]], corpus, labels, k=(1, 2, 3))
    strict = retrieval_precision(query, [["x", "y"]], corpus, labels, k=(1, 2, 3), relevance="strict")
    assert [relaxed[f"precision@{k}"] for k in (1, 2, 3)] == pytest.approx([1, 1, 2 / 3])
    assert [strict[f"precision@{k}"] for k in (1, 2, 3)] == pytest.approx([1, 0.5, 1 / 3])
    assert fraction_cutoff(101, 0.02) == 2 and fraction_cutoff(101, 0.02, "floor") == 2
    assert fraction_cutoff(125, 0.02) == 3 and fraction_cutoff(125, 0.02, "floor") == 2
    result = retrieval_precision(CORPUS_VECTORS[:1], ["A"], CORPUS_VECTORS, CORPUS_LABELS, k=(), fractions=(0.4,))
    assert result["precision@fraction=0.4"] == 1.0  # k = int(5 * 0.4 + 0.5) = 2: c1, c2
    with pytest.raises(ValueError, match="Cut-offs must be in"):
        retrieval_precision(CORPUS_VECTORS, CORPUS_LABELS, CORPUS_VECTORS, CORPUS_LABELS, k=(6,))
    with pytest.raises(ValueError, match="differ in width"):
        retrieval_precision(np.zeros((1, 3)), ["A"], CORPUS_VECTORS, CORPUS_LABELS)


def test_block_normalisation():
    x = np.array([[3.0, 4.0, 0.0, 2.0], [0.0, 0.0, 1.0, 0.0]])
    out = normalize_blocks(x, (2, 2))
    assert out[0].tolist() == pytest.approx([0.6, 0.8, 0.0, 1.0]) and out[1].tolist() == [0, 0, 1, 0]
    with pytest.raises(ValueError, match="do not add up"):
        normalize_blocks(x, (2, 1))


def test_evaluate_retrieval_with_a_model_and_the_baselines(toy, tmp_path):
    tok, topic_tok = toy
    model = tiny_model("nclm-leta-sdt", tok, topic_tok)
    docs = documents_from_lists(CORPUS * 3, label=[0, 1, 0, 1] * 3)
    queries, corpus = docs.select(range(4)), docs.select(range(4, 12))
    result = evaluate_retrieval(model, queries, corpus, k=(1, 5), tokenizer=tok, topic_tokenizer=topic_tok)
    blocks = evaluate_retrieval(model, queries, corpus, k=(1, 5), normalize="blocks", tokenizer=tok,
                                topic_tokenizer=topic_tok)
    assert 0 <= result["precision@5"] <= 1 and "raw" in result["representation"]
    assert "normalised" in blocks["representation"]
    # the queries are copies of corpus documents: identical vectors rank first
    assert result["precision@1"] == 1.0
    assert tfidf_retrieval(queries, corpus, k=(1,))["precision@1"] == 1.0
    assert 0 <= lda_retrieval(queries, corpus, k=(1,), num_topics=2, min_df=1, max_df=1.0)["precision@1"] <= 1
    with pytest.raises(ValueError, match="need a 'label' column"):
        evaluate_retrieval(model, queries.remove_columns("label"), corpus, tokenizer=tok, topic_tokenizer=topic_tok)


# ----------------------------------------------------------------------------------------------
# real data: splits, cleaning, a short classification run above the majority class
# ----------------------------------------------------------------------------------------------


@requires_data("20ng", "train.jsonl.gz")
def test_newsgroups_split_hygiene_and_cleaning():
    train, test = load_classification_splits(DATA / "20ng" / "train.jsonl.gz", clean="newsgroups",
                                             max_train_documents=400, max_test_documents=100)
    assert not set(train["id"]) & set(test["id"])
    again, _ = load_classification_splits(DATA / "20ng" / "train.jsonl.gz", clean="newsgroups",
                                          max_train_documents=400, max_test_documents=100)
    assert again["id"] == train["id"]  # a fixed seed gives the same split
    full_train, full_test = load_classification_splits(DATA / "20ng" / "train.jsonl.gz")
    assert len(full_train) + len(full_test) <= 11314 and len(full_test) == pytest.approx(0.2 * 11314, abs=1)
    assert not set(full_train["id"]) & set(full_test["id"])
    words = {w for doc in train["sentences"][:50] for s in doc for w in s}
    assert "organization" not in words or "lines" not in words  # the header block is gone
    post = "From: a@b.c\nSubject: cars\nOrganization: X\n\nI like cars.\n> quoted text\n-- \nsig"
    assert clean_newsgroups_post(post).strip() == "I like cars."
    with pytest.raises(ValueError, match="clean must be one of"):
        load_classification_splits(DATA / "20ng" / "train.jsonl.gz", clean="html")


def _labelled_file(tmp_path, labels):
    import json

    texts = [" ".join(w for sentence in doc for w in sentence) for doc in CORPUS]
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({"text": texts[i % len(texts)], "label": label}) + "\n"
                            for i, label in enumerate(labels)))
    return path


@pytest.mark.parametrize("labels, message", [
    (["sports"] * 20, "every row has the class 'sports'; a classifier needs at least two classes"),
    ([1] * 20, "every row has the class '1'"),
    ([0.5] + [0, 1] * 10, r"'label' must hold class ids 0, 1, 2, ... or class names; row 0 has 0.5"),
    ([-1] + [0, 1] * 10, "row 0 has -1"),
    ([None] + [0, 1] * 10, "row 0 has no label"),
])
def test_labels_that_would_not_train_a_classifier_are_refused(tmp_path, labels, message):
    with pytest.raises(ValueError, match=message):
        load_classification_splits(_labelled_file(tmp_path, labels))


def test_class_names_are_kept_and_integral_floats_are_ids(tmp_path):
    train, test = load_classification_splits(_labelled_file(tmp_path, ["sports", "law"] * 10))
    assert train.features["label"].names == ["law", "sports"] == test.features["label"].names
    train, _ = load_classification_splits(_labelled_file(tmp_path, [1.0, 0.0, 2.0] * 7))
    assert train.features["label"].names == ["0", "1", "2"] and set(train["label"]) == {0, 1, 2}


@requires_data("r8", "train.jsonl.gz")
def test_r8_classes_are_named_by_their_label_text():
    train, _ = load_classification_splits(DATA / "r8" / "train.jsonl.gz", max_train_documents=10, max_test_documents=5)
    assert train.features["label"].names == ["acq", "crude", "earn", "grain", "interest", "money-fx", "ship", "trade"]


def test_a_label_outside_the_classifier_and_a_one_output_classifier_are_refused(toy, tmp_path):
    tok, topic_tok = toy
    model = tiny_model("tcnlm", tok, topic_tok)
    model.save_pretrained(tmp_path / "lm")
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2)
    batch = _batch(tok, topic_tok, label_column="label")
    batch["labels"] = torch.tensor([0, 1, 2, 1])
    with pytest.raises(ValueError, match=r"label 2 is not a class of this classifier \(num_labels=2\)"):
        clf(**batch)
    regressor = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=1)
    rows = documents_from_lists(CORPUS, label=[0, 1, 0, 1])
    with pytest.raises(ValueError, match="num_labels=1, which transformers trains as a regression"):
        classification_accuracy(regressor, rows, document_collator(regressor, tok, topic_tok))


@requires_data("r8", "train.jsonl.gz")
def test_classifier_from_a_saved_lm_learns_r8_above_the_majority_class(tmp_path):
    from topic_lm_hf import NCLMConfig, TopicLMTrainer, build_vocabularies, save_vocabularies
    from transformers import TrainingArguments

    torch.set_num_threads(1)
    train, test = load_classification_splits(DATA / "r8" / "train.jsonl.gz", max_train_documents=400,
                                             max_test_documents=150)
    tok, topic_tok = build_vocabularies(train, min_freq=3, stopwords="mallet")
    config = NCLMConfig.from_tokenizers(tok, topic_tok, variant="lta", embedding_size=16, hidden_size=16,
                                        num_topics=8, encoder_hidden_size=32, num_topic_samples=1, dropout=0.0)
    lm = AutoModelForCausalLM.from_config(config)
    collator = TopicContextCollator(tok, topic_tok, context="document")
    args = TrainingArguments(output_dir=str(tmp_path / "lm-run"), max_steps=40, per_device_train_batch_size=32,
                             learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    TopicLMTrainer(model=lm, args=args, train_dataset=collator.prepare(train), data_collator=collator).train()
    lm.save_pretrained(tmp_path / "lm")
    save_vocabularies(tok, topic_tok, tmp_path / "lm")
    # the CNN, fine-tuned: a 40-step, 16-unit LM's frozen features hardly vary between documents (measured: a
    # frozen MLP or CNN stays at the majority class)
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=8, classifier_head="cnn",
                                                             freeze_backbone=False)
    collator = document_collator(clf, max_document_length=120)  # the tokenizers saved with the LM
    train_rows, test_rows = collator.prepare(train), collator.prepare(test)
    train_classifier(clf, train_rows, collator, str(tmp_path / "clf"), epochs=3, learning_rate=1e-2, batch_size=25)
    accuracy = classification_accuracy(clf, test_rows, collator)
    majority = majority_accuracy(train["label"], test["label"])
    assert accuracy > majority + 0.1, (accuracy, majority)


def test_every_classifier_loads_as_remote_code_without_the_package(toy, tmp_path):
    import json

    from conftest import run_without_package
    from topic_lm_hf.hub import save_for_hub

    tok, topic_tok = toy
    batch = _batch(tok, topic_tok)
    expected, repos = {}, {}
    for family in ("lstm_lm", "tcnlm", "topic_rnn-gru", "nclm-leta-sdt", "rgbn"):
        model = tiny_rgbn(tok, topic_tok) if family == "rgbn" else tiny_model(family, tok, topic_tok).eval()
        repos[family] = str(tmp_path / family)
        save_for_hub(model, repos[family], tok, topic_tok)
        auto_map = json.loads((tmp_path / family / "config.json").read_text())["auto_map"]
        assert auto_map["AutoModelForSequenceClassification"].endswith("ForSequenceClassification")
        expected[family] = model.document_representation(batch).tolist()
    inputs = {k: batch[k].tolist() for k in ("input_ids", "attention_mask", "context_bow")}
    result = run_without_package(f"""
        import torch
        from transformers import AutoModelForSequenceClassification
        batch = {{k: torch.tensor(v) for k, v in {inputs!r}.items()}}
        out = {{}}
        for family, repo in {repos!r}.items():
            clf = AutoModelForSequenceClassification.from_pretrained(repo, num_labels=3, trust_remote_code=True).eval()
            out[family] = [type(clf).__name__, clf.document_representation(batch).tolist(),
                           list(clf(**batch).logits.shape)]
        print(json.dumps(out))
    """, tmp_path)
    for family, (name, reps, shape) in result.items():
        assert name.endswith("ForSequenceClassification") and shape == [4, 3]
        torch.testing.assert_close(torch.tensor(reps), torch.tensor(expected[family]), atol=1e-5, rtol=0)
