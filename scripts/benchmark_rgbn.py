"""GBN-RNN and rGBN-RNN (1, 2, 3 layers) against same-size stacked LSTMs on APNEWS.

GBN-RNN / rGBN-RNN is Guo, Chen, Lu & Zhou, ICML 2020 (``topic_lm_hf.RGBNRNNForCausalLM``; implementation note
``../shared/docs/rgbn.md``). Every model is trained in this one run on ``apnews/train.txt`` and measured on
``apnews/valid.txt``, with the pieces of ``scripts/benchmarking.py`` (as ``scripts/benchmark_nclm.py``): Lau et
al. 2017 vocabularies, 30-token chunks, context bags of words capped at 300 topic tokens, ``TopicLMTrainer`` with a
fixed batch order and a linear schedule (``BenchmarkTrainer``), per-step timing (``StepTimer``), the perplexity
protocols ``paper`` / ``causal`` / ``causal-carry`` of ``evaluate_perplexity`` and its mismatched-context ablation,
NPMI (``lau2014`` preset, Wikipedia reference) and diversity through ``evaluate_topics`` (per layer: the topics of
layer l projected down to words, ``get_topics(layer=l)``), the interleaved speed measurement, and the steering
evaluation (``steer``). New here: test-BLEU and self-BLEU in the Texygen protocol (``texygen_bleu`` /
``texygen_self_bleu``), and a topic tree and a generated paragraph written for ``results/README.md``.

    python scripts/benchmark_rgbn.py                                   # default: E = H = 128 per layer, topics 50-40-25
    python scripts/benchmark_rgbn.py --only lstm-3 rgbn-3              # a subset (the others can be added later)
    python scripts/benchmark_rgbn.py --paper-sizes --out out/rgbn-paper   # E 300, H 600 per layer, topics 100-80-50
    python scripts/benchmark_rgbn.py --steps 4 --batch-size 2 --hidden 16 --embedding 16 --topic-sizes 6 5 4 \\
        --max-train-docs 24 --max-valid-docs 6 --npmi-max-documents 100 --bleu-samples 40 --steer-topics 2 \\
        --steer-samples 3 --speed-repeats 2 --lda-max-iter 2 --out out/rgbn-smoke  # the smoke configuration (minutes)

How long a run takes at the default sizes: ``results/README.md``, "GBN-RNN and rGBN-RNN against same-size stacked
LSTMs".

Models (``--only`` names; L = 1, 2, 3):

* ``lstm-L``: the stacked LSTM LM with L layers of H units (``LSTMLMForCausalLM``), the baseline of the L-layer
  topic models, and (``lstm-1`` or the first LSTM finished) the fluency judge of the steering evaluation;
* ``gbn-L``: GBN-RNN, L topic layers (``recurrent=False``: every sentence's top layer from the gamma prior);
* ``rgbn-L``: rGBN-RNN, L topic layers (``recurrent=True``: the transition matrices Pi carry topics from sentence
  to sentence);
* ``rgbn-3-official``: rGBN-RNN with 3 layers and ``loss_preset="official"`` (the official code's loss weights:
  Poisson 1e-3, KL 1e-4 / 1e-5 / 1e-6 against the summed token NLL) instead of the default ``"elbo"`` (paper eq. 6,
  all weights 1, under which the Poisson term outweighs the LM loss): a labelled variant, to see what the weighting
  does.

Decisions (the same for every run of this script):

* Sizes. ``LSTMLMForCausalLM`` has one hidden size for all its layers, so every model here has the same H in every
  layer (default 128; ``--paper-sizes``: 600, the official code's 600-600-600; the paper's 600-512-256 has no
  same-size stacked LSTM in this package). E = H unless ``--embedding``. Topics per layer ``--topic-sizes``
  (default 50 40 25, half the paper's 100 80 50); the L-layer models use the first L. Topic encoder hidden sizes are
  the package's (H^s = K, rgbn.md section 6).
* Batches. Every model reads the same batches in the same order: ``--batch-size`` whole training documents per step
  (``TopicContextCollator(layout="documents", context="preceding")``: the sentence recurrence runs over each whole
  document, the context of sentence j is the bag of words of sentences 1..j-1); the LSTMs read the same documents'
  chunks as one batch of chunks (``ChunksOfDocuments``), so the token budget is identical. ``--steps`` steps of Adam
  (lr ``--lr`` 2e-3, linear warm-up over 2 % then linear decay to 0), global gradient-norm clip ``--clip`` 5 (the
  paper's), dropout 0.4, seed 0. TLASGR-MCMC updates Phi and Pi after every optimizer step (inside the training
  step, so its time is in tokens/s); the TLASGR corpus size is the number of training documents.
* Perplexity: ``evaluate_perplexity`` (theta = the posterior mean, ``eval_theta="mean"``, deterministic). ``paper``
  = the context of sentence j is the document minus sentence j (leaks later sentences); ``causal`` = the
  sentences before j, the token state restarting at every chunk (the sentence recurrence is carried inside the
  document); ``causal-carry`` = causal, with the LSTM state also carried across chunks and sentences. The ablation
  (``mismatched_context=True``, under ``causal``) rolls the documents of each evaluation batch by half its size, so
  chunk k of a document reads the context of chunk k of another document (empty where that one is shorter).
* Topics: NPMI ``lau2014`` (window 20, mean over top 5/10/15/20, unseen pair 0) against the Wikipedia reference,
  and diversity (unique fraction of the top-25 words of all topics), per layer.
* BLEU (Texygen, ``docs/metrics.md`` A3): ``--bleu-samples`` (1,000) sentences per model, sampled from ``<bos>``
  with the full softmax at temperature ``--bleu-temperature`` (1.0; no top-k, no top-p), at most
  ``--max-new-tokens`` (30) tokens, ending at ``<eos>``; the topic models sample theta from the prior, top-down,
  one per sentence (rgbn.md section 8). References: every sentence of ``apnews/valid.txt`` (the evaluated
  documents), its words mapped to the LM vocabulary (``<unk>`` for the others, as the models write it). BLEU-n and
  self-BLEU-n, n = 2, 3, 4: NLTK ``sentence_bleu`` with method1 smoothing and cumulative weights averaged over
  hypotheses, all references (Texygen's ``is_fast=False``); self-BLEU scores each generated sentence against the
  other ``--bleu-samples`` - 1. A row ``real sentences`` scores the same number of training sentences (cut at
  ``--max-new-tokens`` tokens) the same way: the ground-truth point of the paper's plots.
* Steering: ``evaluate_steering`` for every topic model, first-layer topics (``topic_ids=[k]``, ``topic_layer=1``):
  ``--steer-topics`` topics drawn with the seed, ``--steer-samples`` texts each and as many unconditioned, top-p
  0.9, at most ``--max-new-tokens`` tokens; judges: the model's encoder, its own first-layer topics and a
  scikit-learn LDA with K_1 topics fitted on train.txt; fluency: perplexity of the generated text under the first
  finished LSTM of this run.
* Speed: training tokens/s (predicted tokens; batch fetch, forward, backward, optimizer and TLASGR; not logging or
  checkpointing) and its ratio to the same-depth LSTM; and the ratio re-measured with the models' steps interleaved
  on identical batches.
* README material: for ``rgbn-3`` (else the deepest rGBN finished), ``topic_tree.txt`` (the top topic whose
  layer-3 NPMI is highest, with 3 children per node and 5 words per topic; ``topic_tree_all.txt`` has every top
  topic) and ``paragraph.txt`` (5 sentences of ``generate_paragraph`` from that top topic, temperature
  ``--bleu-temperature``).

Resumable. ``--out`` (default ``out/rgbn``) holds ``settings.json`` (a rerun with other settings is refused),
``benchmark.log`` (everything printed, appended), and per model ``<name>/model``, ``train.json``, ``eval.json``,
``topics.json``, ``bleu.json`` (+ ``generated.txt``), ``steering.json``, ``steps.jsonl``; then
``real_sentences_bleu.json``, ``lda_judge.safetensors`` and ``lda_judge.json`` (the LDA judge and what it was fitted
with), ``speed.json``, ``topic_tree.txt``, ``paragraph.txt``, ``table.md`` and ``results.json``. A rerun skips
whatever is done and resumes an interrupted training from its last complete checkpoint (``<name>/checkpoints``,
every ``--save-steps`` steps; removed once the model is saved).
"""

