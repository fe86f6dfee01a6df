"""Do the topics steer? Every topic family, as its paper trains it and with the steering recipe, on APNEWS.

One command trains the same-size LSTM and, for each topic family (TCNLM, TopicLSTM, NCLM LETA, rGBN-RNN), two
variants on ``apnews/train.txt`` with the same optimiser and schedule (steps of ``--batch-size`` 30-token
chunks; rGBN-RNN reads whole documents, ``--batch-size`` / 16 of them per step, about as many chunks), each until
its perplexity on a development split (5 % of the training documents, ``causal``) has not improved for
``--patience`` evaluations ``--eval-steps`` steps apart (at most ``--max-steps`` steps; the best weights are kept):

* ``<family>``: the paper's training and model;
* ``<family>-recipe``: the steering recipe, ``steering_recipe(family)`` (what ``topic-lm train`` does by default).
  The topic model is pre-trained alone on bags of words
  (``pretrain_topic_model``) until its objective on a development split (5 % of the training documents) has not
  improved for ``--pretrain-patience`` evaluations (at most ``--pretrain-steps`` steps; its NPMI and diversity are
  recorded), then the LM joins, with
  the shared topic output prior (``topic_output_bias="beta"``: lambda log(V_c p(w | t)) on the topic words, lambda
  learned from ``--prior-weight-init``). TopicLSTM adds its bag-of-words term (``bow_loss_weight=1``) and reads
  its topics as proportions (``theta_transform="softmax"``: theta = softmax(W z + b), the bag-of-words likelihood
  LDA's mixture of the columns of B), NCLM TCNLM's diversity regulariser (``diversity_weight``). These are
  departures from the papers, labelled as such.

Each trained model is measured on ``apnews/valid.txt``: perplexity under ``paper`` and ``causal`` and the
mismatched-context ablation under both (another document's context; ``own topics`` = ablation - protocol), its
topics (NPMI, lau2014 preset against ``wiki/articles.jsonl.gz``, and top-25 diversity; the LDA judge's topics on
the same topic vocabulary are the reference row), and steering
(``evaluate_steering``: accuracy by the model's own encoder and by an LDA judge fitted on train.txt, the top-50
topic-word lift, fluency as the perplexity of the texts under the LSTM of this run, relative to the same
model's unconditioned texts, and distinct-n) at every decode-time guidance scale of ``--guidance-scales``
(``generate(topic_ids=[k], topic_guidance_scale=s)``; s = 1 is plain conditioned generation): the accuracy
against fluency curve.

Every finished piece (the pre-trained topic model, a trained model, its perplexities and topics, each guidance
scale's steering) is written under ``<output-dir>/<variant>/`` at once (``result.json``, ``model/``), and a rerun
skips what is there: an interrupted run resumes, its training from the last checkpoint (one per evaluation).
The LSTM is the fluency judge of every variant; a process that does not train it waits for another (same
``--output-dir``) to finish it, so two single-thread processes can share the work::

    python scripts/benchmark_steering.py                          # every variant
    python scripts/benchmark_steering.py --variants lstm tcnlm tcnlm-recipe &
    python scripts/benchmark_steering.py --variants topic-lstm topic-lstm-recipe nclm-leta nclm-leta-recipe \\
        rgbn rgbn-recipe &                                         # two processes, one thread each
    python scripts/benchmark_steering.py --list                   # the variants and what each changes
    python scripts/benchmark_steering.py --table-only             # the tables from what is finished

The tables say for every run what stopped it (``patience``: converged; ``max_steps``: the cap).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, NCLMConfig, NCLMForCausalLM, RGBNRNNConfig,
                         RGBNRNNForCausalLM, TCNLMConfig, TCNLMForCausalLM, TopicContextCollator, TopicRNNConfig,
                         TopicRNNForCausalLM, build_vocabularies, evaluate_perplexity, evaluate_topics,
                         load_documents, steering_recipe)
from topic_lm_hf.pretraining import RECIPE_PRETRAINING
from topic_lm_hf.evaluation.steering import format_steering_table
from topic_lm_hf.models.modeling_rgbn_rnn import format_topic_tree
from topic_lm_hf.evaluation.topics import load_reference_corpus

from benchmark_training import pretrain_topic_model_once, train_to_convergence
from benchmarking import DATA, TRAINING_FLAGS, add_common_arguments, cached_lda_judge, fluent_setting, steer

RECIPE = "pre-trained topic model (dev early stopping) + shared topic output prior"
# name -> (family, config overrides, steering recipe?, what it is)
VARIANTS = {
    "lstm": ("lstm", {}, False, "the same-size LSTM: the baseline, and the fluency judge of every variant"),
    "tcnlm": ("tcnlm", {}, False, "TCNLM as in the paper (KL annealed)"),
    "tcnlm-recipe": ("tcnlm", steering_recipe("tcnlm"), True, f"TCNLM, {RECIPE}"),
    "topic-lstm": ("topic_rnn", {"cell": "lstm"}, False, "TopicLSTM, the paper's ELBO"),
    "topic-lstm-recipe": ("topic_rnn", {"cell": "lstm", **steering_recipe("topic_rnn")}, True,
                          f"TopicLSTM, {RECIPE}, the bag-of-words term and Gaussian softmax topic proportions"),
    "topic-lstm-recipe-causal": ("topic_rnn", {"cell": "lstm", **steering_recipe("topic_rnn"), "context": "preceding"},
                                 True, "TopicLSTM, the recipe, trained on the causal context (earlier sentences "
                                       "only: what the causal protocol gives it) instead of the paper's"),
    "nclm-leta": ("nclm", {"variant": "leta"}, False, "NCLM LETA as in the paper (alpha 0.01)"),
    "nclm-leta-recipe": ("nclm", {"variant": "leta", **steering_recipe("nclm", variant="leta")}, True,
                         f"NCLM LETA, {RECIPE}, and the diversity regulariser"),
    "rgbn": ("rgbn", {}, False, "rGBN-RNN, one topic layer, the paper's ELBO and TLASGR-MCMC"),
    "rgbn-recipe": ("rgbn", steering_recipe("rgbn_rnn"), True, f"rGBN-RNN, {RECIPE}"),
    "rgbn3-recipe": ("rgbn", {**steering_recipe("rgbn_rnn"), "hierarchy": (1.0, 0.4, 0.2)}, True,
                     f"rGBN-RNN with three topic layers (T, 0.4 T, 0.2 T topics: 50, 20, 10), {RECIPE}; steered "
                     f"at every layer"),
}


def build(name: str, args, tok, topic_tok):
    family, overrides, _, _ = VARIANTS[name]
    torch.manual_seed(args.seed)
    sizes = dict(embedding_size=args.embedding_size, dropout=args.dropout)
    overrides = {k: v for k, v in overrides.items() if k != "context"}  # the collator's, not the config's
    if overrides.get("topic_output_bias") == "beta":
        overrides["topic_prior_weight_init"] = args.prior_weight_init
    if family == "lstm":
        return LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), hidden_size=args.hidden_size, **sizes))
    if family == "rgbn":
        topic_sizes = [max(1, round(f * args.num_topics)) for f in overrides.pop("hierarchy", (1.0,))]
        config = RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=topic_sizes,
                                               hidden_sizes=[args.hidden_size] * len(topic_sizes),
                                               tlasgr_seed=args.seed, **sizes, **overrides)
        return RGBNRNNForCausalLM(config)
    common = dict(num_topics=args.num_topics, hidden_size=args.hidden_size, **sizes, **overrides)
    if family == "tcnlm":
        return TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, kl_annealing_steps=args.kl_annealing_steps,
                                                            **common))
    if family == "nclm":
        return NCLMForCausalLM(NCLMConfig.from_tokenizers(tok, topic_tok, alpha=args.alpha, **common))
    return TopicRNNForCausalLM(TopicRNNConfig.from_tokenizers(tok, topic_tok, **common))


def write(path: Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=1, default=str))


def train_variant(name, args, tok, topic_tok, train_docs, dev_docs, mdir: Path, reference):
    """Train one variant until its development perplexity (``causal``, the 5 % split) stops improving, resumably:
    the recipe's topic-model pre-training first (saved, so a rerun does not repeat it), then the joint run
    (``train_to_convergence``). Returns (its result, the model with its best weights)."""
    family, overrides, recipe, what = VARIANTS[name]
    model = build(name, args, tok, topic_tok)
    # the family's documented training batches (a variant may train on another context)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, context=overrides.get("context"))
    rows = collator.prepare(train_docs)
    result = {"variant": name, "family": family, "overrides": overrides, "recipe": recipe, "what": what}
    # rGBN-RNN reads whole documents: a sixteenth as many rows per step is about as many sentences as the others'
    per_step = (lambda n: max(1, n // 16)) if getattr(model, "reads_documents", False) else (lambda n: n)
    if recipe:
        def topics(model):  # the topics the LM starts from
            t = evaluate_topics(model, reference(), topic_tokenizer=topic_tok)
            return {"topics": {k: t[k] for k in ("npmi", "diversity")}}

        settings = {"steps": args.pretrain_steps, "learning_rate": args.pretrain_lr,
                    "batch_size": args.pretrain_batch_size, "eval_every": args.pretrain_eval_every,
                    "patience": args.pretrain_patience}
        pretraining = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining",
                                                     context=overrides.get("context"))
        model, result["pretraining"] = pretrain_topic_model_once(model, pretraining.prepare(train_docs), pretraining,
                                                                 pretraining.prepare(dev_docs), mdir, settings,
                                                                 seed=args.seed, measure=topics)
    step_args = argparse.Namespace(**vars(args))
    step_args.batch_size = per_step(args.batch_size)
    result.update(train_to_convergence(name, model, rows, collator, step_args, mdir, tok,
                                       None if family == "lstm" else topic_tok, dev_docs, "causal"))
    return result, AutoModelForCausalLM.from_pretrained(mdir / "model").eval()


def measure(name, model, result, args, tok, topic_tok, valid_docs, reference, path: Path) -> None:
    """Perplexities, the ablation and the topics (each written as soon as it is there)."""
    if "paper" not in result:
        for protocol in ("paper", "causal"):
            result[protocol] = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok,
                                                   topic_tokenizer=topic_tok)["perplexity"]
        for protocol in ("paper", "causal") if VARIANTS[name][0] != "lstm" else ():
            result[f"{protocol}-mismatched"] = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok,
                                                                   topic_tokenizer=topic_tok,
                                                                   mismatched_context=True)["perplexity"]
        write(path, result)
    if VARIANTS[name][0] != "lstm" and "topics" not in result:
        topics = evaluate_topics(model, reference(), topic_tokenizer=topic_tok)
        result["topics"] = {k: topics[k] for k in ("npmi", "diversity")}
        result["top_words"] = model.get_topics(top_n=10, topic_tokenizer=topic_tok)
        for layer in range(2, len(getattr(model.config, "topic_sizes", [])) + 1):  # a hierarchy: every layer
            topics = evaluate_topics(model, reference(), topic_tokenizer=topic_tok, layer=layer)
            result.setdefault("topics_by_layer", {})[str(layer)] = {k: topics[k] for k in ("npmi", "diversity")}
            result["tree"] = format_topic_tree(model.topic_tree(top_n=6, num_children=3, topic_tokenizer=topic_tok))
        write(path, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--table-only", action="store_true", help="print the tables of the finished variants")
    parser.add_argument("--guidance-scales", type=float, nargs="+", default=[1.0, 1.5, 2.0, 3.0],
                        help="decode-time topic guidance scales to steer at (1: plain conditioned generation)")
    parser.add_argument("--prior-weight-init", type=float, default=1.0,
                        help="lambda of the shared topic output prior at the start of joint training (recipe)")
    parser.add_argument("--pretrain-steps", type=int, default=RECIPE_PRETRAINING["steps"],
                        help="cap on topic-model pre-training steps (the recipe's pre-training: RECIPE_PRETRAINING)")
    parser.add_argument("--pretrain-lr", type=float, default=RECIPE_PRETRAINING["learning_rate"])
    parser.add_argument("--pretrain-batch-size", type=int, default=RECIPE_PRETRAINING["batch_size"])
    parser.add_argument("--pretrain-eval-every", type=int, default=RECIPE_PRETRAINING["eval_every"])
    parser.add_argument("--pretrain-patience", type=int, default=RECIPE_PRETRAINING["patience"])
    parser.add_argument("--dev-fraction", type=float, default=0.05,
                        help="training documents held out for the pre-training's early stopping")
    parser.add_argument("--embedding-size", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-topics", type=int, default=50)
    parser.add_argument("--output-dir", default="out/benchmark_steering")
    parser.add_argument("--max-steps", type=int, default=20000,
                        help="the cap on joint-training steps (the linear schedule decays to 0 there)")
    parser.add_argument("--eval-steps", type=int, default=500, help="dev evaluation (and checkpoint) every N steps")
    parser.add_argument("--patience", type=int, default=3, help="stop after N dev evaluations without improvement")
    add_common_arguments(parser, *TRAINING_FLAGS, "--batch-size", "--dropout", "--lr", "--clip",
                         "--kl-annealing-steps", "--alpha", "--min-freq", "--max-train-docs", "--max-valid-docs",
                         "--npmi-max-documents", "--steer-topics", "--steer-samples", "--max-new-tokens",
                         "--threads", "--seed")
    args = parser.parse_args()
    if args.list:
        for name, (family, overrides, recipe, what) in VARIANTS.items():
            print(f"{name:20s} {what}")
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
    all_docs = load_documents(DATA / "apnews" / "train.txt", max_documents=args.max_train_docs)
    valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.max_valid_docs)
    order = np.random.default_rng(0).permutation(len(all_docs))
    n_dev = max(1, int(np.ceil(args.dev_fraction * len(all_docs))))
    dev_docs = all_docs.select(sorted(order[:n_dev].tolist()))
    train_docs = all_docs.select(sorted(order[n_dev:].tolist()))
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq,
                                        stopwords="mallet")
    print(f"APNEWS train {len(train_docs)} docs (+ {len(dev_docs)} development), valid {len(valid_docs)}; "
          f"V = {len(tok)}, V_c = {len(topic_tok)}; E = {args.embedding_size}, H = {args.hidden_size}, "
          f"T = {args.num_topics}; until the dev perplexity (causal) has not improved for {args.patience} "
          f"evaluations {args.eval_steps} steps apart, at most {args.max_steps} steps", flush=True)
    if not args.table_only:
        (out / "args.json").write_text(json.dumps(vars(args), indent=1))
    judge = cached_lda_judge(out / f"lda_judge_T{args.num_topics}", train_docs, topic_tok, args.num_topics,
                             args.seed)
    cache = {}

    def reference():
        if "wiki" not in cache:
            cache["wiki"] = load_reference_corpus(DATA / "wiki" / "articles.jsonl.gz",
                                                  max_documents=args.npmi_max_documents)
        return cache["wiki"]

    def fluency():
        if "lstm" not in cache:
            while not (out / "lstm" / "result.json").exists() or "paper" not in read(out / "lstm"):
                time.sleep(20)
            cache["lstm"] = LSTMLMForCausalLM.from_pretrained(out / "lstm" / "model").eval()
        return cache["lstm"]

    lda_path = out / f"lda_topics_T{args.num_topics}.json"
    if not args.table_only and not lda_path.exists():  # the reference: LDA's topics on the same topic vocabulary
        topics = evaluate_topics(judge, reference(), topic_tokenizer=topic_tok)
        write(lda_path, {"what": judge.description, **{k: topics[k] for k in ("npmi", "diversity", "top_words")}})
    names = [v for v in VARIANTS if v in args.variants]
    for name in [] if args.table_only else names:
        mdir, path = out / name, out / name / "result.json"
        mdir.mkdir(exist_ok=True)
        if path.exists():
            result = read(mdir)
            model = AutoModelForCausalLM.from_pretrained(mdir / "model").eval()
            print(f"== {name}: trained earlier", flush=True)
        else:
            print(f"\n== {name}: {VARIANTS[name][3]}", flush=True)
            result, model = train_variant(name, args, tok, topic_tok, train_docs, dev_docs, mdir, reference)
            write(path, result)
        measure(name, model, result, args, tok, topic_tok, valid_docs, reference, path)
        if name == "lstm":
            continue
        layers = [None] + list(range(2, len(getattr(model.config, "topic_sizes", [])) + 1))
        for scale, layer in [(scale, layer) for layer in layers for scale in args.guidance_scales]:
            key = f"{scale:g}" + ("" if layer is None else f", layer {layer}")
            if key in result.get("steering", {}):
                continue
            r = steer(model, args, tok, topic_tok, judge, fluency(), topic_guidance_scale=scale, topic_layer=layer)
            result.setdefault("steering", {})[key] = r
            write(path, result)
            print(f"   {name}, guidance {key}: LDA judge {r['accuracy_lda']:.3f}, own {r['accuracy_own']:.3f}, lift "
                  f"{r['lift'] or 0:.2f}, fluency ratio {r['fluency_ratio'] or 0:.2f}", flush=True)
    print_tables(out, names, args)


def by_scale(item) -> tuple:
    """Sort key of a ``(setting, result)`` steering item: the guidance scale, then the layer ("2, layer 3")."""
    scale, _, layer = item[0].partition(", layer ")
    return float(scale), int(layer or 0)


def read(mdir: Path) -> dict:
    return json.loads((mdir / "result.json").read_text())


def print_tables(out: Path, names, args) -> None:
    results = {n: read(out / n) for n in names if (out / n / "result.json").exists()}
    if (out / "args.json").exists():  # the settings the runs were trained with
        args = argparse.Namespace(**json.loads((out / "args.json").read_text()))
    lstm = results.get("lstm")
    print(f"\n### Steering and topic use on APNEWS (valid.txt; E = H = {args.embedding_size}/{args.hidden_size}, "
          f"T = {args.num_topics}, batches of {args.batch_size} chunks, Adam {args.lr}, dropout {args.dropout}, seed "
          f"{args.seed}; each run until its dev perplexity (causal) had not improved for {args.patience} evaluations "
          f"{args.eval_steps} steps apart, at most {args.max_steps} steps)\n")
    print("| variant | pre-training: steps (what stopped it), NPMI / diversity | joint: best step / trained (what "
          "stopped it) | ppl paper | ppl causal | vs LSTM (causal) | own topics under causal (ablation - causal) | "
          "own topics under paper | NPMI | diversity |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if "paper" not in r:
            continue
        pre = r.get("pretraining")
        pre_cell = "-"
        if pre:
            pre_cell = f"{pre['steps']} ({pre['stopped_by']})"
            if "topics" in pre:
                pre_cell += f", {pre['topics']['npmi']:.3f} / {pre['topics']['diversity']:.2f}"
        own = {p: f"{r[p + '-mismatched'] - r[p]:.2f}" if p + "-mismatched" in r else "-" for p in ("paper", "causal")}
        versus = "-"
        if lstm and "paper" in lstm and name != "lstm":
            gain = lstm["causal"] - r["causal"]
            versus = f"{100 * gain / lstm['causal']:+.1f} %"
            if gain > 0 and "causal-mismatched" in r:
                own["causal"] += f" ({100 * (r['causal-mismatched'] - r['causal']) / gain:.0f} % of the gain)"
        topics = {"npmi": float("nan"), "diversity": float("nan"), **(r.get("topics") or {})}
        print(f"| {name} | {pre_cell} | {r.get('best_step', '?')} / {r.get('steps_trained', '?')} "
              f"({r.get('stopped_by', '?')}) | {r['paper']:.2f} | {r['causal']:.2f} | {versus} | {own['causal']} | "
              f"{own['paper']} | {topics['npmi']:.3f} | {topics['diversity']:.2f} |")
    lda_path = out / f"lda_topics_T{args.num_topics}.json"
    if lda_path.exists():
        lda = json.loads(lda_path.read_text())
        print(f"| reference: {lda['what']} (the LDA judge), same topic vocabulary | - | - | - | - | - | - | - | "
              f"{lda['npmi']:.3f} | {lda['diversity']:.2f} |")
    steering = {f"{name}, s = {scale}": s for name, r in results.items()
                for scale, s in sorted(r.get("steering", {}).items(), key=by_scale)}
    if steering:
        print()
        print(format_steering_table(steering))
    for name, r in results.items():
        if r.get("topics_by_layer"):
            layers = ", ".join(f"layer {l}: NPMI {t['npmi']:.3f}, diversity {t['diversity']:.2f}"
                               for l, t in r["topics_by_layer"].items())
            print(f"\n{name}: topics of the upper layers (projected down to words): {layers}; the hierarchy "
                  f"(every top topic, its three heaviest children, recursively):\n")
            print("\n".join("    " + line for line in r["tree"].splitlines()))
    for name, r in results.items():
        if not r.get("steering"):
            continue
        best, why = fluent_setting(r["steering"])
        print(f"\n{name}: steered samples at guidance {best} ({why})")
        for row in r["steering"][best]["per_topic"][:3]:
            print(f"- topic {row['topic']} ({' '.join(row['top_words'][:8])}): {row['texts'][0]}")


if __name__ == "__main__":
    main()
