"""The downstream tasks from the command line: ``topic-lm classify``, ``topic-lm retrieve``, ``topic-lm wsd train``
and ``topic-lm wsd evaluate``.

    topic-lm wsd train --train $TOPIC_LM_DATA/wsd/semcor --dev $TOPIC_LM_DATA/wsd/semeval2007 \\
        --topic_model out/nclm/leta/model --output_dir out/wsd-nclm --num_train_epochs 5
    topic-lm wsd evaluate --model_name_or_path out/wsd-nclm --dataset $TOPIC_LM_DATA/wsd/senseval2

``classify`` and ``retrieve`` read a JSON-lines corpus with ``text`` and ``label`` (e.g.
``$TOPIC_LM_DATA/20ng/train.jsonl.gz``), split it with :func:`~topic_lm_hf.tasks.load_classification_splits`
(stratified, seeded; the held-out part is the test split), and use a saved model folder (a ``*ForCausalLM`` of any
family, with its tokenizers).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from transformers import TrainingArguments, set_seed

from ..arguments import parse_ids
from ..devices import DeviceArguments
from ..hub import load_pretrained
from ..models.configuration_sense_tagger import INPUT_FEATURES, OUTPUT_MODES

_SPLIT_HELP = ("The held-out share of --dataset (a stratified Dataset.train_test_split with --seed): the test "
               "documents (retrieval queries); the rest trains the classifier (is the retrieval corpus).")


@dataclass
class TaskDataArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder (or Hub id) with its tokenizers: a "
                                                      "*ForCausalLM of any family, or a saved classifier."})
    dataset: str = field(metadata={"help": "JSON lines, CSV or Parquet with 'text' and 'label' columns, e.g. "
                                           "$TOPIC_LM_DATA/20ng/train.jsonl.gz or $TOPIC_LM_DATA/r8/train.jsonl.gz."})
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
    from ..data import check_positive_flags
    from .classification import load_classification_splits

    check_positive_flags(max_train_documents=args.max_train_documents, max_test_documents=args.max_test_documents,
                         batch_size=args.batch_size, max_document_length=args.max_document_length)

    train, test = load_classification_splits(args.dataset, test_fraction=args.test_fraction, seed=args.seed,
                                             clean=args.clean, max_train_documents=args.max_train_documents,
                                             max_test_documents=args.max_test_documents)
    print(f"{args.dataset}: {len(train)} training / {len(test)} held-out documents "
          f"(stratified {1 - args.test_fraction:.0%}/{args.test_fraction:.0%} split, seed {args.seed}"
          + (f", cleaned: {args.clean}" if args.clean else "") + ")")
    return train, test


def run_classify(data_args: TaskDataArguments, args: ClassifyArguments, device: DeviceArguments | None = None) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..data import load_vocabularies, save_vocabularies
    from .classification import (FeatureCollator, add_document_features, bow_logistic_regression,
                                 document_collator, evaluate_classifier, majority_baseline, train_classifier)

    from ..models.configuration_common import CLASSIFIER_HEADS

    if args.head not in CLASSIFIER_HEADS:
        raise ValueError(f"--head must be one of {', '.join(CLASSIFIER_HEADS)}, got {args.head!r}")
    train, test = _splits(data_args)
    names = train.features["label"].names  # the classes' names are kept in the classifier's config
    clf = load_pretrained(AutoModelForSequenceClassification, data_args.model_name_or_path, num_labels=len(names),
                          id2label=dict(enumerate(names)), label2id={name: i for i, name in enumerate(names)},
                                                             freeze_backbone=args.freeze_backbone,
                                                             classifier_head=args.head)
    clf.to((device or DeviceArguments()).torch_device)  # the classifier trains and scores there (train_classifier)
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
    scores = evaluate_classifier(clf, test_rows, collator, data_args.batch_size)
    recipe = f"{args.head} head, {'frozen features' if args.freeze_backbone else 'fine-tuned'}, {args.epochs:g} epochs"
    rows = [(f"{type(clf).__name__} [o_N; c] ({recipe})", scores)]
    if data_args.baselines:
        rows.append(("majority class", majority_baseline(train["label"], test["label"])))
        bow = bow_logistic_regression(train, test)
        rows.append((f"tf-idf + logistic regression ({bow['settings']})", bow))
    print("\n| model | accuracy | macro-F1 |\n|---|---|---|")
    for name, value in rows:
        print(f"| {name} | {value['accuracy']:.4f} | {value['macro_f1']:.4f} |")
    print(f"\n({time.perf_counter() - start:.0f} s)")
    if args.output_dir:
        clf.save_pretrained(args.output_dir)
        if clf.document_topic_size:
            save_vocabularies(*load_vocabularies(data_args.model_name_or_path), args.output_dir)
        else:
            AutoTokenizer.from_pretrained(data_args.model_name_or_path).save_pretrained(args.output_dir)
        (Path(args.output_dir) / "classify_result.json").write_text(json.dumps(
            {**scores, "recipe": recipe, "dataset": data_args.dataset, "test_fraction": data_args.test_fraction,
             "seed": data_args.seed, "baselines": {name: {k: value[k] for k in ("accuracy", "macro_f1")}
                                                   for name, value in rows[1:]}}, indent=1))
        print(f"saved to {args.output_dir}")


def run_retrieve(data_args: TaskDataArguments, args: RetrieveArguments, device: DeviceArguments | None = None) -> None:
    from transformers import AutoModelForCausalLM

    from ..data import check_positive_flags
    from .retrieval import evaluate_retrieval, lda_retrieval, tfidf_retrieval

    ks = parse_ids(args.k, "--k", what="cut-off")
    check_positive_flags(k=min(ks))
    train, test = _splits(data_args)
    fractions = [float(x) for x in args.fractions.split(",") if x.strip()]
    model = load_pretrained(AutoModelForCausalLM, data_args.model_name_or_path).to(
        (device or DeviceArguments()).torch_device)
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


# ------------------------------------------------------------------------------------------------
# word sense disambiguation
# ------------------------------------------------------------------------------------------------


@dataclass
class WSDTrainArguments:
    train: str = field(metadata={"help": "Training set in the Raganato format (a folder with *.data.xml[.gz] and "
                                         "*.gold.key.txt[.gz]), e.g. $TOPIC_LM_DATA/wsd/semcor."})
    topic_model: Optional[str] = field(default=None, metadata={
        "help": "Folder of a trained topic model of the package (NCLM, TCNLM, TopicRNN), frozen, that gives each "
                "document its topic representation c. Without it: the BiLSTM baseline without topics."})
    topic_tokenizer: Optional[str] = field(default=None, metadata={
        "help": "Folder holding the topic model's topic_tokenizer/ when the topic model folder lacks one."})
    dev: Optional[str] = field(default=None, metadata={
        "help": "Development set (e.g. $TOPIC_LM_DATA/wsd/semeval2007): scored after every epoch; the best epoch "
                "(F1 in --output_mode) is kept. Never select on the test sets."})
    sense_inventory: Optional[str] = field(default=None, metadata={
        "help": "senses.tsv.gz of WordNet (default: $TOPIC_LM_DATA/wordnet/senses.tsv.gz)."})
    output_mode: str = field(default="candidates", metadata={
        "help": f"Default prediction mode recorded in the model, one of {OUTPUT_MODES}: 'candidates' (argmax among "
                "the lemma's trained candidate senses, WordNet first sense for unseen lemmas) or 'all_senses' (the "
                "paper: argmax over every training sense)."})
    training_objective: str = field(default="all_senses", metadata={
        "help": "Training loss: 'all_senses' (the paper: softmax over every training sense) or 'candidates' "
                "(softmax over the instance's own candidate senses)."})
    input_feature: str = field(default="lemma", metadata={
        "help": f"What a word is looked up by, one of {INPUT_FEATURES} (lower-cased)."})
    min_word_freq: int = field(default=1, metadata={"help": "Word vocabulary: minimum frequency in the training set."})
    embedding_size: int = field(default=100, metadata={"help": "Word embedding size."})
    hidden_size: int = field(default=100, metadata={"help": "BiLSTM units per direction (the paper: 100)."})
    dropout: float = field(default=0.2, metadata={"help": "Dropout on the embeddings and on the BiLSTM output."})
    max_context_tokens: Optional[int] = field(default=None, metadata={
        "help": "Keep only the first N topic tokens of a document's bag of words (default: the whole document)."})
    max_train_documents: Optional[int] = field(default=None, metadata={
        "help": "Use only the first N documents of the training set."})


@dataclass
class WSDEvaluateArguments:
    model_name_or_path: str = field(metadata={"help": "A trained sense tagger folder (topic-lm wsd train)."})
    dataset: str = field(metadata={"help": "A Raganato-format set with gold keys, e.g. "
                                           "$TOPIC_LM_DATA/wsd/senseval2."})
    modes: str = field(default="candidates,all_senses", metadata={
        "help": f"Comma-separated output modes to score, of {OUTPUT_MODES}."})
    key_file: Optional[str] = field(default=None, metadata={
        "help": "Where to write the answers in the scorer's key format; '{mode}' in it is replaced by the mode "
                "(default: <model>/<dataset name>.{mode}.key.txt)."})
    sense_inventory: Optional[str] = field(default=None, metadata={
        "help": "senses.tsv.gz (default: the one recorded in the model)."})
    topic_model: Optional[str] = field(default=None, metadata={
        "help": "The topic model folder, if it moved since training (default: the one recorded in the model)."})
    batch_size: int = field(default=64, metadata={"help": "Sentences per forward pass."})


def run_wsd_train(args: WSDTrainArguments, training_args: TrainingArguments) -> None:
    from ..models.modeling_conditioning import load_topic_tokenizer
    from .wsd import load_wsd_corpus
    from .wsd_tagger import train_sense_tagger

    from ..data import check_positive_flags

    check_positive_flags(max_train_documents=args.max_train_documents)
    set_seed(training_args.seed)
    train = load_wsd_corpus(args.train)
    if args.max_train_documents is not None:
        keep = set(list(dict.fromkeys(train["document_id"]))[:args.max_train_documents])
        train = train.filter(lambda d: d in keep, input_columns="document_id")
    dev = load_wsd_corpus(args.dev) if args.dev else None
    topic_tokenizer = load_topic_tokenizer(args.topic_tokenizer) if args.topic_tokenizer else None
    if args.topic_model is not None and not os.path.isdir(args.topic_model):
        raise ValueError(f"topic model folder {args.topic_model} does not exist")
    training_args.save_strategy = "no"  # the best epoch on --dev is kept in memory and saved at the end
    model = train_sense_tagger(train, training_args.output_dir, topic_model=args.topic_model,
                               topic_tokenizer=topic_tokenizer, dev=dev, sense_inventory=args.sense_inventory,
                               training_args=training_args, min_word_freq=args.min_word_freq,
                               train_corpus_path=os.path.abspath(args.train), output_mode=args.output_mode,
                               training_objective=args.training_objective, input_feature=args.input_feature, embedding_size=args.embedding_size,
                               hidden_size=args.hidden_size, dropout=args.dropout,
                               max_context_tokens=args.max_context_tokens)
    print(f"{model.config.num_labels} senses, {model.config.vocab_size} words, topics: "
          f"{model.config.topic_model_name_or_path or 'none'} (|c| = {model.config.topic_representation_size})")
    print(f"saved to {training_args.output_dir}")


def run_wsd_evaluate(args: WSDEvaluateArguments, device: DeviceArguments | None = None) -> None:
    from transformers import AutoModelForTokenClassification

    from .wsd import load_sense_inventory, load_wsd_corpus
    from .wsd_tagger import evaluate_sense_tagger, inventory_for

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in OUTPUT_MODES]
    if bad or not modes:
        raise ValueError(f"--modes takes {OUTPUT_MODES}, got {args.modes!r}")
    model = load_pretrained(AutoModelForTokenClassification, args.model_name_or_path).to(
        (device or DeviceArguments()).torch_device)
    corpus = load_wsd_corpus(args.dataset)
    inventory = None
    if "candidates" in modes:
        inventory = (load_sense_inventory(args.sense_inventory, training=model.config.training_corpus)
                     if args.sense_inventory else inventory_for(model, None))
    name = Path(args.dataset.rstrip("/")).name.split(".")[0]
    key_file = args.key_file or os.path.join(args.model_name_or_path, f"{name}.{{mode}}.key.txt")
    if len(modes) > 1 and "{mode}" not in key_file:
        raise ValueError("--key_file needs '{mode}' in it when several modes are scored")
    scores = evaluate_sense_tagger(model, corpus, modes, key_file=key_file, inventory=inventory,
                                   topic_model=args.topic_model, batch_size=args.batch_size)
    print(f"dataset: {args.dataset}; model: {args.model_name_or_path}; topics: "
          f"{model.config.topic_model_name_or_path or 'none'}\n")
    print("| mode | P | R | F1 | key file |\n|---|---|---|---|---|")
    for mode, score in scores.items():
        f = score.formatted()
        print(f"| {mode} | {f['P']} | {f['R']} | {f['F1']} | {key_file.format(mode=mode)} |")
    if any(math.isnan(score.f1) for score in scores.values()):
        print("\nF1 NaN, as the official scorer prints it: precision and recall are both 0 (no instance was answered "
              "correctly, or none was answered)")
