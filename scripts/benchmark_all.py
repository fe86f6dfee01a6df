"""Every model family at one size with one budget, on one corpus: perplexity, topics, steering, speed.

One command trains the LSTM LM and every topic-guided family of the package at one size, with one budget and
early stopping on a development split carved from ``train.txt``, evaluates everything on ``valid.txt``, and
writes ``results.json``, ``table.md`` (the table ``results/README.md`` includes) and two figures. The pieces are
every benchmark's (``scripts/benchmarking.py`` and ``scripts/benchmark_training.py``): the vocabularies of Lau
et al. 2017 (``build_vocabularies``: LM words with frequency >= 10; topic words minus the MALLET stop list, the top
0.1 % and non-alphabetic tokens), 30-token chunks and contexts capped at 300 topic tokens
(``TopicContextCollator``), ``BenchmarkTrainer`` (fixed batch order, linear schedule), ``StepTimer`` (per-step
time and the progress / ETA lines), NCLM's topic-model phase, ``check_settings`` / ``write_json`` / ``read_json`` /
``code_version``, ``evaluate_perplexity``, ``evaluate_topics``, ``interleaved_step_times``, and ``steer`` /
``cached_lda_judge``.

    python scripts/benchmark_all.py --corpus apnews                    # CPU size, every model, out/all/apnews-cpu
    python scripts/benchmark_all.py --corpus brown                     # Brown (the BNC stand-in)
    python scripts/benchmark_all.py --corpus imdb                      # IMDB as an LM corpus (capped, see below)
    python scripts/benchmark_all.py --corpus apnews --size paper --device cuda   # the papers' size, on a GPU
    python scripts/benchmark_all.py --corpus apnews --only lstm lstm-carry    # a subset (others can be added later)
    python scripts/benchmark_all.py --corpus apnews --max-steps 6 --eval-steps 3 --batch-size 2 --hidden 16 \\
        --embedding 16 --topics 4 --max-train-docs 40 --max-valid-docs 6 --npmi-max-documents 50 --steer-topics 2 \\
        --steer-samples 2 --speed-repeats 1 --lda-max-iter 2 --topic-model-steps 2 --only lstm lstm-carry tcnlm \\
        --out out/all-smoke                                           # the smoke configuration (about a minute)

Models (``--only`` names; every one 1 layer, so the same-size single-layer LSTM is every model's reference):

* ``lstm``: the LSTM LM (``LSTMLMForCausalLM``), trained on sentence chunks, each from a zero state;
* ``lstm-carry``: the same LSTM trained with its state carried across the chunks and sentences of each document
  (``TopicLMTrainer(carry_state=True, bptt_chunks=None)``: back-propagation through the whole document, on
  documents batches): the strongest honest baseline of Zheng, Vafa & Blei (TMLR 2023) for ``causal-carry``;
* ``tcnlm``, ``tcnlm-carry``: TCNLM (Wang et al. 2018), KL annealed over ``--kl-annealing-steps`` (as
  ``benchmark_tcnlm.py``);
* ``topic-lstm``, ``topic-lstm-carry``: TopicRNN with an LSTM cell (Dieng et al. 2017), the ELBO;
* ``nclm-lta``, ``nclm-leta``, ``nclm-leta-carry``: NCLM (Chaudhary et al. 2020) without sentence topics (SDT is
  left to ``benchmark_nclm.py``), alpha ``--alpha``, after ``--topic-model-steps`` NVDM-only steps
  (``pretrain_topic_model_phase``: its own Adam at ``--topic-model-lr`` on whole documents, in
  addition to the budget, as in ``benchmark_nclm.py``);
* ``gbn``, ``rgbn``: GBN-RNN / rGBN-RNN (Guo et al. 2020) with one topic layer of K topics, TLASGR-MCMC for Phi
  and Pi, ``loss_preset="elbo"`` (``build_rgbn``); ``rgbn-carry``: rGBN-RNN with its LSTM state carried across the
  chunks of each document in training (``carry_token_state=True``), as ``causal-carry`` feeds them.
* ``tcnlm-recipe``, ``topic-lstm-recipe``, ``nclm-leta-recipe``, ``rgbn-recipe``: the same families by the
  steering recipe, ``topic-lm train``'s default (``steering_recipe``: the shared topic output prior, TopicLSTM's
  bag-of-words term and topic proportions, NCLM's diversity term), their topic model pre-trained alone first
  (``pretrain_topic_model_once``: at most ``--pretrain-steps`` steps of ``--pretrain-batch-size`` rows, stopped when
  the objective on the dev documents has not improved for ``--pretrain-patience`` evaluations
  ``--pretrain-eval-every`` steps apart; recorded in ``train.json``), beside the papers' exact models;
  ``topic-lstm-carry-recipe``: TopicLSTM by the recipe with its state carried (the carried LSTM's protocol).
* ``rgbn-carry-warm``, ``rgbn-carry-warm-recipe``: the carried rGBN-RNN started from this run's trained
  ``lstm-carry`` (``from_language_model``: its embeddings, LSTM and output layer; the gate passing 1.8 % of the
  topic candidate), without and with the steering recipe; ``lstm-carry`` must be trained first in the same ``--out``.
* ``rgbn-carry-warm-recipe-frozen``: the same warm start with the carried LSTM's weights held fixed
  (``freeze_language_model``): only the topic path trains. ``rgbn-carry-recipe``: the recipe from scratch (topic
  model pre-trained, no warm start). More variants of the warm start, each one change (``scripts/benchmarking.py``
  says what): ``-topic-gate``, ``-lr8``, ``-lm-lr8-p10`` (``lm_lr_scale``: the LSTM's weights at a fraction of the
  rate), ``-k200-p10`` (a row's ``num_topics``), ``-learned-p10`` (``topic_output_bias="learned"``), ``-prior1-p10``
  (``topic_prior_weight_trainable=False``: the shared prior's weight held at 1), ``-lrp3`` (``lr_patience``: the
  plateau schedule decays the rate after 3 evaluations in a row without improvement, not after each); ``-p10``: a
  patience of 10.
* ``topic-lstm-carry-warm-recipe``: TopicLSTM by the recipe, carried, started from ``lstm-carry`` the same way (its
  topic prior's weight at 0 at the start); ``tcnlm-carry-recipe``: TCNLM by the recipe, carried (one call per
  documents batch).
* ``rgbn-carry-matched``, ``rgbn-carry-recipe-matched``, ``rgbn-carry-warm-recipe-matched``, ``topic-lstm-carry-warm-recipe-matched``,
  ``tcnlm-carry-recipe-matched``, and the chunk-trained ``tcnlm-recipe-matched``, ``topic-lstm-recipe-matched``,
  ``rgbn-recipe-matched``: the matched topic-free baselines of those rows: the same
  model, built and trained the same way (warm start and topic-model pre-training included), with every context empty
  in training, early stopping and evaluation (``evaluate_perplexity(empty_context=True)``: uninformative topics, the
  same for every document). The comparison names the strongest baseline (``lstm-carry`` or a matched row) and each
  topic row against its matched twin.

Decisions (the same for every run of this script):

* Corpora (``--corpus``; one per invocation, results in ``out/all/<corpus>-<size>`` unless ``--out``). ``apnews``
  and ``brown`` (the public stand-in for the papers' BNC): ``train.txt`` / ``valid.txt`` of ``../shared/data``
  (``TOPIC_LM_DATA``). ``imdb``: ``imdb/train.jsonl.gz`` split as ``benchmark_topicrnn.py`` splits it
  (``load_imdb_splits``: a fixed 20 % held out with seed 0 plays ``valid.txt``, the rest ``train.txt``), and
  capped by default to the first 5,000 / 500 reviews of the two splits (``--max-train-docs`` / ``--max-valid-docs``
  change it) to fit a CPU budget; raw text is sentence-split and tokenized by ``load_documents``. ``wiki``: the
  Wikipedia sample that ships with the package (``wikipedia-sample``, 900 training and 100 validation articles; its
  NPMI reference is the shipped ``wikipedia-sample/npmi-reference``): no ``TOPIC_LM_DATA`` needed.
* Development split. A fixed random 5 % (``--dev-fraction``) of the training documents, drawn with
  ``numpy.random.default_rng(--dev-seed, default 0)`` (the first ceil(5 %) of a permutation; at least one
  document), is held out for early stopping; the vocabularies and every model are built and trained on the other
  95 %. ``valid.txt`` is never read before training ends.
* Sizes (``--size``): ``cpu`` E = H = 128, 50 topics (fits a 2-core CPU); ``paper`` E = 300, H = 600, 50 topics
  (the papers' small LM; Zheng et al.'s defaults). ``--embedding``, ``--hidden`` and ``--topics`` override the
  preset (smoke runs). Dropout 0.4 for every model.
* Batches. Every model reads the same ``--batch-size`` whole training documents per step (default: APNEWS 4 and
  IMDB 6, about 60 chunks: the 64 chunks of the other benchmarks; Brown 1, whose documents are about 140 chunks
  long), in the same seeded order (``batch_order``). Models
  trained on chunks (``lstm``, ``tcnlm``, ``topic-lstm``, ``nclm-*``) get those documents' chunks as one batch of
  chunks (``DocumentChunks``), each from a zero state; ``*-carry`` models get the documents batch and carry their
  state (``carry_state=True``); ``gbn`` / ``rgbn`` read documents batches natively (their sentence recurrence runs
  over the document, the token state restarts at every chunk: they cannot be trained with ``carry_state``), and so
  does ``rgbn-carry``, whose forward carries the token state across the documents batch's chunks itself
  (``trains_with_carry_state``: a ``carry`` row goes through ``carry_state`` only where its family reads sentence
  chunks), so the token budget is identical for all.
* Training context. Chunk-trained topic models use the papers' context (``others``: the document minus the
  sentence), so their ``paper`` number replicates the published setting (and their ``causal`` numbers read a
  context they were not trained with); ``*-carry`` models and ``gbn`` / ``rgbn`` use the causal context
  (``preceding``: earlier sentences only). ``*-carry`` variants exist for the families whose ``forward`` takes a
  state (LSTM, TCNLM, TopicRNN, NCLM) and for rGBN-RNN (``rgbn-carry``, see above); not for GBN-RNN nor for
  NCLM-LTA (only the best variant of the papers, rGBN-RNN and NCLM LETA, gets one, to keep the CPU budget).
* Budget. Every run trains until its development perplexity stops improving (below), with a cap of
  ``--max-steps`` optimizer steps per model (default: ``--max-epochs`` 20 epochs of the training documents, e.g.
  8,550 steps of 4 APNEWS documents; the table says for every run whether the cap or the development
  perplexity stopped it); Adam lr ``--lr`` 2e-3, linear warm-up over 2 % of the first cap of ``--out``, then
  (``--schedule plateau``, the default) constant, halved (``--lr-decay``) at every evaluation that does not
  improve on the best dev perplexity, so that early stopping, not the cap, ends a run (``--schedule linear``: decay
  to 0 at ``--max-steps``, where the best step is always near the cap), global gradient-norm clip ``--clip`` 0.5,
  seed 0). Every ``--eval-steps`` steps (and at the last step) the dev perplexity is measured with
  ``evaluate_perplexity`` under ``causal`` (``causal-carry`` for ``*-carry`` models: the protocol they are trained
  for); training stops after ``--patience`` evaluations without improvement and the best evaluated weights are kept (a
  small callback, ``DevEarlyStopping``: transformers' ``EarlyStoppingCallback`` needs ``Trainer.evaluate``, which
  measures the training collator's protocol, not ``evaluate_perplexity``'s, and cannot score GBN/rGBN-RNN's documents
  batches).
* Perplexity on ``valid.txt`` (``evaluate_perplexity``, every predicted token incl. ``<eos>`` and ``<unk>``):
  ``paper`` (context = document minus the sentence: it sees later sentences), ``causal`` (preceding sentences;
  state reset at every chunk), ``causal-carry`` (causal, with the LSTM state carried across the document); the
  ablation (``mismatched_context=True``: every chunk reads another document's context) under each topic model's own
  protocol (``paper`` for ``others``-trained models, ``causal`` for GBN/rGBN-RNN, ``causal-carry`` for ``*-carry``).
* Topics: NPMI (``lau2014``: window 20, top 5/10/15/20, unseen pair 0) against the Wikipedia reference
  (``wiki/articles.jsonl.gz``) and diversity (unique fraction of the top-25 words), first layer for GBN/rGBN.
* Steering (``steer``: ``evaluate_steering`` with ``topic_ids=[k]`` for ``--steer-topics``
  seeded topics, ``--steer-samples`` texts each and as many unconditioned, top-p 0.9): topic accuracy by the
  model's own encoder and by a scikit-learn LDA judge with K topics fitted on the training documents; fluency =
  perplexity of the generated text under this run's ``lstm`` (fluency ratio = steered / unconditioned); lift =
  the share of the topic's top-50 words in steered over unconditioned text. Every topic model is steered at each
  decode-time guidance scale of ``--guidance-scales`` (1 = plain conditioning); the table reports the most
  accurate (LDA judge) whose fluency ratio is at most 1.5 (``fluent_setting``), the figure the whole curve.
* The gain over the LSTM under ``causal`` is split by the ablation under ``causal`` (every topic model, whatever
  its own protocol): the document's own topics bring (ablation - causal) perplexity points of it.
* Speed: training tokens/s (predicted tokens; batch fetch, forward, backward, optimizer, TLASGR; not logging,
  checkpoints or dev evaluations; a step slower than 20 times the median, a stall of a paused process, is left
  out: ``step_throughput``) and its ratio to ``lstm``; and the ratio re-measured with every model's steps
  interleaved on identical batches (``interleaved_step_times``, ``--speed-repeats`` steps each; ``*-carry`` models
  through ``carried_state_loss``). On CUDA the interleaved times are taken without synchronisation (launch-bound
  at these sizes); the training tokens/s are averages over the whole run.
* Comparisons (``table.md``): under ``causal-carry`` the best topic model against ``lstm-carry``; the ranking of
  the chunk-trained families under ``paper`` against the published rankings (``PUBLISHED``: TCNLM Table 2 at 50
  topics, rGBN-RNN Table 1 single layer, NCLM Table 2, small LMs; Brown against the papers' BNC column), pair by
  pair.

Resumable. ``--out`` holds ``settings.json`` (a rerun with other settings is refused: ``check_settings``),
``benchmark.log`` (everything printed, appended), per model ``<name>/model`` (the best weights and both
vocabularies), ``train.json``, ``dev.jsonl`` (every dev evaluation), ``steps.jsonl``, ``eval.json``,
``topics.json``, ``steering.json``; then ``lda_judge.safetensors`` and ``lda_judge.json`` (the LDA judge and what it
was fitted with), ``speed.json``, ``results.json``, ``table.md``, ``perplexity.png`` and ``steering.png``
(matplotlib, ``pip install topic-lm-hf[bench]``; skipped with a message without it). A rerun skips whatever is done
(a trained model is never retrained) and resumes an interrupted training from its last checkpoint (one at every dev
evaluation), the early-stopping state from ``dev.jsonl``. Under the plateau schedule a rerun may raise the cap (not
lower it): the rows that the smaller cap stopped train on from their last checkpoint, kept for that, with the same
warm-up, and are measured again (their histories keep the development evaluation at the smaller cap, where that
was not an evaluation step, which a run with the larger cap from the start would not have made).
``--readme results/README.md`` publishes a finished table: ``table.md``, ``results.json`` and the figures are copied
to ``results/<corpus>-<size>/``, and the page's block for that run is rewritten (``publish``).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from topic_lm_hf import TopicContextCollator, build_vocabularies, evaluate_topics, load_documents
from topic_lm_hf.pretraining import RECIPE_PRETRAINING
from topic_lm_hf.evaluation.perplexity import empty_context_rows
from topic_lm_hf.evaluation.topics import load_reference_corpus
from topic_lm_hf.protocols import PROTOCOLS as PROTOCOL_RECORDS, evaluation_protocol

from benchmark_training import (cap_raised, pretrain_topic_model_once, pretrain_topic_model_phase, step_throughput,
                                train_to_convergence, warmup_for)
from benchmarking import (CLASSES, DATA, MAX_FLUENCY_RATIO, MODELS, PROTOCOLS, SCHEDULE_FLAGS, SIZES, TRAINING_FLAGS,
                          CarriedLoss, OnDevice, Tee, add_common_arguments, build_model, cached_lda_judge,
                          check_settings, code_version, evaluate_protocols, fluent_setting, fmt,
                          interleaved_step_times, make_collator, prepared_rows, publish, read_json, read_jsonl, steer,
                          trains_with_carry_state, write_json)

MAX_EPOCHS = 20  # the default cap: early stopping is meant to end every run before it
BATCH_DOCUMENTS = {"apnews": 4, "brown": 1, "imdb": 6, "wiki": 4}  # about 60 chunks on APNEWS and IMDB, 100 on Brown
CORPORA = {"apnews": "APNEWS", "brown": "Brown", "imdb": "IMDB", "wiki": "the Wikipedia sample shipped with the package"}
IMDB_DEFAULT_DOCS = (5000, 500)  # train, valid reviews when --max-*-docs are not given

# Published test perplexities of the papers' small LMs (1 x 600), per corpus (the papers' BNC = our Brown
# stand-in), for the families of this benchmark; the orderings are what is compared, not the numbers.
PUBLISHED = {
    "TCNLM paper (Wang et al. 2018), Table 2, small LM, 50 topics": {
        "apnews": {"LSTM": 64.13, "TopicRNN": 56.77, "TCNLM": 52.75},
        "imdb": {"LSTM": 72.14, "TopicRNN": 68.74, "TCNLM": 63.98},
        "brown": {"LSTM": 102.89, "TopicRNN": 94.66, "TCNLM": 87.98}},
    "rGBN-RNN paper (Guo et al. 2020), Table 1, LSTM 600, 100 topics, one layer": {
        "apnews": {"LSTM": 64.13, "TopicRNN": 54.54, "TCNLM": 52.63, "GBN-RNN": 47.42, "rGBN-RNN": 46.35},
        "imdb": {"LSTM": 72.14, "TopicRNN": 67.83, "TCNLM": 62.64, "GBN-RNN": 57.01, "rGBN-RNN": 55.76},
        "brown": {"LSTM": 102.89, "TopicRNN": 93.57, "TCNLM": 86.44, "GBN-RNN": 86.39, "rGBN-RNN": 81.94}},
    "NCLM paper (Chaudhary et al. 2020), Table 2, small LM (TopicRNN, TCNLM copied from TCNLM at 150 topics)": {
        "apnews": {"LSTM": 64.95, "TopicRNN": 54.12, "TCNLM": 52.59, "NCLM LTA": 55.48, "NCLM LETA": 48.33},
        "imdb": {"LSTM": 72.31, "TopicRNN": 66.45, "TCNLM": 62.59, "NCLM LTA": 68.21, "NCLM LETA": 58.10},
        "brown": {"LSTM": 106.82, "TopicRNN": 93.55, "TCNLM": 86.21, "NCLM LTA": 98.31, "NCLM LETA": 94.78}},
}
# what a rerun must share with the run whose results are on disk
SETTINGS = ("corpus", "size", "embedding_size", "hidden_size", "num_topics", "dropout", "max_steps", "eval_steps",
            "patience", "batch_size", "lr", "clip", "kl_annealing_steps", "alpha", "topic_model_steps",
            "topic_model_lr", "topic_model_batch_size", "pretrain_steps", "pretrain_eval_every", "pretrain_patience",
            "min_freq", "seed", "dev_fraction", "dev_seed",
            "max_train_docs", "max_valid_docs", "npmi_max_documents", "steer_topics", "steer_samples",
            "max_new_tokens", "lda_max_iter", "device", "precision", "compile_output_layer", "schedule", "lr_decay",
            "warmup_steps")


def is_topic_model(name: str) -> bool:
    """A model that reads its document's topics: not the LSTM, nor a matched row (its topics held uninformative)."""
    return MODELS[name]["family"] != "lstm" and not MODELS[name].get("matched")


