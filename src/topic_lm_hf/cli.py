"""The `topic-lm` command: train, evaluate, generate, topics, steer, classify, retrieve and demo.

Arguments are dataclasses parsed by `HfArgumentParser`, as in transformers' `run_clm.py`: every
`TrainingArguments` flag works with `topic-lm train`. Each subcommand is one entry of `COMMANDS`
(its argument dataclasses and its handler), so a new subcommand is one more entry. Examples:

    topic-lm train --train_file wikipedia-sample --model_type lstm_lm \\
        --config_overrides "embedding_size=128,hidden_size=128" --output_dir out/lstm-wiki --max_steps 400
    topic-lm train --train_file $TOPIC_LM_DATA/apnews/train.txt --validation_file $TOPIC_LM_DATA/apnews/valid.txt \\
        --model_type lstm_lm --config_overrides "embedding_size=300,hidden_size=600" \\
        --output_dir out/lstm-apnews --max_steps 2000 --per_device_train_batch_size 64
    topic-lm evaluate --model_name_or_path out/lstm-apnews --validation_file $TOPIC_LM_DATA/apnews/valid.txt
    topic-lm generate --model_name_or_path out/lstm-apnews --prompt "the senate" --max_new_tokens 20
    topic-lm demo     # the README's main job: train, evaluate, save, reload, generate
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, HfArgumentParser, PretrainedConfig, TrainingArguments,
                          set_seed)

from . import data as data_lib
from .data import HELP as _HELP
from .data import DataArguments, load_corpora  # noqa: F401 (cli names)
from .collator import TopicContextCollator, make_bow
from .models.configuration_common import config_kwargs_from_tokenizers
from .evaluation import evaluate_perplexity
from .fast_path import FastPathArguments, fast_training_arguments, resolve_compile
from .hub import load_pretrained, resolve_model_source
from .pretraining import RECIPE_PRETRAINING, pretrain_topic_model, steering_recipe
from .models.modeling_recurrent import leaky_modes_of
from .models.modeling_topic_family import TopicFamilyForCausalLM
from .demo import DEMO_FAMILY, TOPIC_FAMILIES, DemoArguments, run_demo
from .devices import DeviceArguments
from .tasks.commands import (ClassifyArguments, RetrieveArguments, TaskDataArguments, WSDEvaluateArguments,
                             WSDTrainArguments, run_classify, run_retrieve, run_wsd_evaluate, run_wsd_train)
from .trainer import TopicLMTrainer

logger = logging.getLogger("topic_lm_hf")



@dataclass
class ModelArguments:
    model_type: str = field(default="lstm_lm", metadata={
        "help": "The model to train: lstm_lm, tcnlm, topic_rnn, nclm or rgbn_rnn (one of the package's families)."})
    model_name_or_path: Optional[str] = field(default=None, metadata={
        "help": "A saved model folder or Hub id to continue training (its vocabularies are reused)."})
    config_file: Optional[str] = field(default=None, metadata={
        "help": "A JSON configuration (e.g. one of hub_configs/), a model folder or a Hub id whose config.json "
                "is used; its model_type wins over --model_type."})
    config_overrides: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated key=value pairs applied to the configuration with transformers' "
                "PretrainedConfig.update_from_string, e.g. 'hidden_size=256,dropout=0.2' (booleans: true / false)."})
    carry_state: bool = field(default=False, metadata={
        "help": "Train with the recurrent state carried across each document's sentences (the causal-carry protocol "
                "that the package's best models are trained for): whole documents per batch, each sentence's context "
                "the sentences before it. rGBN-RNN carries its LSTM state inside its documents batches; every other "
                "family trains through TopicLMTrainer(carry_state=True)."})
    bptt_chunks: Optional[int] = field(default=None, metadata={
        "help": "With --carry_state: the chunks between two detachments of the carried state (default: the whole "
                "document)."})
    pretraining_phases: Optional[str] = field(default=None, metadata={
        "help": "Training phases before the joint objective, as phase:steps pairs in order, e.g. "
                "'lm:2000,topic_model:500' for NCLM (TopicLMTrainer's pretraining_phases)."})
    recipe: Optional[str] = field(default=None, metadata={
        "choices": ["steering", "paper"],
        "help": "How a new topic model is trained. 'steering' (the default for --model_type): the recipe that makes "
                "topics matter and steer (STEERING_RECIPE: the shared topic output prior topic_output_bias=beta, "
                "and per family TopicRNN's bag-of-words term and topic proportions, NCLM's diversity term), after "
                "the topic model is pre-trained alone (see --pretrain_topic_model_steps); --config_overrides win "
                "over it. 'paper': the paper's model and joint training from scratch, exactly (the default with "
                "--config_file: a published configuration trains as published). Models without topics ignore it."})
    pretrain_topic_model_steps: Optional[int] = field(default=None, metadata={
        "help": "Train the topic model alone on bags of words first (pretrain_topic_model), at most this many "
                "steps, stopping when its objective on the validation documents has not improved for 3 "
                "evaluations (every 500 steps); the best topic model is kept. Default: 20000 with --recipe "
                "steering, 0 (none) with --recipe paper or a saved model."})


def parse_phases(text: Optional[str]) -> list[tuple[str, int]]:
    """'lm:2000,topic_model:500' -> [("lm", 2000), ("topic_model", 500)]."""
    phases = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, steps = item.strip().partition(":")
        if not steps.strip().isdigit():
            raise ValueError(f"--pretraining_phases wants phase:steps pairs (e.g. 'topic_model:300'), got {item!r}")
        phases.append((name.strip(), int(steps)))
    return phases


@dataclass
class EvaluateArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder or Hub id (with its tokenizers)."})
    validation_file: Optional[str] = field(default=None, metadata={
        "help": _HELP["validation_file"] + " Default: wikipedia-sample/validation (the validation split of the "
                "Wikipedia sample that ships with the package, topic-lm train's default corpus)."})
    text_column: Optional[str] = field(default=None, metadata={"help": _HELP["text_column"]})
    max_eval_documents: Optional[int] = field(default=None, metadata={"help": _HELP["max_eval_documents"]})
    protocols: str = field(default="paper,causal,causal-carry", metadata={"help": _HELP["protocols"]})
    max_sentence_length: int = field(default=30, metadata={"help": _HELP["max_sentence_length"]})
    max_context_tokens: int = field(default=300, metadata={"help": _HELP["max_context_tokens"]})
    batch_size: int = field(default=64, metadata={"help": "Chunks (or documents, for causal-carry) per forward pass."})
    output_json: Optional[str] = field(default=None, metadata={
        "help": "Also write the rows as JSON here (default: perplexity.json in the model folder, where "
                "`topic-lm export` finds them for the model card; 'none': nowhere)."})


@dataclass
class ExportArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder (topic-lm train's output, a Trainer "
                                                      "checkpoint or a save_pretrained folder)."})
    repo_id: str = field(metadata={"help": "The Hub repository it is for, e.g. org/tcnlm-apnews (the card's "
                                           "examples load it)."})
    output_dir: str = field(metadata={"help": "Where to write the upload-ready folder."})
    results: Optional[str] = field(default=None, metadata={
        "help": "Evaluation rows (JSON list) for the card; default: the model folder's perplexity.json (written by "
                "topic-lm evaluate) when there is one."})
    dataset: Optional[str] = field(default=None, metadata={
        "help": "The evaluation data's name in the card, for rows that have none (default: their validation file)."})
    push_to_hub: bool = field(default=False, metadata={
        "help": "Also upload the folder (without a network: one line says how to upload it later)."})
    private: bool = field(default=False, metadata={"help": "Create the repository private (with --push_to_hub)."})
    overwrite: bool = field(default=False, metadata={
        "help": "Write into a non-empty --output_dir that is not a previous export (its README.md, config.json "
                "and other files of the same names are replaced)."})


@dataclass
class GenerateArguments:
    model_name_or_path: str = field(metadata={"help": "A saved model folder or Hub id (with its tokenizers)."})
    prompt: str = field(default="", metadata={
        "help": "Text to continue (raw text, tokenized and lower-cased like the corpora); empty: start a sentence."})
    max_new_tokens: int = field(default=30, metadata={"help": "Tokens to generate after the prompt."})
    do_sample: bool = field(default=False, metadata={
        "help": "Sample from the model's distribution (with --temperature and --top_k); without it, greedy or "
                "beam search."})
    num_beams: int = field(default=1, metadata={"help": "Beams of beam search (1: no beam search)."})
    num_return_sequences: int = field(default=1, metadata={
        "help": "Continuations to print (at most --num_beams without sampling)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (with --do_sample)."})
    top_k: int = field(default=0, metadata={
        "help": "Sample only among the k most probable tokens (with --do_sample; 0: all tokens)."})
    top_p: float = field(default=1.0, metadata={
        "help": "Nucleus sampling: sample among the most probable tokens whose probabilities sum to p (with "
                "--do_sample; 1: all tokens)."})
    seed: int = field(default=0, metadata={"help": "Random seed (sampling)."})
    topic_ids: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated topic ids: generate from an equal mixture of these topics (topic models; see "
                "topic-lm topics)."})
    context_text: Optional[str] = field(default=None, metadata={
        "help": "A document whose topics steer generation (topic models)."})
    topic_guidance_scale: Optional[float] = field(default=None, metadata={
        "help": "Decode-time topic guidance with --topic_ids or --context_text: mix the conditioned scores with "
                "the model's prior, l_cond + (s - 1)(l_cond - l_prior) (1: none; larger: more on topic)."})
    allow_unk: bool = field(default=False, metadata={
        "help": "Let the model generate <unk> (suppressed by default, as in every model's generation config)."})
    topic_layer: Optional[int] = field(default=None, metadata={
        "help": "rGBN-RNN / GBN-RNN: the layer --topic_ids refer to (1 = bottom, the default)."})


@dataclass
class SteerArguments:
    model_name_or_path: str = field(metadata={"help": "A saved topic model folder (with its tokenizers)."})
    judge_corpus: Optional[str] = field(default=None, metadata={
        "help": "The training corpus (Lau .txt, .jsonl[.gz], .parquet): an LDA fitted on it is the independent "
                "judge of topic accuracy. Without it only the model's own encoder judges."})
    judge_documents: Optional[int] = field(default=None, metadata={
        "help": "Fit the LDA judge on the first N documents of --judge_corpus only (faster)."})
    text_column: Optional[str] = field(default=None, metadata={"help": "Raw-text column of a JSON / Parquet corpus."})
    fluency_model: Optional[str] = field(default=None, metadata={
        "help": "A separately trained LM over the same vocabulary (e.g. a same-size LSTM): the perplexity of the "
                "generated text under it measures fluency."})
    topics: Optional[str] = field(default=None, metadata={
        "help": "Comma-separated topic ids to steer towards (default: --num_topics_sampled of them, drawn with --seed)."})
    num_topics_sampled: Optional[int] = field(default=None, metadata={
        "help": "Topics drawn when --topics is not given (default: 10, or every topic of a model with fewer; more "
                "than the model has is an error)."})
    num_samples: int = field(default=20, metadata={"help": "Texts generated per topic, and without a topic."})
    max_new_tokens: int = field(default=30, metadata={"help": "The longest generated text."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling threshold."})
    topic_guidance_scale: Optional[float] = field(default=None, metadata={
        "help": "Decode-time topic guidance of the steered texts (as generate's): 1 or unset is plain conditioning, "
                "above 1 pushes towards the topic, below 1 towards the model's prior (NCLM LETA's steering recipe "
                "keeps its texts fluent at 0.75)."})
    top_words: int = field(default=50, metadata={"help": "N of topic k's top-N words, for the topic-word share."})
    seed: int = field(default=0, metadata={"help": "Seeds the topic draw and the sampling."})
    json: Optional[str] = field(default=None, metadata={"help": "Also write the full result (with texts) to this file."})


@dataclass
class TopicsArguments:
    model_name_or_path: str = field(metadata={"help": "A saved topic model folder or Hub id."})
    top_n: int = field(default=10, metadata={"help": "Words printed per topic."})
    layer: Optional[int] = field(default=None, metadata={
        "help": "rGBN-RNN / GBN-RNN: the topic layer to print (1 = bottom; default: every layer)."})


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def make_config(model_args: ModelArguments) -> PretrainedConfig:
    """The configuration that ``model_args`` describe, before it is sized to the vocabularies.

    ``--config_file`` is read by ``PretrainedConfig.get_config_dict`` (a JSON file, a model folder
    or a Hub id) and ``--config_overrides`` parsed by ``PretrainedConfig.update_from_string``: a key
    the configuration does not have is an error and values take the type of the current ones. The
    result is built by the configuration class itself (``AutoConfig.for_model``), so its checks run
    and derived defaults follow the overrides (TCNLM's ``num_factors`` follows ``hidden_size``).
    """
    kwargs = {}
    if model_args.config_file:
        kwargs, _ = PretrainedConfig.get_config_dict(model_args.config_file)
        if not isinstance(kwargs, dict):
            raise ValueError(f"--config_file {model_args.config_file} holds a JSON {type(kwargs).__name__}, not an "
                             "object of configuration values (e.g. one of hub_configs/)")
        kwargs = {k: v for k, v in kwargs.items() if k not in ("transformers_version", "architectures", "auto_map")}
    model_type = kwargs.pop("model_type", model_args.model_type)
    from .families import family_of

    family_of(model_type)  # the package's families, not every model_type transformers knows
    overrides = parse_overrides(model_args.config_overrides) if model_args.config_overrides else []
    if recipe_of(model_args) == "steering":  # what the file and the overrides leave unset
        given = set(kwargs) | {key for key, _ in overrides}
        choice = {key: dict(overrides).get(key, kwargs.get(key)) for key in ("variant", "lm_type")}
        kwargs.update({k: v for k, v in steering_recipe(model_type, **choice).items() if k not in given})
    config = AutoConfig.for_model(model_type, **kwargs)
    if overrides:
        values = {}
        for key, text in overrides:
            prop = getattr(type(config), key, None)
            if text.startswith("["):  # a per-layer list (rGBN-RNN's topic_sizes, hidden_sizes)
                try:
                    values[key] = json.loads(text)
                except ValueError:
                    raise ValueError(f"--config_overrides {key}={text}: not a list of numbers (write {key}=[16,16])"
                                     ) from None
                if not hasattr(config, key):
                    raise ValueError(f"--config_overrides: {type(config).__name__} has no {key}")
            elif isinstance(prop, property) and prop.fset is None:  # derived: the class names what to set instead
                values[key] = json.loads(text) if re.fullmatch(r"-?\d+(\.\d*)?", text) else text
            elif hasattr(config, key) and getattr(config, key) is None:  # an option off by default: no type to follow
                values[key] = override_literal(text)
            else:
                try:  # transformers' parser: the key must exist, the value takes the current one's type
                    config.update_from_string(f"{key}={text}")
                except (ValueError, TypeError) as error:
                    raise ValueError(f"--config_overrides {key}={text}: {error}") from error
                values[key] = getattr(config, key)
        try:
            config = AutoConfig.for_model(model_type, **{**kwargs, **values})
        except TypeError as error:  # a word where the option takes a number (its default None gave no type)
            words = [f"{key}={text}" for key, text in overrides if isinstance(values.get(key), str)]
            raise ValueError(f"--config_overrides {', '.join(words) or model_args.config_overrides}: a value of the "
                             f"wrong type for {type(config).__name__} ({error}); see the option in its docstring"
                             ) from None
    return config


def override_literal(text: str):
    """The value of ``key=text`` for an option whose default is None: None, a boolean, an int, a float (``1e-3``)
    or else the word itself."""
    if text in ("None", "null"):
        return None
    if text in ("true", "false"):
        return text == "true"
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def parse_overrides(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of ``--config_overrides``, comma-separated; a value in brackets is a list
    (``hidden_sizes=[16,16]``) whose commas do not separate pairs."""
    pairs, rest = [], text.strip()
    while rest:
        match = re.match(r"\s*(\w+)\s*=\s*(\[[^\]]*\]|[^,]*?)\s*(,|$)", rest)
        if match is None:
            raise ValueError(f"--config_overrides takes key=value pairs separated by commas (lists in brackets: "
                             f"hidden_sizes=[16,16]), got {text!r}")
        pairs.append((match.group(1), match.group(2)))
        rest = rest[match.end():].strip()
    return pairs


def build_model(model_args: ModelArguments, tokenizer, topic_tokenizer):
    """A new model of ``model_type`` sized to the vocabularies, or a saved one."""
    if model_args.model_name_or_path:
        model = load_pretrained(AutoModelForCausalLM, model_args.model_name_or_path)
        data_lib.check_vocabularies(tokenizer, topic_tokenizer, model.config)
        return model
    config = make_config(model_args)
    # Vocabulary sizes, special-token ids and topic_word_ids (the LM id of every topic word), as from_tokenizers;
    # a family without a topic vocabulary (the LSTM LM) takes only the first two.
    for name, value in config_kwargs_from_tokenizers(tokenizer, topic_tokenizer).items():
        if not name.startswith("topic_") or hasattr(config, name):
            setattr(config, name, value)
    return AutoModelForCausalLM.from_config(config)


def format_perplexity_table(rows: list[dict]) -> str:
    lines = ["| model | protocol | context | state | perplexity | tokens |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['protocol']} | {r['context']} | "
                     f"{'carried' if r['carry_state'] else 'reset per chunk'} | {r['perplexity']:.2f} | {r['tokens']} |")
    return "\n".join(lines)


def pin_memory_only_with_accelerator(training_args: TrainingArguments) -> None:
    """Turn ``dataloader_pin_memory`` off on CPU runs: pinning there does nothing but make the
    DataLoader warn ("'pin_memory' argument is set as true but no accelerator is found")."""
    accelerator = getattr(torch, "accelerator", None)
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    if training_args.dataloader_pin_memory and (training_args.use_cpu or not available):
        training_args.dataloader_pin_memory = False


# ----------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------


def train(data_args: DataArguments, model_args: ModelArguments, training_args: TrainingArguments,
          train_docs=None, valid_docs=None, callbacks=None, fast: FastPathArguments | None = None,
          on_finished: Callable[[str], None] | None = None):
    """Train (resuming from the last complete checkpoint in ``output_dir`` if there is one) and save, on the device
    of ``training_args`` (the GPU when there is one; ``--use_cpu true``: the CPU), the topic model's pre-training
    included. ``fast``: the fast path chosen for that device (``topic_lm_hf.fast_path``). A run that is already
    finished in ``output_dir`` (:func:`~topic_lm_hf.trainer.finished_run`) is left as it is and its saved model
    returned; the line saying so is logged, or given to ``on_finished``."""
    set_seed(training_args.seed)
    compile_output_layer = fast is not None and resolve_compile(training_args, fast.compile_output_layer)
    if fast is not None:
        training_args = fast_training_arguments(training_args, fast.precision, compile_output_layer)
    pin_memory_only_with_accelerator(training_args)
    if not model_args.model_name_or_path and not model_args.config_file:  # before the corpora are read
        from .families import family_of

        family_of(model_args.model_type)
    if train_docs is None:
        train_docs, valid_docs, source = load_corpora(data_args)
        logger.info("Data: %s", source)
    out = training_args.output_dir
    if model_args.model_name_or_path:
        tok, topic_tok = data_lib.load_vocabularies(model_args.model_name_or_path)
    else:
        tok, topic_tok = data_lib.build_vocabularies(train_docs, min_freq=data_args.min_freq,
                                                     stopwords=data_args.stopwords,
                                                     min_doc_freq=data_args.min_doc_freq)
    model = build_model(model_args, tok, topic_tok).to(training_args.device)  # where the Trainer will train it
    recipe = steering_recipe(model.config.model_type, variant=getattr(model.config, "variant", None),
                             lm_type=getattr(model.config, "lm_type", None))
    if recipe_of(model_args) == "steering" and not model_args.model_name_or_path and recipe:
        logger.info("Recipe: steering (%s, the topic model pre-trained first; --recipe paper trains the paper's "
                    "model exactly)", ", ".join(f"{k}={getattr(model.config, k)}" for k in recipe))
    carried = carried_training(model_args, data_args, model)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train-carry" if carried else "train",
                                              context=None if carried else data_args.context,
                                              max_sentence_length=data_args.max_sentence_length,
                                              max_context_tokens=data_args.max_context_tokens)
    train_rows = collator.prepare(train_docs)
    eval_rows = collator.prepare(valid_docs) if valid_docs is not None and training_args.eval_strategy != "no" else None
    trainer = TopicLMTrainer(model=model, args=training_args, train_dataset=train_rows, eval_dataset=eval_rows,
                             data_collator=collator, processing_class=tok, callbacks=callbacks,
                             pretraining_phases=parse_phases(model_args.pretraining_phases),
                             compile_output_layer=compile_output_layer,
                             carry_state=carried and not model.reads_documents,
                             bptt_chunks=model_args.bptt_chunks if carried and not model.reads_documents else None)
    from .trainer import OutputDirLock

    # the whole run holds output_dir, pre-training included: a second run on the same folder is refused at once
    # instead of resuming the first one's checkpoints under its own settings and replacing its model
    lock = OutputDirLock(out)
    if training_args.process_index == 0:
        lock.acquire()
        trainer.output_dir_locked = True
    try:
        return _train_locked(model_args, data_args, training_args, model, tok, topic_tok, trainer, train_docs,
                             valid_docs, on_finished)
    finally:
        lock.release()


