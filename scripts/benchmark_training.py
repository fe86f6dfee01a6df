"""Training for the benchmark scripts (``scripts/benchmark_*.py``), the same way in every benchmark: the
predicted tokens of every batch counted (``CountingCollator``, ``BatchTokens``), every model reading the same
batches in the same order (``batch_order``, ``BenchmarkTrainer``) with one linear schedule per phase, every step
timed (``StepTimer``, ``step_throughput``: tokens/s robust to a paused process), NCLM's topic-model phase
(``pretrain_topic_model_phase``), the steering recipe's topic-model pre-training
(``pretrain_topic_model_once``), a plain run (``train_for_steps``), a resumable run (``train_resumable``), and
a resumable run to convergence: early stopping on a development split (``DevEarlyStopping``,
``train_to_convergence``). The rest of what the scripts share (command line,
result folders, models, measurements) is in ``scripts/benchmarking.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from topic_lm_hf import (NCLMForCausalLM, TopicContextCollator, TopicLMTrainer, evaluate_perplexity,
                         pretrain_topic_model, record_vocabularies, save_vocabularies)
from topic_lm_hf.devices import synchronize
from topic_lm_hf.fast_path import fast_training_arguments, resolve_compile
from topic_lm_hf.checkpoints import last_complete_checkpoint
from topic_lm_hf.trainer import float32_forward

from benchmarking import read_json, read_jsonl, write_json


# ----------------------------------------------------------------------------------------------
# batches: counted, in one fixed order for every model, one linear schedule per phase
# ----------------------------------------------------------------------------------------------


class CountingCollator:
    """Wraps a collator and counts the predicted tokens of every training batch it builds (sentence batches (b, l)
    and documents batches (b, c, l) alike: the first position of every chunk is never predicted)."""

    def __init__(self, collator):
        self.collator = collator
        self.tokens = 0

    def __call__(self, features):
        batch = self.collator(features)
        self.tokens += int((batch["labels"][..., 1:] != -100).sum())
        return batch


class BatchTokens(CountingCollator):
    """``CountingCollator`` that also keeps each batch's predicted tokens, in the order they were built (the data
    loader builds a batch ahead of the step that uses it, so the running total is one batch early)."""

    def __init__(self, collator):
        super().__init__(collator)
        self.per_batch = []

    def __call__(self, features):
        before = self.tokens
        batch = super().__call__(features)
        self.per_batch.append(self.tokens - before)
        return batch


def batch_order(n_rows: int, steps: int, batch_size: int, seed: int) -> list[int]:
    """Row indices of ``steps`` batches: seeded permutations of the rows (one per epoch), concatenated."""
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < steps * batch_size:
        order.extend(torch.randperm(n_rows, generator=generator).tolist())
    return order[:steps * batch_size]


def warmup_for(steps: int) -> int:
    """The benchmarks' warm-up: 2 % of a run's ``steps``, at least one step."""
    return max(1, steps // 50)


def linear_schedule(step: int, total: int) -> float:
    """transformers' linear schedule (warm-up over ``warmup_for(total)`` steps, as ``train_for_steps``) at ``step``."""
    warmup = warmup_for(total)
    if step < warmup:
        return step / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


class FixedOrderSampler(torch.utils.data.Sampler):
    def __init__(self, indices):
        self.indices = list(indices)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


def plateau_factor(history: list[dict], decay: float, patience: int = 1) -> float:
    """The plateau schedule's learning-rate factor after the development evaluations ``history``: ``decay`` to the
    power of the times ``patience`` evaluations in a row did not improve on the best perplexity before them (the
    count restarts at each new best and at each decay; ``patience=1``: at every evaluation without improvement). It
    is a function of the evaluations alone, so a resumed run (whose ``history`` is read back from ``dev.jsonl``)
    continues with it."""
    if patience < 1:
        raise ValueError(f"the plateau schedule's patience must be at least 1, got {patience}")
    best, misses, decays = math.inf, 0, 0
    for record in history:
        if record["perplexity"] < best:
            best, misses = record["perplexity"], 0
        else:
            misses += 1
            if misses == patience:
                decays, misses = decays + 1, 0
    return decay ** decays