def own_protocol(name: str) -> str:
    """The protocol a model is trained for: its ablation's base (and, but for ``paper``, its dev protocol)."""
    spec = MODELS[name]
    return evaluation_protocol(spec["context"], carry_state=bool(spec.get("carry"))).name


def dev_protocol(name: str) -> str:
    """The protocol of the dev perplexity: the model's own, with the causal context (a leaky one would pick the
    checkpoint that reads later sentences best)."""
    return evaluation_protocol("preceding", carry_state=bool(MODELS[name].get("carry"))).name


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------


def load_corpus(args):
    """(train, dev, valid) documents: ``dev`` is the fixed-seed ``--dev-fraction`` of the training documents."""
    if args.corpus == "wiki":  # the corpus that ships with the package: no $TOPIC_LM_DATA needed
        train = load_documents("wikipedia-sample", max_documents=args.max_train_docs)
        valid = load_documents("wikipedia-sample/validation", max_documents=args.max_valid_docs)
    elif args.corpus == "imdb":
        from topic_lm_hf.tasks.classification import load_imdb_splits

        train, valid = load_imdb_splits(DATA / "imdb" / "train.jsonl.gz", test_fraction=0.2, seed=0,
                                        max_train_documents=args.max_train_docs,
                                        max_test_documents=args.max_valid_docs)
        train, valid = train.remove_columns("label"), valid.remove_columns("label")
    else:
        train = load_documents(DATA / args.corpus / "train.txt", max_documents=args.max_train_docs)
        valid = load_documents(DATA / args.corpus / "valid.txt", max_documents=args.max_valid_docs)
    order = np.random.default_rng(args.dev_seed).permutation(len(train))
    n_dev = max(1, math.ceil(args.dev_fraction * len(train)))
    dev_idx, train_idx = sorted(order[:n_dev].tolist()), sorted(order[n_dev:].tolist())
    return train.select(train_idx), train.select(dev_idx), valid