def _train_locked(model_args, data_args, training_args, model, tok, topic_tok, trainer, train_docs, valid_docs,
                  on_finished):
    from .trainer import finished_run, last_complete_checkpoint

    out = training_args.output_dir
    # the trainer has recorded the vocabularies in the config: a run with others is not this one
    finished = finished_run(out, training_args, model.config)
    if finished:  # a rerun of a finished run changes nothing
        (on_finished or logger.warning)(finished)
        return load_pretrained(AutoModelForCausalLM, out), *data_lib.load_vocabularies(out)
    last = last_complete_checkpoint(out)  # skips a checkpoint the previous run did not finish writing
    if last:
        logger.info("Resuming from %s", last)
    elif pretraining_steps(model_args, model):  # a resumed run's checkpoint holds the pre-trained topic model
        pretraining = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining",
                                                     context=data_args.context,
                                                     max_sentence_length=data_args.max_sentence_length,
                                                     max_context_tokens=data_args.max_context_tokens)
        # resumable on one process (its checkpoints in output_dir/pretraining; a run on several processes redoes it)
        pretrain_for_cli(model, pretraining.prepare(train_docs), pretraining, pretraining_steps(model_args, model),
                         pretraining.prepare(valid_docs) if valid_docs is not None else None, training_args.seed,
                         checkpoint_dir=os.path.join(out, "pretraining") if training_args.world_size == 1 else None)
    trainer.train(resume_from_checkpoint=last)
    trainer.save_model(out)
    data_lib.save_vocabularies(tok, topic_tok, out)
    return trainer.model, tok, topic_tok


