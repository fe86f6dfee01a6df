"""A ``Trainer`` that logs every loss term and refuses to go on after a non-finite loss or gradient.

Its carried-state loss (``carry_state=True``) is :func:`~topic_lm_hf.carried_state.carried_state_loss`; the
checkpoint hygiene of a run (resuming from a complete checkpoint of the same model, the ``output_dir`` lock) is in
:mod:`topic_lm_hf.checkpoints`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import defaultdict
from collections.abc import Sized

import torch
from transformers import Trainer

from .carried_state import (LOSS_TERMS, carried_state_loss, check_bptt_chunks, check_carry_state_model, model_output,
                            unwrap_model)
from .checkpoints import OutputDirLock, config_differences, last_complete_checkpoint
from .collator import TopicContextCollator
from .cuda_graphs import GraphedTrainingStep, why_not_capturable
from .data import record_vocabularies, save_vocabularies
from .models.modeling_recurrent import RecurrentPreTrainedModel, TopicLMOutput, leaky_modes_of
from .models.modeling_topic_family import TopicFamilyForCausalLM


class NonFiniteLossError(FloatingPointError):
    """Raised when a training loss is NaN or infinite; the weights before that step are saved."""


class NonFiniteGradientError(NonFiniteLossError):
    """Raised when the gradient norm is NaN or infinite; the step is not applied and the weights before it are saved."""


@contextlib.contextmanager
def float32_forward(model):
    """Run ``model`` outside the mixed-precision wrapper that accelerate puts on ``model.forward`` for a
    ``TrainingArguments(bf16=True)`` (or fp16) run: inside this block ``model.forward`` is the class's own again,
    so an evaluation made during training (a callback's) measures the float32 model, as it would after
    loading the saved weights. A model without the wrapper is left as it is."""
    model = unwrap_model(model)
    patched = model.__dict__.pop("forward", None) if "_original_forward" in model.__dict__ else None
    try:
        yield model
    finally:
        if patched is not None:
            model.__dict__["forward"] = patched


def remove_mixed_precision_wrapper(model) -> None:
    """Undo accelerate's autocast wrapper of ``model.forward`` (what ``TopicLMTrainer.train`` does when it ends),
    so that the trained model object computes in float32 like the saved one."""
    model = unwrap_model(model)
    if "_original_forward" in model.__dict__:
        model.__dict__.pop("forward", None)
        del model.__dict__["_original_forward"]


class TopicLMTrainer(Trainer):
    """``transformers.Trainer`` for the package's models.

    * Logs each loss term the model returns (``lm_loss``, ``kl_loss``, ``bow_loss``, ``aux_loss``)
      next to ``loss``, averaged over the logging interval and over processes.
    * Evaluation adds ``eval_perplexity`` (``eval_perplexity_leaky`` for a model whose options let it read the
      words it predicts, ``leaky_modes()``), exp of the mean negative log-likelihood per predicted
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
    * Gradient accumulation equals the big batch: each micro-batch's loss is weighted by its share of the
      optimizer step's predicted tokens (the Trainer's ``num_items_in_batch``), not averaged as a mean of means.
    * Sets ``remove_unused_columns=False`` (the collator needs its raw columns) and
      ``label_names=["labels"]`` (named: transformers reads it from the outermost model's forward, which a
      wrapper such as PEFT hides).
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
    * ``carry_state=True``: train with the recurrent state carried across the chunks and sentences of each
      document (truncated back-propagation through the document), the training counterpart of
      ``evaluate_perplexity(protocol="causal-carry")`` (Zheng, Vafa & Blei 2023). Batches come from
      ``TopicContextCollator(layout="documents", context="preceding")`` (or ``context="none"`` for the LSTM
      LM): each chunk's context then holds only earlier sentences. See :func:`carried_state_loss` for the
      order of the chunks, the loss (the same per-token objective as sentence training) and
      ``bptt_chunks`` (chunks between detachments of the state; None: the whole document). For models with
      ``state`` in ``forward``: the LSTM LM, TCNLM, TopicRNN and NCLM; rGBN-RNN (which reads whole documents,
      ``chunk_mask``), a model without ``state``, a leaky model (``leaky_modes()``), a sentences-layout
      collator, label smoothing and ``compute_loss_func`` are refused with a ``ValueError``. Gradient
      accumulation, checkpoints, resuming and the non-finite checks work as without it (a run resumes with
      the same constructor arguments; nothing more is saved). Evaluation (``Trainer.evaluate``) reads the
      documents batches the same way, in evaluation mode: ``eval_loss`` and ``eval_perplexity`` are then
      those of the carried state (``eval_perplexity`` equals ``causal-carry``'s on the same rows), and no
      predictions are gathered (``compute_metrics`` gets none). Multi-process (DDP) training calls the
      wrapped model once per chunk before one backward pass; ``ddp_broadcast_buffers`` is then False unless
      set (the processes' documents have other numbers of chunks, and the broadcast of every call would not pair
      up); the processes end with the same weights (tested with two).
    * ``compile_output_layer=True``: the output layer and its loss run as one ``torch.compile``'d function
      (``model.compile_output_layer()``; eager, with a warning, where no compiler works). With
      ``TrainingArguments(bf16=True)`` (autocast, on a CPU as on a GPU) this is the package's fast path
      (:mod:`topic_lm_hf.fast_path`).
    * ``cuda_graphs=True`` (one CUDA GPU, float32): each training step's forward and backward replayed from a CUDA
      graph captured once per batch shape (:mod:`topic_lm_hf.cuda_graphs`); only ``loss`` is logged. Refused in
      one line on a CPU, for the families whose step reads values on the host, with ``carry_state``,
      ``pretraining_phases``, gradient accumulation, bf16 / fp16 or several GPUs.
    """

    def __init__(self, *args, pretraining_phases=None, carry_state: bool = False, bptt_chunks: int | None = None,
                 compile_output_layer: bool = False, cuda_graphs: bool = False, **kwargs):
        args_ = kwargs.get("args") if "args" in kwargs else (args[1] if len(args) > 1 else None)
        if args_ is not None:
            if args_.remove_unused_columns:
                args_.remove_unused_columns = False
            if args_.label_names is None:
                args_.label_names = ["labels"]
            if args_.dataloader_pin_memory and args_.device.type == "cpu":
                # Pinned memory only speeds up copies to an accelerator; on CPU, PyTorch warns at every epoch.
                args_.dataloader_pin_memory = False
            if carry_state and args_.ddp_broadcast_buffers is None:
                # DDP broadcasts the buffers at every call of the wrapped model: the processes call it once per chunk
                # of documents of other lengths, so the broadcasts never paired up and training hung.
                args_.ddp_broadcast_buffers = False
        super().__init__(*args, **kwargs)
        # The Trainer counts each optimizer step's predicted tokens (num_items_in_batch) and compute_loss weights
        # every micro-batch by its share of them: gradient accumulation then equals the big batch.
        self.model_accepts_loss_kwargs = True
        self.pretraining_phases = self._check_phases(pretraining_phases)
        self._loss_terms: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._eval_sums: dict[str, torch.Tensor] | None = None  # while evaluating: token-weighted sums
        topic_model = unwrap_model(self.model)
        if isinstance(topic_model, TopicFamilyForCausalLM) and isinstance(self.train_dataset, Sized):
            # Models whose sampler scales minibatch statistics to the corpus (rGBN-RNN's TLASGR-MCMC).
            topic_model.set_training_corpus_size(len(self.train_dataset))
        self.carry_state, self.bptt_chunks = self._check_carry_state(carry_state, bptt_chunks)
        if compile_output_layer:
            if not isinstance(unwrap_model(self.model), RecurrentPreTrainedModel):
                raise ValueError(f"compile_output_layer=True: {type(unwrap_model(self.model)).__name__} has no language "
                                 "model output layer to compile")
            unwrap_model(self.model).compile_output_layer(True)
        self.cuda_graphs, self._graphed_step = self._check_cuda_graphs(cuda_graphs), None
        collator = self.data_collator
        if isinstance(collator, TopicContextCollator) and getattr(self.model.config, "vocab_size", None) is not None:
            # The config (saved in every checkpoint) records which vocabularies the model is trained on.
            record_vocabularies(self.model.config, collator.tokenizer, collator.topic_tokenizer)

    def _check_phases(self, phases) -> list[tuple[str, int]]:
        phases = [tuple(p) for p in (phases or [])]
        if not phases:
            return []
        model = unwrap_model(self.model)
        supported = model.training_phases if isinstance(model, TopicFamilyForCausalLM) else ()
        if not supported:
            raise ValueError(f"{type(self.model).__name__} has no training phases (training_phases / "
                             "set_training_phase): pretraining_phases cannot be used with it")
        for phase in phases:
            if len(phase) != 2 or phase[0] not in supported or phase[0] == "joint" or isinstance(phase[1], bool) \
                    or not isinstance(phase[1], int) or phase[1] < 0:
                raise ValueError(f"pretraining_phases must be (phase, steps) pairs with phase in "
                                 f"{[p for p in supported if p != 'joint']} and steps >= 0, got {phase!r}")
        return phases

    def _check_cuda_graphs(self, cuda_graphs: bool) -> bool:
        if not cuda_graphs:
            return False
        args = self.args
        if args.device.type != "cuda":
            raise ValueError("cuda_graphs=True replays captured CUDA graphs: it needs a CUDA GPU (this run trains on "
                             f"the {args.device.type.upper()})")
        reason = why_not_capturable(unwrap_model(self.model))
        for refused, why in ((self.carry_state, "carry_state=True reads documents of changing lengths"),
                             (self.pretraining_phases, "pretraining_phases change the step between phases"),
                             (args.gradient_accumulation_steps > 1, "gradient accumulation: a replay overwrites the "
                              "gradients of the micro-batch before"),
                             (args.bf16 or args.fp16, "the captured step runs in float32: drop bf16 / fp16"),
                             (args.world_size > 1 or args.n_gpu > 1, "one GPU only"), (reason, reason)):
            if refused:
                raise ValueError(f"cuda_graphs=True: {why}")
        return True

    def _check_carry_state(self, carry_state, bptt_chunks) -> tuple[bool, int | None]:
        check_bptt_chunks(bptt_chunks)
        if not carry_state:
            if bptt_chunks is not None:
                raise ValueError("bptt_chunks is an option of carry_state=True")
            return False, None
        check_carry_state_model(self.model)
        collator = self.data_collator
        if isinstance(collator, TopicContextCollator):
            if collator.layout != "documents":
                raise ValueError(f"carry_state=True needs documents batches: build the collator with "
                                 f"layout='documents' (got layout={collator.layout!r})")
            if collator.context not in ("preceding", "none"):
                raise ValueError(f"carry_state=True trains for the causal-carry protocol: use context='preceding' "
                                 f"(or 'none'), got context={collator.context!r}")
        if self.label_smoother is not None or self.compute_loss_func is not None:
            raise ValueError("carry_state=True computes the loss with the model's own loss terms: label smoothing "
                             "and compute_loss_func are not supported with it")
        return True, bptt_chunks

    def _check_training_set_up(self) -> None:
        """Refuse a collator that would leave part of the model untrained: a model that reads the document's bag
        of words given none, or rGBN-RNN (which reads a document's sentences in order) given sentences as separate
        rows."""
        collator, model = self.data_collator, unwrap_model(self.model)
        if not isinstance(collator, TopicContextCollator):
            return
        name = type(model).__name__
        if not isinstance(model, RecurrentPreTrainedModel):
            return
        if collator.context == "none" and "context_bow" in model.conditioning_inputs:
            raise ValueError(f"{name} reads the document's bag of words, but the collator gives none (context='none'): "
                             f"its topic part would get no training signal. Use TopicContextCollator.for_model(model, "
                             f"...) or context={model.training_context!r}")
        if model.reads_documents and collator.layout != "documents":
            raise ValueError(f"{name} reads whole documents, but the collator gives layout={collator.layout!r}: it "
                             f"would read every sentence as a one-sentence document. Use "
                             f"TopicContextCollator.for_model(model, ...) or layout='documents'")

    def _check_resume(self, resume_from_checkpoint) -> None:
        """Refuse to resume from a checkpoint of a differently configured model, naming the fields."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
        if not isinstance(resume_from_checkpoint, (str, os.PathLike)):
            return
        config = getattr(unwrap_model(self.model), "config", None)
        differences = config_differences(str(resume_from_checkpoint), config) if config is not None else []
        if differences:
            raise ValueError(f"Cannot resume from {resume_from_checkpoint}: it was trained with another configuration "
                             f"({'; '.join(differences[:3])}{'; ...' if len(differences) > 3 else ''}). Give this "
                             f"run another output_dir, or the checkpoint's settings to resume it")

    # set while the command that runs this trainer holds the output_dir lock itself (topic-lm train holds it
    # through pre-training, training and saving)
    output_dir_locked = False

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        self._check_training_set_up()
        self._check_resume(resume_from_checkpoint)
        lock = OutputDirLock(self.args.output_dir)
        if self.args.process_index == 0 and not self.output_dir_locked:  # one run's processes share its folder
            lock.acquire()
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            lock.release()
            if self.pretraining_phases:  # a run that stopped within a phase leaves the model whole
                unwrap_model(self.model).set_training_phase("joint")
            # With bf16 (fp16) accelerate leaves model.forward wrapped in autocast: the trained model would then
            # evaluate in bf16 while the saved weights load and evaluate in float32.
            remove_mixed_precision_wrapper(self.model)

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
            unwrap_model(model).set_training_phase(phase)
        carried = self.carry_state and (model.training or "chunk_mask" in inputs)
        if carried:
            collect = self._add_eval_terms if not model.training and self._eval_sums is not None else None
            # the model and bptt_chunks were checked once, in __init__ (_check_carry_state)
            outputs = carried_state_loss(model, inputs, self.bptt_chunks, chunk_callback=collect, check_model=False)
            loss = outputs.loss
        else:
            unwrapped = unwrap_model(model)
            reads_documents = isinstance(unwrapped, RecurrentPreTrainedModel) and unwrapped.reads_documents
            if inputs.get("chunk_mask") is not None and not reads_documents:
                raise ValueError("A documents batch (chunk_mask) for a model that reads one sentence chunk at a time: "
                                 "train it with TopicLMTrainer(..., carry_state=True), or use layout='sentences'")
            loss = None
            if self.cuda_graphs and model.training:  # None: a batch the captured step does not take, run eagerly
                if self._graphed_step is None:
                    self._graphed_step = GraphedTrainingStep(unwrapped)
                loss = self._graphed_step.loss(inputs)
                outputs = TopicLMOutput(loss=loss)
            if loss is None:
                loss, outputs = super().compute_loss(model, inputs, return_outputs=True)
        if model.training and num_items_in_batch is not None:
            loss = self._share_of_the_batch(loss, labels, num_items_in_batch)
        if model.training:
            if not bool(torch.isfinite(loss.detach()).all()):
                self._stop_on_nonfinite(NonFiniteLossError, f"Training loss is {loss.item()}")
            for key in LOSS_TERMS:
                value = model_output(outputs, key)
                if value is not None:
                    self._loss_terms[key].append(value.detach().float().mean())
        elif self._eval_sums is not None and not carried:  # carried: summed chunk by chunk
            self._add_eval_terms(labels, outputs)
        return (loss, outputs) if return_outputs else loss

    def _share_of_the_batch(self, loss, labels, num_items_in_batch):
        """The micro-batch's token-mean ``loss`` weighted by its share of the optimizer step's predicted tokens
        (``num_items_in_batch``, counted by the Trainer over every micro-batch of the step, and over every process
        with ``average_tokens_across_devices``): summed over the micro-batches of gradient accumulation, the
        gradient is that of the whole step's token mean, as one big batch would give."""
        counted = labels[..., 1:] if self._loss_shifts_labels else labels
        tokens = counted.ne(-100).sum().to(loss.device, loss.dtype)
        share = tokens / torch.as_tensor(num_items_in_batch, device=loss.device, dtype=loss.dtype).clamp_min(1)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            share = share * self.args.world_size  # DDP averages the processes' gradients
        return loss * share

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        if not (self.carry_state and "chunk_mask" in inputs):
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        # A documents batch: the loss (and the evaluation sums, chunk by chunk); no predictions to gather.
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach().mean(), None, None

    # -- evaluation -------------------------------------------------------------------------------

    def _add_eval_terms(self, labels, outputs):
        logits = model_output(outputs, "logits")
        if labels is None or logits is None or model_output(outputs, "lm_loss") is None:
            return  # not a language model's output (a classifier trained with this Trainer)
        targets = labels[..., 1:].to(logits.device)  # logits at position i predict labels at i + 1
        tokens = (targets != -100).sum()
        sums = self._eval_sums
        nll = torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]).float(),
                                                targets.reshape(-1), ignore_index=-100, reduction="sum")
        sums["tokens"] = sums.get("tokens", 0) + tokens
        sums["nll"] = sums.get("nll", 0) + nll.detach()
        for key in LOSS_TERMS:
            value = model_output(outputs, key)
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
            # A model that reads the words it predicts (leaky_modes(), e.g. NCLM's sdt_mode="minus_target") gets
            # its perplexity labelled as such: it is not a language-model perplexity.
            leaky = bool(leaky_modes_of(unwrap_model(self.model)))
            output.metrics[f"{prefix}_perplexity{'_leaky' if leaky else ''}"] = math.exp(totals.pop("nll") / tokens)
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
        if isinstance(self.model, RecurrentPreTrainedModel):
            source = getattr(self, "_checkpoint_being_loaded", None) or "the checkpoint"
            self.model.check_missing_weights(load_result.missing_keys, source, load_result.unexpected_keys)
        super()._issue_warnings_after_load(load_result)

    def log(self, logs, start_time=None):
        if "loss" in logs and self._loss_terms:
            for key, values in self._loss_terms.items():
                value = torch.stack(values).mean().to(self.args.device).unsqueeze(0)
                logs[key] = round(self.accelerator.gather_for_metrics(value).mean().item(), 4)
            self._loss_terms.clear()
        super().log(logs, start_time)
