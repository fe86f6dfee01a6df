"""One command that checks the package on a GPU (or, with ``--device cpu --tiny``, on a CPU in about two minutes).

Every part runs in its own process under its own timeout (a part that hangs or crashes is recorded as such and the
others still run), and everything lands in one folder (``--out``): ``results.json``, ``tables.md`` and
``log.txt``. The parts:

1. ``steps-eager``: one training step (forward, backward, clipping, Adam) of every family (and of the carried LSTM
   and the carried rGBN-RNN) at the papers' size
   (E = 300, H = 600, 50 topics; ``--tiny``: E = H = 16, 4 topics) on the same APNEWS documents (``--batch-size``
   per step), under float32, TF32 matrix products (GPU only) and bf16 autocast, each mode timed with the device
   synchronised around every step, the families interleaved (``benchmarking.interleaved_step_times``), so each
   row has its ratio to the LSTM of the same run. Also the default path that ``topic-lm train`` picks on this
   device (``fast_path``), the seconds from building the models to the end of their first step, and the operations
   and host synchronisations of one eager float32 step of each (``benchmarking.step_cost``).
2. ``steps-compiled``: the same with the compiled output layer (bf16 autocast), with the seconds to the first
   step (compilation included) and the number of graphs compiled (a recompilation shows as more).
3. ``cli-<family>``: ``topic-lm train`` of each family with the default recipe (the topic model pre-trained first,
   ``--pretrain-steps`` steps) for ``--train-steps`` steps on the device, then ``topic-lm evaluate`` and
   ``topic-lm generate`` with ``--topic_ids`` and ``--topic_guidance_scale`` (topic families); these run
   concurrently, one process per family, so their times are not speed figures.
4. ``generation``: tokens/s of greedy ``generate()`` of every family (one row, 50 tokens, with ``topic_ids`` for
   the topic families), synchronised.
5. ``carried``: the unified benchmark (``benchmark_all.py``) at the papers' size on the device, trained the way
   its published carried-state rows are (documents batches, the state carried, the plateau schedule, early
   stopping by development perplexity) for the models of ``--carried-models`` (the carried LSTM and the carried
   rGBN-RNN), capped at ``--carried-steps`` steps: its ``table.md`` lands in ``--out``/carried. At this cap the
   rows are not converged (the table says what stopped each); the same command without the cap is the full run.

    python scripts/gpu_check.py --out out/gpu_check                       # on the GPU machine, < 11 minutes
    python scripts/gpu_check.py --device cpu --tiny --out out/gpu_check   # the same on a CPU, about two minutes

Needs APNEWS (``$TOPIC_LM_DATA`` or ``../shared/data``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# name in MODELS -> (family label, model_type of topic-lm train, its --config_overrides at sizes E, H, K)
SIZED = "embedding_size={e},hidden_size={h},num_topics={k}"
FAMILIES = {
    "lstm": ("LSTM", "lstm_lm", "embedding_size={e},hidden_size={h}"),
    "tcnlm": ("TCNLM", "tcnlm", SIZED),
    "topic-lstm": ("TopicLSTM", "topic_rnn", SIZED + ",cell=lstm"),
    "nclm-leta": ("NCLM LETA", "nclm", SIZED + ",variant=leta"),
    "rgbn": ("rGBN-RNN, 1 layer", "rgbn_rnn", "embedding_size={e},topic_sizes=[{k}],hidden_sizes=[{h}]"),
}
EAGER_MODES = ("fp32", "tf32", "bf16")
# timed beside the families: the unified benchmark's carried-state rows (their state carried across each document)
CARRIED_TIMED = ("lstm-carry", "rgbn-carry", "tcnlm-carry")


def sizes(tiny: bool) -> dict:
    return dict(embedding_size=16, hidden_size=16, num_topics=4) if tiny else \
        dict(embedding_size=300, hidden_size=600, num_topics=50)


# ----------------------------------------------------------------------------------------------
# the parts (each runs in a child process: python gpu_check.py --part NAME ...)
# ----------------------------------------------------------------------------------------------


def _setup(args):
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    torch.set_num_threads(args.threads)
    from topic_lm_hf import build_vocabularies, load_documents
    from benchmarking import DATA

    train_docs = load_documents(DATA / "apnews" / "train.txt", max_documents=args.max_train_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=3 if args.tiny else 10,
                                        stopwords="mallet")
    return torch, train_docs, tok, topic_tok


def _model_args(args):
    s = sizes(args.tiny)
    return argparse.Namespace(**s, layers=1, num_factors=s["hidden_size"], topic_sizes=[s["num_topics"]],
                              dropout=0.4, seed=0, kl_annealing_steps=300, alpha=0.01, batch_size=args.batch_size,
                              clip=0.5)


def part_steps(args, compiled: bool) -> dict:
    torch, train_docs, tok, topic_tok = _setup(args)
    from transformers import TrainingArguments

    from benchmarking import (MODELS, CarriedLoss, OnDevice, build_model, interleaved_step_times, make_collator,
                              prepared_rows, step_cost, trains_with_carry_state)
    from topic_lm_hf.devices import synchronize
    from topic_lm_hf.fast_path import resolve_compile, resolve_precision

    device = torch.device(args.device)
    margs = _model_args(args)
    cache, rows, collators = {}, {}, {}
    timed_names = {**{n: FAMILIES[n][0] for n in FAMILIES}, **{n: MODELS[n]["label"] for n in CARRIED_TIMED}}
    for name in timed_names:
        documents, collator = make_collator(name, tok, topic_tok)
        rows[name] = prepared_rows(cache, name, documents, train_docs)
        collators[name] = OnDevice(collator, device)
    # the default path of topic-lm train on this device
    targs = TrainingArguments(output_dir=str(Path(args.out) / "tmp"), use_cpu=device.type == "cpu", report_to=[])
    default_compiled = resolve_compile(targs, None)
    default_bf16, sentence = resolve_precision(targs, "auto", default_compiled)
    default_mode = ("bf16" if default_bf16 else "fp32") + ("+compiled" if default_compiled else "")
    modes = ["bf16+compiled"] if compiled else [m for m in EAGER_MODES if m != "tf32" or device.type == "cuda"]
    if not compiled and default_mode not in modes:
        modes.append(default_mode)
    result = {"device": str(device), "default_mode": default_mode, "default_sentence": sentence, "modes": {}}
    from torch._dynamo.utils import counters

    for mode in modes:
        counters.clear()
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            torch.backends.cudnn.allow_tf32 = mode == "tf32"
        start = time.perf_counter()
        models = {name: build_model(name, margs, tok, topic_tok).to(device) for name in timed_names}
        models = {name: CarriedLoss(m) if trains_with_carry_state(name) else m for name, m in models.items()}
        speed_mode = mode.replace("tf32", "fp32")
        synchronize(device)
        built_s = time.perf_counter() - start
        timed = interleaved_step_times(models, collators, rows, argparse.Namespace(batch_size=args.batch_size,
                                                                                   clip=0.5),
                                       repeats=args.repeats, modes={n: speed_mode for n in timed_names})
        if mode == "fp32":  # operations and host synchronisations of one eager step (each at least one launch)
            batch = {n: collators[n]([rows[n][i] for i in range(args.batch_size)]) for n in timed_names}
            result["step_cost"] = {timed_names[n]: {k: v for k, v in step_cost(models[n], batch[n]).items()
                                                    if k in ("operations", "host_synchronisations", "gflop")}
                                   for n in timed_names}
        lstm = timed["lstm"]["tokens_per_s"]
        # from the build to the end of each model's first step (compilation included): the longest of them
        first_step_s = built_s + max(t["first_step_s"] for t in timed.values())
        result["modes"][mode] = {
            "first_step_s": first_step_s, "graphs_compiled": int(counters["stats"]["unique_graphs"]),
            "families": {timed_names[n]: {**timed[n], "ratio_to_lstm": timed[n]["tokens_per_s"] / lstm}
                         for n in timed_names}}
        print(f"{mode}: first steps {first_step_s:.1f} s; " + ", ".join(
            f"{timed_names[n]} {1000 * timed[n]['step_s']:.1f} ms" for n in timed_names), flush=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    result["models"] = {FAMILIES[n][0]: MODELS[n]["label"] for n in FAMILIES}
    return result


# the graphs part's families: TCNLM's training step can be captured (supports_cuda_graphs); the LSTM's eager step on the
# same batches is the reference of the ratios
GRAPHED = ("lstm", "tcnlm")


def part_graphs(args, name: str) -> dict:
    """Training steps of family ``name`` replayed from a CUDA graph (``topic_lm_hf.cuda_graphs``) against eager
    float32 steps, on batches of ``--graph-rows`` sentence chunks (one shape once padded to 32 columns), one family
    per process (one captured graph, as in ``topic-lm train``): (1) the same weights trained ``--graph-check-steps``
    steps (Adam, lr 1e-3) both ways on the same batches, the losses side by side; (2) median step times of the two
    models, interleaved. On a CPU, and for a family whose step cannot be captured, only the eager model runs."""
    torch, train_docs, tok, topic_tok = _setup(args)
    from benchmarking import build_model
    from topic_lm_hf import TopicContextCollator
    from topic_lm_hf.cuda_graphs import GraphedTrainingStep
    from topic_lm_hf.devices import synchronize

    device = torch.device(args.device)
    margs = _model_args(args)
    eager = build_model(name, margs, tok, topic_tok).to(device).train()
    modes = ("eager", "graphed") if device.type == "cuda" and eager.supports_cuda_graphs else ("eager",)
    # the same seed, so the same weights
    models = {m: eager if m == "eager" else build_model(name, margs, tok, topic_tok).to(device).train() for m in modes}
    n_batches = max(args.graph_check_steps, args.repeats + 2)
    collator = TopicContextCollator.for_model(eager, tok, topic_tok, context="others")
    rows = collator.prepare(train_docs)
    batches = [{k: v.to(device) for k, v in collator([rows[(i * args.graph_rows + j) % len(rows)]
                                                      for j in range(args.graph_rows)]).items()}
               for i in range(n_batches)]
    optimizers = {m: torch.optim.Adam(models[m].parameters(), lr=1e-3) for m in modes}
    graphed = {m: GraphedTrainingStep(models[m]) if m == "graphed" else None for m in modes}

    def step(mode, batch):
        synchronize(device)
        start = time.perf_counter()
        loss = graphed[mode].loss(batch) if graphed[mode] is not None else models[mode](**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(models[mode].parameters(), 0.5)
        optimizers[mode].step()
        optimizers[mode].zero_grad(set_to_none=True)
        synchronize(device)
        return time.perf_counter() - start, float(loss)

    result = {"family": FAMILIES[name][0], "rows_per_step": args.graph_rows, "modes": list(modes), "check": {},
              "timing": {}}
    times = {m: [] for m in modes}
    losses = {m: [] for m in modes}
    for r in range(n_batches):  # (1) and (2) at once: the two models interleaved on the same batches
        for mode in modes:
            seconds, loss = step(mode, batches[r])
            losses[mode].append(loss)
            times[mode].append((seconds, int((batches[r]["labels"][:, 1:] != -100).sum())))
        print(f"step {r}: " + ", ".join(f"{m} {1000 * times[m][-1][0]:.1f} ms loss {losses[m][-1]:.4f}"
                                        for m in modes), flush=True)
    last = max(1, n_batches // 4)
    mean = {m: sum(v[-last:]) / last for m, v in losses.items()}
    result["check"] = {"losses": losses, "last_steps": last, "mean_loss_last": mean,
                       "relative_difference": abs(mean[modes[-1]] - mean["eager"]) / mean["eager"]}
    for mode in modes:
        timed = times[mode][2:]  # after two warm-up steps (the first graphed step captures)
        result["timing"][mode] = {"step_s": statistics.median(t for t, _ in timed),
                                  "tokens_per_s": sum(k for _, k in timed) / sum(t for t, _ in timed),
                                  "first_step_s": times[mode][0][0],
                                  **({"replays": graphed[mode].replays, "eager_steps": graphed[mode].eager_steps,
                                      "graphs": len(graphed[mode].graphs)} if graphed[mode] is not None else {})}
    return result


def part_generation(args) -> dict:
    torch, train_docs, tok, topic_tok = _setup(args)
    from benchmarking import build_model, generation_speed

    device = torch.device(args.device)
    margs = _model_args(args)
    result = {}
    for name, (label, _, _) in FAMILIES.items():
        model = build_model(name, margs, tok, topic_tok).to(device).eval()
        speed = generation_speed(model, tok, args.new_tokens, str(device),
                                 **({} if name == "lstm" else {"topic_ids": [1]}))
        result[label] = {"tokens_per_s": speed["generate_tokens_per_s"]}
        print(f"{label}: {result[label]['tokens_per_s']:.0f} tokens/s", flush=True)
    return result


def part_carried(args) -> dict:
    """The unified benchmark's carried-state rows at the papers' size (``--tiny``: E = H = 16) on the device: its
    own command (``benchmark_all.py``), run from here."""
    from benchmarking import read_json

    s = sizes(args.tiny)
    folder = Path(args.out) / "carried"
    argv = ["--corpus", "apnews", "--device", args.device, "--out", str(folder),
            "--only", *args.carried_models, "--max-steps", str(args.carried_steps),
            "--eval-steps", str(max(1, args.carried_steps // 8)), "--max-train-docs", str(args.max_train_docs),
            "--max-valid-docs", str(args.eval_docs), "--threads", str(args.threads),
            "--pretrain-steps", str(args.pretrain_steps), "--npmi-max-documents", "200", "--steer-topics", "2",
            "--steer-samples", "2", "--speed-repeats", "2", "--lda-max-iter", "2"]
    argv += ["--embedding", str(s["embedding_size"]), "--hidden", str(s["hidden_size"]), "--topics",
             str(s["num_topics"]), "--batch-size", "2"] if args.tiny else ["--size", "paper"]
    script = Path(__file__).resolve().parent / "benchmark_all.py"
    subprocess.run([sys.executable, str(script), *argv], check=True)
    report, table = read_json(folder / "results.json") or {}, (folder / "table.md").read_text()
    return {"argv": " ".join(argv), "models": list(args.carried_models), "table": table,
            "rows": {name: {"label": row["label"], "perplexity": row["perplexity"], "mismatched": row.get("mismatched"),
                            "steps_trained": row["steps_trained"], "stopped_by": row["train"].get("stopped_by")}
                     for name, row in report.get("results", {}).items()}}


def part_cli(args, name: str) -> dict:
    """topic-lm train, evaluate and generate of one family, in this process (the command line's own entry point)."""
    import io
    from contextlib import redirect_stdout

    from benchmarking import DATA
    from topic_lm_hf.cli import main

    graphs = name.endswith("+graphs")  # topic-lm train --cuda_graphs true (a GPU only)
    name = name.removesuffix("+graphs")
    label, model_type, overrides = FAMILIES[name]
    label += " (--cuda_graphs true)" if graphs else ""
    s = sizes(args.tiny)
    folder = Path(args.out) / "runs" / (name + ("-graphs" if graphs else ""))
    config = overrides.format(e=s["embedding_size"], h=s["hidden_size"], k=s["num_topics"])
    device_flags = ["--use_cpu", "true"] if args.device == "cpu" else []
    train = ["train", "--train_file", str(DATA / "apnews" / "train.txt"),
             "--validation_file", str(DATA / "apnews" / "valid.txt"), "--stopwords", "mallet",
             "--max_train_documents", str(args.max_train_docs), "--max_eval_documents", str(args.eval_docs),
             "--model_type", model_type, "--config_overrides", config, "--output_dir", str(folder),
             "--max_steps", str(args.train_steps), "--per_device_train_batch_size", "64", "--eval_strategy", "no",
             "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", "--logging_steps",
             str(max(1, args.train_steps // 4)), *device_flags]
    if model_type != "lstm_lm":
        train += ["--pretrain_topic_model_steps", str(args.pretrain_steps)]
    if graphs:
        train += ["--cuda_graphs", "true"]
    if args.tiny:
        train += ["--min_freq", "3"]
    if args.device == "cpu" and args.tiny:
        train += ["--compile_output_layer", "false"]  # a compilation per family would take most of the minute
    commands = {"train": train,
                "evaluate": ["evaluate", "--model_name_or_path", str(folder), "--validation_file",
                             str(DATA / "apnews" / "valid.txt"), "--max_eval_documents", str(args.eval_docs),
                             "--output_json", "none", "--device", args.device],
                "generate": ["generate", "--model_name_or_path", str(folder), "--prompt", "the police said",
                             "--max_new_tokens", "20", "--device", args.device]
                + (["--topic_ids", "1", "--topic_guidance_scale", "2"] if model_type != "lstm_lm" else [])}
    result = {"family": label, "commands": {}}
    for step, argv in commands.items():
        start = time.perf_counter()
        out = io.StringIO()
        code = 0
        try:
            with redirect_stdout(out):
                main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
        result["commands"][step] = {"seconds": time.perf_counter() - start, "exit_code": code,
                                    "output_tail": out.getvalue()[-600:], "argv": " ".join(argv)}
        print(f"topic-lm {step}: exit {code}, {time.perf_counter() - start:.1f} s", flush=True)
        if code:
            break
    return result


# ----------------------------------------------------------------------------------------------
# the driver
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny models and few steps (the CPU mode CI runs)")
    parser.add_argument("--out", default="out/gpu_check", help="the folder of results.json, tables.md, log.txt")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole check (default: 450 on a GPU, 400 with --tiny); every part's "
                             "timeout is cut to what is left")
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)  # the child process's part
    parser.add_argument("--batch-size", type=int, default=4, help="training documents per timed step")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per model and mode")
    parser.add_argument("--train-steps", type=int, default=None, help="steps of topic-lm train")
    parser.add_argument("--pretrain-steps", type=int, default=None, help="topic-model pre-training steps")
    parser.add_argument("--max-train-docs", type=int, default=None, help="APNEWS training documents read")
    parser.add_argument("--eval-docs", type=int, default=None, help="validation documents of topic-lm evaluate")
    parser.add_argument("--new-tokens", type=int, default=50, help="tokens per generation timing")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--graph-rows", type=int, default=None, help="sentence chunks per step of the graphs part")
    parser.add_argument("--graph-check-steps", type=int, default=None,
                        help="steps trained both ways (eager, graphed) by the graphs part's check")
    parser.add_argument("--carried-models", nargs="+", default=["lstm-carry", "rgbn-carry"],
                        help="the unified benchmark's models of the carried part (default: the carried LSTM and the "
                             "carried rGBN-RNN, the carried topic model that beat it on APNEWS on a CPU)")
    parser.add_argument("--carried-steps", type=int, default=None, help="the carried part's cap in steps")
    parser.add_argument("--parts", nargs="+", default=None, metavar="PART",
                        help=f"run only these parts (default: all of {[p for p, *_ in PARTS]})")
    args = parser.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    tiny = args.tiny
    for key, (small, full) in {"repeats": (3, 10), "train_steps": (10, 300), "pretrain_steps": (10, 300),
                               "max_train_docs": (60, 2000), "eval_docs": (10, 200), "carried_steps": (8, 600),
                               "graph_rows": (8, 32), "graph_check_steps": (4, 40),
                               "budget": (560, 630)}.items():
        if getattr(args, key) is None:
            setattr(args, key, small if tiny else full)
    return args


# (part, timeout in seconds at full size, at --tiny)
# (generous at --tiny: about a minute in all on an idle 2-core machine, several times that on a busy one)
PARTS = [("steps-eager", 150, 120), ("steps-compiled", 150, 0)] + [(f"graphs-{n}", 90, 60) for n in GRAPHED] + \
    [(f"cli-{name}", 150, 150) for name in FAMILIES] + [("cli-tcnlm+graphs", 150, 0)] + \
    [("generation", 60, 60), ("carried", 180, 160)]


def run_part(args, part: str, timeout: float, log) -> dict:
    """Run one part in a child process under ``timeout`` seconds; its JSON result, or why there is none."""
    folder = Path(args.out) / "parts"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{part}.json"
    target.unlink(missing_ok=True)
    argv = [sys.executable, os.path.abspath(__file__), "--part", part, *_forwarded(args)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=max(timeout, 1))
        status = "ok" if proc.returncode == 0 and target.exists() else f"failed (exit {proc.returncode})"
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as expired:
        status = f"timed out after {timeout:.0f} s"
        output = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) else \
            (expired.stdout or "")
    seconds = time.perf_counter() - start
    log.write(f"== {part}: {status}, {seconds:.1f} s\n{output[-4000:]}\n")
    log.flush()
    print(f"{part}: {status} ({seconds:.0f} s)", flush=True)
    result = json.loads(target.read_text()) if target.exists() else {}
    return {"status": status, "seconds": seconds, **({"result": result} if result else
                                                       {"output_tail": output[-1500:]})}


def _forwarded(args) -> list[str]:
    flags = ["--device", args.device, "--out", args.out, "--batch-size", str(args.batch_size), "--repeats",
             str(args.repeats), "--train-steps", str(args.train_steps), "--pretrain-steps", str(args.pretrain_steps),
             "--max-train-docs", str(args.max_train_docs), "--eval-docs", str(args.eval_docs), "--new-tokens",
             str(args.new_tokens), "--threads", str(args.threads), "--carried-steps", str(args.carried_steps),
             "--graph-rows", str(args.graph_rows), "--graph-check-steps", str(args.graph_check_steps),
             "--carried-models", *args.carried_models]
    return flags + (["--tiny"] if args.tiny else [])


def tables(results: dict) -> str:
    lines = [f"# GPU check: {results['device_name']}", "",
             f"{results['sizes']}; torch {results['torch']}; {results['seconds']:.0f} s in all.", ""]
    lines += ["| part | status | seconds |", "|---|---|---|"]
    lines += [f"| {p} | {r['status']} | {r['seconds']:.0f} |" for p, r in results["parts"].items()]
    steps = {}
    for part in ("steps-eager", "steps-compiled"):
        steps.update(results["parts"].get(part, {}).get("result", {}).get("modes", {}))
    eager = results["parts"].get("steps-eager", {}).get("result", {})
    if steps:
        modes = list(steps)
        lines += ["", "Training step, median ms (tokens/s ratio to the LSTM of the same mode), the device "
                  "synchronised around each step:", "",
                  "| family | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
        for family in next(iter(steps.values()))["families"]:
            cells = [f"{1000 * steps[m]['families'][family]['step_s']:.1f} "
                     f"({steps[m]['families'][family]['ratio_to_lstm']:.2f})" for m in modes]
            lines.append(f"| {family} | " + " | ".join(cells) + " |")
        lines.append("| seconds from build to first steps | " + " | ".join(
            f"{steps[m]['first_step_s']:.1f}" for m in modes) + " |")
        lines.append("| graphs compiled | " + " | ".join(str(steps[m]["graphs_compiled"]) for m in modes) + " |")
        if eager:
            lines += ["", f"Default path here: {eager['default_mode']} ({eager['default_sentence']})"]
        if eager.get("step_cost"):
            lines += ["", "One eager float32 training step (forward and backward): operations dispatched (each at "
                      "least one kernel launch), host synchronisations, GFLOP:", "",
                      "| model | operations | host synchronisations | GFLOP |", "|---|---|---|---|"]
            lines += [f"| {m} | {c['operations']:,} | {c['host_synchronisations']} | {c['gflop']:.2f} |"
                      for m, c in eager["step_cost"].items()]
    graphs = [r["result"] for p, r in results["parts"].items() if p.startswith("graphs-") and "result" in r]
    if graphs:
        modes = max((g["modes"] for g in graphs), key=len)
        lstm = next((g["timing"]["eager"]["tokens_per_s"] for g in graphs if g["family"] == "LSTM"), None)
        lines += ["", f"Training step replayed from a CUDA graph against eager float32 ({graphs[0]['rows_per_step']} "
                  "sentence chunks per step, padded to 32 columns; one family per process, the two models "
                  "interleaved; median ms, in brackets tokens/s as a ratio to the eager LSTM's):", "",
                  "| family | " + " | ".join(modes) + " | mean loss of the last steps, " + ", ".join(modes) + " |",
                  "|---|" + "---|" * len(modes) + "---|"]
        for g in graphs:
            t, mean = g["timing"], g["check"]["mean_loss_last"]
            lines.append(f"| {g['family']} | " + " | ".join(
                (f"{1000 * t[m]['step_s']:.1f}" + (f" ({t[m]['tokens_per_s'] / lstm:.2f})" if lstm else ""))
                if m in t else "not captured" for m in modes) + " | "
                + ", ".join(f"{mean[m]:.4f}" if m in mean else "-" for m in modes) + " |")
    cli = {p: r for p, r in results["parts"].items() if p.startswith("cli-") and "result" in r}
    if cli:
        lines += ["", "topic-lm train / evaluate / generate (concurrent processes; seconds and exit code):", "",
                  "| family | train | evaluate | generate |", "|---|---|---|---|"]
        for part, r in cli.items():
            c = r["result"]["commands"]
            lines.append(f"| {r['result']['family']} | " + " | ".join(
                f"{c[k]['seconds']:.0f} s, exit {c[k]['exit_code']}" if k in c else "not run"
                for k in ("train", "evaluate", "generate")) + " |")
    generation = results["parts"].get("generation", {}).get("result")
    if generation:
        lines += ["", "Greedy generate(), one row (tokens/s):", "", "| family | tokens/s |", "|---|---|"]
        lines += [f"| {f} | {g['tokens_per_s']:.0f} |" for f, g in generation.items()]
    carried = results["parts"].get("carried", {}).get("result")
    if carried:
        lines += ["", f"The unified benchmark's carried-state rows (`benchmark_all.py {carried['argv']}`):", "",
                  carried["table"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part is not None:  # a child process: run the part, write its JSON
        from benchmarking import write_json

        if args.part.startswith("graphs-"):
            result = part_graphs(args, args.part[len("graphs-"):])
        elif args.part.startswith("steps-"):
            result = part_steps(args, compiled=args.part == "steps-compiled")
        elif args.part == "generation":
            result = part_generation(args)
        elif args.part == "carried":
            result = part_carried(args)
        else:
            result = part_cli(args, args.part[len("cli-"):])
        write_json(out / "parts" / f"{args.part}.json", result)
        return result
    import torch

    from benchmarking import DATA, write_json

    if not (DATA / "apnews" / "train.txt").exists():
        raise SystemExit(f"APNEWS is absent ({DATA / 'apnews'}): set TOPIC_LM_DATA to the folder of the corpora")
    start = time.perf_counter()
    deadline = start + args.budget
    unknown = sorted(set(args.parts or ()) - {p for p, *_ in PARTS})
    if unknown:
        raise SystemExit(f"unknown parts {unknown}: choose from {[p for p, *_ in PARTS]}")
    parts = [(p, tiny if args.tiny else full) for p, full, tiny in PARTS if (tiny if args.tiny else full) > 0
             and (args.parts is None or p in args.parts)]
    results = {"device": args.device, "tiny": args.tiny, "sizes": sizes(args.tiny), "torch": torch.__version__,
               "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else
               f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
               "settings": {k: v for k, v in vars(args).items() if k != "part"}, "parts": {}}
    with open(out / "log.txt", "w") as log:
        def run(part_timeout):
            part, timeout = part_timeout
            return part, run_part(args, part, min(timeout, max(1.0, deadline - time.perf_counter())), log)

        # the timed parts alone on the machine, then the command-line runs side by side, then generation
        for item in [p for p in parts if p[0].startswith(("steps-", "graphs-"))]:
            results["parts"].update([run(item)])
        cli = [p for p in parts if p[0].startswith("cli-")]
        if cli:
            with ThreadPoolExecutor(max_workers=len(cli) if args.device != "cpu" else 2) as pool:
                results["parts"].update(pool.map(run, cli))
        for item in [p for p in parts if p[0] in ("generation", "carried")]:
            results["parts"].update([run(item)])
    results["seconds"] = time.perf_counter() - start
    results["ok"] = all(r["status"] == "ok" for r in results["parts"].values())
    write_json(out / "results.json", results)
    (out / "tables.md").write_text(tables(results))
    print(tables(results))
    if not results["ok"]:
        sys.exit(1)
    return results


if __name__ == "__main__":
    main()
