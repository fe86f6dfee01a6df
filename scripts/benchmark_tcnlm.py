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
* for the topic models, an ablation: ``paper`` with every chunk given the context of a chunk of
  another document (``evaluate_perplexity(..., mismatched_context=True)``): what the
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
import platform
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from topic_lm_hf import (LSTMLMForCausalLM, TCNLMForCausalLM, TopicContextCollator, build_vocabularies,
                         evaluate_perplexity, load_documents)
from topic_lm_hf.evaluation.topic_eval import evaluate_topics
from topic_lm_hf.evaluation.topics import load_reference_corpus

from benchmark_training import train_for_steps
from benchmarking import (DATA, PROTOCOLS, TRAINING_FLAGS, add_common_arguments, build_lstm, build_tcnlm,
                          interleaved_step_times)

PAPER_SIZES = {"small": dict(embedding_size=300, hidden_size=600, layers=1),
               "large": dict(embedding_size=300, hidden_size=900, layers=2)}


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
    parser.add_argument("--skip-npmi", action="store_true")
    parser.add_argument("--output-dir", default="/tmp/benchmark_tcnlm")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    add_common_arguments(parser, *TRAINING_FLAGS, "--steps", "--batch-size", "--dropout", "--lr", "--clip", "--kl-annealing-steps",
                         "--min-freq", "--max-train-docs", "--max-valid-docs", "--npmi-max-documents",
                         "--speed-repeats", "--threads", "--seed", steps=1200)
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
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords="mallet")
    print(f"APNEWS train {len(train_docs)} docs, valid {len(valid_docs)} docs; V = {len(tok)}, "
          f"V_c = {len(topic_tok)} (incl. <unk>)", flush=True)

    kinds = ["lstm", "naive_moe", "tcnlm"] if args.table6 else ["lstm", "tcnlm"]
    collators = {kind: TopicContextCollator.for_model(LSTMLMForCausalLM if kind == "lstm" else TCNLMForCausalLM, tok,
                                                      topic_tok)  # TCNLM's training context: "others"
                 for kind in kinds}
    rows = {kind: collators[kind].prepare(train_docs) for kind in kinds}
    models, results = {}, {}
    for kind in kinds:
        model = build_lstm(args, len(tok)) if kind == "lstm" else build_tcnlm(args, len(tok), len(topic_tok), kind)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"\n== training {kind} ({n_params / 1e6:.2f} M parameters) for {args.steps} steps", flush=True)
        stats = train_for_steps(model, rows[kind], collators[kind], args, Path(args.output_dir) / kind)
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
            print(f"   paper, context of another document (ablation): perplexity {result['perplexity']:.2f}",
                  flush=True)
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
    header = "| model | params | ppl paper | ppl causal | ppl causal-carry | ppl paper, another document's context | NPMI (wiki, lau2014) | diversity (top-25) " \
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
