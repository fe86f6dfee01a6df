"""What the core ``topic-lm`` commands do: train, evaluate, generate, topics, steer and export (``topic_lm_hf.cli``
parses their flags, :mod:`topic_lm_hf.arguments`, and calls the ``run_*`` function of each). ``train``,
``evaluate`` and ``generate_text`` are the same steps as functions, for scripts and tests.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, TrainingArguments, set_seed

from . import data as data_lib
from .arguments import (EvaluateArguments, ExportArguments, GenerateArguments, ModelArguments, SteerArguments,
                        TopicsArguments, UsageError, override_literal, parse_ids, parse_overrides, parse_phases,
                        parse_protocols)
from .checkpoints import OutputDirLock, finished_run, last_complete_checkpoint
from .collator import TopicContextCollator, make_bow
from .data import DataArguments, load_corpora
from .devices import DeviceArguments
from .evaluation import evaluate_perplexity
from .evaluation.perplexity import empty_context_rows
from .families import family_of, topic_families
from .fast_path import FastPathArguments, fast_training_arguments, on_gpu, resolve_compile
from .hub import auto_class_for, load_pretrained, push_to_hub, resolve_model_source, save_for_hub
from .models.configuration_common import config_kwargs_from_tokenizers
from .models.modeling_recurrent import leaky_modes_of
from .models.modeling_topic_family import TopicFamilyForCausalLM
from .pretraining import RECIPE_PRETRAINING, pretrain_topic_model, steering_recipe
from .protocols import PROTOCOLS
from .trainer import TopicLMTrainer

logger = logging.getLogger("topic_lm_hf")


# ----------------------------------------------------------------------------------------------
# the configuration and the model of a run
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


def build_model(model_args: ModelArguments, tokenizer, topic_tokenizer):
    """A new model of ``model_type`` sized to the vocabularies, or a saved one."""
    if model_args.model_name_or_path:
        if model_args.language_model:
            raise UsageError("--language_model starts a new model; --model_name_or_path continues a saved one: give "
                             "one of them")
        model = load_pretrained(AutoModelForCausalLM, model_args.model_name_or_path)
        data_lib.check_vocabularies(tokenizer, topic_tokenizer, model.config)
        return model
    config = make_config(model_args)
    # Vocabulary sizes, special-token ids and topic_word_ids (the LM id of every topic word), as from_tokenizers;
    # a family without a topic vocabulary (the LSTM LM) takes only the first two.
    for name, value in config_kwargs_from_tokenizers(tokenizer, topic_tokenizer).items():
        if not name.startswith("topic_") or hasattr(config, name):
            setattr(config, name, value)
    if model_args.language_model:
        return start_from_language_model(model_args.language_model, config, tokenizer)
    return AutoModelForCausalLM.from_config(config)


def start_from_language_model(folder: str, config: PretrainedConfig, tokenizer):
    """``--language_model``: a new topic model of ``config`` started from the LSTM LM saved in ``folder``
    (``from_language_model``), whose vocabulary must be ``tokenizer``'s (the same corpus and ``--min_freq``)."""
    from transformers import AutoTokenizer

    cls = family_of(config.model_type).causal_lm_class
    if not issubclass(cls, TopicFamilyForCausalLM):
        raise UsageError(f"--language_model starts a topic model from an LSTM LM; --model_type {config.model_type} "
                         "has no topics")
    if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise UsageError(f"--language_model {folder}: no saved model with its tokenizer there (a topic-lm train "
                         "output folder)")
    if data_lib.vocabulary_hash(AutoTokenizer.from_pretrained(folder)) != data_lib.vocabulary_hash(tokenizer):
        raise UsageError(f"--language_model {folder} was trained with another vocabulary than this corpus gives: "
                         "train it on the same corpus with the same --min_freq")
    return cls.from_language_model(folder, config)


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
# the commands' steps as functions: train, evaluate, generate
# ----------------------------------------------------------------------------------------------


