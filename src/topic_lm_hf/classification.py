"""Document classification with TopicRNN features, and the bag-of-words baseline.

The paper's recipe (Dieng et al. 2017, §4.2): train TopicRNN as a language model without labels,
pass every labelled document through it, concatenate the output of the inference network with
the last RNN state, and train a network with one hidden layer of 50 sigmoid units on these frozen
features (after Le & Mikolov 2014). Everything here goes through ``Trainer``:

* :class:`DocumentClassificationCollator` turns documents (``sentences`` + ``label``) into
  ``input_ids`` / ``attention_mask`` / ``context_bow`` / ``labels`` batches: the document's
  sentences as ``<bos> w_1 .. w_n <eos>`` one after the other, truncated to ``max_length`` tokens,
  and the bag of words of the whole document (first ``max_context_tokens`` topic tokens, the
  collator's ``"document"`` mode).
* :func:`add_document_features` precomputes the frozen features once, and
  :class:`FeatureCollator` feeds them to ``TopicRNNForSequenceClassification`` (its
  ``document_features`` input) so that a frozen-feature epoch costs only the MLP.
* ``TopicRNNForSequenceClassification(freeze_backbone=False)`` with the document collator is the
  fine-tunable variant.
* :func:`bow_logistic_regression` is the baseline: tf-idf unigrams + bigrams, scikit-learn's
  ``LogisticRegression``.

IMDB: :func:`load_imdb_splits` holds out a fixed 20 % of ``train.jsonl.gz`` (a seeded
permutation: the file is sorted by label) as the test split.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import datasets
import numpy as np
import torch

from .collator import TopicContextCollator
from .data import load_documents


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


def load_imdb_splits(path: str | os.PathLike, test_fraction: float = 0.2, seed: int = 0,
                     max_train_documents: Optional[int] = None, max_test_documents: Optional[int] = None,
                     num_proc: Optional[int] = None) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Train and held-out test documents (``sentences``, ``label``) of an IMDB-style JSON-lines file.

    The split is fixed by ``seed``: the rows are permuted once, the first ``test_fraction`` of the
    permutation is the test split and the rest the training split. ``max_*_documents`` take the
    first N of each split (so a small test split is always a subset of the full one).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    raw = datasets.load_dataset("json", data_files=str(path), split="train")
    if "label" not in raw.column_names or "text" not in raw.column_names:
        raise ValueError(f"{path} needs 'text' and 'label' columns (has {raw.column_names})")
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


@dataclass
class DocumentClassificationCollator:
    """Whole documents as single sequences with their bag of topic words and label.

    Args:
        tokenizer, topic_tokenizer: the LM and topic tokenizers of the TopicRNN model.
        max_length: tokens kept per document (``<bos>``/``<eos>`` of each sentence included).
        max_context_tokens: topic tokens kept in the document's bag of words (``None`` = all).
        label_column: the documents' label column (returned as ``labels``; documents without one, e.g. a
            corpus to extract features from, give batches without ``labels``).

    Accepts raw documents (``sentences``, label) or rows of :meth:`prepare`.
    """

    tokenizer: Any
    topic_tokenizer: Any
    max_length: int = 400
    max_context_tokens: Optional[int] = 300
    label_column: str = "label"

    def __post_init__(self):
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        self._lm = TopicContextCollator(self.tokenizer, self.topic_tokenizer, context="document",
                                        max_context_tokens=self.max_context_tokens)

    def encode(self, sentences: Sequence[Sequence[str]]) -> dict[str, list[int]]:
        ids = [self._lm.encode_sentence(s) for s in sentences if len(s)]
        if not ids:
            raise ValueError("Empty document: remove it (load_documents(..., on_empty='skip') does)")
        tokens = [t for s in ids for t in (self._lm.bos_id, *s, self._lm.eos_id)][:self.max_length]
        return {"input_ids": tokens, "context_ids": self._lm.contexts(ids, mode="document")[0].tolist()}

    def prepare(self, documents: datasets.Dataset, num_proc: Optional[int] = None) -> datasets.Dataset:
        """Encode every document once (``input_ids``, ``context_ids``, and ``labels`` when there is a label column)."""
        labelled = self.label_column in documents.column_names

        def encode(batch):
            rows = [self.encode(doc) for doc in batch["sentences"]]
            out = {"input_ids": [r["input_ids"] for r in rows], "context_ids": [r["context_ids"] for r in rows]}
            if labelled:
                out["labels"] = batch[self.label_column]
            return out

        return documents.map(encode, batched=True, remove_columns=documents.column_names, num_proc=num_proc,
                             desc="encoding documents")

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("Empty batch")
        if "input_ids" not in features[0]:
            features = [{**self.encode(f["sentences"]),
                         **({"labels": f[self.label_column]} if self.label_column in f else {})} for f in features]
        batch = self._lm._lm_batch([f["input_ids"] for f in features])
        del batch["labels"]
        batch["context_bow"] = self._lm.bag_of_words([f["context_ids"] for f in features])
        if "labels" in features[0]:
            batch["labels"] = torch.as_tensor([f["labels"] for f in features])
        return batch


@torch.no_grad()
def extract_document_features(model, rows: datasets.Dataset, collator: DocumentClassificationCollator,
                              batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Frozen document features (n, F) and labels (n,) of prepared rows (``model.document_features``)."""
    was_training = model.training
    model.eval()
    feats, labels = [], []
    try:
        for start in range(0, len(rows), batch_size):
            batch = collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            feats.append(model.document_features(batch).float().cpu().numpy())
            labels.append(batch["labels"].numpy())
    finally:
        model.train(was_training)
    return np.concatenate(feats), np.concatenate(labels)


