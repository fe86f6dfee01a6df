"""Which family the demo's budget favours: every family trained the demo's way for its budget, measured under causal.

``make demo`` trains one topic family beside the same-size LSTM for 60 s each. This script trains the LSTM and each
of the package's topic families exactly as the demo does (``topic_lm_hf.demo``: its vocabulary of APNEWS words seen
at least 25 times, E = H = 128, 20 topics, the family's steering recipe, the topic model pre-trained for 300 steps,
Adam 3e-3 on 64 sentence chunks per step, the fast path) for the same budget, and measures each under ``causal``
(what generation sees: only the preceding sentences) on the first ``--eval-documents`` APNEWS validation documents,
with the mismatched-context ablation (another document's context): how much of each topic model's perplexity its
document's own topics bring.

The budget is the process's CPU time (``time.process_time``; one torch thread), which on an idle machine is the
demo's wall time, so that other jobs on the machine do not shorten it. ``--seeds`` trains every model once per seed;
the table gives the mean and each seed's figure. The topic family with the best mean under ``causal`` is the demo's
default (``topic_lm_hf.demo.DEMO_FAMILY``; ``tests/test_cli.py`` checks it against the published ``results.json``).

    python scripts/benchmark_demo.py --out results/demo-budget          # about 8 minutes per seed on 2 cores
    python scripts/benchmark_demo.py --seconds 5 --families lstm tcnlm  # a quick look

Resumable: each model's figures are written to ``--out/<model>-seed<k>.json`` as it finishes.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import set_seed

from topic_lm_hf import data as data_lib
from topic_lm_hf.collator import TopicContextCollator
from topic_lm_hf.demo import (BASELINE, DEMO_MIN_FREQ, TOPIC_PRETRAINING_STEPS, build_topic_model, demo_families,
                              pretrain, rows_per_step, speed_settings, train_for)
from topic_lm_hf.evaluation import evaluate_perplexity
from topic_lm_hf.families import family_of
from topic_lm_hf.fast_path import FastPathArguments
from topic_lm_hf.models import LSTMLMConfig, LSTMLMForCausalLM

from benchmarking import DATA, check_settings, code_version, fmt, read_json, write_json

MODELS = ("lstm", *demo_families())  # the LSTM by its benchmark name, the topic families by their model_type
LABELS = {"lstm": BASELINE.label, **{family: family_of(family).label for family in demo_families()}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/benchmark_demo", help="results folder (resumable)")
    parser.add_argument("--families", nargs="+", default=list(MODELS), choices=MODELS, metavar="NAME",
                        help=f"the models to train: {', '.join(MODELS)} (default: all)")
    parser.add_argument("--seconds", type=float, default=60.0, help="training budget of each model (CPU seconds)")
    parser.add_argument("--eval-documents", type=int, default=200, help="APNEWS validation documents evaluated")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run of every model per seed")
    parser.add_argument("--pretrain-steps", type=int, default=TOPIC_PRETRAINING_STEPS,
                        help="topic-model pre-training steps (the demo's by default)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the demo's default: 1)")
    args = parser.parse_args(argv)
    for name in ("seconds", "eval_documents", "threads"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.pretrain_steps < 1:
        parser.error(f"--pretrain-steps must be at least 1, got {args.pretrain_steps}")
    return args


def measure(name: str, seed: int, args, train_docs, valid_docs, tok, topic_tok) -> dict:
    """Train model ``name`` the demo's way for ``args.seconds`` of CPU time; its causal perplexity (and ablation)."""
    set_seed(seed)
    if name == "lstm":
        model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), **BASELINE.demo_sizes))
        pretrained = None
    else:
        model = build_topic_model(name, tok, topic_tok)
        start = time.perf_counter()
        pretrain(model, train_docs, tok, topic_tok, steps=args.pretrain_steps)
        pretrained = time.perf_counter() - start
    collator = TopicContextCollator.for_model(model, tok, topic_tok if name != "lstm" else None)
    rows = collator.prepare(train_docs)
    speed, _ = speed_settings(FastPathArguments())
    with tempfile.TemporaryDirectory() as tmp:
        wall = time.perf_counter()
        steps = train_for(model, rows, collator, args.seconds, tmp, LABELS[name], 3e-3, clock=time.process_time,
                          **speed)
        wall = time.perf_counter() - wall
    result = dict(model=name, seed=seed, steps=steps, rows_per_step=rows_per_step(model, rows),
                  parameters=sum(p.numel() for p in model.parameters()), train_wall_seconds=wall,
                  pretrain_seconds=pretrained, bf16=speed["bf16"], compiled_output_layer=speed["compile_output_layer"])
    result["causal"] = evaluate_perplexity(model, valid_docs, "causal", tokenizer=tok,
                                           topic_tokenizer=topic_tok)["perplexity"]
    if name != "lstm":
        result["ablation"] = evaluate_perplexity(model, valid_docs, "causal", tokenizer=tok, topic_tokenizer=topic_tok,
                                                 mismatched_context=True)["perplexity"]
    return result


