"""Do the topics steer? Topic-model variants against the same-size LSTM on APNEWS, one run.

Every variant is trained on ``apnews/train.txt`` with the same batches, optimiser and schedule as
``scripts/benchmark_tcnlm.py`` (30-token chunks, context = document minus the sentence), then
measured on ``apnews/valid.txt``:

* perplexity under ``paper`` and ``causal``, and the mismatched-context ablation (``paper`` with
  another chunk's context): ``gain from own topics`` = ablation - paper;
* what the LM is conditioned on: the mean normalised entropy H(t) / log T of the topic proportions
  of the validation contexts, their mean largest entry, and how many topics are some context's
  largest (TCNLM; TopicRNN's theta is not a distribution);
* steering (``topic_lm_hf.evaluate_steering``): topic accuracy by the model's own encoder and by an
  LDA judge fitted on train.txt, the top-50 topic-word lift, fluency (perplexity of the generated
  text under the LSTM trained in this run) and Dist-n.

Each finished variant is written to ``<output-dir>/<variant>/result.json`` (and its weights next to
it) and skipped when the script is run again, so an interrupted run resumes. Variants::

    python scripts/benchmark_steering.py --variants lstm tcnlm tcnlm-pretrain tcnlm-spread tcnlm-gumbel
    python scripts/benchmark_steering.py --list      # every variant and what it changes
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TCNLMConfig, TCNLMForCausalLM, TopicContextCollator,
                         TopicRNNConfig, TopicRNNForCausalLM, build_vocabularies, evaluate_perplexity, load_documents,
                         pretrain_topic_model)
from topic_lm_hf.benchmark_training import train_for_steps
from topic_lm_hf.benchmarking import DATA, TRAINING_FLAGS, add_common_arguments, cached_lda_judge, steer
from topic_lm_hf.evaluation.steering import format_steering_table

# name -> (family, config overrides, topic-model pre-training steps, what it tests)
VARIANTS = {
    "lstm": ("lstm", {}, 0, "the same-size LSTM: baseline, and the fluency judge of every variant"),
    "tcnlm": ("tcnlm", {}, 0, "TCNLM as in the paper (this package's defaults)"),
    "tcnlm-pretrain": ("tcnlm", {}, 300, "topic model pre-trained alone for 300 steps first"),
    "tcnlm-spread": ("tcnlm", {"topic_factor_spread": 1.0}, 0, "topic factors W_b, U_b start as U(0, 2), not U(0.9, 1.1)"),
    "tcnlm-gumbel": ("tcnlm", {"lm_topic_input": "gumbel"}, 0,
                     "LM trained on one-hot topics drawn from t (straight-through Gumbel), as generation uses"),
    "tcnlm-bias": ("tcnlm", {"topic_output_bias": "learned"}, 0,
                   "a learned topic-to-vocabulary bias B t on the logits (TopicRNN/TDLM-style; not in the paper)"),
    "tcnlm-pretrain-bias": ("tcnlm", {"topic_output_bias": "learned"}, 300, "pre-training and the output bias"),
    "tcnlm-beta": ("tcnlm", {"topic_output_bias": "beta"}, 0,
                   "product of experts with the topic model: lambda log(V_c beta^T t) on topic words (not in the paper)"),
    "tcnlm-pretrain-beta": ("tcnlm", {"topic_output_bias": "beta"}, 300, "pre-training and the beta product of experts"),
    "tcnlm-pretrain-beta1": ("tcnlm", {"topic_output_bias": "beta", "topic_prior_weight_init": 1.0}, 300,
                             "pre-training and the beta product of experts, lambda starting at 1"),
    "tcnlm-pretrain-gumbel-beta": ("tcnlm", {"topic_output_bias": "beta", "lm_topic_input": "gumbel"}, 300,
                                   "pre-training, one-hot topics and the beta product of experts"),
    "tcnlm-1topic": ("tcnlm", {"num_topics": 1}, 0,
                     "a factorised LSTM without topics (T = 1): how much of TCNLM's gap is the factorisation"),
    "tcnlm-nf2h": ("tcnlm", {"num_factors_multiple": 2}, 0, "n_f = 2 H factors instead of H"),
    "tcnlm-pretrain-spread": ("tcnlm", {"topic_factor_spread": 1.0}, 300, "pre-training and spread factors"),
    "tcnlm-pretrain-gumbel": ("tcnlm", {"lm_topic_input": "gumbel"}, 300, "pre-training and one-hot topics"),
    "tcnlm-all": ("tcnlm", {"topic_factor_spread": 1.0, "lm_topic_input": "gumbel"}, 300,
                  "pre-training, spread factors and one-hot topics"),
    "topicgru": ("topic_rnn", {"cell": "gru"}, 0, "TopicGRU, the exact ELBO"),
    "topicgru-anneal": ("topic_rnn", {"cell": "gru", "kl_annealing_steps": 300}, 0,
                        "TopicGRU, KL weight annealed 0 -> 1 over 300 steps (a departure from the exact ELBO early on)"),
    "topicgru-freebits": ("topic_rnn", {"cell": "gru", "kl_free_bits": 0.1}, 0,
                          "TopicGRU, free bits: each dimension's KL counts at least 0.1 nats (not the ELBO)"),
    "topicgru-kl0.1": ("topic_rnn", {"cell": "gru", "kl_weight": 0.1}, 0, "TopicGRU, KL weight 0.1 (not the ELBO)"),
}


def build(name: str, args, tok, topic_tok):
    family, overrides, _, _ = VARIANTS[name]
    torch.manual_seed(args.seed)
    sizes = dict(embedding_size=args.embedding_size, hidden_size=args.hidden_size, dropout=args.dropout)
    overrides = dict(overrides)
    if "num_factors_multiple" in overrides:
        overrides["num_factors"] = overrides.pop("num_factors_multiple") * args.hidden_size
    if family == "lstm":
        return LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), **sizes))
    if family == "tcnlm":
        config = TCNLMConfig.from_tokenizers(tok, topic_tok, **{"num_topics": args.num_topics, "kl_annealing_steps": args.kl_annealing_steps,
                                **sizes, **overrides})
        return TCNLMForCausalLM(config)
    config = TopicRNNConfig.from_tokenizers(tok, topic_tok, **{"num_topics": args.num_topics, **sizes, **overrides})
    return TopicRNNForCausalLM(config)


@torch.no_grad()
def proportion_statistics(model, rows, collator, batch_size: int = 256) -> dict:
    """What the LM is conditioned on: entropy, largest entry and argmax spread of TCNLM's t."""
    if not isinstance(model, TCNLMForCausalLM):
        return {}
    model.eval()
    ts = []
    for start in range(0, len(rows), batch_size):
        batch = collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
        ts.append(model.infer_topics(batch["context_bow"]))
    t = torch.cat(ts).double()
    entropy = -(t * t.clamp_min(1e-30).log()).sum(-1) / math.log(t.shape[1])
    return {"t_entropy": float(entropy.mean()), "t_max": float(t.max(-1).values.mean()),
            "t_argmax_topics": int(t.argmax(-1).unique().numel())}