# ----------------------------------------------------------------------------------------------
# models and training
# ----------------------------------------------------------------------------------------------


def step_cap(args, train_documents: int) -> int:
    """``--max-steps`` where given, else the steps of ``--max-epochs`` epochs of ``train_documents`` in batches of
    ``--batch-size`` documents (rounded up)."""
    if args.max_steps is not None:
        return args.max_steps
    return math.ceil(args.max_epochs * train_documents / args.batch_size)


def warmup_steps(out: Path, args) -> int:
    """The warm-up in steps: 2 % of the cap that the folder ``out`` was first trained under (``settings.json``), so
    that a rerun with a larger cap trains every row, new or continued, with the same schedule."""
    first = read_json(out / "settings.json") or {}
    return first.get("warmup_steps") or warmup_for(first.get("max_steps", args.max_steps))


def load_model(name: str, path: Path, device: str):
    return CLASSES[MODELS[name]["family"]].from_pretrained(path).to(device).eval()


def row_arguments(args, spec: dict) -> argparse.Namespace:
    """The run's arguments as one row trains under them: its learning rate (``lr_scale``, a fraction of ``--lr``), its
    patience, its LM weights' fraction of the rate (``lm_lr_scale``) and the evaluations in a row without
    improvement before each decay of the plateau schedule (``lr_patience``)."""
    return argparse.Namespace(**{**vars(args), "lr": args.lr * spec.get("lr_scale", 1),
                                 "patience": spec.get("patience", args.patience),
                                 "lm_lr_scale": spec.get("lm_lr_scale", 1.0),
                                 "lr_patience": spec.get("lr_patience", 1)})


