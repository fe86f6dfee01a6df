"""Why a topic model's language model is worse than the same-size LSTM once its topics are taken away: each
hypothesis as a training run that changes one thing, at one fixed budget, against the LSTM trained the same way.

Every run is one of the unified benchmark's models (``benchmarking.MODELS``, E = H = 128, 50 topics, APNEWS
``train.txt`` with the benchmark's vocabularies) with configuration values (or the training's ``lr`` and ``clip``)
changed (``--variant NAME=MODEL[:key=value,...]``), trained ``--steps`` steps of ``--batch-size`` documents from the
same seed and in the same batch order (``train_for_steps``: Adam, linear warm-up and decay, the fast path), then
evaluated on the first ``--valid-docs`` documents of ``valid.txt`` under the model's own protocol (``paper`` for the
chunk-trained topic models, which read the document minus the sentence, as the papers; ``causal`` for the LSTM and
GBN/rGBN-RNN):

* with its own document's context, and
* with another document's (``mismatched_context=True``): what the model is worth without its topics.

The table gives both as a change against the LSTM (positive: better than the LSTM). A fixed budget is not a
converged run: the table says so, and a hypothesis that matters at this budget is one to test to convergence.
Each run's result is kept in ``<out>/<variant>/result.json``; a rerun skips the runs already done.

    python scripts/diagnose_topic_gap.py --out out/diagnosis                      # the default hypotheses
    python scripts/diagnose_topic_gap.py --variant base=tcnlm 'flat=tcnlm:topic_factor_spread=0.0' --steps 200
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from topic_lm_hf import build_vocabularies, load_documents
from topic_lm_hf.evaluation import evaluate_perplexity

from benchmark_training import train_for_steps
from benchmarking import (CLASSES, DATA, MODELS, SIZES, TRAINING_FLAGS, add_common_arguments, build_model,
                          make_collator, read_json, write_json)

# values that change the training rather than the configuration: the learning rate and the gradient-norm clip
TRAINING_VALUES = ("lr", "clip")
# name -> (benchmark model, configuration values changed, the hypothesis it tests)
DEFAULT_VARIANTS = {
    "lstm": ("lstm", {}, "the reference"),
    "tcnlm": ("tcnlm", {}, "TCNLM as the benchmark trains it"),
    "tcnlm-flat-start": ("tcnlm", {"topic_factor_spread": 0.0},
                         "initialisation: every topic starts as the same LSTM (W_b t = U_b t = 1)"),
    "tcnlm-per-token-topic-terms": ("tcnlm", {"diversity_weight": 0.0, "topic_loss_normalization": "lm_tokens"},
                                    "the topic model's terms pulling on shared weights: weighed per predicted token "
                                    "(heavier), no diversity term"),
    "tcnlm-loose-clip": ("tcnlm", {"clip": 5.0}, "one gradient-norm clip for the topic model and the LM: the topic "
                                                 "terms' gradients shrink the LM's step"),
    "tcnlm-lr-half": ("tcnlm", {"lr": 1e-3}, "the step size: half the LSTM's learning rate"),
    "tcnlm-recipe": ("tcnlm-recipe", {}, "the steering recipe's configuration (the shared topic output prior), "
                                         "without its topic-model pre-training"),
    "nclm-leta": ("nclm-leta", {}, "NCLM LETA as the benchmark trains it"),
    "nclm-leta-no-topic-loss": ("nclm-leta", {"alpha": 0.0}, "the topic model's loss share pulling on shared "
                                                             "weights (alpha = 0)"),
    "topic-lstm": ("topic-lstm", {}, "TopicLSTM as the benchmark trains it"),
}


def parse_variant(text: str) -> tuple[str, tuple[str, dict, str]]:
    """``NAME=MODEL[:key=value,...]`` -> (NAME, (MODEL, values, "")); values are read as JSON where they parse."""
    name, _, spec = text.partition("=")
    model, _, values = spec.partition(":")
    if not name or model not in MODELS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=MODEL[:key=value,...] with MODEL one of "
                                         f"{sorted(MODELS)}")
    options = {}
    for item in filter(None, values.split(",")):
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return name, (model, options, "")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", nargs="+", type=parse_variant, default=None, metavar="NAME=MODEL[:k=v,...]",
                        help="the runs (default: the hypotheses of DEFAULT_VARIANTS); one must be the LSTM")
    parser.add_argument("--steps", type=int, default=1500, help="training steps of every run")
    parser.add_argument("--valid-docs", type=int, default=300, help="first N documents of valid.txt")
    parser.add_argument("--out", default="out/diagnosis", help="a folder per run, and table.md")
    add_common_arguments(parser, *TRAINING_FLAGS, "--batch-size", "--dropout", "--lr", "--clip",
                         "--kl-annealing-steps", "--alpha", "--min-freq", "--threads", "--seed", batch_size=4,
                         helps={"batch_size": "training documents per step (about 60 sentence chunks)"})
    args = parser.parse_args(argv)
    args.variants = dict(args.variant) if args.variant else DEFAULT_VARIANTS
    if not any(model == "lstm" for model, _, _ in args.variants.values()):
        parser.error("one run must be the LSTM (--variant lstm=lstm): every figure is against it")
    for name, (model, values, _) in args.variants.items():
        config = CLASSES[MODELS[model]["family"]].config_class()
        unknown = [key for key in values if key not in TRAINING_VALUES and not hasattr(config, key)]
        if unknown:
            parser.error(f"{name}: {type(config).__name__} has no option {unknown[0]!r}")
    for key, value in SIZES["cpu"].items():
        setattr(args, key, value)
    args.layers, args.num_factors, args.topic_sizes = 1, args.hidden_size, [args.num_topics]
    args.device = "cpu"
    return args


def run(name: str, spec, args, tok, topic_tok, train_docs, valid_docs) -> dict:
    model_name, values, _ = spec
    out = Path(args.out) / name
    done = read_json(out / "result.json")
    if done is not None:
        return done
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model = build_model(model_name, args, tok, topic_tok)
    config_values = {k: v for k, v in values.items() if k not in TRAINING_VALUES}
    if config_values:
        torch.manual_seed(args.seed)
        model = type(model)(type(model.config).from_dict({**model.config.to_dict(), **config_values}))
    documents, collator = make_collator(model_name, tok, topic_tok)
    rows = documents.prepare(train_docs)
    print(f"== {name}: {model_name} {values or ''}", flush=True)
    training = {k: v for k, v in values.items() if k in TRAINING_VALUES}
    trained = train_for_steps(model, rows, collator,
                              argparse.Namespace(**{**vars(args), "steps": args.steps, **training}), out / "trainer")
    topics = MODELS[model_name]["family"] != "lstm"
    protocol = "causal" if not topics or MODELS[model_name]["context"] == "preceding" else "paper"
    result = {"model": model_name, "values": values, "steps": args.steps, "protocol": protocol,
              "train_seconds": trained["seconds"], "tokens_per_s": trained["tokens_per_s"]}
    with torch.no_grad():
        own = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok if topics
                                  else None)
        result["own"] = own["perplexity"]
        if topics:
            other = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                        mismatched_context=True)
            result["mismatched"] = other["perplexity"]
    print(f"   {protocol}: own {result['own']:.2f}" + (f", another document's {result['mismatched']:.2f}"
                                                       if topics else ""), flush=True)
    write_json(out / "result.json", result)
    return result


def table(results: dict, variants: dict, args) -> list[str]:
    lstm = next(results[n] for n, (m, _, _) in variants.items() if m == "lstm")
    lines = [f"APNEWS, E = H = 128, 50 topics, {args.steps} steps of {args.batch_size} documents (not converged), the "
             f"first {args.valid_docs} validation documents; LSTM `causal` perplexity {lstm['own']:.2f}. Change "
             "against it, positive = better than the LSTM.", "",
             "| run | hypothesis | protocol | perplexity, own context | another document's | own, vs LSTM | "
             "another's, vs LSTM (the LM without its topics) |", "|---|---|---|---|---|---|---|"]
    for name, (model, values, hypothesis) in variants.items():
        r = results[name]
        if model == "lstm":
            continue
        gain = lambda p: f"{(lstm['own'] - p) / lstm['own']:+.1%}"  # noqa: E731
        changed = ", ".join(f"`{k}={v}`" for k, v in values.items())
        lines.append(f"| {name} | {hypothesis or changed or 'as the benchmark trains it'}"
                     f"{' (' + changed + ')' if hypothesis and changed else ''} | "
                     f"`{r['protocol']}` | {r['own']:.2f} | {r['mismatched']:.2f} | {gain(r['own'])} | "
                     f"{gain(r['mismatched'])} |")
    return lines


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    train_file = DATA / "apnews" / "train.txt"
    if not train_file.exists():
        raise SystemExit(f"APNEWS is absent ({train_file}): set TOPIC_LM_DATA to the folder of the corpora")
    train_docs = load_documents(train_file)
    valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.valid_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq,
                                        stopwords="mallet")
    start = time.perf_counter()
    results = {name: run(name, spec, args, tok, topic_tok, train_docs, valid_docs)
               for name, spec in args.variants.items()}
    lines = table(results, args.variants, args)
    (Path(args.out) / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"({time.perf_counter() - start:.0f} s)")
    return results


if __name__ == "__main__":
    main()