def train(data_args: DataArguments, model_args: ModelArguments, training_args: TrainingArguments,
          train_docs=None, valid_docs=None, callbacks=None, fast: FastPathArguments | None = None,
          on_finished: Callable[[str], None] | None = None):
    """Train (resuming from the last complete checkpoint in ``output_dir`` if there is one) and save, on the device
    of ``training_args`` (the GPU when there is one; ``--use_cpu true``: the CPU), the topic model's pre-training
    included. ``fast``: the fast path chosen for that device (``topic_lm_hf.fast_path``). A run that is already
    finished in ``output_dir`` (:func:`~topic_lm_hf.checkpoints.finished_run`) is left as it is and its saved model
    returned; the line saying so is logged, or given to ``on_finished``."""
    set_seed(training_args.seed)
    compile_output_layer = fast is not None and resolve_compile(training_args, fast.compile_output_layer)
    if fast is not None:
        training_args = fast_training_arguments(training_args, fast.precision, compile_output_layer)
    pin_memory_only_with_accelerator(training_args)
    cuda_graphs = fast is not None and fast.cuda_graphs
    if cuda_graphs and not on_gpu(training_args):  # before the corpora are read
        raise UsageError("--cuda_graphs replays captured CUDA graphs: it needs a CUDA GPU (this run trains on the "
                         "CPU)")
    if not model_args.model_name_or_path and not model_args.config_file:  # before the corpora are read
            family_of(model_args.model_type)
    check_early_stopping(model_args, training_args)
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
    if data_args.empty_context:
        check_empty_context(model)
    carried = carried_training(model_args, data_args, model)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train-carry" if carried else "train",
                                              context=None if carried else data_args.context,
                                              max_sentence_length=data_args.max_sentence_length,
                                              max_context_tokens=data_args.max_context_tokens)
    train_rows = collator.prepare(train_docs)
    eval_rows = collator.prepare(valid_docs) if valid_docs is not None and training_args.eval_strategy != "no" else None
    if data_args.empty_context:  # the topic model's matched topic-free twin (its topic model pre-trained as usual)
        train_rows, eval_rows = (None if rows is None else empty_context_rows(rows) for rows in (train_rows, eval_rows))
    callbacks = [*(callbacks or []), *early_stopping(model_args, training_args, eval_rows)]
    trainer = TopicLMTrainer(model=model, args=training_args, train_dataset=train_rows, eval_dataset=eval_rows,
                             data_collator=collator, processing_class=tok, callbacks=callbacks,
                             pretraining_phases=parse_phases(model_args.pretraining_phases),
                             compile_output_layer=compile_output_layer, cuda_graphs=cuda_graphs,
                             carry_state=carried and not model.reads_documents,
                             bptt_chunks=model_args.bptt_chunks if carried and not model.reads_documents else None)
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
    state = trainer.state
    if model_args.early_stopping_patience is not None and state.best_model_checkpoint:
        how = ("stopped by the validation loss" if state.global_step < state.max_steps else "reached --max_steps")
        logger.info("Training %s at step %d; the best checkpoint's weights are saved (%s, validation loss %.4f)", how,
                    state.global_step, os.path.basename(state.best_model_checkpoint), state.best_metric)
    trainer.save_model(out)
    data_lib.save_vocabularies(tok, topic_tok, out)
    return trainer.model, tok, topic_tok


def check_empty_context(model) -> None:
    """``--empty_context true`` holds a topic model's topics uninformative: a model that reads no context has none."""
    if "context_bow" not in model.conditioning_inputs:
        raise UsageError("--empty_context true holds a topic model's topics uninformative, and "
                         f"{model.config.model_type} reads no topics: leave the flag out")


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


