"""Document classification with the features of any model of the package, and its baselines.

Every family's base model gives :meth:`document_representation` (``modeling_document.DocumentRepresentationMixin``):
[o_N; c] per document, or [o_m; c] per token, o the top recurrent layer's output and c the document topic vector
of its bag of words (none for the LSTM LM). Every family has a ``*ForSequenceClassification`` registered with
``AutoModelForSequenceClassification``, which loads the body of a saved causal LM folder. Two recipes, both
through ``Trainer``:

* **frozen features + a small head** (the papers'): TopicRNN's MLP with 50 sigmoid units on [o_N; c]
  (``classifier_head="mlp"``, the default) or NCLM's Kim-style CNN over [o_m; c] (``classifier_head="cnn"``).
  For the MLP, :func:`add_document_features` computes the features once and :class:`FeatureCollator` feeds them
  (an epoch then costs only the MLP); the CNN reads the tokens and runs the frozen body under ``no_grad``.
* **fine-tuning** (``freeze_backbone=False``): the same models, every weight trained.

Documents reach the models through ``TopicContextCollator(tok, topic_tok, context="document",
layout="sequence", label_column="label")``: each document as ONE sequence (its sentences as
``<bos> .. <eos>`` one after the other, cut at ``max_document_length`` tokens) with the bag of words of the
whole document (the first ``max_context_tokens`` topic words).

Data (:func:`load_classification_splits`): JSON-lines corpora with ``text`` and ``label`` (e.g. those of
``$TOPIC_LM_DATA``).
Their test splits are held back, so the training file is split with ``Dataset.train_test_split``
(stratified by label, fixed seed). 20 Newsgroups posts are cleaned with scikit-learn's own functions for
``fetch_20newsgroups(remove=("headers", "footers", "quotes"))`` (``clean="newsgroups"``): the header block
(From, Subject, Organization, Lines, ...; From and Organization name the group), the signature after the last
``--`` line, and quoted lines (``>``, ``|``, "... writes:"). IMDB keeps the seeded permutation of
:func:`load_imdb_splits` (TopicRNN's benchmark).

Scores (:func:`classification_scores`: accuracy and macro-F1) and baselines are computed by scikit-learn:
:func:`majority_baseline` (``DummyClassifier``) and :func:`bow_logistic_regression` (tf-idf uni+bigrams,
logistic regression). ``topic_lm_hf.load_metric("classification")`` is the same as an ``evaluate`` module, for
``Trainer(compute_metrics=...)``.
"""

from __future__ import annotations

import collections
import logging
import math
import os
from typing import Any, Optional, Sequence

import datasets
import numpy as np
import torch

from ..collator import TopicContextCollator
from ..data import load_documents

logger = logging.getLogger(__name__)

CLEANING = (None, "newsgroups")


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


def clean_newsgroups_post(text: str) -> str:
    """A 20 Newsgroups post without its headers, signature and quoted lines: scikit-learn's
    ``strip_newsgroup_header``, ``strip_newsgroup_footer`` and ``strip_newsgroup_quoting`` (what
    ``fetch_20newsgroups(remove=("headers", "footers", "quotes"))`` applies)."""
    try:
        from sklearn.datasets._twenty_newsgroups import (strip_newsgroup_footer, strip_newsgroup_header,
                                                         strip_newsgroup_quoting)
    except ImportError as error:  # the helpers live in a private module of scikit-learn
        raise ImportError("clean='newsgroups' uses scikit-learn's 20 Newsgroups cleaning functions "
                          f"(sklearn.datasets._twenty_newsgroups), which this scikit-learn lacks: {error}") from error
    return strip_newsgroup_quoting(strip_newsgroup_footer(strip_newsgroup_header(text)))


