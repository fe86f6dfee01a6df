"""Training and applying the BiLSTM sense tagger (:class:`~topic_lm_hf.models.SenseTaggerForTokenClassification`).

The NCLM paper's WSD protocol (Chaudhary et al. 2020, section 5), with the decisions it leaves open made here:

* **Input words**: the lower-cased corpus *lemma* of every token (``input_feature="lemma"``; ``"form"``
  uses the lower-cased surface form), from a vocabulary built on the training corpus
  (``min_word_freq``, 1 by default); other words are ``<unk>``. No pretrained embeddings (none can be
  downloaded here).
* **Labels**: every distinct gold key of the training corpus, sorted (35,399 on SemCor); the loss is
  on instance tokens only (SemCor has one gold key per instance; with several, the first is used).
* **Document topics**: c = ``document_topic_representation(bag of words)`` of a frozen topic model of
  the package, over the *whole document* the sentence belongs to (the sentence is not removed), computed
  once per document. The bag of words counts the document's lower-cased surface forms in the topic
  model's topic vocabulary, multiword tokens (``primary_election``) split on ``_``; ``max_context_tokens``
  keeps only the first N topic tokens.
* **Output modes**, both reported: ``"all_senses"`` (the paper, literally: argmax over every training
  sense, no back-off) and ``"candidates"`` (argmax over the candidates of the instance's (lemma, POS) in
  the sense inventory that are training senses; when there is none, i.e. the lemma was never seen in
  training, WordNet's first sense; an instance whose (lemma, POS) has no candidate at all, in WordNet or
  in training, is *abstained on*: no answer, which lowers recall only, as the scorer counts it).

Usage::

    train = load_wsd_corpus(data_dir("wsd", "semcor"))                 # $TOPIC_LM_DATA/wsd/semcor
    model = train_sense_tagger(train, "out/wsd-nclm", topic_model="out/nclm/leta/model",
                               dev=load_wsd_corpus(data_dir("wsd", "semeval2007")))
    model = AutoModelForTokenClassification.from_pretrained("out/wsd-nclm")
    predictions = disambiguate(model, load_wsd_corpus(data_dir("wsd", "senseval2")))  # id -> key
    score_wsd(predictions, data_dir("wsd", "senseval2", "senseval2.gold.key.txt"))
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Optional, Union

import datasets
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments, set_seed

from ..data import data_dir
from ..models.configuration_sense_tagger import OUTPUT_MODES, SenseTaggerConfig
from ..models.modeling_conditioning import TOPIC_TOKENIZER_SUBFOLDER, load_topic_tokenizer
from ..models.modeling_sense_tagger import SenseTaggerForTokenClassification
from ..models.modeling_topic_family import TopicFamilyForCausalLM
from .wsd import (PathLike, SenseInventory, WSDScore, as_corpus, iter_wsd_instances, load_sense_inventory,
                  score_wsd, wsd_gold, write_key_file)

logger = logging.getLogger(__name__)

__all__ = [
    "SenseTaggingCollator",
    "build_sense_vocabulary",
    "build_word_vocabulary",
    "candidate_label_ids",
    "disambiguate",
    "document_bags_of_words",
    "document_topic_representation",
    "document_topic_representations",
    "encode_corpus",
    "evaluate_sense_tagger",
    "inventory_for",
    "sense_candidates",
    "load_frozen_topic_model",
    "train_sense_tagger",
]

UNK, PAD = "<unk>", "<pad>"


# ----------------------------------------------------------------------------------------------
# document topic representations
# ----------------------------------------------------------------------------------------------


def document_topic_representation(topic_model, context_bow: torch.Tensor) -> torch.Tensor:
    """c (b, |c|) of documents given as bags of words (b, V_c): the frozen topic model's deterministic
    document representation (eval mode, no sampling). The one place that asks a topic model for c."""
    if topic_model.training:
        raise ValueError("the topic model must be in eval mode (a deterministic c): call topic_model.eval()")
    with torch.no_grad():
        return topic_model.document_topic_representation(context_bow.to(topic_model.device)).float().cpu()


def load_frozen_topic_model(name_or_path: PathLike):
    """A topic model of the package (any family with ``document_topic_representation``), in eval mode,
    with every parameter frozen. A missing folder is a ``FileNotFoundError`` naming it."""
    path = str(name_or_path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"topic model folder {path} does not exist (pass the folder of a trained topic "
                                "model of the package: NCLM, TCNLM or TopicRNN)")
    model = AutoModelForCausalLM.from_pretrained(path)
    if not isinstance(model, TopicFamilyForCausalLM):
        raise ValueError(f"{path} holds a {type(model).__name__}, which is not a topic model (it has no document "
                         "topic representation)")
    model.eval().requires_grad_(False)
    return model


def weights_fingerprint(folder: PathLike) -> Optional[str]:
    """sha256 of a model folder's weight files (``*.safetensors``, else ``*.bin``, in name order); None when it has
    none (not a local folder)."""
    folder = str(folder)
    if not os.path.isdir(folder):
        return None
    names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors")) or \
        sorted(n for n in os.listdir(folder) if n.endswith(".bin") and n != "training_args.bin")
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def check_topic_model(config, path: PathLike) -> None:
    """Refuse a topic model folder whose weights are not those the tagger of ``config`` was trained with (its
    ``topic_model_sha256``): another model found under the same, or a relative, path would give other c silently."""
    recorded = getattr(config, "topic_model_sha256", None)
    found = weights_fingerprint(path)
    if recorded and found and found != recorded:
        raise ValueError(f"the topic model at {path} is not the one this tagger was trained with (its weights' sha256 "
                         f"{found[:12]}, the tagger's {recorded[:12]}, trained with {config.topic_model_name_or_path}): "
                         f"pass --topic_model the folder it was trained with")


def _topic_words(token: str) -> list[str]:
    return [w for w in token.lower().replace(" ", "_").split("_") if w]


def document_bags_of_words(corpus: datasets.Dataset, topic_tokenizer,
                           max_context_tokens: Optional[int] = None) -> tuple[list[str], torch.Tensor]:
    """(document ids in corpus order, (D, V_c) bags of words over the topic vocabulary): each document's
    lower-cased surface forms (multiword tokens split on ``_``), ``<unk>`` never counted, only the first
    ``max_context_tokens`` topic tokens when given."""
    vocab = topic_tokenizer.get_vocab()
    unk_id = vocab.get(getattr(topic_tokenizer, "unk_token", None) or UNK)
    ids: dict[str, list[int]] = {}
    for document_id, tokens in zip(corpus["document_id"], corpus["tokens"]):
        found = ids.setdefault(document_id, [])
        found.extend(i for t in tokens for w in _topic_words(t) if (i := vocab.get(w)) is not None and i != unk_id)
    documents = list(ids)
    bow = torch.zeros(len(documents), len(vocab))
    for row, document_id in enumerate(documents):
        kept = ids[document_id][:max_context_tokens] if max_context_tokens else ids[document_id]
        if kept:
            bow[row].index_add_(0, torch.as_tensor(kept), torch.ones(len(kept)))
    return documents, bow


def document_topic_representations(corpus: datasets.Dataset, topic_model, topic_tokenizer,
                                   max_context_tokens: Optional[int] = None, batch_size: int = 64) -> dict:
    """document id -> c (|c|,) for every document of ``corpus`` (the topic model is frozen: once per document)."""
    expected = getattr(topic_model.config, "topic_vocab_size", None)
    if expected is not None and len(topic_tokenizer) != expected:
        raise ValueError(f"the topic tokenizer has {len(topic_tokenizer)} entries but the topic model's "
                         f"topic_vocab_size is {expected}: mismatched vocabularies")
    documents, bow = document_bags_of_words(corpus, topic_tokenizer, max_context_tokens)
    rows = [document_topic_representation(topic_model, bow[i:i + batch_size]) for i in range(0, len(bow), batch_size)]
    c = torch.cat(rows) if rows else torch.zeros(0, 0)
    return {document_id: c[i] for i, document_id in enumerate(documents)}


def _topic_tokenizer_for(model_folder: Optional[PathLike], topic_model_path: str):
    """The tagger's own copy of the topic tokenizer (saved at training), else the topic model's."""
    if model_folder is not None and os.path.isfile(os.path.join(str(model_folder), TOPIC_TOKENIZER_SUBFOLDER,
                                                                "tokenizer.json")):
        return load_topic_tokenizer(model_folder)
    return load_topic_tokenizer(topic_model_path)


# ----------------------------------------------------------------------------------------------
# vocabularies and encoding
# ----------------------------------------------------------------------------------------------


def _words(row_tokens, row_lemmas, input_feature: str) -> list[str]:
    return [w.lower() for w in (row_lemmas if input_feature == "lemma" else row_tokens)]


def build_word_vocabulary(corpus: datasets.Dataset, input_feature: str = "lemma", min_freq: int = 1) -> list[str]:
    """``<pad>``, ``<unk>``, then the training words (lower-cased lemmas or forms) seen at least
    ``min_freq`` times, by frequency (ties by word)."""
    counts = Counter()
    for tokens, lemmas in zip(corpus["tokens"], corpus["lemmas"]):
        counts.update(_words(tokens, lemmas, input_feature))
    kept = sorted((w for w, n in counts.items() if n >= min_freq and w not in (PAD, UNK)),
                  key=lambda w: (-counts[w], w))
    return [PAD, UNK, *kept]


def build_sense_vocabulary(corpus: datasets.Dataset) -> list[str]:
    """Every distinct gold key of the training corpus, sorted: the classes of the tagger."""
    return sorted({key for instance in iter_wsd_instances(corpus) for key in instance["gold"]})


def candidate_label_ids(inventory: SenseInventory, config: SenseTaggerConfig, lemma: str, pos: str,
                        cache: Optional[dict] = None) -> list[int]:
    """The tagger's sense ids among the candidates of (lemma, POS) in the inventory: what candidate
    restriction chooses from (empty for a lemma unseen in training). ``cache``: a dict reused across calls."""
    if cache is not None and (lemma, pos) in cache:
        return cache[lemma, pos]
    label2id = config.label2id
    ids = [label2id[key] for key in inventory.candidates(lemma, pos) if key in label2id]
    if cache is not None:
        cache[lemma, pos] = ids
    return ids


def sense_candidates(inventory: SenseInventory, config: SenseTaggerConfig, lemma: str, pos: str,
                     gold_id: int, cache: Optional[dict] = None) -> list[int]:
    """The sense ids a ``training_objective="candidates"`` softmax runs over for one instance: its
    :func:`candidate_label_ids` (as candidate restriction predicts), plus the gold sense when the
    inventory lacks it."""
    ids = candidate_label_ids(inventory, config, lemma, pos, cache)
    return ids if gold_id in ids else [*ids, gold_id]


def encode_corpus(corpus: datasets.Dataset, config: SenseTaggerConfig, topic_representations: Optional[Mapping] = None,
                  labels: bool = True, inventory: Optional[SenseInventory] = None) -> datasets.Dataset:
    """Rows for the tagger, one per sentence that has instances: ``input_ids``, ``labels`` (the sense id
    of the first gold key at instance positions, -100 elsewhere and for keys outside the label
    vocabulary), ``topic_representation`` (the document's c; only for a tagger with topics),
    ``positions`` and ``instance_ids``; with labels and ``config.training_objective="candidates"``,
    ``sense_candidates`` too (the candidate ids of each labelled position, in position order), from
    ``inventory``."""
    vocab = {w: i for i, w in enumerate(config.word_vocabulary)}
    label2id = config.label2id
    if config.uses_topics and topic_representations is None:
        raise ValueError("this tagger uses document topics: pass topic_representations (document id -> c)")
    with_candidates = labels and config.training_objective == "candidates"
    if with_candidates and inventory is None:
        raise ValueError("training_objective='candidates' needs the sense inventory: pass inventory=")
    columns = {"input_ids": [], "labels": [], "positions": [], "instance_ids": [], "topic_representation": [],
               "sense_candidates": []}
    cache: dict = {}
    for row in corpus.select_columns(["document_id", "tokens", "lemmas", "instances"]):
        if not row["instances"]:
            continue  # nothing to tag, no loss
        if not row["tokens"]:
            raise ValueError(f"an empty sentence with instances in document {row['document_id']}")
        ids = [vocab.get(w, 1) for w in _words(row["tokens"], row["lemmas"], config.input_feature)]
        tags = [-100] * len(ids)
        candidates = {}
        if labels:
            for instance in row["instances"]:
                if instance["gold"]:
                    tags[instance["position"]] = tag = label2id.get(instance["gold"][0], -100)
                    if with_candidates and tag != -100:
                        candidates[instance["position"]] = sense_candidates(inventory, config, instance["lemma"],
                                                                            instance["pos"], tag, cache)
        columns["sense_candidates"].append([candidates[p] for p in sorted(candidates)])
        columns["input_ids"].append(ids)
        columns["labels"].append(tags)
        columns["positions"].append([i["position"] for i in row["instances"]])
        columns["instance_ids"].append([i["id"] for i in row["instances"]])
        if config.uses_topics:
            c = topic_representations.get(row["document_id"])
            if c is None:
                raise ValueError(f"no topic representation for document {row['document_id']!r}")
            columns["topic_representation"].append([float(x) for x in c])
    if not config.uses_topics:
        del columns["topic_representation"]
    if not with_candidates:
        del columns["sense_candidates"]
    return datasets.Dataset.from_dict(columns)


@dataclass
class SenseTaggingCollator:
    """Pads encoded sentences (:func:`encode_corpus`) into a batch: ``input_ids`` and ``attention_mask``
    (b, s), ``labels`` (b, s) with -100 at padding, ``topic_representation`` (b, |c|) when the rows
    have one, and ``sense_candidates`` (n, C) (-1 padded, the rows' lists concatenated: the row-major
    order of the labelled positions) when they have those. Other columns are dropped."""

    pad_token_id: int = 0

    def __call__(self, rows: list[dict]) -> dict:
        width = max(len(r["input_ids"]) for r in rows)
        if width == 0:
            raise ValueError("an empty sentence has nothing to tag")
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            input_ids[i, :n] = torch.as_tensor(r["input_ids"])
            mask[i, :n] = 1
            if "labels" in r:
                labels[i, :n] = torch.as_tensor(r["labels"])
        batch = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
        if "sense_candidates" in rows[0]:
            lists = [ids for r in rows for ids in r["sense_candidates"]]
            candidates = torch.full((len(lists), max((len(ids) for ids in lists), default=1)), -1, dtype=torch.long)
            for i, ids in enumerate(lists):
                candidates[i, :len(ids)] = torch.as_tensor(ids)
            batch["sense_candidates"] = candidates
        if "topic_representation" in rows[0]:
            batch["topic_representation"] = torch.tensor([r["topic_representation"] for r in rows],
                                                         dtype=torch.float32)
        return batch


# ----------------------------------------------------------------------------------------------
# disambiguation
# ----------------------------------------------------------------------------------------------


@lru_cache(maxsize=4)
def _cached_inventory(senses: str, training: Optional[str]) -> SenseInventory:
    return load_sense_inventory(senses, training=training)


def inventory_for(model, inventory: Optional[SenseInventory]) -> SenseInventory:
    """``inventory``, else the sense inventory a tagger ``model`` records (``config.sense_inventory``, else the
    WordNet inventory of the data folder), with the first-sense back-off's ranks from its training corpus."""
    if inventory is not None:
        return inventory
    senses = model.config.sense_inventory or data_dir("wordnet", "senses.tsv.gz", required=False)
    if senses is None or not os.path.exists(str(senses)):
        raise FileNotFoundError(f"candidate restriction needs the sense inventory (senses.tsv.gz); the tagger records "
                                f"{model.config.sense_inventory!r}, which is absent: pass inventory=")
    training = model.config.training_corpus
    if training is not None and not os.path.exists(training):
        logger.warning("the training corpus %s is absent: the first-sense back-off breaks rank ties by key only",
                       training)
        training = None
    return _cached_inventory(str(senses), training)


def _topic_representations_for(model, corpus, topic_model=None, topic_tokenizer=None) -> Optional[dict]:
    config = model.config
    if not config.uses_topics:
        return None
    if topic_model is None or isinstance(topic_model, (str, os.PathLike)):
        path = topic_model or config.topic_model_name_or_path
        check_topic_model(config, path)
        topic_model = load_frozen_topic_model(path).to(model.device)
    elif getattr(topic_model, "name_or_path", None):
        check_topic_model(config, topic_model.name_or_path)
    if topic_tokenizer is None:
        topic_tokenizer = _topic_tokenizer_for(getattr(model, "name_or_path", None) or None,
                                               config.topic_model_name_or_path)
    c = document_topic_representations(corpus, topic_model, topic_tokenizer, config.max_context_tokens)
    size = next(iter(c.values())).numel() if c else config.topic_representation_size
    if size != config.topic_representation_size:
        raise ValueError(f"the topic model gives |c| = {size} but the tagger was trained with "
                         f"{config.topic_representation_size} ({config.topic_model_name_or_path}): another topic model?")
    return c


@torch.no_grad()
def disambiguate(model: SenseTaggerForTokenClassification, corpus: Union[datasets.Dataset, PathLike],
                 mode: Optional[str] = None, inventory: Optional[SenseInventory] = None, topic_model=None,
                 topic_tokenizer=None, topic_representations: Optional[Mapping] = None,
                 batch_size: int = 64) -> dict[str, str]:
    """Tag every instance of ``corpus`` (a :func:`load_wsd_corpus` dataset or a set's path).

    Args:
        model: a sense tagger.
        mode: ``"candidates"`` or ``"all_senses"`` (module docstring); default ``model.config.output_mode``.
        inventory: the :class:`SenseInventory` for candidates and back-off (default: the one recorded in
            the config, with the training corpus's counts).
        topic_model: the frozen topic model (a model or a folder; default: the config's); only for a tagger
            with topics. ``topic_tokenizer``: its topic tokenizer (default: the tagger's saved copy).
        topic_representations: document id -> c, precomputed (then no topic model is loaded).

    Returns:
        instance id -> sense key; abstentions (no candidate at all, candidates mode) are left out.
    """
    corpus = as_corpus(corpus)
    mode = mode or model.config.output_mode
    if mode not in OUTPUT_MODES:
        raise ValueError(f"mode must be one of {OUTPUT_MODES}, got {mode!r}")
    if topic_representations is None:
        topic_representations = _topic_representations_for(model, corpus, topic_model, topic_tokenizer)
    inventory = inventory_for(model, inventory) if mode == "candidates" else None
    rows = encode_corpus(corpus, model.config, topic_representations, labels=False)
    lemma_pos = {i["id"]: (i["lemma"], i["pos"]) for i in iter_wsd_instances(corpus)}
    id2label = model.config.id2label
    allowed_cache: dict[tuple[str, str], list[int]] = {}
    collator = SenseTaggingCollator(model.config.pad_token_id)
    was_training = model.training
    model.eval()
    predictions: dict[str, str] = {}
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            chunk = [dict(zip(chunk, values)) for values in zip(*chunk.values())]
            batch = {k: v.to(model.device) for k, v in collator(chunk).items() if k != "labels"}
            positions = torch.tensor([(r, p) for r, row in enumerate(chunk) for p in row["positions"]])
            ids = [i for row in chunk for i in row["instance_ids"]]
            scores = model.instance_logits(batch["input_ids"], positions.to(model.device), batch["attention_mask"],
                                           batch.get("topic_representation")).float().cpu()  # (n, S)
            if mode == "all_senses":
                for instance_id, best in zip(ids, scores.argmax(-1).tolist()):
                    predictions[instance_id] = id2label[best]
                continue
            for n, instance_id in enumerate(ids):
                pair = lemma_pos[instance_id]
                allowed = candidate_label_ids(inventory, model.config, *pair, cache=allowed_cache)
                if allowed:
                    predictions[instance_id] = id2label[allowed[int(scores[n, allowed].argmax())]]
                else:  # lemma unseen in training: WordNet first sense, or abstain when it has no sense at all
                    back_off = inventory.first_sense(*pair)
                    if back_off is not None:
                        predictions[instance_id] = back_off
    finally:
        model.train(was_training)
    return predictions


def evaluate_sense_tagger(model, corpus: Union[datasets.Dataset, PathLike], modes=OUTPUT_MODES,
                          key_file: Optional[PathLike] = None, **kwargs) -> dict[str, WSDScore]:
    """Score the tagger on a corpus with gold keys in each mode: mode -> :class:`WSDScore`. The document
    topics are computed once for all modes. ``key_file`` (with ``{mode}`` in it for several modes) gets
    each mode's answers in the scorer's format."""
    corpus = as_corpus(corpus)
    if kwargs.get("topic_representations") is None:
        kwargs["topic_representations"] = _topic_representations_for(model, corpus, kwargs.pop("topic_model", None),
                                                                      kwargs.pop("topic_tokenizer", None))
    gold = wsd_gold(corpus)
    scores = {}
    for mode in modes:
        predictions = disambiguate(model, corpus, mode=mode, **kwargs)
        if key_file is not None:
            write_key_file(predictions, str(key_file).format(mode=mode))
        scores[mode] = score_wsd(predictions, gold)
    return scores


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------


class DevSelectionCallback(TrainerCallback):
    """Scores the tagger on the development set at the end of every epoch (both modes) and keeps the
    weights of the best epoch by F1 in ``config.output_mode``; they are put back when training ends
    (model selection on the development set only)."""

    def __init__(self, dev: datasets.Dataset, inventory: SenseInventory, topic_representations: Optional[dict]):
        self.dev, self.inventory, self.c = dev, inventory, topic_representations
        self.history: list[dict] = []
        self.best_f1, self.best_state = -1.0, None

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        scores = evaluate_sense_tagger(model, self.dev, inventory=self.inventory, topic_representations=self.c)
        record = {"epoch": round(state.epoch or 0), "step": state.global_step,
                  **{f"dev_f1_{mode}": s.f1 for mode, s in scores.items()}}
        self.history.append(record)
        logger.info("dev after epoch %s: %s", record["epoch"],
                    ", ".join(f"{m} F1 {100 * s.f1:.1f}" for m, s in scores.items()))
        f1 = scores[model.config.output_mode].f1
        if f1 > self.best_f1:
            self.best_f1, self.best_state = f1, copy.deepcopy(model.state_dict())

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.best_state is not None:
            model.load_state_dict(self.best_state)


def train_sense_tagger(train: Union[datasets.Dataset, PathLike], output_dir: PathLike, topic_model=None,
                       topic_tokenizer=None, dev: Union[datasets.Dataset, PathLike, None] = None,
                       sense_inventory: Optional[PathLike] = None, training_args: Optional[TrainingArguments] = None,
                       min_word_freq: int = 1, train_corpus_path: Optional[PathLike] = None,
                       **config_kwargs) -> SenseTaggerForTokenClassification:
    """Train a sense tagger with ``Trainer`` and save it (with its topic tokenizer) to ``output_dir``.

    Args:
        train: the training corpus (SemCor), a dataset or a set's path.
        topic_model: a frozen topic model's folder (or a loaded model: then pass ``topic_model_name_or_path``
            too), or ``None`` for the tagger without topics.
        topic_tokenizer: its topic tokenizer (default: ``<topic_model>/topic_tokenizer``).
        dev: a development set (SemEval-2007): scored after every epoch, the best epoch is kept.
        sense_inventory: ``senses.tsv.gz`` (recorded in the config; default: ``$TOPIC_LM_DATA/wordnet``'s).
        training_args: ``TrainingArguments`` (default: lr 1e-3, batch 32, 1 epoch, as the paper's lr/batch).
        config_kwargs: :class:`SenseTaggerConfig` arguments (``hidden_size``, ``output_mode``, ...).
    """
    if train_corpus_path is None and isinstance(train, (str, os.PathLike)):
        train_corpus_path = train
    train = as_corpus(train)
    dev = as_corpus(dev) if dev is not None else None
    sense_inventory = sense_inventory or data_dir("wordnet", "senses.tsv.gz", required=False)
    topic_path = config_kwargs.pop("topic_model_name_or_path", None)
    if isinstance(topic_model, (str, os.PathLike)):
        topic_path = str(topic_model)
        topic_model = load_frozen_topic_model(topic_model)
        if training_args is not None:  # the frozen topic model computes c where the tagger trains
            topic_model.to(training_args.device)
    elif topic_model is not None:
        topic_model.eval().requires_grad_(False)
        topic_path = topic_path or getattr(topic_model, "name_or_path", None)
        if not topic_path:
            raise ValueError("a topic model object needs topic_model_name_or_path= (recorded in the tagger's config)")
    c_train = c_dev = None
    if topic_model is not None:
        if os.path.isdir(topic_path):  # found again from any folder, and only with the same weights
            topic_path = os.path.abspath(topic_path)
            config_kwargs.setdefault("topic_model_sha256", weights_fingerprint(topic_path))
        if topic_tokenizer is None:
            topic_tokenizer = load_topic_tokenizer(topic_path)
        start = time.perf_counter()
        c_train = document_topic_representations(train, topic_model, topic_tokenizer,
                                                 config_kwargs.get("max_context_tokens"))
        c_dev = document_topic_representations(dev, topic_model, topic_tokenizer,
                                               config_kwargs.get("max_context_tokens")) if dev is not None else None
        size = next(iter(c_train.values())).numel()
        variant = getattr(topic_model.config, "variant", None)
        config_kwargs.setdefault("topic_model_type",
                                 topic_model.config.model_type + (f"-{variant}" if variant else ""))
        logger.info("document topic representations: %d documents, |c| = %d (%.1f s)", len(c_train), size,
                    time.perf_counter() - start)
    else:
        size = 0
    input_feature = config_kwargs.get("input_feature", "lemma")
    senses = build_sense_vocabulary(train)
    if not senses:
        raise ValueError("the training corpus has no gold sense key (its gold file is empty or matches none of its "
                         "instances): a sense tagger trains on a sense-annotated corpus such as SemCor")
    config = SenseTaggerConfig(word_vocabulary=build_word_vocabulary(train, input_feature, min_word_freq),
                               id2label=dict(enumerate(senses)), label2id={k: i for i, k in enumerate(senses)},
                               topic_representation_size=size, topic_model_name_or_path=topic_path,
                               sense_inventory=sense_inventory,
                               training_corpus=None if train_corpus_path is None else str(train_corpus_path),
                               **config_kwargs)
    if training_args is None:
        training_args = TrainingArguments(output_dir=str(output_dir), learning_rate=1e-3, per_device_train_batch_size=32,
                                          num_train_epochs=1, save_strategy="no", report_to="none", use_cpu=True,
                                          logging_steps=50, disable_tqdm=True, dataloader_pin_memory=False)
    set_seed(training_args.seed)  # the initialisation too, as Trainer(model_init=...) would seed it
    model = SenseTaggerForTokenClassification(config)
    inventory = None
    if dev is not None or config.training_objective == "candidates":
        if sense_inventory is None or not os.path.exists(str(sense_inventory)):
            raise FileNotFoundError(f"scoring the development set and training_objective='candidates' need the sense "
                                    f"inventory (senses.tsv.gz), got {sense_inventory!r}: pass sense_inventory=")
        inventory = load_sense_inventory(sense_inventory, training=train)  # counts of the sentences trained on
    rows = encode_corpus(train, config, c_train, inventory=inventory)
    training_args.remove_unused_columns = False  # the collator keeps what the model needs
    callbacks = []
    if dev is not None:
        callbacks.append(DevSelectionCallback(dev, inventory, c_dev))
    trainer = Trainer(model=model, args=training_args, train_dataset=rows,
                      data_collator=SenseTaggingCollator(config.pad_token_id), callbacks=callbacks)
    trainer.train()
    model = trainer.model
    model.save_pretrained(str(output_dir))
    if topic_tokenizer is not None:
        topic_tokenizer.save_pretrained(os.path.join(str(output_dir), TOPIC_TOKENIZER_SUBFOLDER))
    record = {"train_sentences": len(rows), "senses": config.num_labels, "words": config.vocab_size,
              "topic_model": topic_path, "topic_representation_size": size,
              "dev_history": callbacks[0].history if callbacks else [],
              "log_history": trainer.state.log_history}
    Path(output_dir, "wsd_training.json").write_text(json.dumps(record, indent=1))
    model.name_or_path = str(output_dir)
    return model