def early_stopping(model_args: ModelArguments, training_args: TrainingArguments, eval_rows) -> list:
    """``--early_stopping_patience N``: transformers' ``EarlyStoppingCallback`` on the language model's validation
    loss (``eval_lm_loss``, the log of the validation perplexity; ``--metric_for_best_model`` chooses another), the
    best checkpoint's weights loaded at the end; checkpoints are saved at every evaluation (``save_strategy`` and
    ``save_steps`` follow the evaluation's). Nothing without the flag."""
    from transformers import EarlyStoppingCallback
    from transformers.trainer_utils import IntervalStrategy

    patience = model_args.early_stopping_patience
    if patience is None:
        return []  # the flags were checked before the corpora were read (check_early_stopping)
    if eval_rows is None:
        raise UsageError("--early_stopping_patience stops on the validation loss: give validation documents")
    training_args.load_best_model_at_end = True
    # the validation perplexity (a topic model's loss adds its topic terms), unless --metric_for_best_model names
    # another metric ("loss" is what TrainingArguments itself fills in for reduce_lr_on_plateau)
    if training_args.metric_for_best_model in (None, "loss", "eval_loss"):
        training_args.metric_for_best_model, training_args.greater_is_better = "eval_lm_loss", False
    training_args.set_save(strategy="steps", steps=training_args.eval_steps, total_limit=training_args.save_total_limit)
    # a resumed run goes on counting its evaluations without improvement, as if it had not been interrupted
    training_args.restore_callback_states_from_checkpoint = True
    return [EarlyStoppingCallback(early_stopping_patience=patience)]


def check_early_stopping(model_args: ModelArguments, training_args: TrainingArguments) -> None:
    """The flags ``--early_stopping_patience`` needs, checked before anything is read: a positive patience,
    evaluations every ``--eval_steps``, and no pre-training phases (their losses are not the joint objective's)."""
    from transformers.trainer_utils import IntervalStrategy

    if model_args.early_stopping_patience is None:
        return
    data_lib.check_positive_flags(early_stopping_patience=model_args.early_stopping_patience)
    if training_args.eval_strategy != IntervalStrategy.STEPS:
        raise UsageError("--early_stopping_patience stops on the validation loss: give --eval_strategy steps (with "
                         "--eval_steps)")
    if model_args.pretraining_phases:
        raise UsageError("--early_stopping_patience with --pretraining_phases would count the phases' evaluations: "
                         "give one of them")


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
# the handlers: one per entry of topic_lm_hf.cli.COMMANDS
# ----------------------------------------------------------------------------------------------


def run_train(data_args: DataArguments, model_args: ModelArguments, training_args: TrainingArguments,
              fast: FastPathArguments) -> None:
    finished = []
    train(data_args, model_args, training_args, fast=fast, on_finished=finished.append)
    print(finished[0] if finished else f"saved to {training_args.output_dir}")

def run_evaluate(args: EvaluateArguments, device: DeviceArguments | None = None) -> None:
    data_lib.check_positive_flags(max_eval_documents=args.max_eval_documents, batch_size=args.batch_size,
                                  max_sentence_length=args.max_sentence_length)
    protocols = parse_protocols(args.protocols)  # before the model and the data are loaded
    model = load_pretrained(AutoModelForCausalLM, args.model_name_or_path).to((device or DeviceArguments()).torch_device)
    valid_file = args.validation_file or "wikipedia-sample/validation"
    docs = data_lib.load_documents(valid_file, text_column=args.text_column, max_documents=args.max_eval_documents)
    leaky = leaky_modes_of(model)
    skipped = [p for p in protocols if not PROTOCOLS[p].leaky] if leaky else []
    if skipped:  # such a model is only evaluated under a protocol whose context leaks already (paper)
        protocols = [p for p in protocols if PROTOCOLS[p].leaky]
        allowed = " / ".join(name for name, p in PROTOCOLS.items() if p.leaky)
        print(f"{type(model).__name__} reads words it predicts ({', '.join(leaky)}): its perplexity is only "
              f"reported under the {allowed} protocol, labelled leaky; skipped: {', '.join(skipped)}")
        if not protocols:
            raise ValueError(f"no protocol left to evaluate this model under: add {allowed} to --protocols")
    if args.empty_context:
        check_empty_context(model)
    rows = evaluate(model, docs, protocols, name=args.model_name_or_path,
                    max_sentence_length=args.max_sentence_length, max_context_tokens=args.max_context_tokens,
                    batch_size=args.batch_size, empty_context=args.empty_context)
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
            raise UsageError(f"{flag}: {name} has no topics; leave the flag out (topic conditioning is for the "
                             f"topic families: {', '.join(f.model_type for f in topic_families())})")


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

