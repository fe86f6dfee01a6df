"""NCLM (LTA, ETA, LETA, LETA+SDT) against the same-size LSTM on APNEWS: perplexity, topics, speed, steering.

NCLM is Chaudhary, Schütze & Gupta, ICML 2020 (``topic_lm_hf.NCLMForCausalLM``). Every model is
trained in this one run on ``apnews/train.txt`` and measured on ``apnews/valid.txt``, with the
settings of ``scripts/benchmark_tcnlm.py`` and the pieces of ``scripts/benchmarking.py``: the vocabularies
of Lau et al. 2017 (LM: words with frequency >= 10; topic: minus the MALLET stop list, the top 0.1 % and
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
  touch the LM. Why this recipe: ``results/README.md``, "NCLM against the same-size LSTM".
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
  under the LSTM trained in this run), through ``benchmarking.steer``.

Resumable. ``--out`` (default ``out/nclm``) holds ``settings.json`` (a rerun with other settings is
refused), and per model ``<name>/model`` (the trained weights and both vocabularies),
``<name>/train.json``, ``<name>/eval.json``, ``<name>/topics.json``, ``<name>/steps.jsonl`` (per-step time
and tokens); then ``lda_judge.safetensors`` and ``lda_judge.json`` (the LDA judge and what it was fitted
with), ``steering.json``, ``speed.json``, ``table.md`` and ``results.json``. A rerun skips whatever is
done and resumes an interrupted training from its last complete checkpoint (``<name>/checkpoints``, every
``--save-steps`` steps; removed once the model is saved).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from topic_lm_hf import (LSTMLMForCausalLM, NCLMForCausalLM, TopicContextCollator, build_vocabularies,
                         evaluate_topics, load_documents)
from topic_lm_hf.evaluation.steering import format_steering_table
from topic_lm_hf.evaluation.topics import load_reference_corpus

from benchmark_training import train_resumable
from benchmarking import (DATA, PROTOCOLS, TRAINING_FLAGS, add_common_arguments, build_lstm, build_nclm,
                          cached_lda_judge, check_settings, code_version, evaluate_protocols, fmt,
                          interleaved_step_times, read_json, steer, write_json)

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
# what a rerun must share with the run whose results are on disk
SETTINGS = ("steps", "topic_model_steps", "topic_model_lr", "embedding_size", "hidden_size", "layers", "num_topics", "alpha", "dropout",
            "batch_size", "lr", "clip", "min_freq", "seed", "max_train_docs", "max_valid_docs", "npmi_max_documents",
            "steer_topics", "steer_samples", "max_new_tokens")


def is_leaky(name: str) -> bool:
    spec = MODELS[name]
    return spec["family"] == "nclm" and spec.get("sdt_mode") == "minus_target"


# ----------------------------------------------------------------------------------------------
# models and batches
# ----------------------------------------------------------------------------------------------


def build(name: str, args, tok, topic_tok):
    spec = MODELS[name]
    if spec["family"] == "lstm":
        return build_lstm(args, len(tok))
    return build_nclm(args, tok, topic_tok, spec["variant"], spec["sentence_topics"], spec.get("sdt_mode", "prefix"),
                      spec.get("num_topics"))


def make_collator(name: str, tok, topic_tok) -> TopicContextCollator:
    spec = MODELS[name]
    if spec["family"] == "lstm":
        return TopicContextCollator.for_model(LSTMLMForCausalLM, tok)
    # NCLM reads the sentence prefix (used by the sentence-topic variants), with this run's training context
    return TopicContextCollator.for_model(NCLMForCausalLM, tok, topic_tok, context=spec["context"])


# ----------------------------------------------------------------------------------------------
# measurements
# ----------------------------------------------------------------------------------------------


def evaluate(name: str, model, valid_docs, tok, topic_tok, mdir: Path) -> dict:
    """Every protocol (n/a where the package refuses a leaky model's) and, for the NCLMs, the ablation under
    causal (paper for the leaky one)."""
    ablation = None if MODELS[name]["family"] != "nclm" else "paper" if is_leaky(name) else "causal"
    return evaluate_protocols(model, valid_docs, tok, topic_tok, mdir, ablation, leaky=is_leaky(name))


def load_model(name: str, mdir: Path):
    cls = LSTMLMForCausalLM if MODELS[name]["family"] == "lstm" else NCLMForCausalLM
    return cls.from_pretrained(mdir / "model").eval()


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/nclm", help="results folder (resumable)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help=f"train and measure only these models (space- or comma-separated) of {list(MODELS)}")
    parser.add_argument("--hidden", dest="hidden_size", type=int, default=256, help="H, the LSTM size")
    parser.add_argument("--embedding", dest="embedding_size", type=int, default=None, help="E (default: H)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--topics", dest="num_topics", type=int, default=50)
    add_common_arguments(parser, *TRAINING_FLAGS, "--steps", "--topic-model-steps", "--topic-model-lr", "--alpha", "--dropout",
                         "--batch-size", "--lr", "--clip", "--min-freq", "--max-train-docs", "--max-valid-docs",
                         "--npmi-max-documents", "--steer-topics", "--steer-samples", "--max-new-tokens",
                         "--speed-repeats", "--save-steps", "--threads", "--seed", steps=1200,
                         helps={"steps": "joint training steps (the LSTM's steps)"})
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
    code = code_version()  # read at start: the modules imported now are the ones that run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in SETTINGS}
    check_settings(out, settings)

    train_docs = load_documents(DATA / "apnews" / "train.txt", max_documents=args.max_train_docs)
    valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.max_valid_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords="mallet")
    print(f"APNEWS train {len(train_docs)} docs, valid {len(valid_docs)} docs; V = {len(tok)}, "
          f"V_c = {len(topic_tok)} (incl. <unk>); E = {args.embedding_size}, H = {args.hidden_size}, "
          f"{args.layers} layer(s), {args.num_topics} topics, alpha {args.alpha}; {args.steps} joint steps "
          f"(+{args.topic_model_steps} topic-model-only steps for NCLM); out: {out}; code: {code}", flush=True)

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
            stats = train_resumable(name, model, training_rows(name), collators[name], args, mdir, tok, topic_tok,
                                    MODELS[name], code, train_docs)
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
            judge = cached_lda_judge(out / "lda_judge", train_docs, topic_tok, args.num_topics, args.seed)
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
             "state (and SDT's sentence sum) carried across the document. **another document's context** = the "
             "ablation `mismatched_context=True` (every chunk reads the context of a chunk of another document), under "
             "`causal` for the causal NCLMs and under `paper` for the leaky one. NPMI: `lau2014` preset (window 20, "
             f"mean over the top 5/10/15/20 words) against {reference}; diversity: unique fraction of the top-"
             f"{topic_entry['diversity_k'] if topic_entry else 25} words of all topics. Training tokens/s: predicted "
             "tokens per second of the training run (NCLM: joint phase only; fetch, forward, backward, optimizer), and "
             "the ratio to the LSTM of this run; interleaved: the same ratio re-measured afterwards with the models' "
             f"steps interleaved on identical batches ({speed['repeats'] if speed else '-'} steps each).",
             "",
             "| model | params | ppl paper | ppl causal | ppl causal-carry | ppl, another document's context | "
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