def hold_weights(model, spec: dict) -> None:
    """The weights a row holds fixed in training: ``freeze_lm`` the language model's (the topic path trains alone),
    ``topic_only_gate`` the gate's h-dependent ones at 0 (a held prior is the configuration's:
    ``topic_prior_weight_trainable``)."""
    if spec.get("freeze_lm"):
        model.freeze_language_model()
    if spec.get("topic_only_gate"):
        for gate in model.model.gates:
            for weight in (gate.hidden_proj.weight, gate.candidate_proj.weight):
                weight.data.zero_()
                weight.requires_grad_(False)


def train(name: str, model, rows, collator, args, mdir: Path, tok, topic_tok, train_docs, dev_docs) -> dict:
    """Train one model with early stopping (``train_to_convergence``: resuming from its last checkpoint), keep its
    best weights in ``<mdir>/model``, return its training statistics (NCLM: after its topic-model phase)."""
    spec = MODELS[name]
    topics = spec["family"] != "lstm"
    topic_phase = {}
    if spec.get("recipe"):  # the steering recipe: the topic model alone first, early-stopped on the dev documents
        settings = {"steps": args.pretrain_steps, "learning_rate": RECIPE_PRETRAINING["learning_rate"],
                    "batch_size": args.pretrain_batch_size, "eval_every": args.pretrain_eval_every,
                    "patience": args.pretrain_patience}
        pretraining = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining",
                                                     context=spec["context"])
        model, pre = pretrain_topic_model_once(model, pretraining.prepare(train_docs), pretraining,
                                               pretraining.prepare(dev_docs), mdir, settings, seed=args.seed)
        topic_phase = {"pretraining": pre}
    elif spec["family"] == "nclm" and args.topic_model_steps:
        nvdm_args = argparse.Namespace(**{**vars(args), "batch_size": args.topic_model_batch_size})
        topic_phase = pretrain_topic_model_phase(name, model, train_docs, nvdm_args, mdir, tok, topic_tok)
    hold_weights(model, spec)  # after the topic model's pre-training (a resumed run reloads the model from its folder)
    args = row_arguments(args, spec)
    stats = train_to_convergence(name, model, rows, collator, args, mdir, tok, topic_tok if topics else None,
                                 dev_docs, dev_protocol(name), carry_state=trains_with_carry_state(name),
                                 code=CODE_VERSION, empty_context=bool(spec.get("matched")))
    return {**stats, "training_context": spec["context"], **topic_phase}


# ----------------------------------------------------------------------------------------------
# measurements
# ----------------------------------------------------------------------------------------------


def evaluate(name: str, model, valid_docs, tok, topic_tok, mdir: Path) -> dict:
    """Perplexity under every protocol and, for the topic models, the ablation under their own protocol and
    under ``causal`` (where the gain over the LSTM is split into the document's own topics and the rest)."""
    ablation = own_protocol(name) if is_topic_model(name) else None
    return evaluate_protocols(model, valid_docs, tok, topic_tok, mdir, ablation, more_ablations=("causal",),
                              empty_context=bool(MODELS[name].get("matched")))


def evaluated(name: str, ev: dict) -> bool:
    """Whether ``eval.json`` (``ev``) holds every figure ``evaluate`` measures for ``name``."""
    ablations = ("mismatched", "mismatched-causal") if is_topic_model(name) else ()
    return all(k in ev for k in (*PROTOCOLS, *ablations))


def steering_settings(path: Path) -> dict:
    """``steering.json``'s results by guidance scale (``{"1": ..., "2": ...}``); a file written before the guidance
    scales were measured holds plain conditioning alone, which is scale 1."""
    st = read_json(path) or {}
    if "result" in st and "by_scale" not in st:
        st = {"fluency_judge": st.get("fluency_judge"), "by_scale": {"1": st["result"]}}
    return st