LABELLED_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def labelled_file_format(path: str | os.PathLike) -> str:
    """The ``datasets`` builder of a labelled corpus file by its extension (``.gz`` aside): JSON lines, CSV or
    Parquet; anything else (a Lau .txt has no labels) is a ``ValueError`` naming the accepted formats."""
    name = str(path).lower()
    name = name[:-3] if name.endswith(".gz") else name
    for suffix, builder in LABELLED_FORMATS.items():
        if name.endswith(suffix):
            return builder
    raise ValueError(f"{path}: a labelled corpus is JSON lines (.jsonl[.gz], .json), CSV (.csv[.gz]) or Parquet "
                     f"(.parquet) with 'text' and 'label' columns, e.g. $TOPIC_LM_DATA/20ng/train.jsonl.gz")


def check_stratified_split(labels: Sequence[int], names: Sequence[str], test_fraction: float, path) -> None:
    """One ``ValueError`` naming what to change where the stratified split cannot be made (scikit-learn's own
    message speaks of "groups" and "n_classes"): a label with a single document, or a held-out or training part
    with fewer documents than there are labels."""
    counts = collections.Counter(labels)
    lonely = [names[label] for label, n in sorted(counts.items()) if n < 2]
    if lonely:
        raise ValueError(f"{path}: the stratified split needs at least 2 documents of every label; {len(lonely)} "
                         f"label(s) have one ({', '.join(map(str, lonely[:5]))}): give more of them, or leave them out")
    n = len(labels)
    test = math.ceil(test_fraction * n)
    if min(test, n - test) < len(counts):
        raise ValueError(f"{path}: a held-out share of {test_fraction:g} (test_fraction; --test_fraction on the command "
                         f"line) splits {n} documents into {n - test} and {test}, and each part needs at least one "
                         f"document of each of the {len(counts)} labels: change the share or give more documents")


def load_classification_splits(path: str | os.PathLike, test_fraction: float = 0.2, seed: int = 0,
                               clean: Optional[str] = None, max_train_documents: Optional[int] = None,
                               max_test_documents: Optional[int] = None, num_proc: Optional[int] = None
                               ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train and held-out documents (``sentences``, ``label``, ``id``) of a JSON-lines, CSV or Parquet file
    (:func:`labelled_file_format`) with ``text`` and ``label``: ``Dataset.train_test_split(test_size=test_fraction, seed=seed, stratify_by_column="label")``.

    ``clean="newsgroups"`` applies :func:`clean_newsgroups_post` first. Documents left without a token are
    dropped after the split (logged), so no document is in both splits and the split does not depend on the
    cleaning. ``max_*_documents`` keep the first N of each split (a small split is a subset of the full one).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if clean not in CLEANING:
        raise ValueError(f"clean must be one of {CLEANING}, got {clean!r}")
    raw = datasets.load_dataset(labelled_file_format(path), data_files=str(path), split="train")
    if "label" not in raw.column_names or "text" not in raw.column_names:
        raise ValueError(f"{path} needs 'text' and 'label' columns (has {raw.column_names})")
    if "id" not in raw.column_names:
        raw = raw.add_column("id", [str(i) for i in range(len(raw))])
    raw = _with_class_labels(raw, path)
    class_label = raw.features["label"]
    raw = raw.select_columns(["id", "text", "label"])
    check_stratified_split(raw["label"], class_label.names, test_fraction, path)
    split = raw.train_test_split(test_size=test_fraction, seed=seed, stratify_by_column="label")
    train, test = split["train"], split["test"]
    if max_train_documents is not None:
        train = train.select(range(min(max_train_documents, len(train))))
    if max_test_documents is not None:
        test = test.select(range(min(max_test_documents, len(test))))
    if clean == "newsgroups":
        train = train.map(lambda row: {"text": clean_newsgroups_post(row["text"])}, num_proc=num_proc)
        test = test.map(lambda row: {"text": clean_newsgroups_post(row["text"])}, num_proc=num_proc)
    out = []
    for name, part in (("train", train), ("test", test)):
        docs = load_documents(part, text_column="text", on_empty="skip", num_proc=num_proc).remove_columns("text")
        if len(docs) < len(part):
            logger.info("%s: %d of %d %s documents have no token left and were dropped", path,
                        len(part) - len(docs), len(part), name)
        out.append(docs.cast_column("label", class_label))
    return out[0], out[1]


def _with_class_labels(raw: datasets.Dataset, path) -> datasets.Dataset:
    """``raw`` with a ``ClassLabel`` ``label`` column: class names are kept (string labels, or the names of a
    ``label_text`` column beside integer ids). Refuses what would train something else than a classifier:
    labels that are not class ids or names, and fewer than two classes (transformers treats one output as
    regression)."""
    feature, values = raw.features["label"], raw["label"]
    if any(v is None for v in values):
        raise ValueError(f"{path}: row {values.index(None)} has no label; every row needs one")
    if isinstance(feature, datasets.ClassLabel):
        names = feature.names
    elif getattr(feature, "dtype", None) == "string":
        raw = raw.class_encode_column("label")
        names = raw.features["label"].names
    else:
        bad = next((i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, (int, float))
                    or not float(v).is_integer() or v < 0), None)
        if bad is not None:
            raise ValueError(f"{path}: 'label' must hold class ids 0, 1, 2, ... or class names; row {bad} has "
                             f"{values[bad]!r}")
        ids = np.asarray(values).astype(np.int64)
        names = [str(i) for i in range(int(ids.max()) + 1)]
        if "label_text" in raw.column_names:  # R8 and 20 Newsgroups name their classes beside the ids
            named = dict(zip(ids.tolist(), raw["label_text"]))
            names = [str(named.get(i, i)) for i in range(len(names))]
        raw = raw.remove_columns("label").add_column("label", ids.tolist(), feature=datasets.ClassLabel(names=names))
    present = sorted(set(raw["label"]))
    if len(present) < 2:
        raise ValueError(f"{path}: every row has the class {names[present[0]]!r}; a classifier needs at least two "
                         f"classes (with one, transformers would train a regression)")
    return raw