from __future__ import annotations

import argparse
import platform
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from topic_lm_hf import (LSTMLMForCausalLM, RGBNRNNForCausalLM, TopicContextCollator, build_vocabularies,
                         evaluate_topics, load_documents)
from topic_lm_hf.evaluation import texygen_bleu, texygen_self_bleu
from topic_lm_hf.evaluation.topics import load_reference_corpus
from topic_lm_hf.models.modeling_rgbn_rnn import format_topic_tree

from benchmark_training import train_resumable
from benchmarking import (DATA, PROTOCOLS, TRAINING_FLAGS, Tee, add_common_arguments, build_lstm, build_rgbn,
                          cached_lda_judge, check_settings, code_version, evaluate_protocols, fmt,
                          interleaved_step_times, read_json, steer, write_json)

MODELS = {}
for _L in (1, 2, 3):
    MODELS[f"lstm-{_L}"] = dict(label=f"LSTM, {_L} layer(s)", family="lstm", layers=_L, context="none")
for _L in (1, 2, 3):
    MODELS[f"gbn-{_L}"] = dict(label=f"GBN-RNN-{_L}", family="rgbn", layers=_L, recurrent=False, context="preceding")
for _L in (1, 2, 3):
    MODELS[f"rgbn-{_L}"] = dict(label=f"rGBN-RNN-{_L}", family="rgbn", layers=_L, recurrent=True, context="preceding")