def pretraining_steps(model_args: ModelArguments, model) -> int:
    """The cap on topic-model pre-training steps: ``--pretrain_topic_model_steps``, else the steering recipe's for a
    new topic model (``RECIPE_PRETRAINING``), else 0."""
    if model_args.pretrain_topic_model_steps is not None:
        return model_args.pretrain_topic_model_steps
    new_topic_model = not model_args.model_name_or_path and isinstance(model, TopicFamilyForCausalLM)
    return RECIPE_PRETRAINING["steps"] if recipe_of(model_args) == "steering" and new_topic_model else 0


def carried_training(model_args: ModelArguments, data_args: DataArguments, model) -> bool:
    """``--carry_state``: checks its flags against each other and the model, and switches a model that reads whole
    documents (rGBN-RNN) to carrying its LSTM state across their chunks (``carry_token_state``, saved in its config).
    Returns whether the run trains with the state carried."""
    if not model_args.carry_state:
        if model_args.bptt_chunks is not None:
            raise UsageError("--bptt_chunks is an option of --carry_state true")
        return False
    if data_args.context != "preceding" and "context_bow" in getattr(model, "conditioning_inputs", ()):
        logger.info("--carry_state: each sentence's context is the sentences before it (--context %s is not used)",
                    data_args.context)
    if model_args.bptt_chunks is not None:
        data_lib.check_positive_flags(bptt_chunks=model_args.bptt_chunks)
    if model.reads_documents:
        if model_args.bptt_chunks is not None:
            raise UsageError(f"--bptt_chunks: {type(model).__name__} carries its state through each whole document")
        model.config.carry_token_state = True
    return True


