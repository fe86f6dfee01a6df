"""``topic-lm classify`` and ``topic-lm retrieve``: the downstream tasks from the command line.

Both read a JSON-lines corpus with ``text`` and ``label`` (e.g. ``../shared/data/20ng/train.jsonl.gz``), split it
with :func:`~topic_lm_hf.tasks.load_classification_splits` (stratified, seeded; the held-out part is the test
split), and use a saved model folder (a ``*ForCausalLM`` of any family, with its tokenizers).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

_SPLIT_HELP = ("The held-out share of --dataset (a stratified Dataset.train_test_split with --seed): the test "
               "documents (retrieval queries); the rest trains the classifier (is the retrieval corpus).")


@dataclass
class TaskDataArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder (or Hub id) with its tokenizers: a "
                                                      "*ForCausalLM of any family, or a saved classifier."})
    dataset: str = field(metadata={"help": "JSON lines with 'text' and 'label' columns, e.g. "
                                           "../shared/data/20ng/train.jsonl.gz or ../shared/data/r8/train.jsonl.gz."})
    clean: Optional[str] = field(default=None, metadata={
        "help": "'newsgroups': strip 20 Newsgroups headers, signatures and quoted lines (scikit-learn's "
                "fetch_20newsgroups(remove=('headers', 'footers', 'quotes')) functions). Default: none."})
    test_fraction: float = field(default=0.2, metadata={"help": _SPLIT_HELP})
    seed: int = field(default=0, metadata={"help": "Seed of the split and of the classifier's training."})
    max_document_length: int = field(default=400, metadata={"help": "Tokens kept per document."})
    max_train_documents: Optional[int] = field(default=None, metadata={"help": "Use only the first N training "
                                                                                "documents of the split."})
    max_test_documents: Optional[int] = field(default=None, metadata={"help": "Use only the first N test documents."})
    baselines: bool = field(default=True, metadata={"help": "Also report the scikit-learn baselines on the same "
                                                            "split."})
    batch_size: int = field(default=50, metadata={"help": "Batch size (training and feature extraction)."})


@dataclass
class ClassifyArguments:
    head: str = field(default="mlp", metadata={
        "help": "'mlp': TopicRNN's head (50 sigmoid units) on [o_N; c]; 'cnn': NCLM's Kim CNN over [o_m; c]."})
    freeze_backbone: bool = field(default=True, metadata={
        "help": "Train only the head on frozen features (the papers' recipe); false fine-tunes the whole model."})
    epochs: float = field(default=20, metadata={"help": "Training epochs of the classifier."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate of the classifier."})
    output_dir: Optional[str] = field(default=None, metadata={
        "help": "Save the trained classifier (and the tokenizers) here."})


@dataclass
class RetrieveArguments:
    k: str = field(default="5,10", metadata={"help": "Comma-separated cut-offs k of precision@k."})
    fractions: str = field(default="", metadata={
        "help": "Comma-separated corpus fractions r (precision at k = int(N r + 0.5)), e.g. 0.02 (Gupta et al.)."})
    normalize: str = field(default="none", metadata={
        "help": "'none': cosine of the raw [o_N; c] (the paper); 'blocks': o_N and c L2-normalised separately."})


def _splits(args: TaskDataArguments):
    from .classification import load_classification_splits

    train, test = load_classification_splits(args.dataset, test_fraction=args.test_fraction, seed=args.seed,
                                             clean=args.clean, max_train_documents=args.max_train_documents,
                                             max_test_documents=args.max_test_documents)
    print(f"{args.dataset}: {len(train)} training / {len(test)} held-out documents "
          f"(stratified {1 - args.test_fraction:.0%}/{args.test_fraction:.0%} split, seed {args.seed}"
          + (f", cleaned: {args.clean}" if args.clean else "") + ")")
    return train, test


def run_classify(data_args: TaskDataArguments, args: ClassifyArguments) -> None:
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from ..data import load_vocabularies, save_vocabularies
    from .classification import (FeatureCollator, add_document_features, bow_logistic_regression,
                                 classification_accuracy, document_collator, majority_accuracy, train_classifier)

    train, test = _splits(data_args)
    labels = sorted(set(train["label"]) | set(test["label"]))
    num_labels = int(max(labels)) + 1
    config = AutoConfig.from_pretrained(data_args.model_name_or_path)
    kwargs = {"freeze_backbone": args.freeze_backbone, "classifier_head": args.head}
    if getattr(config, "num_labels", None) != num_labels or "ForSequenceClassification" not in str(
            getattr(config, "architectures", None)):
        kwargs["num_labels"] = num_labels
    clf = AutoModelForSequenceClassification.from_pretrained(data_args.model_name_or_path, **kwargs)
    collator = document_collator(clf, max_document_length=data_args.max_document_length)
    start = time.perf_counter()
    if args.head == "mlp" and args.freeze_backbone:  # features once, then an epoch costs only the MLP
        train_rows = add_document_features(clf, train, collator, data_args.batch_size)
        test_rows = add_document_features(clf, test, collator, data_args.batch_size)
        collator = FeatureCollator()
    else:
        train_rows, test_rows = collator.prepare(train), collator.prepare(test)
    out_dir = args.output_dir or str(Path(data_args.model_name_or_path) / "classify-run")
    train_classifier(clf, train_rows, collator, out_dir, epochs=args.epochs, learning_rate=args.learning_rate,
                     batch_size=data_args.batch_size, seed=data_args.seed)
    accuracy = classification_accuracy(clf, test_rows, collator, data_args.batch_size)
    recipe = f"{args.head} head, {'frozen features' if args.freeze_backbone else 'fine-tuned'}, {args.epochs:g} epochs"
    rows = [(f"{type(clf).__name__} [o_N; c] ({recipe})", accuracy)]
    if data_args.baselines:
        rows.append(("majority class", majority_accuracy(train["label"], test["label"])))
        bow = bow_logistic_regression(train, test)
        rows.append((f"tf-idf + logistic regression ({bow['settings']})", bow["accuracy"]))
    print(f"\n| model | accuracy |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value:.4f} |")
    print(f"\n({time.perf_counter() - start:.0f} s)")
    if args.output_dir:
        clf.save_pretrained(args.output_dir)
        if clf.document_topic_size:
            save_vocabularies(*load_vocabularies(data_args.model_name_or_path), args.output_dir)
        else:
            AutoTokenizer.from_pretrained(data_args.model_name_or_path).save_pretrained(args.output_dir)
        (Path(args.output_dir) / "classify_result.json").write_text(json.dumps(
            {"accuracy": accuracy, "recipe": recipe, "dataset": data_args.dataset, "test_fraction":
             data_args.test_fraction, "seed": data_args.seed, "baselines": dict(rows[1:])}, indent=1))
        print(f"saved to {args.output_dir}")


def run_retrieve(data_args: TaskDataArguments, args: RetrieveArguments) -> None:
    from transformers import AutoModelForCausalLM

    from .retrieval import evaluate_retrieval, lda_retrieval, tfidf_retrieval

    train, test = _splits(data_args)
    ks = [int(x) for x in args.k.split(",") if x.strip()]
    fractions = [float(x) for x in args.fractions.split(",") if x.strip()]
    model = AutoModelForCausalLM.from_pretrained(data_args.model_name_or_path)
    results = [(type(model).__name__, evaluate_retrieval(model, test, train, ks, fractions, normalize=args.normalize,
                                                          batch_size=data_args.batch_size,
                                                          max_document_length=data_args.max_document_length))]
    if data_args.baselines:
        results.append(("tf-idf", tfidf_retrieval(test, train, ks, fractions)))
        results.append(("LDA", lda_retrieval(test, train, ks, fractions, seed=data_args.seed)))
    names = [key for key in results[0][1] if key.startswith("precision@")]
    print("\n| vectors | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for name, result in results:
        print(f"| {name}: {result['representation']} | " + " | ".join(f"{result[n]:.4f}" for n in names) + " |")
    print(f"\nqueries = the {len(test)} held-out documents, corpus = the {len(train)} training documents, cosine, "
          "relevance = same label")
