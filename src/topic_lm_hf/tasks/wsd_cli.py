"""``topic-lm wsd train`` and ``topic-lm wsd evaluate``: the sense tagger from the command line.

    topic-lm wsd train --train ../shared/data/wsd/semcor --dev ../shared/data/wsd/semeval2007 \\
        --topic_model out/nclm/leta/model --output_dir out/wsd-nclm --num_train_epochs 5
    topic-lm wsd evaluate --model_name_or_path out/wsd-nclm --dataset ../shared/data/wsd/senseval2
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from transformers import TrainingArguments, set_seed

from ..models.configuration_sense_tagger import INPUT_FEATURES, OUTPUT_MODES


@dataclass
class WSDTrainArguments:
    train: str = field(metadata={"help": "Training set in the Raganato format (a folder with *.data.xml[.gz] and "
                                         "*.gold.key.txt[.gz]), e.g. ../shared/data/wsd/semcor."})
    topic_model: Optional[str] = field(default=None, metadata={
        "help": "Folder of a trained topic model of the package (NCLM, TCNLM, TopicRNN), frozen, that gives each "
                "document its topic representation c. Without it: the BiLSTM baseline without topics."})
    topic_tokenizer: Optional[str] = field(default=None, metadata={
        "help": "Folder holding the topic model's topic_tokenizer/ when the topic model folder lacks one."})
    dev: Optional[str] = field(default=None, metadata={
        "help": "Development set (e.g. ../shared/data/wsd/semeval2007): scored after every epoch; the best epoch "
                "(F1 in --output_mode) is kept. Never select on the test sets."})
    sense_inventory: Optional[str] = field(default=None, metadata={
        "help": "senses.tsv.gz of WordNet (default: ../shared/data/wordnet/senses.tsv.gz or $TOPIC_LM_DATA's)."})
    output_mode: str = field(default="candidates", metadata={
        "help": f"Default prediction mode recorded in the model, one of {OUTPUT_MODES}: 'candidates' (argmax among "
                "the lemma's trained candidate senses, WordNet first sense for unseen lemmas) or 'all_senses' (the "
                "paper: argmax over every training sense)."})
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
                                           "../shared/data/wsd/senseval2."})
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
    from ..models.modeling_common import load_topic_tokenizer
    from .wsd import load_wsd_corpus
    from .wsd_tagger import train_sense_tagger

    set_seed(training_args.seed)
    train = load_wsd_corpus(args.train)
    if args.max_train_documents is not None:
        keep = set(list(dict.fromkeys(train["document_id"]))[:args.max_train_documents])
        train = train.filter(lambda d: d in keep, input_columns="document_id")
    dev = load_wsd_corpus(args.dev) if args.dev else None
    topic_tokenizer = load_topic_tokenizer(args.topic_tokenizer) if args.topic_tokenizer else None
    if args.topic_model is not None and not os.path.isdir(args.topic_model):
        raise SystemExit(f"topic-lm wsd train: error: topic model folder {args.topic_model} does not exist")
    training_args.save_strategy = "no"  # the best epoch on --dev is kept in memory and saved at the end
    model = train_sense_tagger(train, training_args.output_dir, topic_model=args.topic_model,
                               topic_tokenizer=topic_tokenizer, dev=dev, sense_inventory=args.sense_inventory,
                               training_args=training_args, min_word_freq=args.min_word_freq,
                               train_corpus_path=os.path.abspath(args.train), output_mode=args.output_mode,
                               input_feature=args.input_feature, embedding_size=args.embedding_size,
                               hidden_size=args.hidden_size, dropout=args.dropout,
                               max_context_tokens=args.max_context_tokens)
    print(f"{model.config.num_labels} senses, {model.config.vocab_size} words, topics: "
          f"{model.config.topic_model_name_or_path or 'none'} (|c| = {model.config.topic_representation_size})")
    print(f"saved to {training_args.output_dir}")


def run_wsd_evaluate(args: WSDEvaluateArguments) -> None:
    from transformers import AutoModelForTokenClassification

    from .wsd import load_sense_inventory, load_wsd_corpus
    from .wsd_tagger import _inventory_for, evaluate_sense_tagger

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in OUTPUT_MODES]
    if bad or not modes:
        raise SystemExit(f"topic-lm wsd evaluate: error: --modes takes {OUTPUT_MODES}, got {args.modes!r}")
    model = AutoModelForTokenClassification.from_pretrained(args.model_name_or_path)
    corpus = load_wsd_corpus(args.dataset)
    inventory = None
    if "candidates" in modes:
        inventory = (load_sense_inventory(args.sense_inventory, training=model.config.training_corpus)
                     if args.sense_inventory else _inventory_for(model, None))
    name = Path(args.dataset.rstrip("/")).name.split(".")[0]
    key_file = args.key_file or os.path.join(args.model_name_or_path, f"{name}.{{mode}}.key.txt")
    if len(modes) > 1 and "{mode}" not in key_file:
        raise SystemExit("topic-lm wsd evaluate: error: --key_file needs '{mode}' in it when several modes are scored")
    scores = evaluate_sense_tagger(model, corpus, modes, key_file=key_file, inventory=inventory,
                                   topic_model=args.topic_model, batch_size=args.batch_size)
    print(f"dataset: {args.dataset}; model: {args.model_name_or_path}; topics: "
          f"{model.config.topic_model_name_or_path or 'none'}\n")
    print("| mode | P | R | F1 | key file |\n|---|---|---|---|---|")
    for mode, score in scores.items():
        f = score.formatted()
        print(f"| {mode} | {f['P']} | {f['R']} | {f['F1']} | {key_file.format(mode=mode)} |")
