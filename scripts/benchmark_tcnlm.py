"""TCNLM against the same-size LSTM baseline on APNEWS: perplexity, topics, training speed.

Both models are trained in this one run, on ``apnews/train.txt``, for the same number of steps
with the same batches, optimiser and schedule, through ``TopicLMTrainer``; everything is reported
on ``apnews/valid.txt``. Vocabularies follow Lau et al. 2017 (LM: words with frequency >= 10;
topic: minus the MALLET stop list, the top 0.1 % and non-alphabetic tokens); 30-token chunks,
context bags of words capped at 300 topic tokens. TCNLM is trained with the papers' context (the
document minus the sentence).

    python scripts/benchmark_tcnlm.py                       # CPU default: E=H=256, 50 topics, 1 layer, 1200 steps
    python scripts/benchmark_tcnlm.py --paper-size small    # the paper's small model (E=300, H=600)
    python scripts/benchmark_tcnlm.py --paper-size large    # the paper's large model (2 x 900)
    python scripts/benchmark_tcnlm.py --table6              # Table 6: LSTM vs naive MoE vs TCNLM (30 topics, H=100)

Reported:

* perplexity under the ``paper`` protocol (context = document minus the sentence; it sees the
  sentences that follow), ``causal`` (preceding sentences only) and ``causal-carry`` (also carries
  the LSTM state across the document), see ``topic_lm_hf.evaluation.perplexity``;
* for the topic models, an ablation: ``paper`` with every chunk given the context of another chunk
  of its evaluation batch (``evaluate_perplexity(..., mismatched_context=True)``): what the
  document's topics are worth, as opposed to the extra capacity of the model;
* NPMI coherence of the topics (Lau et al. 2014 preset: window 20, mean over top 5/10/15/20)
  against the Wikipedia reference corpus, and topic diversity (unique fraction of the top-25);
* training throughput in predicted tokens per second during the training runs, and the same
  ratio re-measured with the two models' steps interleaved on identical batches (less sensitive
  to other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from transformers import TrainingArguments  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, TopicLMTrainer,  # noqa: E402
                         build_vocabularies, evaluate_perplexity, load_documents)
from topic_lm_hf.evaluation.topic_eval import evaluate_topics  # noqa: E402
from topic_lm_hf.evaluation.topics import load_reference_corpus  # noqa: E402
from topic_lm_hf.models.configuration_tcnlm import TCNLMConfig  # noqa: E402
from topic_lm_hf.models.modeling_tcnlm import TCNLMForCausalLM  # noqa: E402

DATA = Path(os.environ.get("TOPIC_LM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
PAPER_SIZES = {"small": dict(embedding_size=300, hidden_size=600, layers=1),
               "large": dict(embedding_size=300, hidden_size=900, layers=2)}
PROTOCOLS = ("paper", "causal", "causal-carry")


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


def build(kind: str, args, vocab_size: int, topic_vocab_size: int):
    torch.manual_seed(args.seed)
    if kind == "lstm":
        config = LSTMLMConfig(vocab_size=vocab_size, embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                              num_hidden_layers=args.layers, dropout=args.dropout)
        return LSTMLMForCausalLM(config)
    config = TCNLMConfig(vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, num_topics=args.num_topics,
                         embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                         num_hidden_layers=args.layers, num_factors=args.num_factors, dropout=args.dropout,
                         lm_type=kind, kl_annealing_steps=args.kl_annealing_steps)
    return TCNLMForCausalLM(config)


def train(model, rows, collator, args, out_dir: Path) -> dict:
    counting = CountingCollator(collator)
    targs = TrainingArguments(output_dir=str(out_dir), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                              learning_rate=args.lr, max_grad_norm=args.clip, lr_scheduler_type="linear",
                              warmup_steps=max(1, args.steps // 50), logging_steps=max(1, args.steps // 10),
                              save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                              seed=args.seed, dataloader_num_workers=0)
    trainer = TopicLMTrainer(model=model, args=targs, train_dataset=rows, data_collator=counting)
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


def interleaved_step_times(models: dict, collators: dict, rows: dict, args, repeats: int) -> dict:
    """Median seconds per training step (fwd + bwd + Adam) of each model, steps interleaved on identical batches."""
    times = {name: [] for name in models}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-6) for name, m in models.items()}
    n = len(next(iter(rows.values())))
    for r in range(repeats + 2):
        idx = [(r * args.batch_size + i) % n for i in range(args.batch_size)]
        for name, model in models.items():
            batch = collators[name]([rows[name][i] for i in idx])
            model.train()
            start = time.perf_counter()
            model(**batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            if r >= 2:  # two warm-up rounds
                times[name].append((time.perf_counter() - start, int((batch["labels"][..., 1:] != -100).sum())))
    model_times = {}
    for name, values in times.items():
        model_times[name] = {"step_s": statistics.median(t for t, _ in values),
                             "tokens_per_s": sum(k for _, k in values) / sum(t for t, _ in values)}
        models[name].eval()
    return model_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper-size", choices=sorted(PAPER_SIZES), default=None,
                        help="use the paper's small (1x600) or large (2x900) LM size")
    parser.add_argument("--table6", action="store_true",
                        help="Table 6 comparison: LSTM vs naive MoE vs TCNLM, 30 topics, 1 x 100 hidden units")
    parser.add_argument("--embedding-size", type=int, default=256)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--num-topics", type=int, default=50)
    parser.add_argument("--num-factors", type=int, default=None, help="n_f (default: the hidden size)")
    parser.add_argument("--dropout", type=float, default=0.4)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate (linear decay to 0)")
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--kl-annealing-steps", type=int, default=300,
                        help="TCNLM's KL weight rises from 0 to 1 over these steps (not in the paper; without it "
                             "the topic posterior collapsed to the prior on this data)")
    parser.add_argument("--min-freq", type=int, default=10)
    parser.add_argument("--max-train-docs", type=int, default=None)
    parser.add_argument("--max-valid-docs", type=int, default=None)
    parser.add_argument("--speed-repeats", type=int, default=10, help="interleaved timing steps per model")
    parser.add_argument("--skip-npmi", action="store_true")
    parser.add_argument("--npmi-max-documents", type=int, default=None, help="first N Wikipedia articles only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="/tmp/benchmark_tcnlm")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.table6:
        args.num_topics, args.hidden_size, args.embedding_size, args.layers = 30, 100, 100, 1
    if args.paper_size:
        size = PAPER_SIZES[args.paper_size]
        args.embedding_size, args.hidden_size, args.layers = size["embedding_size"], size["hidden_size"], size["layers"]
    args.num_factors = args.num_factors or args.hidden_size
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    t_start = time.perf_counter()

    train_docs = load_documents(DATA / "apnews" / "train.txt", max_documents=args.max_train_docs)
    valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.max_valid_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords=DATA / "stopwords" / "mallet_en.txt")
    print(f"APNEWS train {len(train_docs)} docs, valid {len(valid_docs)} docs; V = {len(tok)}, "
          f"V_c = {len(topic_tok)} (incl. <unk>)", flush=True)

    kinds = ["lstm", "naive_moe", "tcnlm"] if args.table6 else ["lstm", "tcnlm"]
    collators = {kind: TopicContextCollator(tok, topic_tok if kind != "lstm" else None,
                                            context="others" if kind != "lstm" else "none")
                 for kind in kinds}
    rows = {kind: collators[kind].prepare(train_docs) for kind in kinds}
    models, results = {}, {}
    for kind in kinds:
        model = build(kind, args, len(tok), len(topic_tok))
        n_params = sum(p.numel() for p in model.parameters())
        print(f"\n== training {kind} ({n_params / 1e6:.2f} M parameters) for {args.steps} steps", flush=True)
        stats = train(model, rows[kind], collators[kind], args, Path(args.output_dir) / kind)
        print(f"   {stats['tokens']:,} tokens in {stats['seconds']:.0f} s = {stats['tokens_per_s']:,.0f} tokens/s",
              flush=True)
        stats["parameters"] = n_params
        for protocol in PROTOCOLS:
            result = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok)
            stats[protocol] = result["perplexity"]
            stats["eval_tokens"] = result["tokens"]
            print(f"   {protocol}: perplexity {result['perplexity']:.2f} ({result['tokens']:,} tokens)", flush=True)
        if kind != "lstm":
            result = evaluate_perplexity(model, valid_docs, "paper", tokenizer=tok, topic_tokenizer=topic_tok,
                                         mismatched_context=True)
            stats["paper-mismatched"] = result["perplexity"]
            print(f"   paper, context of another chunk (ablation): perplexity {result['perplexity']:.2f}", flush=True)
        models[kind], results[kind] = model, stats

    reference = None
    if not args.skip_npmi:
        start = time.perf_counter()
        reference = load_reference_corpus(DATA / "wiki" / "articles.jsonl.gz", max_documents=args.npmi_max_documents)
        print(f"\n== NPMI reference: {reference.description} ({time.perf_counter() - start:.0f} s to load)", flush=True)
    for kind in kinds:
        if kind == "lstm":
            continue
        if reference is not None:
            topics = evaluate_topics(models[kind], reference, topic_tokenizer=topic_tok)
            results[kind].update(npmi=topics["npmi"], diversity=topics["diversity"], top_words=topics["top_words"],
                                 coherence=topics["coherence"])
        else:
            results[kind]["top_words"] = models[kind].get_topics(top_n=10, topic_tokenizer=topic_tok)

    # Last: these timing steps update the models (Adam, lr 1e-6), so every quality number comes first.
    print(f"\n== interleaved speed measurement ({args.speed_repeats} steps per model)", flush=True)
    speed = interleaved_step_times(models, collators, rows, args, args.speed_repeats)
    for kind in kinds:
        results[kind]["interleaved_tokens_per_s"] = speed[kind]["tokens_per_s"]

    # ------------------------------------------------------------------------------------------
    # the table
    # ------------------------------------------------------------------------------------------
    lstm = results["lstm"]
    cpu = platform.processor() or platform.machine()
    title = "Table 6 setting (30 topics, 1 x 100 hidden units)" if args.table6 else (
        f"paper {args.paper_size} size" if args.paper_size else "CPU size")
    print(f"\n### TCNLM vs LSTM on APNEWS ({title})\n")
    print(f"Data: `apnews/train.txt` ({len(train_docs)} documents) for training, `apnews/valid.txt` "
          f"({len(valid_docs)} documents, {lstm['eval_tokens']:,} predicted tokens) for every number below. "
          f"V = {len(tok):,}, V_c = {len(topic_tok):,}. Sizes: E = {args.embedding_size}, H = {args.hidden_size}, "
          f"{args.layers} layer(s), {args.num_topics} topics, n_f = {args.num_factors}, dropout {args.dropout}. "
          f"Training: {args.steps} steps of {args.batch_size} 30-token chunks, Adam lr {args.lr} (linear decay), "
          f"gradient clip {args.clip}, TCNLM context = document minus sentence; {args.threads} CPU thread(s) "
          f"({cpu}), torch {torch.__version__}.\n")
    header = "| model | params | ppl paper | ppl causal | ppl causal-carry | ppl paper, another chunk's context | NPMI (wiki, lau2014) | diversity (top-25) " \
             "| train tokens/s | ratio to LSTM | interleaved ratio |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    names = {"lstm": "LSTM", "tcnlm": "TCNLM", "naive_moe": "naive MoE"}
    for kind in kinds:
        r = results[kind]
        npmi = f"{r['npmi']:.3f}" if "npmi" in r else "-"
        div = f"{r['diversity']:.3f}" if "diversity" in r else "-"
        ratio = r["tokens_per_s"] / lstm["tokens_per_s"]
        inter = r["interleaved_tokens_per_s"] / lstm["interleaved_tokens_per_s"]
        mismatched = f"{r['paper-mismatched']:.2f}" if "paper-mismatched" in r else "-"
        print(f"| {names[kind]} | {r['parameters'] / 1e6:.2f} M | {r['paper']:.2f} | {r['causal']:.2f} | "
              f"{r['causal-carry']:.2f} | {mismatched} | {npmi} | {div} | {r['tokens_per_s']:,.0f} | {ratio:.2f} | {inter:.2f} |")
    for kind in kinds:
        if kind == "lstm":
            continue
        change = {p: 100 * (results[kind][p] / lstm[p] - 1) for p in PROTOCOLS}
        print(f"\n{names[kind]} vs LSTM perplexity: " + ", ".join(f"{p} {c:+.1f} %" for p, c in change.items()))
        print(f"\n{names[kind]}: 10 of its {args.num_topics} topics (top words from beta):\n")
        for k, words in enumerate(results[kind]["top_words"][:10]):
            print(f"- topic {k}: {' '.join(words)}")
    print(f"\nTotal time {(time.perf_counter() - t_start) / 60:.1f} min.")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