class BenchmarkTrainer(TopicLMTrainer):
    """``TopicLMTrainer`` with a fixed batch order and one schedule per phase: linear (warm-up over 2 %, then decay
    to 0 at the phase's last step), or for the joint phase with ``plateau=(history, decay)`` the same warm-up, then
    constant, times ``plateau_factor(history, decay)`` (``history``: the development evaluations, appended to as
    the run goes; ``plateau=(history, decay, patience)``: decayed after ``patience`` evaluations in a row without
    improvement; ``warmup_steps``: the plateau schedule's warm-up in steps, in place of 2 %). ``lm_lr_scale``: the
    language-model weights (``language_model_parameters``: those a warm start took from an LSTM LM) learn at this
    fraction of the rate, the topic path at the full rate."""

    def __init__(self, *args, order=None, topic_model_steps: int = 0, plateau: tuple | None = None,
                 lm_lr_scale: float = 1.0, warmup_steps: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._order = order
        self._topic_model_steps = topic_model_steps
        self._plateau = plateau
        self._lm_lr_scale = lm_lr_scale
        self._warmup_steps = warmup_steps

    def create_optimizer(self, model=None):
        created = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if created and self._lm_lr_scale != 1.0:  # each group split in two: its LM weights at the scaled rate
            lm = {id(p) for p in (self.model if model is None else model).language_model_parameters()}
            if not lm:
                raise ValueError(f"{type(self.model).__name__} has no language-model weights to scale the rate of")
            for group in list(optimizer.param_groups):
                slow = [p for p in group["params"] if id(p) in lm]
                group["params"] = [p for p in group["params"] if id(p) not in lm]
                if slow:
                    optimizer.add_param_group({**{k: v for k, v in group.items() if k != "params"},
                                               "params": slow, "lr": group["lr"] * self._lm_lr_scale})
        return optimizer

    def _get_train_sampler(self, train_dataset=None):
        return FixedOrderSampler(self._order)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None:
            pre, joint = self._topic_model_steps, num_training_steps - self._topic_model_steps

            def factor(step):
                if step < pre:
                    return linear_schedule(step, pre)
                if self._plateau is None:
                    return linear_schedule(step - pre, joint)
                warmup = self._warmup_steps or warmup_for(joint)
                return min(1.0, (step - pre) / warmup) * plateau_factor(*self._plateau)

            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
            self._created_lr_scheduler = True
        return self.lr_scheduler


# ----------------------------------------------------------------------------------------------
# per-step timing
# ----------------------------------------------------------------------------------------------


def step_throughput(records: list[dict], stall_factor: float = 20.0) -> dict:
    """Training tokens/s from ``StepTimer`` records, robust to stalls: a step that took more than ``stall_factor``
    times the median step (the process was stopped or the machine suspended while it ran) is left out of both the
    tokens and the seconds, and counted in ``stalled_steps``. With no stall this is sum(tokens) / sum(seconds)."""
    if not records:
        return {"tokens": 0, "seconds": 0.0, "steps": 0, "stalled_steps": 0, "stalled_seconds": 0.0,
                "tokens_per_s": float("nan")}
    median = statistics.median(r["seconds"] for r in records)
    kept = [r for r in records if r["seconds"] <= stall_factor * median]
    stalled = [r for r in records if r["seconds"] > stall_factor * median]
    tokens, seconds = sum(r["tokens"] for r in kept), sum(r["seconds"] for r in kept)
    return {"tokens": tokens, "seconds": seconds, "steps": len(kept), "stalled_steps": len(stalled),
            "stalled_seconds": sum(r["seconds"] for r in stalled), "tokens_per_s": tokens / max(seconds, 1e-9)}


class StepTimer(TrainerCallback):
    """Per optimizer step: wall time (batch fetch and collation, forward, backward, optimizer; not logging or
    checkpointing) and predicted tokens, appended to ``steps.jsonl``; a progress line at every log."""

    def __init__(self, name, counting, path: Path, phase_of, total_steps: int):
        self.name, self.counting, self.path, self.phase_of, self.total = name, counting, path, phase_of, total_steps
        self.mark, self.steps_this_session, self.recent = None, 0, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.mark = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        synchronize(args.device)  # on a GPU: the step's kernels done, not only queued
        seconds = time.perf_counter() - self.mark
        tokens = self.counting.per_batch[self.steps_this_session]  # the batch of this step (one per step)
        self.steps_this_session += 1
        record = {"step": state.global_step, "phase": self.phase_of(state.global_step - 1), "seconds": seconds,
                  "tokens": tokens}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        self.recent.append(seconds)
        self.mark = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.mark = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            step = state.global_step
            per_step = sum(self.recent) / max(1, len(self.recent))
            terms = " ".join(f"{k}={logs[k]:.4g}" for k in ("loss", "lm_loss", "bow_loss", "kl_loss") if k in logs)
            print(f"   [{self.name}] step {step}/{self.total} ({self.phase_of(step - 1)}) {terms} | "
                  f"{per_step:.3f} s/step, about {per_step * (self.total - step) / 60:.1f} min left in this training",
                  flush=True)
            self.recent = []
        self.mark = time.perf_counter()


# ----------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------


def fast_path(targs: TrainingArguments, args) -> tuple[TrainingArguments, bool]:
    """(training arguments, compile the output layer?) of a run: bf16 autocast where the device runs it natively
    (``args.precision``, default "auto") and the compiled output layer (``args.compile_output_layer``, default: on
    a CPU, off on a GPU); prints the one sentence that says which (``fast_training_arguments``)."""
    compile_output_layer = resolve_compile(targs, getattr(args, "compile_output_layer", None))
    targs = fast_training_arguments(targs, getattr(args, "precision", "auto"), compile_output_layer,
                                    say=lambda sentence: print(f"   {sentence}", flush=True))
    return targs, compile_output_layer


def train_for_steps(model, rows, collator, args, out_dir: Path) -> dict:
    """``args.steps`` steps of ``TopicLMTrainer`` (Adam ``args.lr``, linear warm-up over 2 % then decay to 0, clip
    ``args.clip``, batches of ``args.batch_size`` rows in the trainer's seeded order); no checkpoint."""
    counting = CountingCollator(collator)
    targs = TrainingArguments(output_dir=str(out_dir), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                              learning_rate=args.lr, max_grad_norm=args.clip, lr_scheduler_type="linear",
                              warmup_steps=warmup_for(args.steps), logging_steps=max(1, args.steps // 10),
                              save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                              seed=args.seed, dataloader_num_workers=0)
    targs, compile_output_layer = fast_path(targs, args)
    trainer = TopicLMTrainer(model=model, args=targs, train_dataset=rows, data_collator=counting,
                             compile_output_layer=compile_output_layer)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    for entry in logs:
        print("   ", {k: entry[k] for k in ("step", "loss", "lm_loss", "bow_loss", "kl_loss", "aux_loss") if k in entry},
              flush=True)
    model.eval()
    return {"seconds": seconds, "tokens": counting.tokens, "tokens_per_s": counting.tokens / seconds,
            "final_log": logs[-1] if logs else {}}


def document_rows(train_docs, tok, topic_tok):
    """The training chunks with their document's bag of words as ``context_bow`` (its first 300 topic words, the
    cap of every context in this package), for the topic-model phase: a document weighs as many rows as it has
    chunks, as the official code replicates a document's topic-model row once per window."""
    collator = TopicContextCollator(tok, topic_tok, context="document")
    return collator.prepare(train_docs), collator


def pretrain_topic_model_phase(name: str, model, train_docs, args, mdir: Path, tok, topic_tok) -> dict:
    """The NCLM paper's NVDM pre-training on full documents: a ``TopicLMTrainer`` run of ``args.topic_model_steps``
    steps in the ``topic_model`` phase only (the LM is not run), with its own Adam at ``args.topic_model_lr``;
    the joint run then starts a fresh Adam (as the official code does). Saved, so a rerun skips it."""
    done_path, saved = mdir / "topic_model_phase.json", mdir / "after_topic_model"
    if done_path.exists():
        loaded = NCLMForCausalLM.from_pretrained(saved)
        model.model.topic_model.load_state_dict(loaded.model.topic_model.state_dict())
        print(f"   topic-model phase done earlier ({done_path})", flush=True)
        return read_json(done_path)
    rows, collator = document_rows(train_docs, tok, topic_tok)
    targs = TrainingArguments(output_dir=str(mdir / "topic_model_checkpoints"), max_steps=args.topic_model_steps,
                              per_device_train_batch_size=args.batch_size, learning_rate=args.topic_model_lr,
                              lr_scheduler_type="constant", max_grad_norm=0.0,  # no clipping, as the official code
                              logging_steps=max(1, args.topic_model_steps // 5),
                              save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                              seed=args.seed, dataloader_num_workers=0)
    trainer = TopicLMTrainer(model=model, args=targs, train_dataset=rows, data_collator=collator,
                             pretraining_phases=[("topic_model", args.topic_model_steps)])
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logs = [e for e in trainer.state.log_history if "loss" in e]
    for e in logs:
        print(f"   [{name}] topic-model step {e['step']}/{args.topic_model_steps}: loss per word {e['loss']:.3f}",
              flush=True)
    trainer.save_model(str(saved))
    stats = {"topic_model_steps": args.topic_model_steps, "topic_model_lr": args.topic_model_lr,
             "topic_model_rows": len(rows), "topic_model_seconds": seconds,
             "topic_model_first_loss": logs[0]["loss"] if logs else None,
             "topic_model_final_loss": logs[-1]["loss"] if logs else None}
    write_json(done_path, stats)
    return stats


def pretrain_topic_model_once(model, rows, collator, dev_rows, mdir: Path, settings: dict, seed: int = 0,
                              measure=None):
    """The steering recipe's topic-model pre-training (``pretrain_topic_model`` with ``settings``: ``steps``,
    ``learning_rate``, ``batch_size``, ``eval_every``, ``patience``; early-stopped on ``dev_rows``), done once per
    model folder: the pre-trained model is saved to ``<mdir>/after_pretraining`` with ``<mdir>/pretraining.json``,
    and a rerun loads them instead. ``measure(model)`` adds to the record (e.g. the topics' NPMI). Returns (the
    model, the record: steps, best step, what stopped it, the development objective at every evaluation,
    seconds)."""
    record_path, saved = mdir / "pretraining.json", mdir / "after_pretraining"
    if record_path.exists():
        print("   topic model pre-trained earlier", flush=True)
        return type(model).from_pretrained(saved), read_json(record_path)
    start = time.perf_counter()
    settings = dict(settings)
    result = pretrain_topic_model(model, rows, collator, settings.pop("steps"), seed=seed, eval_dataset=dev_rows,
                                  **settings)
    record = {"steps": result.steps, "best_step": result.best_step, "stopped_by": result.stopped_by,
              "dev_losses": result.dev_losses, "seconds": time.perf_counter() - start,
              "batch_size": settings.get("batch_size"), "learning_rate": settings.get("learning_rate")}
    if measure is not None:
        record.update(measure(model))
    model.save_pretrained(saved)
    write_json(record_path, record)
    print(f"   topic model pre-trained: {result.steps} steps ({result.stopped_by}), best dev objective "
          f"{result.best_dev_loss:.3f} at step {result.best_step}, {record['seconds']:.0f} s", flush=True)
    return model, record


def keep_records_up_to(step: int, *paths: Path) -> None:
    """Drop the records (JSON lines with a ``step``) after ``step`` from each file, creating it empty if absent: a
    run resumed from the checkpoint of ``step`` redoes what came after it."""
    for path in paths:
        kept = [line for line in (path.read_text().splitlines() if path.exists() else [])
                if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in kept))


def train_resumable(name: str, model, rows, collator, args, mdir: Path, tok, topic_tok, spec: dict, code: str,
                    train_docs=None) -> dict:
    """Train one model for ``args.steps`` steps on the batches of ``batch_order`` (resuming from its last complete
    checkpoint, one every ``args.save_steps``), save it to ``mdir/model``, return its training statistics.

    ``spec`` gives ``family`` (``"lstm"``: no topic vocabulary; ``"nclm"``: the topic-model phase first, on
    ``train_docs``) and ``context`` (recorded); ``code`` (``code_version()``) is recorded too."""
    nclm = spec["family"] == "nclm"
    topics = spec["family"] != "lstm"
    topic_phase = pretrain_topic_model_phase(name, model, train_docs, args, mdir, tok, topic_tok) \
        if nclm and args.topic_model_steps else {}
    pre = 0  # the topic-model phase ran above, on its own data; the joint run is the LSTM's run
    total = pre + args.steps
    ckpt_dir, steps_path = mdir / "checkpoints", mdir / "steps.jsonl"
    resume = last_complete_checkpoint(ckpt_dir)
    done = int(resume.rsplit("-", 1)[1]) if resume else 0
    keep_records_up_to(done, steps_path)
    if resume:
        print(f"   resuming from {resume} (step {done} of {total})", flush=True)

    order = (batch_order(len(rows), pre, args.batch_size, args.seed + 1) if pre else []) + \
        batch_order(len(rows), args.steps, args.batch_size, args.seed)
    counting = BatchTokens(collator)
    targs = TrainingArguments(output_dir=str(ckpt_dir), max_steps=total, per_device_train_batch_size=args.batch_size,
                              learning_rate=args.lr, max_grad_norm=args.clip, logging_steps=max(1, total // 20),
                              save_strategy="steps", save_steps=args.save_steps, save_total_limit=2,
                              eval_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=args.seed,
                              dataloader_num_workers=0)
    targs, compile_output_layer = fast_path(targs, args)
    record_vocabularies(model.config, tok, topic_tok if topics else None)  # the counting wrapper hides the collator
    trainer = BenchmarkTrainer(model=model, args=targs, train_dataset=rows, data_collator=counting,
                               pretraining_phases=[("topic_model", pre)] if pre else None, order=order,
                               topic_model_steps=pre, compile_output_layer=compile_output_layer)
    phase_of = trainer.training_phase if pre else (lambda step: "joint")
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StepTimer(name, counting, steps_path, phase_of, total))
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds_this_session = time.perf_counter() - start
    model.eval()
    trainer.save_model(str(mdir / "model"))
    save_vocabularies(tok, topic_tok if topics else None, mdir / "model")

    records = read_jsonl(steps_path)
    joint = [r for r in records if r["phase"] == "joint"]
    topic = [r for r in records if r["phase"] != "joint"]
    logs = [e for e in trainer.state.log_history if "loss" in e]
    first_joint = next((e for e in logs if e["step"] > pre), {})
    stats = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "joint_steps": args.steps, "batch_size": args.batch_size,
        "joint_seconds": sum(r["seconds"] for r in joint), "joint_tokens": sum(r["tokens"] for r in joint),
        "topic_model_seconds": sum(r["seconds"] for r in topic) + topic_phase.get("topic_model_seconds", 0.0),
        **{k: v for k, v in topic_phase.items() if k != "topic_model_seconds"},
        "steps_timed": len(records), "resumed_from_step": done, "seconds_last_session": seconds_this_session,
        "first_log": logs[0] if logs else {}, "first_joint_log": first_joint, "final_log": logs[-1] if logs else {},
        "training_context": spec["context"], "code": code,
    }
    joint_speed = step_throughput(joint)
    stats["tokens_per_s"], stats["stalled_steps"] = joint_speed["tokens_per_s"], joint_speed["stalled_steps"]
    if len(records) != total:
        print(f"   note: {len(records)} of {total} steps were timed (steps.jsonl)", flush=True)
    return stats


# ----------------------------------------------------------------------------------------------
# early stopping on a development split
# ----------------------------------------------------------------------------------------------


def best_dirs(mdir: Path) -> dict[int, Path]:
    return {int(p.name.rsplit("-", 1)[1]): p for p in mdir.glob("best-*") if p.is_dir()}


def stopped(history: list[dict], patience: int) -> bool:
    """Whether ``patience`` evaluations in a row came after the best one."""
    if not history:
        return False
    best = min(range(len(history)), key=lambda i: history[i]["perplexity"])
    return len(history) - 1 - best >= patience


class DevEarlyStopping(TrainerCallback):
    """Every ``every`` steps and at the last step: the dev perplexity (``evaluate_perplexity``, ``protocol``); a new
    best is saved to ``<mdir>/best-<step>``; training stops after ``patience`` evaluations without improvement.
    A checkpoint is written at every evaluation, and older best folders are removed only once a checkpoint after
    the newer one exists, so an interrupted run resumes with a best folder that matches ``dev.jsonl``."""

    def __init__(self, name, dev_docs, protocol, tok, topic_tok, every, patience, mdir: Path, history: list[dict],
                 empty_context: bool = False):
        self.name, self.dev_docs, self.protocol, self.tok, self.topic_tok = name, dev_docs, protocol, tok, topic_tok
        self.every, self.patience, self.mdir, self.history = every, patience, mdir, history
        self.empty_context = empty_context  # a matched topic-free row: evaluated as it is trained

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.every and step < state.max_steps:
            return
        rng = torch.get_rng_state()  # evaluation must not change the training's random stream
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        start = time.perf_counter()
        model.eval()
        with torch.no_grad(), float32_forward(model):  # as the saved weights will be evaluated
            r = evaluate_perplexity(model, self.dev_docs, self.protocol, tokenizer=self.tok,
                                    topic_tokenizer=self.topic_tok, empty_context=self.empty_context)
        model.train()
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        best = min((h["perplexity"] for h in self.history), default=math.inf)
        record = {"step": step, "perplexity": r["perplexity"], "tokens": r["tokens"], "protocol": self.protocol,
                  "seconds": time.perf_counter() - start}
        self.history.append(record)
        with open(self.mdir / "dev.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if r["perplexity"] < best:
            model.save_pretrained(self.mdir / f"best-{step}")
        print(f"   [{self.name}] step {step}: dev perplexity ({self.protocol}) {r['perplexity']:.2f}"
              + (" (best)" if r["perplexity"] < best else f" (best {best:.2f})")
              + f", {record['seconds']:.0f} s", flush=True)
        if stopped(self.history, self.patience):
            print(f"   [{self.name}] early stop: {self.patience} evaluations without improvement", flush=True)
            control.should_training_stop = True
        control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        kept = [s for s in best_dirs(self.mdir) if s <= state.global_step]
        for s, path in best_dirs(self.mdir).items():
            if kept and s < max(kept):
                shutil.rmtree(path, ignore_errors=True)


def train_to_convergence(name: str, model, rows, collator, args, mdir: Path, tok, topic_tok, dev_docs,
                         dev_protocol: str = "causal", carry_state: bool = False, code: str = "?",
                         empty_context: bool = False) -> dict:
    """Train one model until its development perplexity stops improving, resumably; keep its best weights.

    At most ``args.max_steps`` steps of ``args.batch_size`` rows in the seeded order of ``batch_order`` (Adam
    ``args.lr``, linear warm-up over 2 % (``args.warmup_steps`` where set), then ``args.schedule``: "plateau"
    constant, times ``args.lr_decay`` at every evaluation without improvement (at every ``args.lr_patience``-th in a
    row where it is set), or "linear" (the default of a script without the flag) decay to 0 at ``args.max_steps``;
    clip ``args.clip``); every ``args.eval_steps`` steps the perplexity of ``dev_docs`` under ``dev_protocol``
    (``DevEarlyStopping``) and a checkpoint; the run stops after ``args.patience`` evaluations without improvement.
    An interrupted run resumes from its last complete checkpoint (``<mdir>/checkpoints``) with its early-stopping
    state (``<mdir>/dev.jsonl``); a finished one is not trained again, unless it stopped at its cap under the plateau
    schedule and ``args.max_steps`` is larger: it trains on from its last checkpoint, kept for that. The best weights
    and the vocabularies (``tok``, and ``topic_tok`` unless it is None) end in ``<mdir>/model``. Returns the training
    statistics, ``stopped_by`` saying what ended the run (``"patience"`` or ``"max_steps"``). ``empty_context``: the
    dev perplexity with every context empty (a matched topic-free row, whose ``rows`` hold empty contexts too)."""
    ckpt_dir, steps_path, dev_path = mdir / "checkpoints", mdir / "steps.jsonl", mdir / "dev.jsonl"
    finished = mdir / "trained.json"  # written once the best weights are final: the run is over
    if finished.exists():
        stats = read_json(finished)
        if not cap_raised(stats, args, ckpt_dir):
            return _finish(mdir, stats)
        # stopped by a smaller cap: its best weights go back among the candidates, and it trains on
        print(f"   stopped by its cap of {stats['max_steps']} steps earlier: continuing to at most {args.max_steps}",
              flush=True)
        if (mdir / "model").is_dir():
            os.replace(mdir / "model", mdir / f"best-{stats['best_step']}")
        finished.unlink()
    resume = last_complete_checkpoint(ckpt_dir)
    done = int(resume.rsplit("-", 1)[1]) if resume else 0
    keep_records_up_to(done, steps_path, dev_path)
    for step, path in best_dirs(mdir).items():
        if step > done:
            shutil.rmtree(path)
    history = [json.loads(line) for line in dev_path.read_text().splitlines() if line]
    start = time.perf_counter()
    device = getattr(args, "device", "cpu")
    schedule = getattr(args, "schedule", "linear")
    if stopped(history, args.patience) or done >= args.max_steps:
        print(f"   training finished earlier (step {done})", flush=True)
    else:
        if resume:
            print(f"   resuming from {resume} (step {done} of at most {args.max_steps})", flush=True)
        counting = BatchTokens(collator)
        targs = TrainingArguments(output_dir=str(ckpt_dir), max_steps=args.max_steps,
                                  per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
                                  max_grad_norm=args.clip, logging_steps=max(1, args.eval_steps // 4),
                                  save_strategy="steps", save_steps=args.eval_steps, save_total_limit=2,
                                  eval_strategy="no", report_to=[], use_cpu=device == "cpu",
                                  disable_tqdm=True, seed=args.seed, dataloader_num_workers=0)
        targs, compile_output_layer = fast_path(targs, args)
        record_vocabularies(model.config, tok, topic_tok)  # BatchTokens hides the collator
        plateau = (history, args.lr_decay, getattr(args, "lr_patience", 1)) if schedule == "plateau" else None
        trainer = BenchmarkTrainer(model=model, args=targs, train_dataset=rows, data_collator=counting,
                                   order=batch_order(len(rows), args.max_steps, args.batch_size, args.seed),
                                   carry_state=carry_state, compile_output_layer=compile_output_layer,
                                   plateau=plateau, lm_lr_scale=getattr(args, "lm_lr_scale", 1.0),
                                   warmup_steps=getattr(args, "warmup_steps", None))
        trainer.remove_callback(PrinterCallback)
        # StepTimer first: the dev evaluation runs after it has timed the step (and on_save restarts its clock)
        trainer.add_callback(StepTimer(name, counting, steps_path, lambda step: "joint", args.max_steps))
        trainer.add_callback(DevEarlyStopping(name, dev_docs, dev_protocol, tok, topic_tok, args.eval_steps,
                                              args.patience, mdir, history, empty_context))
        trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - start
    best_step = min(history, key=lambda h: h["perplexity"])["step"]
    save_vocabularies(tok, topic_tok, best_dirs(mdir)[best_step])
    records = read_jsonl(steps_path)
    speed = step_throughput(records)
    early = stopped(history, args.patience)
    stats = {"parameters": sum(p.numel() for p in model.parameters()), "batch_size": args.batch_size,
            "steps_trained": history[-1]["step"], "best_step": best_step,
            "best_dev_perplexity": min(h["perplexity"] for h in history), "dev_protocol": dev_protocol,
            "early_stopped": early, "stopped_by": "patience" if early else "max_steps", "max_steps": args.max_steps,
            "dev_history": history, "train_seconds": sum(r["seconds"] for r in records),
            "train_tokens": sum(r["tokens"] for r in records), "steps_timed": len(records),
            "stalled_steps": speed["stalled_steps"], "seconds_last_session": seconds, "carry_state": carry_state,
            "code": code, "tokens_per_s": speed["tokens_per_s"], "schedule": schedule}
    write_json(finished, stats)
    return _finish(mdir, stats)


def cap_raised(stats: dict, args, ckpt_dir: Path) -> bool:
    """Whether a finished run continues: it stopped at its step cap under the plateau schedule (the linear one decays
    to 0 at the cap), ``args.max_steps`` is larger, and its last checkpoint is there to train on from."""
    if stats.get("stopped_by") != "max_steps" or args.max_steps <= stats["max_steps"]:
        return False
    if stats.get("schedule") != "plateau" or getattr(args, "schedule", "linear") != "plateau":
        return False
    if last_complete_checkpoint(ckpt_dir) is None:
        print(f"   stopped by its cap of {stats['max_steps']} steps, and its checkpoints are gone: it cannot "
              f"continue (train it in another --out)", flush=True)
        return False
    return True


def _finish(mdir: Path, stats: dict) -> dict:
    """The last steps of a finished ``train_to_convergence`` run, each safe to redo after an interruption: the best
    weights become ``<mdir>/model``, the checkpoints go (those of a run stopped by its cap stay: a larger cap
    continues it)."""
    best = best_dirs(mdir).get(stats["best_step"])
    if best is not None:
        shutil.rmtree(mdir / "model", ignore_errors=True)
        os.replace(best, mdir / "model")
    if stats["stopped_by"] != "max_steps":
        shutil.rmtree(mdir / "checkpoints", ignore_errors=True)
    return stats