def recipe_of(model_args: ModelArguments) -> str:
    """``--recipe``, or its default: "steering" for a model built from ``--model_type``, "paper" for a published
    ``--config_file`` (it trains as published)."""
    if model_args.recipe is not None:
        return model_args.recipe
    return "paper" if model_args.config_file else "steering"


def pretrain_for_cli(model, train_rows, collator, steps: int, dev_rows, seed: int, checkpoint_dir=None) -> None:
    """``--pretrain_topic_model_steps``: the topic model alone first, early-stopped on ``dev_rows`` when given."""
    if steps < 0:
        raise ValueError(f"--pretrain_topic_model_steps must be >= 0, got {steps}")
    if not isinstance(model, TopicFamilyForCausalLM):
        raise ValueError(f"--pretrain_topic_model_steps: {type(model).__name__} has no topic model to pre-train")
    rows = "whole documents' bags of words" if collator.layout == "sequence" else "the context bags of sentence chunks"
    logger.info("Pre-training the topic model on %d rows, %s (at most %d steps) ...", len(train_rows), rows, steps)
    start = time.time()
    settings = {k: v for k, v in RECIPE_PRETRAINING.items() if k != "steps"}
    result = pretrain_topic_model(model, train_rows, collator, steps, seed=seed, eval_dataset=dev_rows,
                                  checkpoint_dir=checkpoint_dir, save_every=settings["eval_every"], **settings)
    best = f", best development objective {result.best_dev_loss:.3f} at step {result.best_step}" \
        if result.dev_losses else ""
    logger.info("Topic model pre-trained: %d steps (stopped by %s)%s, %.0f s", result.steps,
                "its development objective" if result.stopped_by == "patience" else "the step cap", best,
                time.time() - start)