MODELS["rgbn-3-official"] = dict(label="rGBN-RNN-3, loss_preset=official", family="rgbn", layers=3, recurrent=True,
                                 context="preceding", loss_preset="official")
# what a rerun must share with the run whose results are on disk
SETTINGS = ("steps", "embedding_size", "hidden_size", "topic_sizes", "dropout", "batch_size", "lr", "clip",
            "min_freq", "seed", "max_train_docs", "max_valid_docs", "npmi_max_documents", "bleu_samples",
            "bleu_temperature", "steer_topics", "steer_samples", "max_new_tokens", "lda_max_iter")


class ChunksOfDocuments:
    """The chunks of a documents batch as one batch of chunks: the LSTM reads exactly the topic models' tokens."""

    def __init__(self, collator: TopicContextCollator):
        self.collator = collator

    def __call__(self, features):
        return self.collator([{"input_ids": chunk} for f in features for chunk in f["input_ids"]])


def build(name: str, args, tok, topic_tok):
    spec = MODELS[name]
    if spec["family"] == "lstm":
        return build_lstm(args, len(tok), layers=spec["layers"])
    return build_rgbn(args, tok, topic_tok, spec["layers"], spec["recurrent"], spec.get("loss_preset", "elbo"))


def load_model(name: str, mdir: Path):
    cls = LSTMLMForCausalLM if MODELS[name]["family"] == "lstm" else RGBNRNNForCausalLM
    return cls.from_pretrained(mdir / "model").eval()


def baseline(name: str) -> str:
    return f"lstm-{MODELS[name]['layers']}"


# ----------------------------------------------------------------------------------------------
# measurements
# ----------------------------------------------------------------------------------------------


def evaluate(name: str, model, valid_docs, tok, topic_tok, mdir: Path) -> dict:
    """Perplexity under every protocol, and for the topic models the mismatched-context ablation under causal."""
    ablation = None if MODELS[name]["family"] == "lstm" else "causal"
    return evaluate_protocols(model, valid_docs, tok, topic_tok, mdir, ablation)


def to_lm_words(sentence, vocab: dict, unk: str) -> list[str]:
    return [w if w in vocab else unk for w in sentence]