def load_imdb_splits(path: str | os.PathLike, test_fraction: float = 0.2, seed: int = 0,
                     max_train_documents: Optional[int] = None, max_test_documents: Optional[int] = None,
                     num_proc: Optional[int] = None) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train and held-out test documents (``sentences``, ``label``) of an IMDB-style JSON-lines file, as
    TopicRNN's benchmark splits them: the rows are permuted once with ``seed``, the first ``test_fraction`` of
    the permutation is the test split and the rest the training split. ``max_*_documents`` take the first N of
    each split (so a small test split is always a subset of the full one).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    raw = datasets.load_dataset(labelled_file_format(path), data_files=str(path), split="train")
    if "label" not in raw.column_names or "text" not in raw.column_names:
        raise ValueError(f"{path} needs 'text' and 'label' columns (has {raw.column_names})")
    raw = _with_class_labels(raw, path)  # the same label rules and names as load_classification_splits
    order = np.random.default_rng(seed).permutation(len(raw))
    n_test = int(round(test_fraction * len(raw)))
    test_idx, train_idx = order[:n_test], order[n_test:]
    if max_train_documents is not None:
        train_idx = train_idx[:max_train_documents]
    if max_test_documents is not None:
        test_idx = test_idx[:max_test_documents]
    keep = [c for c in raw.column_names if c not in ("text", "label")]

    def load(idx):
        subset = raw.select(idx.tolist()).remove_columns(keep)
        return load_documents(subset, text_column="text", num_proc=num_proc).remove_columns("text")

    return load(train_idx), load(test_idx)


# ----------------------------------------------------------------------------------------------
# features
# ----------------------------------------------------------------------------------------------


def document_collator(model, tokenizer=None, topic_tokenizer=None, max_document_length: int = 400,
                      max_context_tokens: Optional[int] = 300, label_column: Optional[str] = "label"
                      ) -> TopicContextCollator:
    """The ``layout="sequence"`` collator of ``model``: its tokenizers are read from the model's folder
    (``model.name_or_path``) when not given. A model without a topic part (the LSTM LM) gets
    ``context="none"``."""
    from ..data import load_vocabularies

    topical = "context_bow" in model.conditioning_inputs
    if tokenizer is None:
        from transformers import AutoTokenizer

        source = getattr(model, "name_or_path", "") or ""
        if not source:
            raise ValueError("Give the tokenizer (and topic_tokenizer): the model was not loaded from a folder")
        if topical:
            tokenizer, loaded_topic = load_vocabularies(source)
            topic_tokenizer = topic_tokenizer or loaded_topic
        else:
            tokenizer = AutoTokenizer.from_pretrained(source)
    if topical and topic_tokenizer is None:
        raise ValueError(f"{type(model).__name__} reads a bag of topic words: give topic_tokenizer")
    return TopicContextCollator.for_model(model, tokenizer, topic_tokenizer, protocol="document",
                                          max_document_length=max_document_length,
                                          max_context_tokens=max_context_tokens, label_column=label_column)