CODE_VERSION = "?"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="apnews")
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu", help="cpu: E=H=128; paper: E=300, H=600")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", default=None, help="results folder (resumable); default out/all/<corpus>-<size>")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help=f"train and measure only these models (space- or comma-separated) of {list(MODELS)}")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="the cap: at most this many steps per model (default: --max-epochs epochs)")
    parser.add_argument("--max-epochs", type=float, default=MAX_EPOCHS,
                        help="the cap in epochs of the training documents, where --max-steps is not given")
    parser.add_argument("--eval-steps", type=int, default=200, help="dev evaluation (and checkpoint) every N steps")
    parser.add_argument("--patience", type=int, default=3, help="stop after N dev evaluations without improvement")
    parser.add_argument("--embedding", dest="embedding_size", type=int, default=None, help="E (default: the size's)")
    parser.add_argument("--hidden", dest="hidden_size", type=int, default=None, help="H (default: the size's)")
    parser.add_argument("--topics", dest="num_topics", type=int, default=None, help="K (default: the size's)")
    parser.add_argument("--topic-model-batch-size", type=int, default=64, help="chunks per NVDM-phase step")
    parser.add_argument("--pretrain-steps", type=int, default=RECIPE_PRETRAINING["steps"],
                        help="the steering recipe's rows (*-recipe): at most this many topic-model pre-training steps "
                             "of --pretrain-batch-size rows, early-stopped on the dev documents")
    parser.add_argument("--pretrain-batch-size", type=int, default=RECIPE_PRETRAINING["batch_size"],
                        help="the recipe rows' pre-training: rows per step (chunks for chunk-trained models, "
                             "documents for GBN/rGBN-RNN), as topic-lm train's recipe; recorded in each row's "
                             "train.json")
    parser.add_argument("--pretrain-eval-every", type=int, default=RECIPE_PRETRAINING["eval_every"])
    parser.add_argument("--pretrain-patience", type=int, default=RECIPE_PRETRAINING["patience"])
    parser.add_argument("--readme", default=None, metavar="results/README.md",
                        help="publish the finished table into this results page: copy table.md, results.json and "
                             "the figures to <its folder>/<corpus>-<size>/ and rewrite its block between "
                             "'<!-- benchmark_all <corpus>-<size> start/end -->' (added after its last block the "
                             "first time)")
    parser.add_argument("--guidance-scales", type=float, nargs="+", default=[0.75, 1.0, 1.5, 2.0, 3.0],
                        help="decode-time topic guidance scales every topic model is steered at (1: plain "
                             "conditioning; below 1: between the topic-conditioned and the prior's logits, "
                             "l_prior + s (l_cond - l_prior)); the table reports the most accurate one whose "
                             f"fluency ratio is at most {MAX_FLUENCY_RATIO:g} (a measurement setting: adding a scale "
                             "later measures only it)")
    parser.add_argument("--dev-fraction", type=float, default=0.05, help="training documents held out as dev")
    parser.add_argument("--dev-seed", type=int, default=0, help="seed of the dev split")
    add_common_arguments(parser, *TRAINING_FLAGS, *SCHEDULE_FLAGS, "--batch-size", "--dropout", "--lr", "--clip",
                         "--kl-annealing-steps", "--alpha", "--topic-model-steps", "--topic-model-lr", "--min-freq",
                         "--max-train-docs", "--max-valid-docs", "--npmi-max-documents", "--steer-topics", "--steer-samples",
                         "--max-new-tokens", "--lda-max-iter", "--speed-repeats", "--threads", "--seed",
                         batch_size=None,
                         helps={"batch_size": "training documents per step, every model (default: apnews 4, "
                                              "brown 1, imdb 6)"})
    args = parser.parse_args(argv)
    for key, value in {**SIZES[args.size],
                       "batch_size": BATCH_DOCUMENTS[args.corpus]}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.corpus == "imdb":
        args.max_train_docs = args.max_train_docs or IMDB_DEFAULT_DOCS[0]
        args.max_valid_docs = args.max_valid_docs or IMDB_DEFAULT_DOCS[1]
    # what the imported builders read
    args.layers, args.num_factors, args.topic_sizes = 1, args.hidden_size, [args.num_topics]
    args.out = Path(args.out or f"out/all/{args.corpus}-{args.size}")
    names = [n for item in (args.only or list(MODELS)) for n in item.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    if not 0 < args.dev_fraction < 1:
        parser.error(f"--dev-fraction must be in (0, 1), got {args.dev_fraction}")
    args.names = [n for n in MODELS if n in names]  # the LSTM first: the fluency judge and the speed reference
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    stdout = sys.stdout
    sys.stdout = Tee(stdout, out / "benchmark.log")
    try:
        return run(args)
    finally:
        sys.stdout.file.close()
        sys.stdout = stdout


def run(args) -> dict:
    global CODE_VERSION
    out, names = args.out, args.names
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import datasets

    datasets.disable_progress_bars()
    t_start = time.perf_counter()
    CODE_VERSION = code_version()
    train_docs, dev_docs, valid_docs = load_corpus(args)
    args.max_steps = step_cap(args, len(train_docs))  # settings.json records the steps
    args.warmup_steps = warmup_steps(out, args)
    settings = {k: getattr(args, k) for k in SETTINGS}
    # folders written before the schedule was a setting were trained with the linear one (lr_decay unused there);
    # under the plateau schedule a larger cap continues the rows its smaller one stopped (train_to_convergence)
    check_settings(out, settings, before={"schedule": "linear", "lr_decay": args.lr_decay,
                                          "warmup_steps": args.warmup_steps},
                   may_grow=("max_steps",) if args.schedule == "plateau" else ())

    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq,
                                        stopwords="mallet")
    corpus = CORPORA[args.corpus]
    print(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {corpus}: train {len(train_docs)} docs, dev {len(dev_docs)} "
          f"docs ({args.dev_fraction:.0%} of train, seed {args.dev_seed}), valid {len(valid_docs)} docs; V = "
          f"{len(tok)}, V_c = {len(topic_tok)}; E = {args.embedding_size}, H = {args.hidden_size}, K = "
          f"{args.num_topics}; at most {args.max_steps} steps of {args.batch_size} documents, dev every "
          f"{args.eval_steps}, patience {args.patience}; {args.device}; models {names}; out {out}; code "
          f"{CODE_VERSION}", flush=True)

    rows_by_context, collators, rows = {}, {}, {}

    def training_rows(name):
        if name not in rows:
            documents, collators[name] = make_collator(name, tok, topic_tok)
            rows[name] = prepared_rows(rows_by_context, name, documents, train_docs)
            if MODELS[name].get("matched"):  # its topics held uninformative: every context empty
                rows[name] = empty_context_rows(rows[name])
            first = next(iter(rows_by_context.values()))
            if rows[name][:8]["input_ids"] != first[:8]["input_ids"]:
                raise RuntimeError("the models' rows differ: they would not see the same batches")
        return rows[name]

    reference = None

    def npmi_reference():
        nonlocal reference
        if reference is None:
            source = ("wikipedia-sample/npmi-reference" if args.corpus == "wiki"
                      else DATA / "wiki" / "articles.jsonl.gz")
            reference = load_reference_corpus(source, max_documents=args.npmi_max_documents)
            print(f"\n== NPMI reference: {reference.description}", flush=True)
        return reference

    # ------------------------------------------------------------------------------------------
    # train and measure every model
    # ------------------------------------------------------------------------------------------
    for i, name in enumerate(names):
        spec, mdir = MODELS[name], out / name
        mdir.mkdir(exist_ok=True)
        model = None
        elapsed = (time.perf_counter() - t_start) / 60
        trained = read_json(mdir / "train.json")
        if trained is not None and cap_raised(trained, args, mdir / "checkpoints"):
            for stale in ("train.json", "eval.json", "topics.json", "steering.json"):  # of the weights at the cap
                (mdir / stale).unlink(missing_ok=True)
            trained = None
        if trained is not None:
            print(f"\n== [{i + 1}/{len(names)}] {name}: trained earlier", flush=True)
        else:
            model = build_model(name, args, tok, topic_tok)
            if spec.get("warm"):  # from this run's converged language model
                start = out / spec["warm"] / "model"
                if not (start / "config.json").exists():
                    raise SystemExit(f"{name} starts from {spec['warm']}'s trained model: train {spec['warm']} first "
                                     f"in {out} (--only {spec['warm']} {name})")
                torch.manual_seed(args.seed)
                model = type(model).from_language_model(start, model.config)
            print(f"\n== [{i + 1}/{len(names)}, {elapsed:.1f} min] training {name}: {spec['label']} "
                  f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters), context "
                  f"{spec['context']!r}, carry_state {bool(spec.get('carry'))}", flush=True)
            stats = train(name, model, training_rows(name), collators[name], args, mdir, tok, topic_tok, train_docs,
                          dev_docs)
            write_json(mdir / "train.json", stats)
            print(f"   {stats['train_tokens']:,} tokens in {stats['train_seconds']:.0f} s = "
                  f"{stats['tokens_per_s']:,.0f} tokens/s; {stats['steps_trained']} steps, best dev step "
                  f"{stats['best_step']} ({stats['best_dev_perplexity']:.2f})", flush=True)
            model = None  # the best weights are the ones on disk
        ev = read_json(mdir / "eval.json") or {}
        if not evaluated(name, ev):
            model = model or load_model(name, mdir / "model", args.device)
            print(f"== evaluating {name} on {args.corpus} valid", flush=True)
            evaluate(name, model, valid_docs, tok, topic_tok, mdir)
        if is_topic_model(name) and not (mdir / "topics.json").exists():
            model = model or load_model(name, mdir / "model", args.device)
            layer = {"layer": 1} if spec["family"] == "rgbn" else {}
            topics = evaluate_topics(model, npmi_reference(), topic_tokenizer=topic_tok, **layer)
            write_json(mdir / "topics.json", topics)
            print(f"   {name}: NPMI (lau2014) {topics['npmi']:.3f}, diversity {topics['diversity']:.3f}", flush=True)
        del model

    done = [n for n in names if (out / n / "train.json").exists() and (out / n / "eval.json").exists()]

    # ------------------------------------------------------------------------------------------
    # steering of every topic model, fluency judged by this run's LSTM
    # ------------------------------------------------------------------------------------------
    judge = fluency_model = None
    for name in [n for n in done if is_topic_model(n)]:
        path = out / name / "steering.json"
        st = steering_settings(path)
        todo = [s for s in args.guidance_scales if f"{s:g}" not in st.get("by_scale", {})]
        if not todo or "lstm" not in done:
            continue
        if judge is None:
            judge = cached_lda_judge(out / "lda_judge", train_docs, topic_tok, args.num_topics, args.seed,
                                     max_iter=args.lda_max_iter)
            fluency_model = load_model("lstm", out / "lstm" / "model", args.device)
        model = load_model(name, out / name / "model", args.device)
        for scale in todo:
            print(f"\n== steering {name} at guidance scale {scale:g}", flush=True)
            result = steer(model, args, tok, topic_tok, judge, fluency_model, topic_guidance_scale=scale)
            st = {"fluency_judge": "lstm", "by_scale": {**st.get("by_scale", {}), f"{scale:g}": result}}
            write_json(path, st)
            print(f"   accuracy own encoder {fmt(result['accuracy_own'], '{:.3f}')}, LDA "
                  f"{fmt(result['accuracy_lda'], '{:.3f}')}, lift {fmt(result['lift'])}; fluency ratio "
                  f"{fmt(result['fluency_ratio'])}", flush=True)
        del model
    if "lstm" not in done:
        print("\n(steering skipped: the LSTM of this run is the fluency judge and is not finished)", flush=True)

    # ------------------------------------------------------------------------------------------
    # interleaved speed (its steps update the models in memory; nothing is saved)
    # ------------------------------------------------------------------------------------------
    speed = read_json(out / "speed.json")
    if "lstm" in done and len(done) > 1 and (speed is None or sorted(speed["models"]) != sorted(done)):
        print(f"\n== interleaved speed measurement ({args.speed_repeats} steps per model: {done})", flush=True)
        for n in done:
            training_rows(n)
        models = {n: load_model(n, out / n / "model", args.device) for n in done}
        models = {n: CarriedLoss(m) if trains_with_carry_state(n) else m for n, m in models.items()}
        measured = interleaved_step_times(models, {n: OnDevice(collators[n], args.device) for n in done},
                                          {n: rows[n] for n in done}, args, args.speed_repeats)
        speed = {"models": done, "repeats": args.speed_repeats, "device": args.device, "results": measured}
        write_json(out / "speed.json", speed)
        del models

    # ------------------------------------------------------------------------------------------
    # results, table, figures
    # ------------------------------------------------------------------------------------------
    if not done:
        print(f"\nNo model of {names} is finished in {out}: no table.", flush=True)
        return {}
    results = {n: collect(n, out, speed) for n in done}
    context = {"corpus": args.corpus, "corpus_name": corpus, "size": args.size, "device": device_name(args.device),
               "code": CODE_VERSION, "train_documents": len(train_docs), "dev_documents": len(dev_docs),
               "valid_documents": len(valid_docs), "vocab_size": len(tok), "topic_vocab_size": len(topic_tok),
               "reference": next((r["topics"]["coherence"].get("reference") for r in results.values()
                                  if r.get("topics")), None)}
    report = {"settings": settings, "context": context, "results": results, "speed": speed,
              "comparison": compare(results, args.corpus)}
    write_json(out / "results.json", report)
    text = "\n".join(table(report, args))
    (out / "table.md").write_text(text + "\n")
    print("\n" + text, flush=True)
    figures(report, out)
    if args.readme is not None:
        publish(out, Path(args.readme), f"{args.corpus}-{args.size}")
    print(f"\nWritten: {out / 'results.json'}, {out / 'table.md'}. Time of this invocation "
          f"{(time.perf_counter() - t_start) / 60:.1f} min.", flush=True)
    return report


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s))"