def add_document_features(model, rows: datasets.Dataset, collator: DocumentClassificationCollator,
                          batch_size: int = 64) -> datasets.Dataset:
    """A dataset of ``document_features`` and ``labels`` for :class:`FeatureCollator`."""
    features, labels = extract_document_features(model, rows, collator, batch_size)
    return datasets.Dataset.from_dict({"document_features": features.tolist(), "labels": labels.tolist()})


class FeatureCollator:
    """Batches of precomputed ``document_features`` (b, F) and ``labels`` (b,)."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {"document_features": torch.as_tensor([f["document_features"] for f in features], dtype=torch.float32),
                "labels": torch.as_tensor([f["labels"] for f in features])}


# ----------------------------------------------------------------------------------------------
# training and scoring
# ----------------------------------------------------------------------------------------------


def train_classifier(model, train_rows: datasets.Dataset, collator, output_dir: str, *, epochs: float = 3,
                     learning_rate: float = 1e-3, batch_size: int = 32, seed: int = 0, max_steps: int = -1,
                     **training_kwargs):
    """Train a sequence classifier with ``Trainer`` (no checkpoints written); returns the trainer."""
    from transformers import TrainingArguments

    from .trainer import TopicLMTrainer

    args = TrainingArguments(output_dir=output_dir, num_train_epochs=epochs, max_steps=max_steps,
                             learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                             per_device_eval_batch_size=batch_size, save_strategy="no", report_to=[],
                             seed=seed, use_cpu=not torch.cuda.is_available(), remove_unused_columns=False,
                             disable_tqdm=True, **{"logging_steps": 50, **training_kwargs})
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=train_rows, data_collator=collator)
    trainer.train()
    return trainer


@torch.no_grad()
def classification_accuracy(model, rows: datasets.Dataset, collator, batch_size: int = 64) -> float:
    """Accuracy of a single-label classifier on prepared rows."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    try:
        for start in range(0, len(rows), batch_size):
            batch = collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            labels = batch.pop("labels")
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
            correct += int((logits.argmax(-1).cpu() == labels).sum())
    finally:
        model.train(was_training)
    return correct / len(rows)


def majority_accuracy(train_labels: Sequence[int], test_labels: Sequence[int]) -> float:
    """Accuracy of always predicting the most frequent training label."""
    values, counts = np.unique(np.asarray(train_labels), return_counts=True)
    return float(np.mean(np.asarray(test_labels) == values[counts.argmax()]))


def bow_logistic_regression(train_docs: datasets.Dataset, test_docs: datasets.Dataset, label_column: str = "label",
                            ngram_range: tuple[int, int] = (1, 2), min_df: int = 2, C: float = 4.0,
                            max_iter: int = 1000) -> dict[str, Any]:
    """Bag-of-words baseline: tf-idf (sublinear tf) n-grams + logistic regression (scikit-learn).

    Returns ``{"accuracy", "train_documents", "test_documents", "features", "settings"}``.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    def texts(docs):
        return [" ".join(w for s in d for w in s) for d in docs["sentences"]]

    vectorizer = TfidfVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False, ngram_range=ngram_range,
                                 min_df=min_df, sublinear_tf=True)
    x_train = vectorizer.fit_transform(texts(train_docs))
    x_test = vectorizer.transform(texts(test_docs))
    clf = LogisticRegression(C=C, max_iter=max_iter)
    clf.fit(x_train, train_docs[label_column])
    accuracy = float(np.mean(clf.predict(x_test) == np.asarray(test_docs[label_column])))
    return {"accuracy": accuracy, "train_documents": len(train_docs), "test_documents": len(test_docs),
            "features": x_train.shape[1],
            "settings": f"tf-idf (sublinear) {ngram_range[0]}-{ngram_range[1]}-grams, min_df={min_df}, "
                        f"LogisticRegression(C={C})"}