def evaluate(model, docs, protocols, tokenizer=None, topic_tokenizer=None, name="model", **kw) -> list[dict]:
    """Perplexity under each protocol; logs a line when a protocol starts and when it ends (with its time)."""
    rows = []
    for i, protocol in enumerate(protocols, 1):
        logger.info("%s: evaluating protocol %s (%d/%d) on %d documents ...", name, protocol, i, len(protocols),
                    len(docs))
        start = time.time()
        result = evaluate_perplexity(model, docs, protocol, tokenizer=tokenizer, topic_tokenizer=topic_tokenizer, **kw)
        logger.info("%s: %s perplexity %.2f on %d tokens (%.0f s)", name, protocol, result["perplexity"],
                    result["tokens"], time.time() - start)
        rows.append({"model": name, **result})
    return rows


def generate_text(model, tokenizer, prompt: str = "", topic_tokenizer=None, topic_ids=None, context_text=None,
                  allow_unk: bool = False, **generate_kwargs) -> list[str]:
    """Generate from a raw-text prompt (tokenized like the corpora), optionally steered by topics.
    ``<unk>`` is never generated unless ``allow_unk``."""
    words = [w for s in data_lib.tokenize_text(prompt) for w in s]
    inputs = tokenizer([" ".join(words)], return_tensors="pt").to(model.device)
    kwargs = dict(generate_kwargs)
    if allow_unk:
        kwargs["suppress_tokens"] = []
    if topic_ids is not None:
        kwargs["topic_ids"] = topic_ids
    if context_text is not None:
        if topic_tokenizer is None:
            raise ValueError("context_text needs the topic tokenizer")
        kwargs["context_bow"] = make_bow([context_text], topic_tokenizer).to(model.device)
        if not kwargs["context_bow"].any():  # no topic word: it would generate unconditioned text
            raise ValueError(f"the bag of words of context_text {context_text[:60]!r} is empty: it has no word of the "
                             "topic vocabulary, so nothing would steer; give a text with content words (topic-lm "
                             "topics lists some)")
    out = model.generate(**inputs, pad_token_id=tokenizer.pad_token_id, **kwargs)
    # Keep <unk> visible (an out-of-vocabulary prompt word must not silently vanish); drop the rest.
    hidden = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    return [" ".join(tokenizer.convert_ids_to_tokens([i for i in row.tolist() if i not in hidden])) for row in out]


# ----------------------------------------------------------------------------------------------
# the command line: one entry of COMMANDS per subcommand
# ----------------------------------------------------------------------------------------------


def run_train(data_args: DataArguments, model_args: ModelArguments, training_args: TrainingArguments,
              fast: FastPathArguments) -> None:
    finished = []
    train(data_args, model_args, training_args, fast=fast, on_finished=finished.append)
    print(finished[0] if finished else f"saved to {training_args.output_dir}")


def parse_protocols(text: str) -> list[str]:
    """``--protocols``: names separated by commas (spaces around them allowed), each checked before any runs."""
    from .evaluation import PROTOCOLS

    protocols = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if not protocols or unknown:
        raise ValueError(f"--protocols {text!r}: {'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'none'}"
                         f"; give some of {', '.join(PROTOCOLS)} separated by commas")
    return protocols


def run_evaluate(args: EvaluateArguments, device: DeviceArguments | None = None) -> None:
    data_lib.check_positive_flags(max_eval_documents=args.max_eval_documents, batch_size=args.batch_size,
                                  max_sentence_length=args.max_sentence_length)
    protocols = parse_protocols(args.protocols)  # before the model and the data are loaded
    model = load_pretrained(AutoModelForCausalLM, args.model_name_or_path).to((device or DeviceArguments()).torch_device)
    valid_file = args.validation_file or "wikipedia-sample/validation"
    docs = data_lib.load_documents(valid_file, text_column=args.text_column, max_documents=args.max_eval_documents)
    leaky = leaky_modes_of(model)
    if leaky and protocols != ["paper"]:
        skipped = [p for p in protocols if p != "paper"]
        protocols = ["paper"] if "paper" in protocols else []
        print(f"{type(model).__name__} reads words it predicts ({', '.join(leaky)}): its perplexity is only "
              f"reported under the paper protocol, labelled leaky; skipped: {', '.join(skipped)}")
        if not protocols:
            raise ValueError("no protocol left to evaluate this model under: add paper to --protocols")
    rows = evaluate(model, docs, protocols, name=args.model_name_or_path,
                    max_sentence_length=args.max_sentence_length, max_context_tokens=args.max_context_tokens,
                    batch_size=args.batch_size)
    print(f"validation: {valid_file} ({len(docs)} documents)\n")
    print(format_perplexity_table(rows))
    output = args.output_json
    if output is None and Path(args.model_name_or_path).is_dir():
        output = str(Path(args.model_name_or_path) / "perplexity.json")
    if output and output != "none":
        parent = Path(valid_file).parent.name
        dataset = f"{parent}/{Path(valid_file).name}" if parent else Path(valid_file).name
        new = [{**r, "dataset": dataset, "documents": len(docs)} for r in rows]
        merged = merge_result_rows(read_result_rows(output), new)
        Path(output).write_text(json.dumps(merged, indent=1))
        print(f"\nrows written to {output} (with {len(merged) - len(new)} earlier row(s) of other data or protocols)"
              if len(merged) > len(new) else f"\nrows written to {output}")


def _row_key(row: dict) -> tuple:
    return row.get("dataset"), row.get("protocol"), row.get("documents")


def read_result_rows(path) -> list[dict]:
    """The evaluation rows of a ``perplexity.json`` (none when it is absent or not a list of rows)."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def merge_result_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` rows without those ``new`` replaces (the same dataset, protocol and number of documents), then
    ``new``: an evaluation on other data, or on fewer documents, never erases earlier results."""
    replaced = {_row_key(r) for r in new}
    return [r for r in old if _row_key(r) not in replaced] + list(new)