def summarise(runs: list[dict]) -> list[dict]:
    """One row per model: the mean over the seeds of its steps, causal perplexity and ablation, with each seed's
    causal figure, and its difference to the LSTM's mean (negative = better than the LSTM)."""
    rows = []
    for name in MODELS:
        mine = sorted((r for r in runs if r["model"] == name), key=lambda r: r["seed"])
        if not mine:
            continue
        row = dict(model=name, label=LABELS[name], seeds=[r["seed"] for r in mine],
                   steps=statistics.mean(r["steps"] for r in mine), parameters=mine[0]["parameters"],
                   causal=statistics.mean(r["causal"] for r in mine), causal_per_seed=[r["causal"] for r in mine])
        if name != "lstm":
            row["ablation"] = statistics.mean(r["ablation"] for r in mine)
            row["own_topics"] = row["ablation"] - row["causal"]
        rows.append(row)
    lstm = next((r for r in rows if r["model"] == "lstm"), None)
    for row in rows:
        row["vs_lstm"] = None if lstm is None else 100 * (row["causal"] - lstm["causal"]) / lstm["causal"]
    return rows


def table(rows: list[dict], args, corpus: str) -> str:
    lines = [f"Every model trained the demo's way for {args.seconds:g} s of CPU time, a fixed budget (not converged; "
             f"{corpus}); `causal` perplexity "
             f"on the first {args.eval_documents} validation documents, mean over seed(s) "
             f"{', '.join(map(str, args.seeds))}.", "",
             "| model | steps in the budget | parameters | causal (each seed) | ablation: another document's context "
             "| own topics (points) | vs the LSTM |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = " / ".join(f"{x:.2f}" for x in r["causal_per_seed"])
        lines.append(f"| {r['label']} | {r['steps']:,.0f} | {r['parameters'] / 1e6:.2f} M | {r['causal']:.2f} "
                     f"({seeds}) | {fmt(r.get('ablation'))} | {fmt(r.get('own_topics'))} | "
                     f"{fmt(r['vs_lstm'], '{:+.1f} %')} |")
    topic = [r for r in rows if r["model"] != "lstm"]
    if topic:
        best = min(topic, key=lambda r: r["causal"])
        lines += ["", f"Best topic family under causal at this budget: {best['label']} ({best['model']})."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import datasets

    datasets.disable_progress_bars()
    if not (DATA / "apnews" / "train.txt").exists():
        sys.exit(f"scripts/benchmark_demo.py measures on APNEWS: {DATA / 'apnews'} was not found "
                 "(set TOPIC_LM_DATA to the folder of the corpora)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, dict(seconds=args.seconds, eval_documents=args.eval_documents,
                             pretrain_steps=args.pretrain_steps, threads=args.threads))
    train_docs = data_lib.load_documents(DATA / "apnews" / "train.txt")
    valid_docs = data_lib.load_documents(DATA / "apnews" / "valid.txt", max_documents=args.eval_documents)
    tok, topic_tok = data_lib.build_vocabularies(train_docs, min_freq=DEMO_MIN_FREQ, stopwords="mallet")
    source = f"APNEWS {DATA / 'apnews'}: train.txt ({len(train_docs)} docs) / valid.txt (the first {len(valid_docs)})"
    runs = []
    for seed in args.seeds:
        for name in args.families:
            path = out / f"{name}-seed{seed}.json"
            result = read_json(path)
            if result is None:
                print(f"[{name}, seed {seed}] training for {args.seconds:g} s of CPU time", flush=True)
                result = measure(name, seed, args, train_docs, valid_docs, tok, topic_tok)
                write_json(path, result)
            print(f"[{name}, seed {seed}] {result['steps']} steps; causal {result['causal']:.2f}"
                  + (f", ablation {result['ablation']:.2f}" if "ablation" in result else ""), flush=True)
            runs.append(result)
    rows = summarise(runs)
    corpus = f"{source}, LM vocabulary {len(tok):,} words, topic vocabulary {len(topic_tok):,}"
    text = table(rows, args, corpus)
    topic = [r for r in rows if r["model"] != "lstm"]
    report = dict(settings=vars(args), corpus=corpus, rows=rows, runs=runs, code=code_version(),
                  machine=f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)",
                  best_topic_family=min(topic, key=lambda r: r["causal"])["model"] if topic else None,
                  best=min(rows, key=lambda r: r["causal"])["model"] if rows else None)
    write_json(out / "results.json", report)
    (out / "table.md").write_text(text)
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