@torch.no_grad()
def generate_sentences(model, n: int, args, tok, seed: int, batch: int = 100) -> list[list[str]]:
    """``n`` sentences sampled from ``<bos>`` (full softmax at ``--bleu-temperature``), as LM tokens, ``<eos>`` cut.
    Every row is its own generation (a topic model samples its own theta per row)."""
    torch.manual_seed(seed)
    model.eval()
    special = {tok.pad_token_id, tok.bos_token_id}
    sentences = []
    for start in range(0, n, batch):
        m = min(batch, n - start)
        bos = torch.full((m, 1), tok.bos_token_id, dtype=torch.long)
        out = model.generate(input_ids=bos, attention_mask=torch.ones_like(bos), do_sample=True,
                             temperature=args.bleu_temperature, top_k=0, top_p=1.0,
                             max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)[:, 1:]
        for row in out.tolist():
            if tok.eos_token_id in row:
                row = row[:row.index(tok.eos_token_id)]
            sentences.append(tok.convert_ids_to_tokens([i for i in row if i not in special]))
    return sentences


def bleu_scores(hypotheses, references) -> dict:
    test, self_bleu = texygen_bleu(hypotheses, references, max_n=4), texygen_self_bleu(hypotheses, max_n=4)
    return {"bleu": {n: test[n] for n in (2, 3, 4)}, "self_bleu": {n: self_bleu[n] for n in (2, 3, 4)},
            "bleu_protocol": test.as_dict() | {"scores": None}, "self_bleu_protocol": self_bleu.as_dict() | {"scores": None},
            "num_hypotheses": len(hypotheses), "empty_hypotheses": sum(not h for h in hypotheses),
            "mean_length": sum(map(len, hypotheses)) / max(1, len(hypotheses))}