def check_result_rows(rows, source) -> None:
    """Evaluation rows as ``topic-lm evaluate`` writes them, before a card publishes them: a list of objects, each
    with a protocol and a perplexity that is a finite number >= 1 (and a positive token count where given)."""
    if not isinstance(rows, list):
        raise ValueError(f"{source} holds {type(rows).__name__}, not a list of evaluation rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{source}: row {i} is {type(row).__name__}, not an evaluation row (an object with "
                             "protocol and perplexity, as topic-lm evaluate writes)")
        perplexity, tokens = row.get("perplexity"), row.get("tokens")
        if not isinstance(row.get("protocol"), str) or isinstance(perplexity, bool) \
                or not isinstance(perplexity, (int, float)) or not math.isfinite(perplexity) or perplexity < 1:
            raise ValueError(f"{source}: row {i} needs a protocol and a perplexity >= 1 (a perplexity is never "
                             f"below 1), got protocol {row.get('protocol')!r}, perplexity {perplexity!r}")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise ValueError(f"{source}: row {i} has tokens {tokens!r}: a positive whole number, or leave it out")


def best_result_rows(rows: list[dict]) -> list[dict]:
    """One row per dataset and protocol: the one measured on the most tokens (what a model card shows)."""
    best: dict = {}
    for r in rows:
        key = (r.get("dataset"), r.get("protocol"))
        if key not in best or (r.get("tokens") or 0) > (best[key].get("tokens") or 0):
            best[key] = r
    return list(best.values())


def run_export(args: ExportArguments) -> None:
    import json

    from transformers import AutoConfig

    from .hub import auto_class_for, push_to_hub, save_for_hub

    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:  # before anything is written
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        raise UsageError(f"--repo_id {args.repo_id!r} is not a Hub repository id (namespace/name, e.g. "
                         f"org/tcnlm-apnews): {' '.join(str(error).split())}") from None
    check_export_folder(args.output_dir, args.overwrite)
    source = resolve_model_source(args.model_name_or_path)
    model = load_pretrained(auto_class_for(AutoConfig.from_pretrained(source)), source)
    try:
        tok, topic_tok = data_lib.load_vocabularies(source)
    except OSError:
        from transformers import AutoTokenizer

        tok, topic_tok = AutoTokenizer.from_pretrained(source), None  # an LSTM LM folder may have no topic vocabulary
    results_file = args.results or (str(Path(source) / "perplexity.json")
                                    if (Path(source) / "perplexity.json").is_file() else None)
    results = json.loads(Path(results_file).read_text()) if results_file else []
    check_result_rows(results, results_file)
    results = best_result_rows([{**r, "dataset": r.get("dataset") or args.dataset or "evaluation data"}
                                for r in results])
    if args.push_to_hub:
        push_to_hub(model, args.repo_id, tok, topic_tok, private=args.private, local_dir=args.output_dir,
                    results=results)
        print(f"uploaded {args.output_dir} to https://huggingface.co/{args.repo_id}")
    else:
        save_for_hub(model, args.output_dir, tok, topic_tok, results=results, repo_id=args.repo_id)
        print(f"upload-ready folder: {args.output_dir} ({len(results)} evaluation rows in its card"
              f"{', from ' + results_file if results_file else ''}); upload it with "
              f"`hf upload {args.repo_id} {args.output_dir}`")


def check_export_folder(folder: str, overwrite: bool) -> None:
    """Refuse to export into a non-empty folder that is not a previous export (a README.md card of the package
    beside a config.json with an auto_map) unless ``overwrite``: its README.md and config.json would be replaced."""
    path = Path(folder)
    if overwrite or not path.is_dir() or not any(path.iterdir()):
        return
    card, config = path / "README.md", path / "config.json"
    previous = card.is_file() and "topic-lm-hf" in card.read_text(errors="replace") and config.is_file() and \
        "auto_map" in config.read_text(errors="replace")
    if not previous:
        raise UsageError(f"--output_dir {folder} is not empty and holds no previous export: its README.md and "
                         f"config.json would be overwritten; give an empty or new folder, or add --overwrite")


def run_generate(args: GenerateArguments, device: DeviceArguments | None = None) -> None:
    set_seed(args.seed)
    model = load_pretrained(AutoModelForCausalLM, args.model_name_or_path).to(
        (device or DeviceArguments()).torch_device).eval()
    tok, topic_tok = data_lib.load_vocabularies(args.model_name_or_path)
    check_conditioning_flags(model, args)
    topic_ids = parse_ids(args.topic_ids, "--topic_ids") if args.topic_ids is not None else None
    data_lib.check_positive_flags(num_beams=args.num_beams, num_return_sequences=args.num_return_sequences,
                                  max_new_tokens=args.max_new_tokens)
    texts = generate_text(model, tok, args.prompt, topic_tokenizer=topic_tok, topic_ids=topic_ids,
                          context_text=args.context_text, max_new_tokens=args.max_new_tokens,
                          do_sample=args.do_sample, num_beams=args.num_beams,
                          num_return_sequences=args.num_return_sequences, temperature=args.temperature,
                          top_k=args.top_k or None, top_p=args.top_p, allow_unk=args.allow_unk,
                          **{name: getattr(args, name) for name in ("topic_layer", "topic_guidance_scale")
                             if getattr(args, name) is not None})
    print("\n".join(texts))


def check_conditioning_flags(model, args) -> None:
    """The conditioning flags of ``topic-lm generate`` against what the loaded model takes, each mistake one line
    naming the flag (transformers' own message named keywords the user never typed)."""
    takes = set(getattr(model, "conditioning_inputs", ())) | set(getattr(model, "conditioning_options", ()))
    name = type(model).__name__
    given = {flag: value for flag, value in (("--topic_ids", args.topic_ids), ("--context_text", args.context_text),
                                             ("--topic_layer", args.topic_layer),
                                             ("--topic_guidance_scale", args.topic_guidance_scale)) if value is not None}
    if args.topic_ids is not None and args.context_text is not None:
        raise UsageError("give one of --topic_ids and --context_text: both condition the topics")
    needs = {"--topic_ids": "topic_ids", "--context_text": "context_bow", "--topic_layer": "topic_layer"}
    for flag in given:
        wanted = needs.get(flag)
        if (wanted is not None and wanted not in takes) or (flag == "--topic_guidance_scale" and not takes):
            if flag == "--topic_layer" and takes:
                raise UsageError(f"--topic_layer: {name} has one layer of topics (the flag picks a layer of "
                                 "rGBN-RNN's hierarchy); leave it out")
            from .families import topic_families

            raise UsageError(f"{flag}: {name} has no topics; leave the flag out (topic conditioning is for the "
                             f"topic families: {', '.join(f.model_type for f in topic_families())})")