@torch.no_grad()
def extract_document_features(model, documents: datasets.Dataset, collator: Optional[TopicContextCollator] = None,
                              batch_size: int = 64, tokenizer=None, topic_tokenizer=None,
                              **collator_kwargs) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Frozen document features (n, H + |c|) = ``model.document_representation`` (eval mode) and the labels
    (n,) (``None`` for unlabelled documents).

    ``documents``: raw documents (``sentences`` [+ ``label``]) or rows prepared by the collator. ``collator``
    defaults to :func:`document_collator` (the model's own tokenizers)."""
    if collator is None:
        collator = document_collator(model, tokenizer, topic_tokenizer, **collator_kwargs)
    if collator.layout != "sequence":
        raise ValueError("extract_document_features needs a layout='sequence' collator (one sequence per document)")
    if len(documents) == 0:
        raise ValueError("No documents to featurise")
    was_training = model.training
    model.eval()
    feats, labels = [], []
    try:
        for start in range(0, len(documents), batch_size):
            batch = collator([documents[i] for i in range(start, min(start + batch_size, len(documents)))])
            feats.append(model.document_representation(batch).float().cpu().numpy())
            if collator.label_column is not None and "labels" in batch:  # class labels, not the LM's
                labels.append(batch["labels"].numpy())
    finally:
        model.train(was_training)
    return np.concatenate(feats), (np.concatenate(labels) if labels else None)


def add_document_features(model, documents: datasets.Dataset, collator: Optional[TopicContextCollator] = None,
                          batch_size: int = 64, **kwargs) -> datasets.Dataset:
    """A dataset of ``document_features`` (and ``labels``) for :class:`FeatureCollator`."""
    features, labels = extract_document_features(model, documents, collator, batch_size, **kwargs)
    columns = {"document_features": features.tolist()}
    if labels is not None:
        columns["labels"] = labels.tolist()
    return datasets.Dataset.from_dict(columns)


class FeatureCollator:
    """Batches of precomputed ``document_features`` (b, F) and ``labels`` (b,)."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = {"document_features": torch.as_tensor([f["document_features"] for f in features], dtype=torch.float32)}
        if "labels" in features[0]:
            batch["labels"] = torch.as_tensor([f["labels"] for f in features])
        return batch


# ----------------------------------------------------------------------------------------------
# training and scoring
# ----------------------------------------------------------------------------------------------


def train_classifier(model, train_rows: datasets.Dataset, collator, output_dir: str, *, epochs: float = 3,
                     learning_rate: float = 1e-3, batch_size: int = 32, seed: int = 0, max_steps: int = -1,
                     **training_kwargs):
    """Train a sequence classifier with ``Trainer`` (no checkpoints written) on the device ``model`` is on (a model
    on the CPU trains there even when a GPU is present); returns the trainer."""
    from transformers import TrainingArguments

    from ..trainer import TopicLMTrainer

    args = TrainingArguments(output_dir=output_dir, num_train_epochs=epochs, max_steps=max_steps,
                             learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                             per_device_eval_batch_size=batch_size, save_strategy="no", report_to=[],
                             seed=seed, use_cpu=model.device.type == "cpu", remove_unused_columns=False,
                             disable_tqdm=True, **{"logging_steps": 50, **training_kwargs})
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=train_rows, data_collator=collator)
    trainer.train()
    return trainer


@torch.no_grad()
def predict_labels(model, rows: datasets.Dataset, collator, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, gold) labels of a single-label classifier on rows (documents or precomputed features)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predicted, gold = [], []
    try:
        for start in range(0, len(rows), batch_size):
            batch = collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            labels = batch.pop("labels")
            logits = model(**{k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}).logits
            predicted.append(logits.argmax(-1).cpu().numpy())
            gold.append(labels.numpy())
    finally:
        model.train(was_training)
    return np.concatenate(predicted), np.concatenate(gold)


def classification_scores(predicted: Sequence[int], gold: Sequence[int]) -> dict[str, float]:
    """Accuracy and macro-F1 (scikit-learn's ``accuracy_score`` and ``f1_score(average="macro",
    zero_division=0)``): what the package reports for a classifier, and what its ``evaluate`` module
    ``load_metric("classification")`` computes."""
    from sklearn.metrics import accuracy_score, f1_score

    return {"accuracy": float(accuracy_score(gold, predicted)),
            "macro_f1": float(f1_score(gold, predicted, average="macro", zero_division=0))}


def evaluate_classifier(model, rows: datasets.Dataset, collator, batch_size: int = 64) -> dict[str, float]:
    """:func:`classification_scores` of a single-label classifier on rows (documents or precomputed features)
    with labels."""
    if model.config.num_labels < 2:
        raise ValueError(f"{type(model).__name__} has num_labels={model.config.num_labels}, which transformers trains "
                         f"as a regression: accuracy needs a classifier of at least two classes")
    return classification_scores(*predict_labels(model, rows, collator, batch_size))


def classification_accuracy(model, rows: datasets.Dataset, collator, batch_size: int = 64) -> float:
    """Accuracy of a single-label classifier on rows (documents or precomputed features) with labels."""
    return evaluate_classifier(model, rows, collator, batch_size)["accuracy"]


def majority_baseline(train_labels: Sequence[int], test_labels: Sequence[int]) -> dict[str, float]:
    """:func:`classification_scores` of always predicting the most frequent training label (scikit-learn's
    ``DummyClassifier(strategy="most_frequent")``; a tie goes to the smallest label)."""
    from sklearn.dummy import DummyClassifier

    train_labels, test_labels = np.asarray(train_labels), np.asarray(test_labels)
    dummy = DummyClassifier(strategy="most_frequent").fit(np.zeros((len(train_labels), 1)), train_labels)
    return classification_scores(dummy.predict(np.zeros((len(test_labels), 1))), test_labels)


def majority_accuracy(train_labels: Sequence[int], test_labels: Sequence[int]) -> float:
    """Accuracy of always predicting the most frequent training label."""
    return majority_baseline(train_labels, test_labels)["accuracy"]


def document_texts(documents: datasets.Dataset) -> list[str]:
    """Each document's tokens joined by spaces (the input of the scikit-learn baselines)."""
    return [" ".join(w for s in d for w in s) for d in documents["sentences"]]


def bow_logistic_regression(train_docs: datasets.Dataset, test_docs: datasets.Dataset, label_column: str = "label",
                            ngram_range: tuple[int, int] = (1, 2), min_df: int = 2, C: float = 4.0,
                            max_iter: int = 1000) -> dict[str, Any]:
    """Bag-of-words baseline: tf-idf (sublinear tf) n-grams + logistic regression (scikit-learn).

    Returns ``{"accuracy", "macro_f1", "train_documents", "test_documents", "features", "settings"}``.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False, ngram_range=ngram_range,
                                 min_df=min_df, sublinear_tf=True)
    x_train = vectorizer.fit_transform(document_texts(train_docs))
    x_test = vectorizer.transform(document_texts(test_docs))
    clf = LogisticRegression(C=C, max_iter=max_iter)
    clf.fit(x_train, train_docs[label_column])
    scores = classification_scores(clf.predict(x_test), test_docs[label_column])
    return {**scores, "train_documents": len(train_docs), "test_documents": len(test_docs),
            "features": x_train.shape[1],
            "settings": f"tf-idf (sublinear) {ngram_range[0]}-{ngram_range[1]}-grams, min_df={min_df}, "
                        f"LogisticRegression(C={C})"}