def write_readme_material(name: str, model, topics: dict, args, tok, topic_tok, out: Path) -> dict:
    """One three-layer topic tree (the top topic with the best NPMI) and one paragraph generated from its top topic."""
    L = model.config.num_layers
    top = topics[str(L)]["npmi_per_topic"]
    root = max(range(len(top)), key=lambda k: (top[k] if top[k] is not None else -2.0))
    tree = model.topic_tree(top_n=5, num_children=3, topic_tokenizer=topic_tok)
    (out / "topic_tree_all.txt").write_text(format_topic_tree(tree) + "\n")
    (out / "topic_tree.txt").write_text(format_topic_tree([tree[root]]) + "\n")
    torch.manual_seed(args.seed)
    paragraph = model.generate_paragraph(num_sentences=5, topic_ids=[root], topic_layer=L, tokenizer=tok,
                                         do_sample=True, temperature=args.bleu_temperature, top_k=0, top_p=1.0,
                                         max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id,
                                         eos_token_id=tok.eos_token_id)[0]
    (out / "paragraph.txt").write_text("\n".join(paragraph) + "\n")
    return {"model": name, "root_topic": root, "layer": L, "tree": format_topic_tree([tree[root]]),
            "paragraph": paragraph}


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/rgbn", help="results folder (resumable)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help=f"train and measure only these models (space- or comma-separated) of {list(MODELS)}")
    parser.add_argument("--hidden", dest="hidden_size", type=int, default=128, help="H, every layer's LSTM size")
    parser.add_argument("--embedding", dest="embedding_size", type=int, default=None, help="E (default: H)")
    parser.add_argument("--topic-sizes", type=int, nargs=3, default=[50, 40, 25], metavar=("K1", "K2", "K3"),
                        help="topics per layer, bottom first (the L-layer models use the first L)")
    parser.add_argument("--paper-sizes", action="store_true",
                        help="E 300, H 600 in every layer (the official code's 600-600-600), topics 100 80 50")
    parser.add_argument("--bleu-samples", type=int, default=1000, help="generated sentences per model for BLEU")
    parser.add_argument("--bleu-temperature", type=float, default=1.0, help="sampling temperature of the BLEU texts")
    add_common_arguments(parser, *TRAINING_FLAGS, "--steps", "--batch-size", "--dropout", "--lr", "--clip", "--min-freq",
                         "--max-train-docs", "--max-valid-docs", "--npmi-max-documents", "--steer-topics",
                         "--steer-samples", "--lda-max-iter", "--max-new-tokens", "--speed-repeats", "--save-steps",
                         "--threads", "--seed", steps=300, batch_size=4, clip=5.0, save_steps=50,
                         helps={"batch_size": "training documents per step (every model)",
                                "clip": "global gradient-norm clip (the paper's 5)",
                                "steer_topics": "first-layer topics sampled for steering"})
    args = parser.parse_args()
    if args.paper_sizes:
        args.embedding_size, args.hidden_size, args.topic_sizes = 300, 600, [100, 80, 50]
    args.embedding_size = args.embedding_size or args.hidden_size
    if any(a < b for a, b in zip(args.topic_sizes, args.topic_sizes[1:])):
        parser.error(f"--topic-sizes must be non-increasing, got {args.topic_sizes}")
    names = [n for item in (args.only or list(MODELS)) for n in item.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    names = [n for n in MODELS if n in names]  # the LSTMs first, then the table's order

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.stdout = Tee(sys.stdout, out / "benchmark.log")
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()
    t_start = time.perf_counter()
    code = code_version()  # read at start: the modules imported now are the ones that run
    settings = {k: getattr(args, k) for k in SETTINGS}
    check_settings(out, settings)

    train_docs = load_documents(DATA / "apnews" / "train.txt", max_documents=args.max_train_docs)
    valid_docs = load_documents(DATA / "apnews" / "valid.txt", max_documents=args.max_valid_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords="mallet")
    documents = TopicContextCollator.for_model(RGBNRNNForCausalLM, tok, topic_tok)  # whole documents, "preceding"
    rows = documents.prepare(train_docs)
    chunks = sum(len(x) for x in rows["input_ids"])
    print(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} APNEWS train {len(train_docs)} docs ({chunks:,} chunks), valid "
          f"{len(valid_docs)} docs; V = {len(tok)}, V_c = {len(topic_tok)}; E = {args.embedding_size}, H = "
          f"{args.hidden_size} per layer, topics {args.topic_sizes}; {args.steps} steps of {args.batch_size} documents; "
          f"out: {out}; code: {code}", flush=True)
    collators = {n: ChunksOfDocuments(TopicContextCollator.for_model(LSTMLMForCausalLM, tok))
                 if MODELS[n]["family"] == "lstm" else documents for n in MODELS}

    reference = None

    def npmi_reference():
        nonlocal reference
        if reference is None:
            reference = load_reference_corpus(DATA / "wiki" / "articles.jsonl.gz", max_documents=args.npmi_max_documents)
            print(f"\n== NPMI reference: {reference.description}", flush=True)
        return reference

    vocab, unk = tok.get_vocab(), tok.unk_token
    references = [to_lm_words(s, vocab, unk) for doc in valid_docs["sentences"] for s in doc if s]

    # ------------------------------------------------------------------------------------------
    # train and measure every model
    # ------------------------------------------------------------------------------------------
    for name in names:
        spec, mdir = MODELS[name], out / name
        mdir.mkdir(exist_ok=True)
        model = None
        if (mdir / "train.json").exists():
            print(f"\n== {name}: trained earlier", flush=True)
        else:
            model = build(name, args, tok, topic_tok)
            print(f"\n== training {name}: {spec['label']} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M "
                  f"parameters), {args.steps} steps", flush=True)
            stats = train_resumable(name, model, rows, collators[name], args, mdir, tok, topic_tok, spec, code)
            write_json(mdir / "train.json", stats)
            shutil.rmtree(mdir / "checkpoints", ignore_errors=True)
            print(f"   {stats['joint_tokens']:,} tokens in {stats['joint_seconds']:.0f} s = "
                  f"{stats['tokens_per_s']:,.0f} tokens/s; final {stats['final_log']}", flush=True)
        ev = read_json(mdir / "eval.json") or {}
        if not all(p in ev for p in PROTOCOLS) or (spec["family"] != "lstm" and "mismatched" not in ev):
            model = model or load_model(name, mdir)
            print(f"== evaluating {name} on apnews/valid.txt", flush=True)
            evaluate(name, model, valid_docs, tok, topic_tok, mdir)
        if spec["family"] != "lstm" and not (mdir / "topics.json").exists():
            model = model or load_model(name, mdir)
            topics = {str(l): evaluate_topics(model, npmi_reference(), topic_tokenizer=topic_tok, layer=l)
                      for l in range(1, spec["layers"] + 1)}
            write_json(mdir / "topics.json", topics)
            print(f"   {name}: NPMI per layer " + " / ".join(f"{t['npmi']:.3f}" for t in topics.values())
                  + ", diversity " + " / ".join(f"{t['diversity']:.3f}" for t in topics.values()), flush=True)
        if not (mdir / "bleu.json").exists():
            model = model or load_model(name, mdir)
            start = time.perf_counter()
            generated = generate_sentences(model, args.bleu_samples, args, tok, args.seed)
            (mdir / "generated.txt").write_text("\n".join(" ".join(s) for s in generated) + "\n")
            result = bleu_scores(generated, references) | {"seconds": time.perf_counter() - start}
            write_json(mdir / "bleu.json", result)
            print(f"   {name}: BLEU-2/3/4 " + " / ".join(f"{result['bleu'][n]:.3f}" for n in (2, 3, 4))
                  + ", self-BLEU-2/3/4 " + " / ".join(f"{result['self_bleu'][n]:.3f}" for n in (2, 3, 4)), flush=True)
        del model

    done = [n for n in names if all((out / n / f).exists() for f in ("train.json", "eval.json", "bleu.json"))]
    if not (out / "real_sentences_bleu.json").exists():
        pool = [to_lm_words(s[:args.max_new_tokens], vocab, unk) for doc in train_docs["sentences"] for s in doc if s]
        sample = random.Random(args.seed).sample(pool, min(args.bleu_samples, len(pool)))
        write_json(out / "real_sentences_bleu.json", bleu_scores(sample, references))
    real = read_json(out / "real_sentences_bleu.json")

    # ------------------------------------------------------------------------------------------
    # steering of every topic model (first-layer topics), fluency judged by an LSTM of this run
    # ------------------------------------------------------------------------------------------
    lstms = [n for n in MODELS if MODELS[n]["family"] == "lstm" and (out / n / "train.json").exists()]
    judge_name = lstms[0] if lstms else None
    judge = fluency_model = None
    for name in [n for n in done if MODELS[n]["family"] != "lstm"]:
        path = out / name / "steering.json"
        previous = read_json(path)
        if judge_name is None or (previous is not None and previous["fluency_judge"] == judge_name):
            continue
        if judge is None:
            judge = cached_lda_judge(out / "lda_judge", train_docs, topic_tok, args.topic_sizes[0], args.seed,
                                     max_iter=args.lda_max_iter)
            fluency_model = load_model(judge_name, out / judge_name)
        print(f"\n== steering {name} (first-layer topics; fluency judge {judge_name})", flush=True)
        result = steer(load_model(name, out / name), args, tok, topic_tok, judge, fluency_model)
        write_json(path, {"fluency_judge": judge_name, "result": result})
        print(f"   accuracy own encoder {fmt(result['accuracy_own'], '{:.3f}')}, own topics "
              f"{fmt(result['accuracy_own_topics'], '{:.3f}')}, LDA {fmt(result['accuracy_lda'], '{:.3f}')}; "
              f"fluency ratio {fmt(result['fluency_ratio'])}", flush=True)
    if judge_name is None:
        print("\n(steering skipped: it needs an LSTM of this run as the fluency judge)", flush=True)

    # ------------------------------------------------------------------------------------------
    # interleaved speed re-measure (its steps update the models in memory; nothing is saved)
    # ------------------------------------------------------------------------------------------
    speed = read_json(out / "speed.json")
    if lstms and len(done) > 1 and (speed is None or sorted(speed["models"]) != sorted(done)):
        print(f"\n== interleaved speed measurement ({args.speed_repeats} steps per model: {done})", flush=True)
        models = {n: load_model(n, out / n) for n in done}
        measured = interleaved_step_times(models, {n: collators[n] for n in done}, {n: rows for n in done}, args,
                                          args.speed_repeats)
        speed = {"models": done, "repeats": args.speed_repeats, "results": measured}
        write_json(out / "speed.json", speed)
        del models

    # ------------------------------------------------------------------------------------------
    # README material: one three-layer tree and one paragraph
    # ------------------------------------------------------------------------------------------
    rgbns = [n for n in ("rgbn-3", "rgbn-2", "rgbn-1") if n in done]
    material = read_json(out / "readme_material.json")
    if rgbns and (material is None or material["model"] != rgbns[0]):
        name = rgbns[0]
        material = write_readme_material(name, load_model(name, out / name), read_json(out / name / "topics.json"),
                                         args, tok, topic_tok, out)
        write_json(out / "readme_material.json", material)

    # ------------------------------------------------------------------------------------------
    # the table
    # ------------------------------------------------------------------------------------------
    if not done:
        print(f"\nNo model of {names} is finished in {out}: no table.", flush=True)
        return
    results = {n: {k: read_json(out / n / f"{k}.json") for k in ("train", "eval", "topics", "bleu", "steering")}
               for n in done}
    lines = table(results, real, speed, material, args, train_docs, valid_docs, tok, topic_tok, len(references))
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    (out / "table.md").write_text(text + "\n")
    write_json(out / "results.json", {"settings": settings, "results": results, "real_sentences": real,
                                      "speed": speed, "readme_material": material})
    print(f"\nWritten: {out / 'table.md'}, {out / 'results.json'}. Time of this invocation "
          f"{(time.perf_counter() - t_start) / 60:.1f} min.", flush=True)