def parse_ids(text: str, flag: str, what: str = "topic id") -> list[int]:
    """Comma-separated integers (``3,7``), at least one and none twice; anything else is a :class:`UsageError`
    naming the flag (an empty list would silently mean "no topics", a repeated one would count twice). ``what``:
    what the integers are, for the messages."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, e.g. {flag} 3,7 (got {text!r})") from None
    if not ids:
        raise UsageError(f"{flag} is empty: give at least one {what}, e.g. {flag} 3,7")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise UsageError(f"{flag} lists {what.removesuffix(' id')} {repeated[0]} more than once (got {text!r})")
    return ids


def run_steer(args: SteerArguments, device: DeviceArguments | None = None) -> None:
    from .evaluation.steering import evaluate_steering, fit_lda_judge, format_steering_table

    data_lib.check_positive_flags(judge_documents=args.judge_documents, num_samples=args.num_samples,
                                  max_new_tokens=args.max_new_tokens, num_topics_sampled=args.num_topics_sampled,
                                  top_words=args.top_words)
    if args.json and not Path(args.json).resolve().parent.is_dir():  # before all the generation, not after it
        raise UsageError(f"--json {args.json}: there is no folder {Path(args.json).parent}; create it first")
    where = (device or DeviceArguments()).torch_device
    model = load_pretrained(AutoModelForCausalLM, args.model_name_or_path).to(where).eval()
    tok, topic_tok = data_lib.load_vocabularies(args.model_name_or_path)
    judge = None
    if args.judge_corpus:
        start = time.perf_counter()
        docs = data_lib.load_documents(args.judge_corpus, text_column=args.text_column,
                                       max_documents=args.judge_documents)
        logger.info("Fitting the LDA judge (%d topics) on %d documents of %s ...", model.config.num_topics, len(docs),
                    args.judge_corpus)
        judge = fit_lda_judge(docs, topic_tok, num_topics=model.config.num_topics, seed=args.seed)
        logger.info("%s (%.0f s)", judge.description, time.perf_counter() - start)
    fluency = load_pretrained(AutoModelForCausalLM, args.fluency_model).to(where).eval() if args.fluency_model else None
    topics = parse_ids(args.topics, "--topics") if args.topics is not None else None
    logger.info("Generating %d texts per topic ...", args.num_samples)
    result = evaluate_steering(model, topics=topics, num_topics_sampled=args.num_topics_sampled,
                               num_samples=args.num_samples, max_new_tokens=args.max_new_tokens, tokenizer=tok,
                               topic_tokenizer=topic_tok, judge=judge, fluency_model=fluency, top_words=args.top_words,
                               top_p=args.top_p, seed=args.seed, topic_guidance_scale=args.topic_guidance_scale)
    print(format_steering_table({args.model_name_or_path: result}))
    print(f"\nchance = 1/T = {result['chance']:.3f}; judge: {result['judge'] or 'none (no --judge_corpus)'}; "
          f"fluency model: {args.fluency_model or 'none'}\n")
    for row in result["per_topic"]:
        print(f"topic {row['topic']} ({' '.join(row['top_words'][:8])}): own encoder {row['accuracy_own']:.2f}, "
              f"own topics {row['accuracy_own_topics']:.2f}"
              + (f", LDA {row['accuracy_lda']:.2f}" if row["accuracy_lda"] is not None else "")
              + f"\n    {row['texts'][0] if row['texts'] else ''}")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(result, indent=1))


def run_topics(args: TopicsArguments, device: DeviceArguments | None = None) -> None:
    model = load_pretrained(AutoModelForCausalLM, args.model_name_or_path).to((device or DeviceArguments()).torch_device)
    if not isinstance(model, TopicFamilyForCausalLM):
        raise ValueError(f"{type(model).__name__} has no topics (it is not a topic model)")
    if model.num_topic_layers == 1:
        if args.layer is not None:
            raise ValueError(f"--layer is for models with topic layers (rGBN-RNN); {type(model).__name__} has one")
        for k, words in enumerate(model.get_topics(top_n=args.top_n)):
            print(f"topic {k:3d}: {' '.join(words)}")
        return
    if args.layer is not None and not 1 <= args.layer <= model.num_topic_layers:
        raise ValueError(f"--layer must be in 1..{model.num_topic_layers} (1 = bottom) for this model, got {args.layer}")
    for layer in ([args.layer] if args.layer is not None else range(1, model.num_topic_layers + 1)):
        topics = model.get_topics(layer=layer, top_n=args.top_n)
        print(f"layer {layer} ({len(topics)} topics)")
        for k, words in enumerate(topics):
            print(f"topic {k:3d}: {' '.join(words)}")


@dataclass(frozen=True)
class Command:
    """A subcommand: what it does (``summary`` for ``topic-lm --help``, ``help`` for its own
    ``--help``), the dataclasses of its flags, the handler that gets one instance of each, and
    defaults that differ from the dataclasses' own."""

    summary: str
    arguments: tuple
    handler: Callable[..., None]
    help: str = ""
    defaults: dict = field(default_factory=dict)


