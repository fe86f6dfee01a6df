"""Training and generation speed of every family: float32 eager, bf16 autocast, and bf16 with the compiled output
layer (the package's fast path, ``topic_lm_hf.fast_path``), against the same-size LSTM in the same run.

The models are the unified benchmark's (``benchmarking.MODELS``, ``build_model``, ``make_collator``):
E = H = 128 and 50 topics (``--size cpu``) on APNEWS ``train.txt`` with its vocabularies (words seen at least 10
times; the topic vocabulary without the MALLET stop list), every model reading the same ``--batch-size`` training
documents per step (their sentence chunks, about 60 of 30 tokens; ``*-carry`` models the documents with the state
carried). Prints markdown tables:

1. **Training** tokens/s (predicted tokens per second of forward, backward, gradient clipping and Adam; median
   step, ``interleaved_step_times``: every model and mode takes its step in turn on identical batches, after two
   warm-up rounds), each family under each mode, and the ratio to the LSTM under the same mode; with the
   activations saved for backward by one step (MiB, what grows with the batch: parameters and Adam's moments come
   on top).
2. **Carried state**: ``TopicLMTrainer(carry_state=True)``'s step on the same documents (``carried_state_loss``) on
   the fast path, as a fraction of the same family's chunk-trained speed.
3. **Operations per step**: the operations dispatched and the host synchronisations (``benchmarking.OperationCounter``,
   a ``TorchDispatchMode``: on a GPU each operation is at least one kernel launch, each synchronisation a wait for
   the device) and the GFLOP (``FlopCounterMode``) of one eager float32 training forward and backward of every model
   (``*-carry``: its carried-state step), beside its fast-path tokens/s and FLOP efficiency (GFLOP/s), each as a
   ratio to the LSTM of the same run (a carried row: to the carried LSTM).
4. **Generation**: tokens/s of ``generate()`` (greedy, one row, ``--new-tokens`` tokens, cache on) against a plain
   loop over the same model (``forward`` with the returned ``state``, argmax), and the difference per token.
5. With ``--quality-steps N``: the LSTM and TCNLM trained N steps from the same seed in float32 and on the fast
   path (``BenchmarkTrainer``: Adam 2e-3, linear schedule, clip 0.5), and their validation perplexity
   (``evaluate_perplexity``, ``causal`` for the LSTM, ``paper`` for TCNLM; the first ``--valid-docs`` documents of
   ``valid.txt``), evaluated in float32.

    python scripts/benchmark_speed.py                                  # CPU size, every family (about 5 minutes)
    python scripts/benchmark_speed.py --quality-steps 1000             # and bf16 against float32 training
    python scripts/benchmark_speed.py --only lstm tcnlm --repeats 3    # a quick look

One torch thread by default (``--threads``): on a 2-core machine two single-thread jobs beat one two-thread job.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from transformers import TrainingArguments

from topic_lm_hf import build_vocabularies, load_documents
from topic_lm_hf.evaluation import evaluate_perplexity
from topic_lm_hf.fast_path import cpu_bf16_flags

from benchmark_training import BatchTokens, BenchmarkTrainer, batch_order, fast_path
from benchmarking import (DATA, MODELS, SIZES, SPEED_MODES, CarriedLoss, OnDevice, add_common_arguments, build_model,
                          generation_speed, interleaved_step_times, make_collator, prepared_rows, step_cost,
                          trains_with_carry_state, write_json)

CHUNK_MODELS = ("lstm", "tcnlm", "topic-lstm", "nclm-lta", "nclm-leta", "gbn", "rgbn")
CARRY_MODELS = ("lstm-carry", "tcnlm-carry", "topic-lstm-carry", "nclm-leta-carry", "rgbn-carry")
TIMED_MODES = ("fp32", "bf16", "bf16+compiled")
FAST = "bf16+compiled"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help=f"these models only (of {list(CHUNK_MODELS + CARRY_MODELS)}; the LSTM is always timed)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per model and mode")
    parser.add_argument("--new-tokens", type=int, default=50, help="generated tokens per generation timing")
    parser.add_argument("--quality-steps", type=int, default=0,
                        help="also train the LSTM and TCNLM this many steps in float32 and on the fast path and "
                             "compare validation perplexity (0: skip)")
    parser.add_argument("--valid-docs", type=int, default=200, help="validation documents of the quality check")
    parser.add_argument("--quality-models", nargs="+", default=["lstm", "tcnlm"], choices=["lstm", "tcnlm"],
                        help="the models of the quality check")
    parser.add_argument("--quality-modes", nargs="+", default=["fp32", "bf16+compiled"],
                        choices=["fp32", "fp32+compiled", "bf16", "bf16+compiled"],
                        help="the training paths of the quality check")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="out/speed", help="results.json and the quality runs' checkpoints")
    add_common_arguments(parser, "--batch-size", "--dropout", "--lr", "--clip", "--kl-annealing-steps", "--alpha",
                         "--min-freq", "--max-train-docs", "--threads", "--seed", batch_size=4,
                         helps={"batch_size": "training documents per step (about 60 sentence chunks on APNEWS)"})
    args = parser.parse_args(argv)
    for key, value in SIZES[args.size].items():
        setattr(args, key, value)
    args.layers, args.num_factors, args.topic_sizes = 1, args.hidden_size, [args.num_topics]
    names = [n for item in (args.only or CHUNK_MODELS + CARRY_MODELS) for n in item.split(",") if n]
    unknown = [n for n in names if n not in CHUNK_MODELS + CARRY_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(CHUNK_MODELS + CARRY_MODELS)}")
    args.names = ["lstm"] + [n for n in CHUNK_MODELS + CARRY_MODELS if n in names and n != "lstm"]
    return args


def saved_activation_mib(model, batch, bf16: bool, compiled: bool) -> float:
    """MiB of the tensors autograd saves for backward in one training forward (the memory that grows with the
    batch); counted with ``saved_tensors_hooks``, each storage once."""
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += key[1]
        return t

    lm = model.model if isinstance(model, CarriedLoss) else model
    lm.output_layer_compiled = compiled and lm.compile_output_layer(True)
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16, enabled=bf16):
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return total / 2 ** 20


def quality(args, train_docs, valid_docs, tok, topic_tok) -> dict:
    """Validation perplexity of the LSTM and TCNLM after ``args.quality_steps`` steps in float32 and on the fast
    path, from the same seed and batch order."""
    results = {}
    for name, protocol in (("lstm", "causal"), ("tcnlm", "paper")):
        if name not in args.quality_models:
            continue
        documents, collator = make_collator(name, tok, topic_tok)
        rows = documents.prepare(train_docs)
        for mode in args.quality_modes:
            bf16, compiled = SPEED_MODES[mode]
            run = argparse.Namespace(**{**vars(args), "precision": "bf16" if bf16 else "fp32",
                                        "compile_output_layer": compiled})
            model = build_model(name, args, tok, topic_tok)
            targs = TrainingArguments(output_dir=str(Path(args.out) / f"quality-{name}-{mode}"),
                                      max_steps=args.quality_steps, per_device_train_batch_size=args.batch_size,
                                      learning_rate=args.lr, max_grad_norm=args.clip,
                                      logging_steps=max(1, args.quality_steps // 5), save_strategy="no",
                                      report_to=[], use_cpu=args.device == "cpu", disable_tqdm=True, seed=args.seed,
                                      dataloader_num_workers=0)
            targs, compile_output_layer = fast_path(targs, run)
            counting = BatchTokens(collator)
            trainer = BenchmarkTrainer(model=model, args=targs, train_dataset=rows, data_collator=counting,
                                       order=batch_order(len(rows), args.quality_steps, args.batch_size, args.seed),
                                       compile_output_layer=compile_output_layer)
            start = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - start
            model.eval()
            ppl = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok)
            results[f"{name}/{mode}"] = {"perplexity": ppl["perplexity"], "protocol": protocol,
                                         "train_seconds": seconds, "tokens": counting.tokens}
            print(f"   {name} {mode}: {args.quality_steps} steps in {seconds:.0f} s, {protocol} perplexity "
                  f"{ppl['perplexity']:.2f}", flush=True)
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    train_file = DATA / "apnews" / "train.txt"
    if not train_file.exists():
        raise SystemExit(f"APNEWS is absent ({train_file}): set TOPIC_LM_DATA to the folder of the corpora")
    train_docs = load_documents(train_file, max_documents=args.max_train_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq,
                                        stopwords="mallet")
    cpu = platform.processor() or platform.machine()
    bf16_flags = ", ".join(cpu_bf16_flags()) or "no native bf16"
    print(f"APNEWS train.txt ({len(train_docs)} documents), V = {len(tok):,}, V_c = {len(topic_tok):,}; E = "
          f"{args.embedding_size}, H = {args.hidden_size}, K = {args.num_topics}; {args.batch_size} documents per "
          f"step; {args.device}, {cpu} ({bf16_flags}), {torch.get_num_threads()} thread(s), torch "
          f"{torch.__version__}", flush=True)

    models, collators, rows, entries, modes = {}, {}, {}, {}, {}
    documents_rows = {}
    for name in args.names:
        documents, collator = make_collator(name, tok, topic_tok)
        name_rows = prepared_rows(documents_rows, name, documents, train_docs)
        model = build_model(name, args, tok, topic_tok).to(args.device)
        models[name] = CarriedLoss(model) if trains_with_carry_state(name) else model
        for mode in (TIMED_MODES if not MODELS[name].get("carry") else (FAST,)):
            key = f"{name}/{mode}"
            entries[key], modes[key] = models[name], mode
            collators[key] = OnDevice(collator, args.device)
            rows[key] = name_rows
    start = time.perf_counter()
    timing_args = argparse.Namespace(batch_size=args.batch_size, clip=args.clip)
    timed = interleaved_step_times(entries, collators, rows, timing_args, args.repeats, modes)
    print(f"(interleaved timing: {time.perf_counter() - start:.0f} s)", flush=True)

    batch = {key: collators[key]([rows[key][i] for i in range(args.batch_size)]) for key in entries}
    memory = {key: saved_activation_mib(entries[key], batch[key], *SPEED_MODES[modes[key]]) for key in entries}
    # operations dispatched and FLOPs of one eager float32 step (what launches kernels on a GPU)
    costs = {name: step_cost(entries[f"{name}/{mode}"], batch[f"{name}/{mode}"])
             for name in args.names for mode in [FAST if MODELS[name].get("carry") else "fp32"]}

    print("\n| model | fp32 tokens/s | bf16 | bf16 + compiled output layer | speed-up of the fast path | "
          "ratio to LSTM, fp32 | ratio to LSTM, fast path | activations saved, MiB (fp32 / fast) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.names:
        if MODELS[name].get("carry"):
            continue
        tps = {mode: timed[f"{name}/{mode}"]["tokens_per_s"] for mode in TIMED_MODES}
        lstm = {mode: timed[f"lstm/{mode}"]["tokens_per_s"] for mode in TIMED_MODES}
        print(f"| {MODELS[name]['label']} | {tps['fp32']:,.0f} | {tps['bf16']:,.0f} | {tps[FAST]:,.0f} | "
              f"{tps[FAST] / tps['fp32']:.2f} | {tps['fp32'] / lstm['fp32']:.2f} | {tps[FAST] / lstm[FAST]:.2f} | "
              f"{memory[f'{name}/fp32']:.0f} / {memory[f'{name}/{FAST}']:.0f} |")

    carried = [n for n in args.names if MODELS[n].get("carry")]
    if carried:
        print("\n| model, carried state (fast path) | tokens/s | ratio to the same family chunk-trained | "
              "ratio to LSTM chunk-trained |\n|---|---|---|---|")
        for name in carried:
            chunk = next(n for n in CHUNK_MODELS if MODELS[n]["family"] == MODELS[name]["family"]
                         and MODELS[n].get("nclm") == MODELS[name].get("nclm"))
            tps = timed[f"{name}/{FAST}"]["tokens_per_s"]
            reference = timed.get(f"{chunk}/{FAST}", {}).get("tokens_per_s")
            ratio = f"{tps / reference:.2f}" if reference else "n/a (not timed)"
            print(f"| {MODELS[name]['label']} | {tps:,.0f} | {ratio} | "
                  f"{tps / timed[f'lstm/{FAST}']['tokens_per_s']:.2f} |")

    # FLOP efficiency: the GFLOP of a step over its median time on the fast path, against the LSTM of the same kind
    # (a carried row against the carried LSTM when it was timed) in the same interleaved run
    def efficiency(name):
        return costs[name]["gflop"] / timed[f"{name}/{FAST}"]["step_s"]

    def reference(name):
        return "lstm-carry" if MODELS[name].get("carry") and "lstm-carry" in costs else "lstm"

    print("\n| model | operations per step | host synchronisations | GFLOP per step | tokens/s, fast path | GFLOP/s, "
          "fast path | FLOP efficiency, ratio to the LSTM | tokens/s, ratio to the LSTM | operations, ratio to the "
          "LSTM |\n|---|---|---|---|---|---|---|---|---|")
    for name in args.names:
        ref = reference(name)
        tps = timed[f"{name}/{FAST}"]["tokens_per_s"]
        print(f"| {MODELS[name]['label']} | {costs[name]['operations']:,} | {costs[name]['host_synchronisations']} | "
              f"{costs[name]['gflop']:.2f} | {tps:,.0f} | {efficiency(name):.1f} | "
              f"{efficiency(name) / efficiency(ref):.2f} | {tps / timed[f'{ref}/{FAST}']['tokens_per_s']:.2f} | "
              f"{costs[name]['operations'] / costs[ref]['operations']:.1f} |")
    print("(ratios of a carried-state row: to the carried LSTM)" if "lstm-carry" in costs else "")

    generation = {}
    print("\n| model | generate() tokens/s | plain loop tokens/s | overhead per token, ms |\n|---|---|---|---|")
    for name in args.names:
        if MODELS[name].get("carry"):
            continue
        generation[name] = g = generation_speed(models[name], tok, args.new_tokens, args.device)
        print(f"| {MODELS[name]['label']} | {g['generate_tokens_per_s']:,.0f} | {g['loop_tokens_per_s']:,.0f} | "
              f"{g['overhead_ms_per_token']:.2f} |")

    quality_results = {}
    if args.quality_steps:
        valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.valid_docs)
        print(f"\nquality: {args.quality_steps} steps in float32 and on the fast path, same seed", flush=True)
        quality_results = quality(args, train_docs, valid_docs, tok, topic_tok)
        print("\n| model | protocol | float32 perplexity | fast path perplexity | difference | training time, "
              "float32 / fast path |\n|---|---|---|---|---|---|")
        for name in args.quality_models:
            if f"{name}/fp32" not in quality_results or f"{name}/{FAST}" not in quality_results:
                continue
            a, b = quality_results[f"{name}/fp32"], quality_results[f"{name}/{FAST}"]
            print(f"| {MODELS[name]['label']} | {a['protocol']} | {a['perplexity']:.2f} | {b['perplexity']:.2f} | "
                  f"{b['perplexity'] / a['perplexity'] - 1:+.2%} | {a['train_seconds']:.0f} s / "
                  f"{b['train_seconds']:.0f} s |")

    results = {"settings": {k: v for k, v in vars(args).items() if k != "names"}, "models": args.names,
               "training": timed, "activations_mib": memory, "step_cost": costs, "generation": generation, "quality": quality_results,
               "cpu": cpu, "bf16_flags": bf16_flags, "torch": torch.__version__}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out) / "results.json", results)
    return results


if __name__ == "__main__":
    main()