def training_speed(out: Path, name: str) -> float:
    """A model's training tokens/s, recomputed from its ``steps.jsonl`` with ``step_throughput`` (stalled steps
    left out), so that a run paused or suspended while it trained still reports its real speed."""
    return step_throughput(read_jsonl(out / name / "steps.jsonl"))["tokens_per_s"]


def collect(name: str, out: Path, speed) -> dict:
    """One model's numbers, for results.json."""
    tr, ev = read_json(out / name / "train.json"), read_json(out / name / "eval.json")
    tr["tokens_per_s"] = training_speed(out, name)
    tp, st = read_json(out / name / "topics.json"), steering_settings(out / name / "steering.json")
    r = {"label": MODELS[name]["label"], "family": MODELS[name]["family"], "training_context": MODELS[name]["context"],
         "carry_state": bool(MODELS[name].get("carry")), "parameters": tr["parameters"],
         "steps_trained": tr["steps_trained"], "best_step": tr["best_step"],
         "best_dev_perplexity": tr["best_dev_perplexity"], "dev_protocol": tr["dev_protocol"],
         "early_stopped": tr["early_stopped"],
         "perplexity": {p: {"perplexity": ev[p]["perplexity"], "tokens": ev[p]["tokens"]} for p in PROTOCOLS},
         "train_tokens_per_s": tr["tokens_per_s"], "train": tr, "eval": ev}
    for key in ("mismatched", "mismatched-causal"):
        if key in ev:
            m = ev[key]
            r[key] = {"perplexity": m["perplexity"], "tokens": m["tokens"], "base_protocol": m["base_protocol"]}
    if tp:
        r["topics"] = {k: tp[k] for k in ("npmi", "npmi_median", "diversity", "diversity_k", "num_topics",
                                          "coherence") if k in tp} | {"top_words": tp["top_words"][:10]}
    if st.get("by_scale"):
        keys = ("accuracy_own", "accuracy_own_topics", "accuracy_lda", "chance", "lift", "fluency_ratio",
                "fluency_ppl_steered", "fluency_ppl_unconditioned", "protocol")
        by_scale = {scale: {k: s.get(k) for k in keys} for scale, s in st["by_scale"].items()}
        scale, why = fluent_setting(by_scale)
        r["steering"] = {**by_scale[scale], "guidance_scale": float(scale), "setting": why}
        r["steering_by_scale"] = by_scale
    if (out / "lstm" / "train.json").exists():
        r["train_ratio_to_lstm"] = tr["tokens_per_s"] / training_speed(out, "lstm")
    if speed and name in speed["results"] and "lstm" in speed["results"]:
        r["interleaved_tokens_per_s"] = speed["results"][name]["tokens_per_s"]
        r["interleaved_ratio_to_lstm"] = speed["results"][name]["tokens_per_s"] / speed["results"]["lstm"][
            "tokens_per_s"]
    return r


def compare(results: dict, corpus: str) -> dict:
    """Under causal-carry, the best topic model against lstm-carry; under paper, the ranking of the chunk-trained
    families against each paper's, pair by pair."""
    out = {}
    topic = [n for n in results if is_topic_model(n)]
    if "lstm" in results:  # every topic model against the LSTM under causal, the gain split by the ablation
        lstm = results["lstm"]["perplexity"]["causal"]["perplexity"]
        out["causal"] = {}
        for n in topic:
            a = results[n]["perplexity"]["causal"]["perplexity"]
            row = {"perplexity": a, "lstm_perplexity": lstm, "gain": lstm - a, "percent": 100 * (lstm - a) / lstm}
            m = results[n].get("mismatched-causal")
            if m:
                row["ablation_perplexity"] = m["perplexity"]
                row["from_own_topics"] = m["perplexity"] - a
                if row["gain"] > 0:
                    row["share_from_own_topics"] = row["from_own_topics"] / row["gain"]
            if f"{n}-matched" in results:  # against its matched twin under causal
                twin = results[f"{n}-matched"]["perplexity"]["causal"]["perplexity"]
                row["matched_perplexity"], row["percent_to_matched"] = twin, 100 * (twin - a) / twin
            out["causal"][n] = row
    carried = lambda n: results[n]["perplexity"]["causal-carry"]["perplexity"]  # noqa: E731
    if topic and "lstm-carry" in results:
        best = min(topic, key=carried)
        a, b = carried(best), carried("lstm-carry")
        # the strongest baseline: the carried LSTM or a matched topic-free row (a topic model's architecture and
        # training with its topics held uninformative)
        baseline = min(["lstm-carry", *(n for n in results if MODELS[n].get("matched"))], key=carried)
        out["causal_carry"] = {"best_topic_model": best, "perplexity": a, "lstm_carry_perplexity": b,
                               "difference": a - b, "percent": 100 * (a / b - 1), "best_baseline": baseline,
                               "baseline_perplexity": carried(baseline),
                               "percent_to_best_baseline": 100 * (a / carried(baseline) - 1)}
        # each topic row against its matched twin, where the run has both
        out["matched"] = {n: {"perplexity": carried(n), "matched_perplexity": carried(f"{n}-matched"),
                              "percent": 100 * (carried(n) / carried(f"{n}-matched") - 1)}
                          for n in topic if f"{n}-matched" in results}
        m = results[best].get("mismatched")
        if m and m["base_protocol"] == "causal-carry":  # how much of it the document's own topics give
            out["causal_carry"]["ablation_perplexity"] = m["perplexity"]
            out["causal_carry"]["from_own_topics"] = m["perplexity"] - a
    ours = {MODELS[n]["published"]: results[n]["perplexity"]["paper"]["perplexity"]
            for n in results if "published" in MODELS[n]}
    out["ranking_paper"] = sorted(ours, key=ours.get)
    out["ours_paper"] = ours
    out["papers"] = {}
    for paper, tables in PUBLISHED.items():
        published = tables.get(corpus, {})
        common = [f for f in sorted(published, key=published.get) if f in ours]
        pairs = []
        for i, x in enumerate(common):
            for y in common[i + 1:]:  # the paper ranks x above (lower perplexity than) y
                pairs.append({"better": x, "worse": y, "published": [published[x], published[y]],
                              "ours": [ours[x], ours[y]], "agree": ours[x] < ours[y]})
        out["papers"][paper] = {"ranking": common, "pairs": pairs}
    return out