COMMANDS: dict[str, Command] = {
    "train": Command(
        "Train a model on a corpus and save it with its tokenizers.",
        (DataArguments, ModelArguments, TrainingArguments, FastPathArguments), run_train,
        help="Resumes from the last checkpoint-* in --output_dir. Every TrainingArguments flag works; defaults that "
             "differ from TrainingArguments: --learning_rate 1e-3, --logging_steps 50, progress bar on "
             "(--disable_tqdm true turns it off; the logs are then printed as lines). Trains on the GPU when "
             "there is one (--use_cpu true: the CPU), topic-model pre-training included; in bf16 autocast with a "
             "compiled output layer on a CPU with native bf16, in float32 eager on a GPU (measured faster there; one "
             "log line says which and why; --precision and --compile_output_layer force either).",
        defaults={"learning_rate": 1e-3, "logging_steps": 50, "disable_tqdm": False}),
    "evaluate": Command(
        "Perplexity of a saved model under each context protocol.", (EvaluateArguments, DeviceArguments), run_evaluate,
        help="Logs a line when each protocol starts and ends (with its time), then prints a table."),
    "generate": Command(
        "Generate text from a saved model: from a prompt, from topics or from a document's topics.",
        (GenerateArguments, DeviceArguments), run_generate),
    "topics": Command("Print the top words of every topic of a saved topic model.", (TopicsArguments, DeviceArguments),
                      run_topics),
    "export": Command(
        "Write a saved model as an upload-ready Hub folder: weights, code, tokenizers and a card with its results.",
        (ExportArguments,), run_export,
        help="The folder loads with every Auto class and trust_remote_code=True, without the package. The card "
             "reports the rows of --results or of the model folder's perplexity.json (topic-lm evaluate writes it)."),
    "steer": Command(
        "Does generate(topic_ids=[k]) write about topic k? Topic accuracy, topic-word lift, fluency, Dist-n.",
        (SteerArguments, DeviceArguments), run_steer,
        help="The protocol of topic_lm_hf.evaluate_steering (PPLM-style, judged by the model's own encoder and by an "
             "LDA fitted on --judge_corpus)."),
    "classify": Command(
        "Document classification with a saved model's features: train a head (or fine-tune) and report accuracy.",
        (TaskDataArguments, ClassifyArguments, DeviceArguments), run_classify,
        help="Splits --dataset (stratified, seeded), loads the model folder with AutoModelForSequenceClassification "
             "and trains through Trainer; prints accuracy next to the majority class and tf-idf + logistic "
             "regression."),
    "retrieve": Command(
        "Document retrieval with a saved model's [o_N; c]: precision@k of cosine search, labels as relevance.",
        (TaskDataArguments, RetrieveArguments, DeviceArguments), run_retrieve,
        help="Queries = the held-out documents of --dataset, corpus = the rest; prints precision next to tf-idf "
             "and LDA cosine retrieval."),
    "demo": Command(
        f"The first thing to run: train a topic model ({TOPIC_FAMILIES[DEMO_FAMILY][0]} unless --family says) and the "
        "same-size LSTM, show topics, steered text and perplexity.",
        (DemoArguments, FastPathArguments, DeviceArguments), run_demo,
        help="Trains on wikipedia-sample (English Wikipedia articles that ship with the package), or on "
             "--train_file. About 4 minutes on 2 CPU cores."),
    # two-word commands: "topic-lm wsd train ..." (main joins the words)
    "wsd train": Command(
        "Train a BiLSTM word sense tagger (optionally with a frozen topic model's document topics) and save it.",
        (WSDTrainArguments, TrainingArguments), run_wsd_train,
        help="Every TrainingArguments flag works; defaults that differ from TrainingArguments: --learning_rate 1e-3 "
             "and --per_device_train_batch_size 32 (the paper's), --num_train_epochs 5, --logging_steps 100.",
        defaults={"learning_rate": 1e-3, "per_device_train_batch_size": 32, "num_train_epochs": 5,
                  "logging_steps": 100, "report_to": "none"}),
    "wsd evaluate": Command(
        "Tag a WSD set with a trained sense tagger, write the key file(s) and print P / R / F1 per output mode.",
        (WSDEvaluateArguments, DeviceArguments), run_wsd_evaluate),
}


def command_parser(name: str) -> HfArgumentParser:
    """The parser of one subcommand: its usage line names it and it lists only its own flags."""
    command = COMMANDS[name]
    parser = HfArgumentParser(command.arguments, prog=f"topic-lm {name}",
                              description=f"{command.summary} {command.help}".strip(), allow_abbrev=False)
    parser.set_defaults(**command.defaults)
    return parser


def parse_command(name: str, argv: list[str]) -> tuple:
    """One instance of each argument dataclass of ``name``; an unknown flag is an error (exit 2)."""
    parser = command_parser(name)
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        hint = ""
        if any(a == "--device" or a.startswith("--device=") for a in remaining):
            hint = {"train": " (topic-lm train places the model as transformers' Trainer does: on the GPU when there "
                             "is one; --use_cpu true keeps it on the CPU, CUDA_VISIBLE_DEVICES picks a GPU)",
                    "export": " (topic-lm export only copies the weights: it needs no device)"}.get(name, "")
        parser.error(f"unrecognized arguments: {' '.join(remaining)}{hint}")
    return tuple(parsed)


def usage() -> str:
    """``topic-lm --help``: the subcommands and what each does."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: topic-lm {{{','.join(COMMANDS)}}} [-h] ...", "",
             "Topic-guided neural language models as Hugging Face transformers models.", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    lines += ["", "Run 'topic-lm COMMAND --help' for the flags of a command."]
    return "\n".join(lines)


class UsageError(ValueError):
    """A mistake in how a command was called: one line on stderr, exit code 2."""


def main(argv: Optional[list[str]] = None) -> None:
    """``topic-lm COMMAND [flags]``. A user error (a bad value, a missing file or folder, input the package
    refuses: ``ValueError`` and ``OSError``) is one line on stderr and exit code 2; ``--debug`` (anywhere, or
    ``TOPIC_LM_DEBUG=1``) shows its traceback instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("TOPIC_LM_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    name, argv = argv[0], argv[1:]
    if argv and f"{name} {argv[0]}" in COMMANDS:  # a two-word command: topic-lm wsd train ...
        name, argv = f"{name} {argv[0]}", argv[1:]
    group = [c for c in COMMANDS if c.startswith(f"{name} ")]
    if name not in COMMANDS and group:  # topic-lm wsd, topic-lm wsd --help
        lines = [f"usage: topic-lm {name} {{{','.join(c.split(' ', 1)[1] for c in group)}}} [-h] ...", ""]
        lines += [f"  {c:<{max(map(len, group))}}  {COMMANDS[c].summary}" for c in group]
        wants_help = bool(argv) and argv[0] in ("-h", "--help")
        print("\n".join(lines), file=sys.stdout if wants_help else sys.stderr)
        sys.exit(0 if wants_help else 2)
    if name not in COMMANDS:
        print(usage(), file=sys.stderr)
        sys.exit(f"topic-lm: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("datasets", "transformers.trainer", "transformers.configuration_utils", "transformers.modeling_utils"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    parsed = parse_command(name, argv)
    try:
        for part in parsed:  # a device this machine lacks is refused before any data or model is loaded
            if isinstance(part, DeviceArguments):
                part.torch_device
        COMMANDS[name].handler(*parsed)
    except (ValueError, OSError) as error:  # the package's user errors: what to do is in the message
        if debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"topic-lm {name}: error: {message}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:  # noqa: BLE001 (a full disk, in the words of the library that was writing)
        if debug or not disk_full(error):
            raise
        print(f"topic-lm {name}: error: the disk is full (no space left on device) while writing "
              f"({type(error).__name__}): free some space or write to another disk, then run the command again "
              f"(a training run resumes from its last complete checkpoint)", file=sys.stderr)
        sys.exit(2)


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) says the disk is full: an OSError ENOSPC, or a library's own
    error that wraps it (torch.save's "file write failed", safetensors' "No space left on device")."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in text \
                or "file write failed" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


if __name__ == "__main__":
    main()