def table(results, real, speed, material, args, train_docs, valid_docs, tok, topic_tok, n_references) -> list[str]:
    cpu = platform.processor() or platform.machine()
    eval_tokens = next(e["causal"]["tokens"] for e in (r["eval"] for r in results.values()))
    bleu_protocol = next(iter(results.values()))["bleu"]["bleu_protocol"]["protocol"]
    lines = [f"### GBN-RNN and rGBN-RNN vs same-size stacked LSTMs on APNEWS (E = {args.embedding_size}, H = "
             f"{args.hidden_size} in every layer, topics {'-'.join(map(str, args.topic_sizes))}; {args.steps} steps of "
             f"{args.batch_size} documents)",
             "",
             f"Data: `apnews/train.txt` ({len(train_docs)} documents) for training (and the LDA judge), "
             f"`apnews/valid.txt` ({len(valid_docs)} documents, {eval_tokens:,} predicted tokens) for every number. "
             f"V = {len(tok):,} (frequency >= {args.min_freq}), V_c = {len(topic_tok):,}. Every model: the same "
             f"{args.steps} batches of {args.batch_size} whole documents in the same order (the LSTMs read the same "
             f"chunks), Adam lr {args.lr} (linear warm-up over 2 %, linear decay to 0), clip {args.clip}, dropout "
             f"{args.dropout}, seed {args.seed}; topic models trained with the causal context (`preceding`), "
             f"`loss_preset=\"elbo\"` unless labelled, TLASGR-MCMC for Phi and Pi. {args.threads} CPU thread(s) ({cpu}), "
             f"torch {torch.__version__}; code: {', '.join(sorted({r['train'].get('code', '?') for r in results.values()}))}.",
             "",
             "Perplexity (`evaluate_perplexity`, theta = posterior mean): **paper** = context is the document minus the "
             "sentence (sees later sentences); **causal** = the preceding sentences; **causal-carry** = causal with the "
             "LSTM state carried across the document; **other doc's context** = `causal` with `mismatched_context=True`. "
             "NPMI: `lau2014` (window 20, top 5/10/15/20) against Wikipedia, per layer L1 / L2 / L3 (topics projected "
             "to words); diversity: unique fraction of the top-25 words, per layer. BLEU-n / self-BLEU-n (n = 2, 3, 4): "
             f"Texygen protocol ({bleu_protocol}), {args.bleu_samples} sentences sampled from `<bos>` at temperature "
             f"{args.bleu_temperature} (full softmax, at most {args.max_new_tokens} tokens; topic models: theta from the "
             f"prior), references: all {n_references:,} valid sentences in the LM vocabulary; self-BLEU against the "
             "other generated sentences. Training tokens/s (TLASGR included) and the ratio to the LSTM of the same "
             f"depth; interleaved: the same ratio re-measured with steps interleaved on identical batches "
             f"({speed['repeats'] if speed else '-'} steps each). Steering: first-layer topics, `evaluate_steering` "
             "(accuracy by the own encoder / own topics / LDA judge; fluency ratio = perplexity of steered / "
             "unconditioned text under an LSTM of this run; the bars: accuracy >= 0.5, ratio <= 1.5).",
             "",
             "| model | params | ppl paper | ppl causal | ppl causal-carry | ppl causal, other doc's context | "
             "NPMI L1 / L2 / L3 | diversity L1 / L2 / L3 | BLEU-2 / 3 / 4 | self-BLEU-2 / 3 / 4 | train tokens/s | "
             "ratio to LSTM | interleaved ratio | steering acc. own / topics / LDA | fluency ratio |",
             "|" + "---|" * 15]
    for name, r in results.items():
        ev, tr, tp, bl, st = r["eval"], r["train"], r["topics"], r["bleu"], r["steering"]
        base = results.get(baseline(name))
        cells = [f"{ev[p]['perplexity']:.2f}" for p in PROTOCOLS]
        cells.append(f"{ev['mismatched']['perplexity']:.2f}" if "mismatched" in ev else "-")
        cells.append(" / ".join(f"{t['npmi']:.3f}" for t in tp.values()) if tp else "-")
        cells.append(" / ".join(f"{t['diversity']:.2f}" for t in tp.values()) if tp else "-")
        cells.append(" / ".join(f"{bl['bleu'][str(n)]:.3f}" for n in (2, 3, 4)))
        cells.append(" / ".join(f"{bl['self_bleu'][str(n)]:.3f}" for n in (2, 3, 4)))
        cells.append(f"{tr['tokens_per_s']:,.0f}")
        cells.append(f"{tr['tokens_per_s'] / base['train']['tokens_per_s']:.2f}" if base else "-")
        sr = speed["results"] if speed else {}
        cells.append(f"{sr[name]['tokens_per_s'] / sr[baseline(name)]['tokens_per_s']:.2f}"
                     if name in sr and baseline(name) in sr else "-")
        if st:
            s = st["result"]
            cells.append(" / ".join(fmt(s[k], "{:.2f}") for k in ("accuracy_own", "accuracy_own_topics", "accuracy_lda")))
            cells.append(fmt(s["fluency_ratio"]))
        else:
            cells += ["-", "-"]
        lines.append(f"| {MODELS[name]['label']} | {tr['parameters'] / 1e6:.2f} M | " + " | ".join(cells) + " |")
    lines.append(f"| real sentences ({real['num_hypotheses']} of train.txt) | | | | | | | | "
                 + " / ".join(f"{real['bleu'][str(n)]:.3f}" for n in (2, 3, 4)) + " | "
                 + " / ".join(f"{real['self_bleu'][str(n)]:.3f}" for n in (2, 3, 4)) + " | | | | | |")
    lines.append("")
    for name, r in results.items():
        base = results.get(baseline(name))
        if MODELS[name]["family"] == "lstm" or not base:
            continue
        change = [f"{p} {100 * (r['eval'][p]['perplexity'] / base['eval'][p]['perplexity'] - 1):+.1f} %"
                  for p in PROTOCOLS]
        lines.append(f"- {MODELS[name]['label']} vs {MODELS[baseline(name)]['label']}: {', '.join(change)}")
    if material:
        lines += ["", f"{MODELS[material['model']]['label']}: top topic {material['root_topic']} (the best layer-"
                      f"{material['layer']} NPMI) with its 3 heaviest children per layer (`topic_tree`):", "", "```",
                  material["tree"], "```", "", "A paragraph from that topic (`generate_paragraph(num_sentences=5, "
                  f"topic_ids=[{material['root_topic']}], topic_layer={material['layer']})`):", "", "```",
                  *material["paragraph"], "```"]
    return lines


if __name__ == "__main__":
    main()