def table(report: dict, args) -> list[str]:
    c, results, comp = report["context"], report["results"], report["comparison"]
    epochs = args.max_steps * args.batch_size / c["train_documents"]
    budget = (f"until the dev perplexity has not improved for {args.patience} evaluations {args.eval_steps} steps "
              f"apart, at most {args.max_steps} steps of {args.batch_size} documents ({epochs:.1f} epochs: the cap)")
    schedule = (f"linear warm-up over {args.warmup_steps} steps, then constant, times {args.lr_decay:g} at "
                "every dev evaluation without improvement (every n-th in a row for a row whose label names its "
                "decay after n misses)" if args.schedule == "plateau" else
                f"linear warm-up and decay over {args.max_steps} steps")
    lines = [f"### All families on {c['corpus_name']}: size `{args.size}` (E = {args.embedding_size}, H = "
             f"{args.hidden_size}, {args.num_topics} topics, 1 layer); budget {budget}; device {c['device']}; "
             f"code {', '.join(sorted({r['train'].get('code', '?') for r in results.values()}))}",
             "",
             f"Data: {c['corpus_name']} training documents ({c['train_documents']}; {c['dev_documents']} more held out "
             f"as dev: a fixed {args.dev_fraction:.0%}, seed {args.dev_seed}), every number on the validation "
             f"documents ({c['valid_documents']}). V = {c['vocab_size']:,}, V_c = {c['topic_vocab_size']:,}. Every "
             f"model reads the same batches of whole documents in the same order (chunk-trained models: their chunks, "
             f"each from a zero state); Adam lr {args.lr}, {schedule}, clip "
             f"{args.clip}, dropout {args.dropout}, seed {args.seed}; the best dev checkpoint is kept (dev perplexity "
             f"under `causal`, `causal-carry` for carried-state models). NCLM: + {args.topic_model_steps} NVDM-only "
             "steps first. Training context: `others` (document minus the sentence, the papers') for chunk-trained "
             "topic models, `preceding` for carried-state models and GBN/rGBN-RNN.",
             "",
             "Perplexity (`evaluate_perplexity`, per predicted token), the context of sentence j and the state: "
             + "; ".join(f"**{p.name}** = {p.description}" for p in PROTOCOL_RECORDS.values())
             + "; **ablation** = the model's own protocol (in brackets) with every chunk given another document's "
             "context. NPMI: `lau2014` "
             f"(window 20, top 5/10/15/20) against {c['reference'] or 'Wikipedia'}; diversity: unique fraction of "
             "the top-25. "
             "Steering: `evaluate_steering`, accuracy by the own encoder / an LDA judge fitted on train, fluency "
             "ratio = perplexity of steered / unconditioned text under this run's LSTM, lift = share of the "
             "topic's top-50 words in steered / unconditioned text, at the decode-time guidance scale s (of "
             f"{', '.join(f'{x:g}' for x in args.guidance_scales)}; 1 = plain conditioning, below 1 towards the "
             f"prior) that is the most accurate with a fluency ratio of at most {MAX_FLUENCY_RATIO:g} (s in "
             "italics: none was; plain conditioning is shown). "
             "**vs LSTM (causal)**: the perplexity gain over the LSTM under `causal`, and the perplexity points of "
             "it that the document's own topics bring (the ablation under `causal` minus `causal`; their share of "
             "the gain in brackets). Speed: training tokens/s and its ratio to the LSTM; interleaved = the ratio "
             "re-measured with steps interleaved on identical batches.",
             "",
             "| model | params | steps trained (best), stopped by | " + "".join(f"ppl {p} | " for p in PROTOCOLS)
             + "ppl ablation (protocol) | vs LSTM (causal): gain, own topics (share) | NPMI lau2014 | diversity | "
             "steering s | steering acc. own / LDA | lift | fluency ratio | train tokens/s | ratio to LSTM | "
             "interleaved ratio |",
             "|" + "---|" * 17]
    causal = comp.get("causal", {})
    for name, r in results.items():
        stopped = {"patience": "dev", "max_steps": "cap"}.get(r["train"].get("stopped_by"), r["train"].get(
            "stopped_by", "dev" if r["early_stopped"] else "cap"))
        cells = [f"{r['parameters'] / 1e6:.2f} M", f"{r['steps_trained']} ({r['best_step']}), {stopped}"]
        cells += [f"{r['perplexity'][p]['perplexity']:.2f}" for p in PROTOCOLS]
        m = r.get("mismatched")
        cells.append(f"{m['perplexity']:.2f} ({m['base_protocol']})" if m else "-")
        g = causal.get(name)
        cell = "-"
        if g:
            cell = f"{g['percent']:+.1f} %"
            if "from_own_topics" in g:
                cell += f", {round(g['from_own_topics'], 2) + 0.0:.2f}"  # + 0.0: no "-0.00"
                if "share_from_own_topics" in g:
                    cell += f" ({round(100 * g['share_from_own_topics']):d} %)"  # round(): no "-0 %"
        cells.append(cell)
        t = r.get("topics")
        cells += [f"{t['npmi']:.3f}" if t else "-", f"{t['diversity']:.3f}" if t else "-"]
        s = r.get("steering")
        if s:
            scale = f"{s['guidance_scale']:g}"
            cells.append(scale if s["setting"].startswith("the most accurate") else f"*{scale}*")
        else:
            cells.append("-")
        cells.append(f"{fmt(s['accuracy_own'])} / {fmt(s['accuracy_lda'])}" if s else "-")
        cells.append(fmt(s.get("lift")) if s else "-")
        cells.append(fmt(s["fluency_ratio"]) if s else "-")
        cells.append(f"{r['train_tokens_per_s']:,.0f}")
        cells.append(fmt(r.get("train_ratio_to_lstm")))
        cells.append(fmt(r.get("interleaved_ratio_to_lstm")))
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    missing = [MODELS[n]["label"] for n in MODELS if n not in results]
    if missing:
        lines += ["", f"Not in this table (not finished in this run's folder): {'; '.join(missing)}."]
    lines += ["", "#### Comparisons", ""]
    if causal:
        best = max(causal, key=lambda n: causal[n]["gain"])
        g = causal[best]
        line = (f"- Under **causal**: the best topic model, {results[best]['label']}, {g['perplexity']:.2f} against "
                f"the LSTM {g['lstm_perplexity']:.2f} ({g['percent']:+.1f} %; positive = the topic model is better)")
        if "from_own_topics" in g:
            line += (f"; with another document's context it scores {g['ablation_perplexity']:.2f}: the document's own "
                     f"topics account for {g['from_own_topics']:.2f} perplexity points")
            if "share_from_own_topics" in g:
                line += f", {round(100 * g['share_from_own_topics']):d} % of the gain"
        lines.append(line + ".")
    cc = comp.get("causal_carry")
    if cc:
        own = round(cc.get("from_own_topics", 0.0), 2) + 0.0  # + 0.0: no "-0.00"
        lines.append(f"- Under **causal-carry**: the best topic model, {results[cc['best_topic_model']]['label']}, "
                     f"{cc['perplexity']:.2f} against the carried-state LSTM {cc['lstm_carry_perplexity']:.2f}: "
                     f"{cc['difference']:+.2f} ({cc['percent']:+.1f} %; negative = the topic model is better)."
                     + (f" With another document's context (ablation) it scores {cc['ablation_perplexity']:.2f}: "
                        f"the document's own topics account for {own:.2f} perplexity points."
                        if "ablation_perplexity" in cc else ""))
        if cc["best_baseline"] != "lstm-carry":
            lines.append(f"- The strongest baseline under **causal-carry** is {results[cc['best_baseline']]['label']} "
                         f"({cc['baseline_perplexity']:.2f}): the best topic model is {cc['percent_to_best_baseline']:+.1f} "
                         "% against it (negative = the topic model is better).")
        for name, row in comp.get("causal", {}).items():
            if "matched_perplexity" in row:
                lines.append(f"- Under **causal**, {results[name]['label']} {row['perplexity']:.2f} against the same "
                             f"model with its topics held uninformative {row['matched_perplexity']:.2f} "
                             f"({row['percent_to_matched']:+.1f} %; positive = its document's topics pay).")
        for name, m in comp.get("matched", {}).items():
            lines.append(f"- Under **causal-carry**, {results[name]['label']} {m['perplexity']:.2f} against the same "
                         f"model with its topics held uninformative {m['matched_perplexity']:.2f} ({m['percent']:+.1f} "
                         "%; negative = its document's topics pay).")
    else:
        lines.append("- Under **causal-carry**: needs `lstm-carry` and a topic model finished.")
    ranking = comp["ranking_paper"]
    lines.append("- Ranking under **paper** here (chunk-trained models; GBN/rGBN-RNN trained on `preceding`): "
                 + (" < ".join(f"{f} {comp['ours_paper'][f]:.2f}" for f in ranking) or "-"))
    if args.corpus == "brown":
        lines.append("- Brown is compared with the papers' BNC column (Brown is the public stand-in for BNC).")
    rows = []
    for paper, p in comp["papers"].items():
        if len(p["ranking"]) < 2:
            lines.append(f"- {paper}: fewer than two of its families finished here.")
            continue
        agree = sum(x["agree"] for x in p["pairs"])
        lines.append(f"- {paper}: published ranking {' < '.join(p['ranking'])}; {agree} of {len(p['pairs'])} "
                     "pairs agree here (below).")
        rows += [f"| {paper.split(' (')[0]} | {x['better']} < {x['worse']} | {x['published'][0]:.2f} / "
                 f"{x['published'][1]:.2f} | {x['ours'][0]:.2f} / {x['ours'][1]:.2f} | "
                 f"{'agree' if x['agree'] else 'disagree'} |" for x in p["pairs"]]
    if rows:
        lines += ["", "| published in | pair (published order) | published ppl | ppl paper here | |",
                  "|---|---|---|---|---|", *rows]
    return lines