def run_variant(name, args, tok, topic_tok, train_docs, valid_docs, judge, fluency) -> dict:
    """Train, save and measure one variant; ``fluency()`` returns the LSTM fluency judge (waiting for it)."""
    family, overrides, pretrain_steps, what = VARIANTS[name]
    out = Path(args.output_dir) / name
    model = build(name, args, tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok)  # the family's training context ("others")
    rows = collator.prepare(train_docs)
    result = {"variant": name, "family": family, "overrides": overrides, "pretrain_steps": pretrain_steps,
              "what": what, "parameters": sum(p.numel() for p in model.parameters())}
    start = time.perf_counter()
    if pretrain_steps:
        losses = pretrain_topic_model(model, rows, collator, pretrain_steps, learning_rate=args.lr,
                                      batch_size=args.batch_size, seed=args.seed)
        result["pretrain_loss"] = [losses[0], losses[-1]]
        print(f"   pre-trained the topic model: loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    result.update(train_for_steps(model, rows, collator, args, out))
    result["train_seconds"] = time.perf_counter() - start
    model.save_pretrained(out)
    for protocol in ("paper", "causal"):
        result[protocol] = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok,
                                               topic_tokenizer=topic_tok)["perplexity"]
    if family != "lstm":
        result["paper-mismatched"] = evaluate_perplexity(model, valid_docs, "paper", tokenizer=tok,
                                                         topic_tokenizer=topic_tok,
                                                         mismatched_context=True)["perplexity"]
        valid_collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="paper")
        result.update(proportion_statistics(model, valid_collator.prepare(valid_docs), valid_collator))
        if model.config.num_topics > 1:  # one topic: nothing to steer towards
            result["steering"] = steer(model, args, tok, topic_tok, judge, fluency())
    print(f"   {name}: paper {result['paper']:.2f}, causal {result['causal']:.2f}"
          + (f", mismatched {result['paper-mismatched']:.2f}" if family != "lstm" else "")
          + (f", steering own {result['steering']['accuracy_own']:.3f} / LDA {result['steering']['accuracy_lda']:.3f}"
             if "steering" in result else ""), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["lstm", "tcnlm", "tcnlm-pretrain", "tcnlm-spread",
                                                          "tcnlm-gumbel", "topicgru"])
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--lambda-scales", type=float, nargs="*", default=[],
                        help="for finished topic_output_bias='beta' variants: also evaluate steering with the learned "
                             "lambda multiplied by each of these at generation (the steering-strength trade-off)")
    parser.add_argument("--rescore-steering", action="store_true",
                        help="re-run only the steering evaluation of finished variants, from their saved weights")
    parser.add_argument("--embedding-size", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-topics", type=int, default=50)
    parser.add_argument("--output-dir", default="out/benchmark_steering")
    add_common_arguments(parser, *TRAINING_FLAGS, "--steps", "--batch-size", "--dropout", "--lr", "--clip", "--kl-annealing-steps",
                         "--min-freq", "--steer-topics", "--steer-samples", "--max-new-tokens", "--threads", "--seed",
                         steps=500)
    args = parser.parse_args()
    if args.list:
        for name, (family, overrides, pretrain, what) in VARIANTS.items():
            print(f"{name:24s} {family:10s} {what}")
        return
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; --list shows them")
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(vars(args), indent=1))
    train_docs = load_documents(DATA / "apnews" / "train.txt")
    valid_docs = load_documents(DATA / "apnews" / "valid.txt")
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords=DATA / "stopwords" / "mallet_en.txt")
    print(f"APNEWS train {len(train_docs)} docs, valid {len(valid_docs)} docs; V = {len(tok)}, V_c = {len(topic_tok)}; "
          f"E = {args.embedding_size}, H = {args.hidden_size}, T = {args.num_topics}, {args.steps} steps", flush=True)
    judge = cached_lda_judge(out / f"lda_judge_T{args.num_topics}.pkl", train_docs, topic_tok, args.num_topics,
                             args.seed)

    # The LSTM is every variant's fluency judge: trained first when listed; a run that does not list it waits
    # for another run (in parallel, same --output-dir) to finish it.
    names = (["lstm"] if "lstm" in args.variants else []) + [v for v in args.variants if v != "lstm"]
    results, fluency_model = {}, None

    def fluency():
        nonlocal fluency_model
        if fluency_model is None:
            while not (out / "lstm" / "result.json").exists():
                time.sleep(20)
            results.setdefault("lstm", json.loads((out / "lstm" / "result.json").read_text()))
            fluency_model = LSTMLMForCausalLM.from_pretrained(out / "lstm").eval()
        return fluency_model

    for name in names:
        path = out / name / "result.json"
        if path.exists():
            results[name] = json.loads(path.read_text())
            print(f"== {name}: done earlier ({path})", flush=True)
            if args.rescore_steering and "steering" in results[name]:
                model = AutoModelForCausalLM.from_pretrained(out / name).eval()
                results[name]["steering"] = steer(model, args, tok, topic_tok, judge, fluency())
                path.write_text(json.dumps(results[name], indent=1, default=str))
        else:
            print(f"\n== {name}: {VARIANTS[name][3]}", flush=True)
            results[name] = run_variant(name, args, tok, topic_tok, train_docs, valid_docs, judge, fluency)
            path.write_text(json.dumps(results[name], indent=1, default=str))
    fluency()  # the table needs the LSTM's row
    for name in names:
        r = results[name]
        if not args.lambda_scales or r.get("overrides", {}).get("topic_output_bias") != "beta":
            continue
        model = AutoModelForCausalLM.from_pretrained(out / name).eval()
        learned = float(model.topic_prior_weight.detach())
        r["lambda"] = learned
        for scale in args.lambda_scales:
            if str(scale) in r.get("steering_by_lambda_scale", {}):
                continue
            with torch.no_grad():
                model.topic_prior_weight.fill_(learned * scale)
            r.setdefault("steering_by_lambda_scale", {})[str(scale)] = steer(model, args, tok, topic_tok, judge,
                                                                             fluency())
            (out / name / "result.json").write_text(json.dumps(r, indent=1, default=str))

    results = {"lstm": results.pop("lstm"), **results}
    lstm = results["lstm"]
    print(f"\n### Steering and topic use on APNEWS (E = H = {args.embedding_size}/{args.hidden_size}, "
          f"T = {args.num_topics}, {args.steps} steps x {args.batch_size} chunks, Adam {args.lr}, clip {args.clip}, "
          f"dropout {args.dropout}, seed {args.seed}; valid.txt)\n")
    print("| variant | ppl paper | ppl causal | ppl paper, another chunk's context | perplexity reduction vs LSTM (paper) "
          "| part from own topics | H(t)/log T | max t | topics that are some argmax |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if name == "lstm":
            print(f"| LSTM | {r['paper']:.2f} | {r['causal']:.2f} | - | - | - | - | - | - |")
            continue
        gain = lstm["paper"] - r["paper"]
        own = r["paper-mismatched"] - r["paper"]
        share = f"{own / gain:.0%}" if gain > 0 else "-"
        stats = [f"{r[k]:.3f}" if k in r else "-" for k in ("t_entropy", "t_max")] + [str(r.get("t_argmax_topics", "-"))]
        print(f"| {name} | {r['paper']:.2f} | {r['causal']:.2f} | {r['paper-mismatched']:.2f} | "
              f"{100 * gain / lstm['paper']:+.1f} % | {own:.2f} ({share}) | " + " | ".join(stats) + " |")
    print()
    steering = {name: r["steering"] for name, r in results.items() if "steering" in r}
    for name, r in results.items():
        for scale, result in r.get("steering_by_lambda_scale", {}).items():
            steering[f"{name}, lambda x {scale} ({r['lambda'] * float(scale):.2f})"] = result
    print(format_steering_table(steering))
    for name, r in results.items():
        if "steering" not in r:
            continue
        print(f"\n{name}: steered samples")
        for row in r["steering"]["per_topic"][:3]:
            print(f"- topic {row['topic']} ({' '.join(row['top_words'][:8])}): {row['texts'][0]}")


if __name__ == "__main__":
    main()
