"""NCLM (LTA, ETA, LETA, LETA+SDT) against the same-size LSTM on APNEWS: perplexity, topics, speed, steering.

NCLM is Chaudhary, Schütze & Gupta, ICML 2020 (``topic_lm_hf.NCLMForCausalLM``). Every model is
trained in this one run on ``apnews/train.txt`` and measured on ``apnews/valid.txt``, with the
pieces of ``scripts/benchmark_tcnlm.py`` (imported from it, not copied): the vocabularies of Lau et
al. 2017 (LM: words with frequency >= 10; topic: minus the MALLET stop list, the top 0.1 % and
non-alphabetic tokens), 30-token chunks, context bags of words capped at 300 topic tokens,
``TopicLMTrainer`` with the same optimiser (Adam, lr 2e-3, linear warm-up over 2 % of the steps
then linear decay to 0, gradient clip 0.5, dropout 0.4, batches of 64 chunks, seed 0), the
perplexity protocols ``paper`` / ``causal`` / ``causal-carry`` of ``evaluate_perplexity``, the
mismatched-context ablation, NPMI (``lau2014`` preset, Wikipedia reference) and diversity, and the
training-speed ratio to the LSTM (during training, and re-measured with the models' steps
interleaved on identical batches).

    python scripts/benchmark_nclm.py                                  # default: E=H=256, 50 topics, 1 layer, 1200 steps
    python scripts/benchmark_nclm.py --only lstm leta-sdt             # a subset (the others can be added later)
    python scripts/benchmark_nclm.py --steps 20 --topic-model-steps 5 --max-train-docs 60 --max-valid-docs 10 \\
        --npmi-max-documents 200 --steer-topics 2 --steer-samples 3 --out out/nclm-smoke   # a quick check

Models (``--only`` names):

* ``lstm``: the same-size LSTM LM (baseline, and the fluency judge of the steering evaluation);
* ``lta``, ``eta``, ``leta``: NCLM with the latent, the explainable, or both topic representations;
* ``leta-sdt``: LETA with sentence-level topics, ``sdt_mode="prefix"`` (causal: the sentence part reads
  the words of the sentence before the target only);
* ``lta-1topic``: LTA with a single topic, so h = [1] whatever the context: the composition
  sigmoid([o; c] W_p + b_p) and the joint training without any topic information (a diagnosis of how
  much of the difference to the LSTM is the architecture, as ``benchmark_steering.py``'s 1-topic TCNLM);
* ``leta-sdt-paper``: LETA+SDT with ``sdt_mode="minus_target"``, the paper's and its official code's
  sentence topics, which read the sentence's words *after* the target: LEAKY. ``evaluate_perplexity``
  refuses to call its perplexity causal, so it has a ``paper`` number only, labelled
  ``paper+sdt_mode=minus_target``; it replicates the published setting, it is not a language model
  perplexity.

Decisions (the same for every run of this script):

* Context. The causal NCLMs (``lta``, ``eta``, ``leta``, ``leta-sdt``) are trained with the causal
  context (``TopicContextCollator(context="preceding")``: the sentences before the current one), the
  SDT one also with ``sentence_prefix=True`` (a chunk that continues a sentence gets the sentence's
  earlier topic words). The leaky model is trained with the papers' context (``"others"``: the
  document minus the sentence, so it also sees the following sentences), and ``sentence_prefix=True``
  (the perplexity code gives every sentence-topic model its sentence prefix). All are then evaluated
  under every protocol they allow; the causal models' ``paper`` number is therefore measured with a
  context they were not trained with.
* Topic-model phase. Every NCLM first trains its NVDM alone for ``--topic-model-steps`` optimizer steps
  (1000 by default) on whole training documents, as the paper pre-trains its NVDM on full documents:
  each training chunk with its *document's* bag of words (``context="document"``, capped at 300 topic
  words as every context here), so a document weighs as many rows as it has chunks, as the official code
  replicates a document's row once per window. It is a ``TopicLMTrainer`` run with
  ``pretraining_phases=[("topic_model", N)]`` (the LSTM is not run, the LM weights get no gradient), its
  own Adam with ``--topic-model-lr`` (1e-2), constant, without gradient clipping (the official code
  clips nothing). Then the joint objective for ``--steps`` steps with a fresh Adam (the official code's
  joint Adam also starts fresh), reading exactly the LSTM's batches in the LSTM's order with the
  LSTM's schedule. The topic-model steps come in addition to the LSTM's ``--steps``, since they do not
  touch the LM. Measured while designing this (1000 NVDM steps on APNEWS, 50 topics): on the causal
  contexts at the joint run's 2e-3, the NVDM stayed 0.6 nats per word below uniform with every topic a
  list of frequent words; with one row per document at 1e-2 its posterior collapsed (KL 0.15 nats per
  document); with the rows above at 1e-2 it reached 7.34 nats per word (uniform: 8.36), KL 11 nats per
  document and distinct topics (courts, police, ...).
* alpha (the topic model's share of the loss) is the paper's 0.01 for APNEWS unless ``--alpha`` says
  otherwise. Other NCLM settings are the package's defaults (the paper's: NVDM encoder 256 sigmoid
  units, 10 samples, ETR from the top 20 words of each topic with the LM's own embeddings, read
  without gradient, as no pretrained vectors can be downloaded here).
* Speed. Training tokens/s counts the predicted tokens of the joint phase only (fetching and
  collating the batch, forward, backward and the optimizer step; logging and checkpoint writing
  excluded), so it compares like with like with the LSTM; the topic-model phase's time is reported
  separately in ``train.json``.
* Steering. For the causal NCLM variant with the lowest ``causal`` perplexity, ``evaluate_steering``
  (``topic_ids=[k]`` for a seeded sample of topics; judges: the model's encoder, the model's own topic
  distributions and scikit-learn LDA fitted on train.txt; fluency = perplexity of the generated text
  under the LSTM trained in this run), through ``benchmark_steering.steer``.

Resumable. ``--out`` (default ``out/nclm``) holds ``settings.json`` (a rerun with other settings is
refused), and per model ``<name>/model`` (the trained weights and both vocabularies),
``<name>/train.json``, ``<name>/eval.json``, ``<name>/topics.json``, ``<name>/steps.jsonl`` (per-step
time and tokens); then ``lda_judge.pkl``, ``steering.json``, ``speed.json``, ``table.md`` and
``results.json``. A rerun skips whatever is done and resumes an interrupted training from its last
complete checkpoint (``<name>/checkpoints``, every ``--save-steps`` steps; removed once the model is
saved).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS.parent / "src"))
sys.path.insert(0, str(SCRIPTS))

from benchmark_steering import cached_lda_judge, steer  # noqa: E402
from benchmark_tcnlm import DATA, PROTOCOLS, CountingCollator, interleaved_step_times  # noqa: E402
from benchmark_tcnlm import build as build_benchmark_model  # noqa: E402
from transformers import TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from topic_lm_hf import (LSTMLMForCausalLM, NCLMConfig, NCLMForCausalLM, TopicContextCollator,  # noqa: E402
                         TopicLMTrainer, build_vocabularies, evaluate_perplexity, evaluate_topics,
                         load_documents, record_vocabularies, save_vocabularies)
from topic_lm_hf.evaluation.steering import format_steering_table  # noqa: E402
from topic_lm_hf.evaluation.topics import load_reference_corpus  # noqa: E402
from topic_lm_hf.trainer import last_complete_checkpoint  # noqa: E402

# name -> what it is; NCLM entries give the config and the training context
MODELS = {
    "lstm": dict(label="LSTM", family="lstm", context="none"),
    "lta": dict(label="NCLM LTA", family="nclm", variant="lta", sentence_topics=False, context="preceding"),
    "eta": dict(label="NCLM ETA", family="nclm", variant="eta", sentence_topics=False, context="preceding"),
    "leta": dict(label="NCLM LETA", family="nclm", variant="leta", sentence_topics=False, context="preceding"),
    "leta-sdt": dict(label="NCLM LETA+SDT (causal, sdt_mode=prefix)", family="nclm", variant="leta",
                     sentence_topics=True, sdt_mode="prefix", context="preceding"),
    "lta-1topic": dict(label="NCLM LTA with 1 topic (diagnosis: the composition without topic information)",
                       family="nclm", variant="lta", sentence_topics=False, context="preceding", num_topics=1),
    "leta-sdt-paper": dict(label="NCLM LETA+SDT (paper mode, sdt_mode=minus_target: LEAKY)", family="nclm",
                           variant="leta", sentence_topics=True, sdt_mode="minus_target", context="others"),
}
CAUSAL_NCLMS = ("lta", "eta", "leta", "leta-sdt")
CODE_VERSION = "?"
# what a rerun must share with the run whose results are on disk
SETTINGS = ("steps", "topic_model_steps", "topic_model_lr", "embedding_size", "hidden_size", "layers", "num_topics", "alpha", "dropout",
            "batch_size", "lr", "clip", "min_freq", "seed", "max_train_docs", "max_valid_docs", "npmi_max_documents",
            "steer_topics", "steer_samples", "max_new_tokens")


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # per process: runs with disjoint --only may share
    tmp.write_text(json.dumps(jsonable(data), indent=1))     # an --out (settings.json is written by each)
    os.replace(tmp, path)  # never a half-written result file


def check_settings(out: Path, settings: dict) -> None:
    """Record the run's settings in ``out/settings.json``; a rerun with other settings in the same folder is refused
    (its results would mix with the earlier ones)."""
    previous = read_json(out / "settings.json")
    if previous is not None and previous != jsonable(settings):
        now = jsonable(settings)
        diff = {k: (previous.get(k), now.get(k)) for k in {**previous, **now} if previous.get(k) != now.get(k)}
        sys.exit(f"{out} holds results of other settings (saved, now): {diff}; use another --out")
    write_json(out / "settings.json", settings)


def code_version() -> str:
    """The commit of the checkout, and a hash of the uncommitted changes under src/ if there are any."""
    import hashlib
    import subprocess

    root = SCRIPTS.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "src"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit} + uncommitted src/ changes (diff sha1 {hashlib.sha1(diff).hexdigest()[:12]})" if diff else commit


def is_leaky(name: str) -> bool:
    spec = MODELS[name]
    return spec["family"] == "nclm" and spec.get("sdt_mode") == "minus_target"


# ----------------------------------------------------------------------------------------------
# models, batches, schedule
# ----------------------------------------------------------------------------------------------


def build(name: str, args, tok, topic_tok):
    spec = MODELS[name]
    if spec["family"] == "lstm":
        return build_benchmark_model("lstm", args, len(tok), len(topic_tok))  # benchmark_tcnlm's LSTM, seeded
    torch.manual_seed(args.seed)
    config = NCLMConfig.from_tokenizers(tok, topic_tok, variant=spec["variant"], sentence_topics=spec["sentence_topics"],
                                        sdt_mode=spec.get("sdt_mode", "prefix"),
                                        num_topics=spec.get("num_topics", args.num_topics),
                                        embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                                        num_hidden_layers=args.layers, dropout=args.dropout, alpha=args.alpha)
    return NCLMForCausalLM(config)


def make_collator(name: str, tok, topic_tok) -> TopicContextCollator:
    spec = MODELS[name]
    if spec["family"] == "lstm":
        return TopicContextCollator(tok, None, context="none")
    return TopicContextCollator(tok, topic_tok, context=spec["context"], sentence_prefix=spec["sentence_topics"])


def batch_order(n_rows: int, steps: int, batch_size: int, seed: int) -> list[int]:
    """Row indices of ``steps`` batches: seeded permutations of the rows (one per epoch), concatenated."""
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < steps * batch_size:
        order.extend(torch.randperm(n_rows, generator=generator).tolist())
    return order[:steps * batch_size]


def linear_schedule(step: int, total: int) -> float:
    """transformers' linear schedule (warm-up over max(1, total // 50) steps, as benchmark_tcnlm.py) at ``step``."""
    warmup = max(1, total // 50)
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


class BenchmarkTrainer(TopicLMTrainer):
    """``TopicLMTrainer`` with a fixed batch order and one linear schedule per phase (the joint phase's the LSTM's)."""

    def __init__(self, *args, order=None, topic_model_steps: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self._order = order
        self._topic_model_steps = topic_model_steps

    def _get_train_sampler(self, train_dataset=None):
        return FixedOrderSampler(self._order)

    def create_scheduler(self, num_training_steps, optimizer=None):
        if self.lr_scheduler is None:
            pre, joint = self._topic_model_steps, num_training_steps - self._topic_model_steps

            def factor(step):
                return linear_schedule(step, pre) if step < pre else linear_schedule(step - pre, joint)

            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
            self._created_lr_scheduler = True
        return self.lr_scheduler


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


def document_rows(train_docs, tok, topic_tok):
    """The training chunks with their document's bag of words as ``context_bow`` (its first 300 topic words, the
    cap of every context in this package), for the topic-model phase: a document weighs as many rows as it has
    chunks, as the official code replicates a document's topic-model row once per window."""
    collator = TopicContextCollator(tok, topic_tok, context="document")
    return collator.prepare(train_docs), collator


def pretrain_topic_model_phase(name: str, model, train_docs, args, mdir: Path, tok, topic_tok) -> dict:
    """The paper's NVDM pre-training on full documents: a ``TopicLMTrainer`` run of ``--topic-model-steps``
    steps in the ``topic_model`` phase only (the LM is not run), with its own Adam and ``--topic-model-lr``;
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


def train(name: str, model, rows, collator, args, mdir: Path, tok, topic_tok, train_docs=None, spec=None) -> dict:
    """Train one model (resuming from its last complete checkpoint), save it, return its training statistics.

    ``spec`` (default ``MODELS[name]``) gives ``family`` (``"lstm"``: no topic vocabulary; ``"nclm"``: the
    topic-model phase first) and ``context`` (recorded); other benchmarks (``benchmark_rgbn.py``) pass theirs."""
    spec = spec or MODELS[name]
    nclm = spec["family"] == "nclm"
    topics = spec["family"] != "lstm"
    topic_phase = pretrain_topic_model_phase(name, model, train_docs, args, mdir, tok, topic_tok) \
        if nclm and args.topic_model_steps else {}
    pre = 0  # the topic-model phase ran above, on its own data; the joint run is the LSTM's run
    total = pre + args.steps
    ckpt_dir, steps_path = mdir / "checkpoints", mdir / "steps.jsonl"
    resume = last_complete_checkpoint(ckpt_dir)
    done = int(resume.rsplit("-", 1)[1]) if resume else 0
    kept = []
    if resume and steps_path.exists():
        kept = [line for line in steps_path.read_text().splitlines() if line and json.loads(line)["step"] <= done]
    steps_path.write_text("".join(line + "\n" for line in kept))
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
    record_vocabularies(model.config, tok, topic_tok if topics else None)  # the counting wrapper hides the collator
    trainer = BenchmarkTrainer(model=model, args=targs, train_dataset=rows, data_collator=counting,
                               pretraining_phases=[("topic_model", pre)] if pre else None, order=order,
                               topic_model_steps=pre)
    phase_of = trainer.training_phase if pre else (lambda step: "joint")
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StepTimer(name, counting, steps_path, phase_of, total))
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    seconds_this_session = time.perf_counter() - start
    model.eval()
    trainer.save_model(str(mdir / "model"))
    save_vocabularies(tok, topic_tok if topics else None, mdir / "model")

    records = [json.loads(line) for line in steps_path.read_text().splitlines() if line]
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
        "training_context": spec["context"], "code": CODE_VERSION,
    }
    joint_speed = step_throughput(joint)
    stats["tokens_per_s"], stats["stalled_steps"] = joint_speed["tokens_per_s"], joint_speed["stalled_steps"]
    if len(records) != total:
        print(f"   note: {len(records)} of {total} steps were timed (steps.jsonl)", flush=True)
    return stats


# ----------------------------------------------------------------------------------------------
# measurements
# ----------------------------------------------------------------------------------------------


def evaluate_protocols(model, valid_docs, tok, topic_tok, mdir: Path, ablation: str | None = None,
                       leaky: bool = False) -> dict:
    """Perplexity under every protocol and, with ``ablation`` (a protocol), the mismatched-context ablation
    under it; cached in ``mdir/eval.json``. A ``leaky`` model gets n/a (with the package's reason) where
    ``evaluate_perplexity`` refuses a protocol. Shared by the benchmark scripts."""
    path = mdir / "eval.json"
    ev = read_json(path) or {}
    for protocol in PROTOCOLS:
        if protocol in ev:
            continue
        try:
            r = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok)
            print(f"   {r['protocol']}: perplexity {r['perplexity']:.2f} ({r['tokens']:,} tokens)", flush=True)
        except ValueError as e:
            if not leaky:
                raise
            r = {"n/a": str(e), "protocol": protocol}
            print(f"   {protocol}: n/a ({e})", flush=True)
        ev[protocol] = r
        write_json(path, ev)
    if ablation is not None and "mismatched" not in ev:
        r = evaluate_perplexity(model, valid_docs, ablation, tokenizer=tok, topic_tokenizer=topic_tok,
                                mismatched_context=True)
        r["base_protocol"] = ablation
        print(f"   {r['protocol']}, every chunk given another chunk's context (ablation): perplexity "
              f"{r['perplexity']:.2f}", flush=True)
        ev["mismatched"] = r
        write_json(path, ev)
    return ev


def evaluate(name: str, model, valid_docs, tok, topic_tok, mdir: Path) -> dict:
    """Every protocol (n/a where the package refuses a leaky model's) and, for the NCLMs, the ablation under
    causal (paper for the leaky one)."""
    ablation = None if MODELS[name]["family"] != "nclm" else "paper" if is_leaky(name) else "causal"
    return evaluate_protocols(model, valid_docs, tok, topic_tok, mdir, ablation, leaky=is_leaky(name))


def load_model(name: str, mdir: Path):
    cls = LSTMLMForCausalLM if MODELS[name]["family"] == "lstm" else NCLMForCausalLM
    return cls.from_pretrained(mdir / "model").eval()


def fmt(x, pattern="{:.2f}"):
    return "-" if x is None else pattern.format(x)


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/nclm", help="results folder (resumable)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help=f"train and measure only these models (space- or comma-separated) of {list(MODELS)}")
    parser.add_argument("--steps", type=int, default=1200, help="joint training steps (the LSTM's steps)")
    parser.add_argument("--topic-model-steps", type=int, default=1000,
                        help="NCLM: topic-model-only steps on full training documents before the joint ones "
                             "(the LM is not touched)")
    parser.add_argument("--topic-model-lr", type=float, default=1e-2,
                        help="NCLM: the learning rate of the topic-model phase (its own Adam)")
    parser.add_argument("--hidden", dest="hidden_size", type=int, default=256, help="H, the LSTM size")
    parser.add_argument("--embedding", dest="embedding_size", type=int, default=None, help="E (default: H)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--topics", dest="num_topics", type=int, default=50)
    parser.add_argument("--alpha", type=float, default=0.01, help="NCLM's topic-model loss share (paper: 0.01, APNEWS)")
    parser.add_argument("--dropout", type=float, default=0.4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate (linear warm-up and decay to 0)")
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--min-freq", type=int, default=10)
    parser.add_argument("--max-train-docs", type=int, default=None, help="first N training documents (quick checks)")
    parser.add_argument("--max-valid-docs", type=int, default=None, help="first N validation documents (quick checks)")
    parser.add_argument("--npmi-max-documents", type=int, default=None, help="first N Wikipedia articles (quick checks)")
    parser.add_argument("--steer-topics", type=int, default=10, help="topics sampled for the steering evaluation")
    parser.add_argument("--steer-samples", type=int, default=20, help="texts per topic (and unconditioned)")
    parser.add_argument("--max-new-tokens", type=int, default=30)
    parser.add_argument("--speed-repeats", type=int, default=10, help="interleaved timing steps per model")
    parser.add_argument("--save-steps", type=int, default=100, help="checkpoint every N steps (resume points)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.embedding_size = args.embedding_size or args.hidden_size
    names = [n for item in (args.only or list(MODELS)) for n in item.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    names = [n for n in MODELS if n in names]  # the LSTM first, then the table's order

    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # no "Writing model shards" / "Loading weights" bars in the log
    import datasets

    datasets.disable_progress_bars()
    t_start = time.perf_counter()
    global CODE_VERSION
    CODE_VERSION = code_version()  # read at start: the modules imported now are the ones that run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in SETTINGS}
    check_settings(out, settings)

    train_docs = load_documents(DATA / "apnews" / "train.txt", max_documents=args.max_train_docs)
    valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.max_valid_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords=DATA / "stopwords" / "mallet_en.txt")
    print(f"APNEWS train {len(train_docs)} docs, valid {len(valid_docs)} docs; V = {len(tok)}, "
          f"V_c = {len(topic_tok)} (incl. <unk>); E = {args.embedding_size}, H = {args.hidden_size}, "
          f"{args.layers} layer(s), {args.num_topics} topics, alpha {args.alpha}; {args.steps} joint steps "
          f"(+{args.topic_model_steps} topic-model-only steps for NCLM); out: {out}; code: {CODE_VERSION}", flush=True)

    collators, rows_by_key, rows = {}, {}, {}

    def training_rows(name):
        if name not in rows:
            collators[name] = make_collator(name, tok, topic_tok)
            key = (collators[name].context, collators[name].sentence_prefix)
            if key not in rows_by_key:
                rows_by_key[key] = collators[name].prepare(train_docs)
            rows[name] = rows_by_key[key]
            first = next(iter(rows_by_key.values()))
            if len(rows[name]) != len(first) or rows[name][:32]["input_ids"] != first[:32]["input_ids"]:
                raise RuntimeError("the collators' rows differ: the models would not see the same batches")
        return rows[name]

    reference = None

    def npmi_reference():
        nonlocal reference
        if reference is None:
            start = time.perf_counter()
            reference = load_reference_corpus(DATA / "wiki" / "articles.jsonl.gz",
                                              max_documents=args.npmi_max_documents)
            print(f"\n== NPMI reference: {reference.description} ({time.perf_counter() - start:.0f} s to load)",
                  flush=True)
        return reference

    # ------------------------------------------------------------------------------------------
    # train and measure every model
    # ------------------------------------------------------------------------------------------
    for name in names:
        mdir = out / name
        mdir.mkdir(exist_ok=True)
        nclm = MODELS[name]["family"] == "nclm"
        train_path = mdir / "train.json"
        model = None
        if train_path.exists():
            print(f"\n== {name}: trained earlier ({train_path})", flush=True)
        else:
            model = build(name, args, tok, topic_tok)
            budget = (f"{args.topic_model_steps} topic-model-only + {args.steps} joint steps" if nclm
                      else f"{args.steps} steps")
            print(f"\n== training {name}: {MODELS[name]['label']} "
                  f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters), {budget}, "
                  f"context {MODELS[name]['context']!r}", flush=True)
            stats = train(name, model, training_rows(name), collators[name], args, mdir, tok, topic_tok, train_docs)
            write_json(train_path, stats)
            shutil.rmtree(mdir / "checkpoints", ignore_errors=True)
            print(f"   joint phase: {stats['joint_tokens']:,} tokens in {stats['joint_seconds']:.0f} s = "
                  f"{stats['tokens_per_s']:,.0f} tokens/s"
                  + (f"; topic-model phase {stats['topic_model_seconds']:.0f} s" if nclm else ""), flush=True)
        ev = read_json(mdir / "eval.json") or {}
        if not all(p in ev for p in PROTOCOLS) or (nclm and "mismatched" not in ev):
            model = model or load_model(name, mdir)
            print(f"== evaluating {name} on apnews/valid.txt", flush=True)
            evaluate(name, model, valid_docs, tok, topic_tok, mdir)
        if nclm and not (mdir / "topics.json").exists():
            model = model or load_model(name, mdir)
            topics = evaluate_topics(model, npmi_reference(), topic_tokenizer=topic_tok)
            write_json(mdir / "topics.json", topics)
            print(f"   {name}: NPMI (lau2014) {topics['npmi']:.3f}, diversity (top-{topics['diversity_k']}) "
                  f"{topics['diversity']:.3f}", flush=True)
        del model

    done = [n for n in names if (out / n / "train.json").exists() and (out / n / "eval.json").exists()]
    results = {n: {"train": read_json(out / n / "train.json"), "eval": read_json(out / n / "eval.json"),
                   "topics": read_json(out / n / "topics.json")} for n in done}

    # ------------------------------------------------------------------------------------------
    # steering of the best causal NCLM (by causal perplexity)
    # ------------------------------------------------------------------------------------------
    candidates = [n for n in CAUSAL_NCLMS if n in done]
    steering = read_json(out / "steering.json")
    if candidates and "lstm" in done:
        best = min(candidates, key=lambda n: results[n]["eval"]["causal"]["perplexity"])
        if steering is None or steering.get("model") != best:
            judge = cached_lda_judge(out / "lda_judge.pkl", train_docs, topic_tok, args.num_topics, args.seed)
            print(f"\n== steering {best} (lowest causal perplexity among {candidates})", flush=True)
            model = load_model(best, out / best)
            fluency_model = load_model("lstm", out / "lstm")
            result = steer(model, args, tok, topic_tok, judge, fluency_model)
            steering = {"model": best, "candidates": candidates, "result": result,
                        "topics": model.get_topics(10, topic_tokenizer=topic_tok)}
            write_json(out / "steering.json", steering)
            del model, fluency_model
    elif steering is None:
        print("\n(steering skipped: it needs the LSTM and at least one causal NCLM finished)", flush=True)

    # ------------------------------------------------------------------------------------------
    # interleaved speed re-measure (last: its steps update the models in memory; nothing is saved)
    # ------------------------------------------------------------------------------------------
    speed = read_json(out / "speed.json")
    if "lstm" in done and len(done) > 1 and (speed is None or sorted(speed["models"]) != sorted(done)):
        print(f"\n== interleaved speed measurement ({args.speed_repeats} steps per model: {done})", flush=True)
        models = {n: load_model(n, out / n) for n in done}
        for n in done:
            training_rows(n)
        measured = interleaved_step_times(models, collators, rows, args, args.speed_repeats)
        speed = {"models": done, "repeats": args.speed_repeats, "results": measured}
        write_json(out / "speed.json", speed)
        del models

    # ------------------------------------------------------------------------------------------
    # the table
    # ------------------------------------------------------------------------------------------
    if not results:
        print(f"\nNo model of {names} is finished in {out}: no table.", flush=True)
        return
    lines = table(results, speed, steering, args, train_docs, valid_docs, tok, topic_tok, reference_name(results))
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    (out / "table.md").write_text(text + "\n")
    write_json(out / "results.json", {"settings": settings, "results": results, "speed": speed, "steering": steering})
    print(f"\nWritten: {out / 'table.md'}, {out / 'results.json'}. Time of this invocation "
          f"{(time.perf_counter() - t_start) / 60:.1f} min.", flush=True)


def reference_name(results) -> str:
    for r in results.values():
        if r["topics"]:
            return r["topics"]["coherence"].get("reference", "?")
    return "?"


def table(results, speed, steering, args, train_docs, valid_docs, tok, topic_tok, reference) -> list[str]:
    lstm = results.get("lstm")
    cpu = platform.processor() or platform.machine()
    eval_tokens = next((e["tokens"] for r in results.values() for e in r["eval"].values() if "tokens" in e), 0)
    topic_entry = next((r["topics"] for r in results.values() if r["topics"]), None)
    lines = [f"### NCLM vs LSTM on APNEWS (E = {args.embedding_size}, H = {args.hidden_size}, {args.layers} layer(s), "
             f"{args.num_topics} topics; {args.steps} joint steps, NCLM + {args.topic_model_steps} topic-model-only steps)",
             "",
             f"Data: `apnews/train.txt` ({len(train_docs)} documents) for training and the LDA judge, `apnews/valid.txt` "
             f"({len(valid_docs)} documents, {eval_tokens:,} predicted tokens) for every perplexity. "
             f"V = {len(tok):,} (frequency >= {args.min_freq}), V_c = {len(topic_tok):,} (Lau et al. 2017 filter). "
             f"Budget: every model {args.steps} steps of {args.batch_size} 30-token chunks on the same batches in the "
             f"same order, Adam lr {args.lr} (linear warm-up over 2 %, linear decay to 0), gradient clip {args.clip}, "
             f"dropout {args.dropout}, seed {args.seed}; every NCLM first trains its topic model alone for "
             f"{args.topic_model_steps} steps on full training documents (the paper's NVDM pre-training: its own "
             f"TopicLMTrainer run in the `topic_model` phase, Adam lr {args.topic_model_lr} constant, no clipping; the LSTM "
             f"is not run, so these steps come in addition to the {args.steps}; the joint run starts a fresh Adam, as "
             f"the official code does). NCLM alpha = {args.alpha}. Causal NCLMs "
             f"are trained with the context of the preceding sentences, the leaky one with the document minus the "
             f"sentence (the papers'), so the causal NCLMs' `paper` numbers read a context they were not trained "
             f"with. {args.threads} CPU thread(s) ({cpu}), torch {torch.__version__}; code: "
             f"{', '.join(sorted({r['train'].get('code', '?') for r in results.values()}))}.",
             "",
             "Protocols (`evaluate_perplexity`): **paper** = context is the document minus the sentence (it sees the "
             "sentences that follow); **causal** = preceding sentences only; **causal-carry** = causal and the LSTM "
             "state (and SDT's sentence sum) carried across the document. **another chunk's context** = the ablation "
             "`mismatched_context=True` (every chunk reads the context of another chunk of its evaluation batch), under "
             "`causal` for the causal NCLMs and under `paper` for the leaky one. NPMI: `lau2014` preset (window 20, "
             f"mean over the top 5/10/15/20 words) against {reference}; diversity: unique fraction of the top-"
             f"{topic_entry['diversity_k'] if topic_entry else 25} words of all topics. Training tokens/s: predicted "
             "tokens per second of the training run (NCLM: joint phase only; fetch, forward, backward, optimizer), and "
             "the ratio to the LSTM of this run; interleaved: the same ratio re-measured afterwards with the models' "
             f"steps interleaved on identical batches ({speed['repeats'] if speed else '-'} steps each).",
             "",
             "| model | params | ppl paper | ppl causal | ppl causal-carry | ppl, another chunk's context | "
             "NPMI (lau2014, wiki) | diversity | train tokens/s | ratio to LSTM | interleaved ratio |",
             "|" + "---|" * 11]
    footnotes = {}
    for name, r in results.items():
        ev, tr, tp = r["eval"], r["train"], r["topics"]
        cells = []
        for protocol in PROTOCOLS:
            e = ev[protocol]
            if "n/a" in e:
                reason = e["n/a"].replace(f"'{protocol}'", "causal")  # one footnote for both causal protocols
                footnotes.setdefault(reason, len(footnotes) + 1)
                cells.append(f"n/a ({footnotes[reason]})")
            else:
                label = "" if e["protocol"] == protocol else f" [{e['protocol']}]"
                cells.append(f"{e['perplexity']:.2f}{label}")
        m = ev.get("mismatched")
        cells.append(f"{m['perplexity']:.2f} ({m['base_protocol']})" if m else "-")
        cells.append(fmt(tp["npmi"], "{:.3f}") if tp else "-")
        cells.append(fmt(tp["diversity"], "{:.3f}") if tp else "-")
        cells.append(f"{tr['tokens_per_s']:,.0f}")
        cells.append(f"{tr['tokens_per_s'] / lstm['train']['tokens_per_s']:.2f}" if lstm else "-")
        if speed and name in speed["results"] and "lstm" in speed["results"]:
            cells.append(f"{speed['results'][name]['tokens_per_s'] / speed['results']['lstm']['tokens_per_s']:.2f}")
        else:
            cells.append("-")
        lines.append(f"| {MODELS[name]['label']} | {tr['parameters'] / 1e6:.2f} M | " + " | ".join(cells) + " |")
    for reason, k in footnotes.items():
        lines.append(f"\n({k}) not measured: the package refuses it: {reason}")
    if lstm:
        lines.append("")
        for name, r in results.items():
            if name == "lstm":
                continue
            change = [f"{p} {100 * (r['eval'][p]['perplexity'] / lstm['eval'][p]['perplexity'] - 1):+.1f} %"
                      for p in PROTOCOLS if "perplexity" in r["eval"][p]]
            lines.append(f"- {MODELS[name]['label']} vs LSTM perplexity: {', '.join(change)}"
                         + (" (leaky: not a language-model perplexity)" if is_leaky(name) else ""))
    if steering:
        s, best = steering["result"], steering["model"]
        p = s["protocol"]
        lines += ["", f"### Steering: {MODELS[best]['label']} (lowest causal perplexity among "
                      f"{', '.join(steering['candidates'])})", "",
                  f"`evaluate_steering`: topics {p['topics']}, {p['num_samples']} texts per topic with "
                  f"`topic_ids=[k]` and {p['num_samples']} unconditioned, from `<bos>`, at most {p['max_new_tokens']} "
                  f"tokens, decoding {p['decoding']}, seed {p['seed']}. Judges: own encoder ({p['own_judge']}), own "
                  f"topics ({p['own_topics_judge']}), LDA ({s['judge']}; topics matched to the model's, mean cosine "
                  f"{fmt(s['lda_match_cosine'], '{:.3f}')}). Fluency: perplexity of the generated text under the LSTM "
                  f"of this run (trained on apnews/train.txt, {args.steps} steps).", "",
                  f"- topic accuracy: own encoder {fmt(s['accuracy_own'], '{:.3f}')}, own topics "
                  f"{fmt(s['accuracy_own_topics'], '{:.3f}')}, LDA judge {fmt(s['accuracy_lda'], '{:.3f}')} "
                  f"(chance {s['chance']:.3f})",
                  f"- fluency ratio (steered / unconditioned perplexity under the LSTM): "
                  f"{fmt(s['fluency_ratio'])} ({fmt(s['fluency_ppl_steered'], '{:.1f}')} / "
                  f"{fmt(s['fluency_ppl_unconditioned'], '{:.1f}')})", "",
                  format_steering_table({MODELS[best]["label"]: s}), "",
                  f"{MODELS[best]['label']}: 10 of its {len(steering['topics'])} topics "
                  "(`get_topics(10)`: the largest entries of each decoder row), trained as above:", ""]
        lines += [f"- topic {k}: {' '.join(words)}" for k, words in enumerate(steering["topics"][:10])]
    return lines


if __name__ == "__main__":
    main()