def figures(report: dict, out: Path) -> None:
    """perplexity.png (perplexity by model and protocol), steering.png (steering accuracy against fluency over the
    guidance scale) and dev_curves.png (development perplexity over training, per model)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(figures skipped: matplotlib is not installed; pip install 'topic-lm-hf[bench]')", flush=True)
        return
    results, c = report["results"], report["context"]
    title = f"{c['corpus_name']}, size {report['settings']['size']}, {c['device']}"

    def save(fig, ax, name: str, heading: str, **legend) -> None:
        """Title (with the run's corpus, size and device), legend, and ``out/<name>``."""
        ax.set_title(f"{heading}\n({title})", fontsize=9)
        if ax.get_legend_handles_labels()[0]:  # a folder with only the LSTM has no steering curve
            ax.legend(**{"fontsize": 6, **legend})
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)

    names = list(results)
    series = [(p, [results[n]["perplexity"][p]["perplexity"] for n in names]) for p in PROTOCOLS]
    series.append(("ablation (own protocol, another document's context)",
                   [results[n]["mismatched"]["perplexity"] if "mismatched" in results[n] else np.nan for n in names]))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.5))
    width = 0.8 / len(series)
    for k, (label, values) in enumerate(series):
        ax.bar(np.arange(len(names)) + (k - (len(series) - 1) / 2) * width, values, width, label=label)
    ax.set_xticks(np.arange(len(names)), [results[n]["label"] for n in names], rotation=30, ha="right")
    ax.set_ylabel("validation perplexity")
    finite = [v for _, values in series for v in values if np.isfinite(v)]
    ax.set_ylim(0.9 * min(finite), 1.18 * max(finite))  # headroom for the legend above the bars
    save(fig, ax, "perplexity.png", "Perplexity by model and protocol", fontsize=7, ncol=len(series),
         loc="upper center")

    steered = [n for n in names if results[n].get("steering_by_scale")]
    fig, ax = plt.subplots(figsize=(7, 5))
    for n in steered:  # one curve per model over the guidance scale, each point labelled with its scale
        points = [(v["fluency_ratio"], v["accuracy_lda"], scale) for scale, v in
                  sorted(results[n]["steering_by_scale"].items(), key=lambda kv: float(kv[0]))
                  if v["fluency_ratio"] is not None and v["accuracy_lda"] is not None]
        (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, lw=1,
                          label=results[n]["label"])
        for x, y, scale in points:
            ax.annotate(scale, (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points", color=line.get_color())
    if steered:
        ax.axhline(results[steered[0]]["steering"]["chance"], color="grey", lw=0.8, ls="--", label="chance")
        ax.axvline(MAX_FLUENCY_RATIO, color="grey", lw=0.8, ls=":", label=f"fluency ratio {MAX_FLUENCY_RATIO:g}")
    ax.set_xlabel("fluency ratio (steered / unconditioned perplexity under the LSTM)")
    ax.set_ylabel("topic accuracy (LDA judge)")
    save(fig, ax, "steering.png", "Steering accuracy against fluency over the guidance scale s")

    fig, ax = plt.subplots(figsize=(7, 5))
    low, high = [], []
    for n in names:
        history = read_jsonl(out / n / "dev.jsonl")
        if history:
            values = [h["perplexity"] for h in history]
            ax.plot([h["step"] for h in history], values, lw=1,
                    label=f"{results[n]['label']} ({results[n]['dev_protocol']})")
            low.append(min(values))
            high.append(values[len(values) // 4])  # the first quarter's steep descent is cut off
    if low:
        ax.set_ylim(0.97 * min(low), max(high) * 1.03)
    ax.set_xlabel("training step")
    ax.set_ylabel("development perplexity")
    save(fig, ax, "dev_curves.png", "Development curves")
    print(f"Figures: {out / 'perplexity.png'}, {out / 'steering.png'}, {out / 'dev_curves.png'}", flush=True)


if __name__ == "__main__":
    main()
