"""A ``Trainer`` that logs every loss term and refuses to go on after a non-finite loss or gradient."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import defaultdict

import torch
from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from .collator import TopicContextCollator
from .data import record_vocabularies, save_vocabularies

logger = logging.getLogger(__name__)

LOSS_TERMS = ("lm_loss", "kl_loss", "bow_loss", "aux_loss")
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


class NonFiniteLossError(FloatingPointError):
    """Raised when a training loss is NaN or infinite; the weights before that step are saved."""


class NonFiniteGradientError(NonFiniteLossError):
    """Raised when the gradient norm is NaN or infinite; the step is not applied and the weights before it are saved."""


def last_complete_checkpoint(output_dir) -> str | None:
    """The newest ``checkpoint-<N>`` folder in ``output_dir`` that training can resume from (None if none).

    ``Trainer`` writes ``trainer_state.json`` last, so a run killed while writing a checkpoint
    leaves a folder without it (or with it truncated); transformers' ``get_last_checkpoint``
    still picks that folder, and resuming failed with ``FileNotFoundError``. Such folders are
    skipped with a warning naming them."""
    if not os.path.isdir(output_dir):
        return None
    steps = {}
    for name in os.listdir(output_dir):
        match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps[int(match.group(1))] = os.path.join(output_dir, name)
    for step in sorted(steps, reverse=True):
        problem = _incomplete_checkpoint(steps[step])
        if problem is None:
            return steps[step]
        logger.warning("Not resuming from %s: %s (was the run stopped while writing it?)", steps[step], problem)
    return None


def _incomplete_checkpoint(path: str) -> str | None:
    """What a checkpoint folder lacks to be resumed from, or None when it is complete."""
    state = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isfile(state):
        return f"it has no {TRAINER_STATE_NAME}"
    try:
        with open(state, encoding="utf-8") as f:
            json.load(f)
    except ValueError:
        return f"its {TRAINER_STATE_NAME} is truncated"
    if not any(os.path.isfile(os.path.join(path, name)) for name in WEIGHTS_FILES):
        return "it has no model weights"
    return None


class TopicLMTrainer(Trainer):
    """``transformers.Trainer`` for the package's models.

    * Logs each loss term the model returns (``lm_loss``, ``kl_loss``, ``bow_loss``, ``aux_loss``)
      next to ``loss``, averaged over the logging interval and over processes.
    * Evaluation adds ``eval_perplexity``, exp of the mean negative log-likelihood per predicted
      token under the model's predictive distribution ``log_softmax(logits)`` (the LM alone:
      ``eval_loss`` is the whole training objective, KL and bag-of-words terms included; for
      TopicRNN the stop-word indicator is marginalised, as in ``evaluate_perplexity``), and each
      loss term (``eval_lm_loss``, ``eval_kl_loss``, ...), averaged over batches weighted by
      their predicted tokens.
    * Every checkpoint (and ``save_model``) holds both vocabularies: the LM tokenizer and the
      collator's topic tokenizer in ``topic_tokenizer/``, so a checkpoint folder can be
      evaluated, resumed or asked for its topics on its own.
    * Records the hashes of the collator's vocabularies in the model config
      (:func:`~topic_lm_hf.data.record_vocabularies`), so evaluation refuses other tokenizers.
    * Sets ``remove_unused_columns=False`` (the collator needs its raw columns) and
      ``label_names=["labels"]`` (hf-notes §4).
    * Stops with :class:`NonFiniteLossError` on a NaN / inf loss, and with
      :class:`NonFiniteGradientError` on a NaN / inf gradient norm (the loss can be finite while
      the backward pass overflows), before the optimizer step: the step is not applied, the
      current (finite) weights are saved to ``<output_dir>/nonfinite-step-<N>`` (N = steps
      done), and every checkpoint stays finite. Resume from the last checkpoint with a lower
      learning rate or stronger clipping. (Mixed precision with a gradient scaler skips such
      steps itself and is left to it.)
    * Tells a model with ``set_training_corpus_size`` the number of training rows (rGBN-RNN's sampler scales
      its minibatch statistics by it).
    * ``pretraining_phases``: training phases before the joint objective, as ``[(phase, steps), ...]``
      in order, e.g. NCLM's ``[("lm", 2000), ("topic_model", 500)]`` (the paper's LM pre-training, then
      the topic model's). The phase of an optimizer step follows from ``global_step``, so a resumed run
      resumes in the right phase; one optimizer and one schedule serve every phase, and evaluation is
      always of the full model. The model must list the phases in ``training_phases`` and switch with
      ``set_training_phase`` (a phase leaves some parameters without gradient: with DDP, set
      ``ddp_find_unused_parameters=True``).
    """

    def __init__(self, *args, pretraining_phases=None, **kwargs):
        args_ = kwargs.get("args") if "args" in kwargs else (args[1] if len(args) > 1 else None)
        if args_ is not None:
            if args_.remove_unused_columns:
                args_.remove_unused_columns = False
            if args_.label_names is None:
                args_.label_names = ["labels"]
            if args_.dataloader_pin_memory and args_.device.type == "cpu":
                # Pinned memory only speeds up copies to an accelerator; on CPU, PyTorch warns at every epoch.
                args_.dataloader_pin_memory = False
        super().__init__(*args, **kwargs)
        self.pretraining_phases = self._check_phases(pretraining_phases)
        self._loss_terms: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._eval_sums: dict[str, torch.Tensor] | None = None  # while evaluating: token-weighted sums
        set_corpus_size = getattr(self.model, "set_training_corpus_size", None)
        if set_corpus_size is not None and self.train_dataset is not None and hasattr(self.train_dataset, "__len__"):
            # Models whose sampler scales minibatch statistics to the corpus (rGBN-RNN's TLASGR-MCMC).
            set_corpus_size(len(self.train_dataset))
        collator = self.data_collator
        if isinstance(collator, TopicContextCollator) and getattr(self.model.config, "vocab_size", None) is not None:
            # The config (saved in every checkpoint) records which vocabularies the model is trained on.
            record_vocabularies(self.model.config, collator.tokenizer, collator.topic_tokenizer)

    def _check_phases(self, phases) -> list[tuple[str, int]]:
        phases = [tuple(p) for p in (phases or [])]
        if not phases:
            return []
        supported = getattr(self.model, "training_phases", None)
        if supported is None or not hasattr(self.model, "set_training_phase"):
            raise ValueError(f"{type(self.model).__name__} has no training phases (training_phases / "
                             "set_training_phase): pretraining_phases cannot be used with it")
        for phase in phases:
            if len(phase) != 2 or phase[0] not in supported or phase[0] == "joint" or isinstance(phase[1], bool) \
                    or not isinstance(phase[1], int) or phase[1] < 0:
                raise ValueError(f"pretraining_phases must be (phase, steps) pairs with phase in "
                                 f"{[p for p in supported if p != 'joint']} and steps >= 0, got {phase!r}")
        return phases

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:
            if self.pretraining_phases:  # a run that stopped within a phase leaves the model whole
                self.model.set_training_phase("joint")

    def training_phase(self, step: int) -> str:
        """The phase of optimizer step ``step`` (0-based): one of ``pretraining_phases``, then ``"joint"``."""
        done = 0
        for phase, steps in self.pretraining_phases:
            if step < done + steps:
                return phase
            done += steps
        return "joint"

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.get("labels")
        if self.pretraining_phases:
            phase = self.training_phase(self.state.global_step) if model.training else "joint"
            self.accelerator.unwrap_model(model).set_training_phase(phase)
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        if model.training:
            if not bool(torch.isfinite(loss.detach()).all()):
                self._stop_on_nonfinite(NonFiniteLossError, f"Training loss is {loss.item()}")
            for key in LOSS_TERMS:
                value = _output(outputs, key)
                if value is not None:
                    self._loss_terms[key].append(value.detach().float().mean())
        elif self._eval_sums is not None:
            self._add_eval_terms(labels, outputs)
        return (loss, outputs) if return_outputs else loss

    # -- evaluation -------------------------------------------------------------------------------

    def _add_eval_terms(self, labels, outputs):
        logits = _output(outputs, "logits")
        if labels is None or logits is None or _output(outputs, "lm_loss") is None:
            return  # not a language model's output (a classifier trained with this Trainer)
        targets = labels[..., 1:].to(logits.device)  # logits at position i predict labels at i + 1
        tokens = (targets != -100).sum()
        sums = self._eval_sums
        nll = torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]).float(),
                                                targets.reshape(-1), ignore_index=-100, reduction="sum")
        sums["tokens"] = sums.get("tokens", 0) + tokens
        sums["nll"] = sums.get("nll", 0) + nll.detach()
        for key in LOSS_TERMS:
            value = _output(outputs, key)
            if value is not None:
                sums[key] = sums.get(key, 0) + value.detach().float().mean() * tokens

    def evaluation_loop(self, *args, **kwargs):
        self._eval_sums = {}
        try:
            output = super().evaluation_loop(*args, **kwargs)
            sums = self._eval_sums
        finally:
            self._eval_sums = None
        if "tokens" in sums:
            prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
            keys = sorted(sums)
            totals = self.accelerator.reduce(torch.stack([torch.as_tensor(sums[k], dtype=torch.float64,
                                                                          device=self.args.device) for k in keys]),
                                             reduction="sum")
            totals = dict(zip(keys, totals.tolist()))
            tokens = max(totals.pop("tokens"), 1.0)
            output.metrics[f"{prefix}_perplexity"] = math.exp(totals.pop("nll") / tokens)
            for key, value in totals.items():
                output.metrics[f"{prefix}_{key}"] = value / tokens
        return output

    # -- saving -------------------------------------------------------------------------------------

    def _save(self, output_dir=None, state_dict=None):
        super()._save(output_dir, state_dict)
        collator = self.data_collator
        if self.args.should_save and isinstance(collator, TopicContextCollator):
            save_vocabularies(collator.tokenizer, collator.topic_tokenizer,
                              output_dir if output_dir is not None else self.args.output_dir)

    def _get_grad_norm(self, model, grad_norm=None):
        # transformers 5.x calls this once per optimizer step, after clipping and just before
        # optimizer.step(): the last moment to refuse a non-finite update.
        grad_norm = super()._get_grad_norm(model, grad_norm)
        if grad_norm is not None and self.accelerator.scaler is None and not math.isfinite(float(grad_norm)):
            self._stop_on_nonfinite(NonFiniteGradientError, f"The gradient norm is {float(grad_norm)} (the loss was "
                                    "finite); the step was not applied")
        return grad_norm

    def _stop_on_nonfinite(self, error_class, what: str):
        done = self.state.global_step
        path = os.path.join(self.args.output_dir, f"nonfinite-step-{done}")
        self.save_model(path)
        raise error_class(
            f"{what} at step {done + 1}. The weights after step {done} are saved in {path}; the last checkpoint "
            f"in {self.args.output_dir} can be resumed with a lower learning rate or stronger gradient clipping "
            "(max_grad_norm).")

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self._checkpoint_being_loaded = resume_from_checkpoint
        try:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        finally:
            self._checkpoint_being_loaded = None

    def _issue_warnings_after_load(self, load_result):
        # Resuming loads with load_state_dict(strict=False), which only warns about missing weights:
        # for the package's models they are an error, as in from_pretrained.
        check = getattr(self.model, "check_missing_weights", None)
        if check is not None:
            check(load_result.missing_keys, getattr(self, "_checkpoint_being_loaded", None) or "the checkpoint",
                  load_result.unexpected_keys)
        super()._issue_warnings_after_load(load_result)

    def log(self, logs, start_time=None):
        if "loss" in logs and self._loss_terms:
            for key, values in self._loss_terms.items():
                value = torch.stack(values).mean().to(self.args.device).unsqueeze(0)
                logs[key] = round(self.accelerator.gather_for_metrics(value).mean().item(), 4)
            self._loss_terms.clear()
        super().log(logs, start_time)


def _output(outputs, key):
    return outputs.get(key) if isinstance(outputs, dict) else getattr(outputs, key, None)
