"""What the benchmark scripts (``scripts/benchmark_*.py``) share, in one place, so that every benchmark states,
records and measures its runs the same way. Their training pieces are in ``scripts/benchmark_training.py``.

* **Command line.** ``add_common_arguments`` adds the flags the scripts share (``--steps``, ``--dropout``,
  ``--lr``, ``--threads``, ``--seed``, ...), each with one definition; a script names the ones it takes and
  its own defaults.
* **Result folders.** ``write_json`` (atomic) / ``read_json``, ``check_settings`` (a rerun with other settings is
  refused), ``code_version`` (the commit and a hash of uncommitted changes), ``Tee`` (a log of everything
  printed), and ``publish`` (a finished table into ``results/README.md``).
* **Models.** ``build_lstm``, ``build_tcnlm``, ``build_nclm``, ``build_rgbn``: a seeded model at the run's sizes;
  the unified benchmark's table (``MODELS``, ``SIZES``, ``build_model``, ``make_collator``, ``DocumentChunks``,
  ``CarriedLoss``), which ``benchmark_all.py`` trains and ``benchmark_speed.py`` times.
* **Measurements.** ``evaluate_protocols`` (perplexity under every protocol and the mismatched-context ablation),
  ``interleaved_step_times`` (speed with the models' steps interleaved on identical batches), ``steer`` and
  ``cached_lda_judge`` (the steering evaluation).

The corpora are read from ``DATA``: ``$TOPIC_LM_DATA``, else ``../shared/data`` beside this checkout.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, NCLMConfig, NCLMForCausalLM, RGBNRNNConfig,
                         RGBNRNNForCausalLM, TCNLMConfig, TCNLMForCausalLM, TopicContextCollator, TopicRNNConfig,
                         TopicRNNForCausalLM, evaluate_perplexity, evaluate_steering, fit_lda_judge)
from topic_lm_hf.families import FAMILIES
from topic_lm_hf.devices import synchronize
from topic_lm_hf.models.configuration_common import config_kwargs_from_tokenizers
from topic_lm_hf.pretraining import steering_recipe
from topic_lm_hf.carried_state import carried_state_loss
from topic_lm_hf.evaluation import LDAJudge
from topic_lm_hf.protocols import PROTOCOLS as PROTOCOL_RECORDS

ROOT = Path(__file__).resolve().parents[1]  # the checkout: scripts/benchmarking.py
# The corpora (README: Corpora): $TOPIC_LM_DATA, else, in this project's development setup, the folder beside the
# checkout (as tests/conftest.py finds them); where they are absent, the path the error messages name
DATA = Path(os.environ.get("TOPIC_LM_DATA") or ROOT.parent / "shared" / "data")
PROTOCOLS = tuple(PROTOCOL_RECORDS)  # the evaluation protocols' names: paper, causal, causal-carry

# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------

# flag -> add_argument keywords: one definition of each flag the scripts share
COMMON_ARGUMENTS = {
    "--steps": dict(type=int, help="training steps of every model"),
    "--batch-size": dict(type=int, default=64, help="30-token chunks per training step, every model"),
    "--dropout": dict(type=float, default=0.4),
    "--lr": dict(type=float, default=2e-3, help="Adam learning rate (linear warm-up and decay to 0)"),
    "--clip": dict(type=float, default=0.5, help="global gradient-norm clip"),
    "--schedule": dict(choices=("plateau", "linear"), default="plateau",
                       help="learning rate after a linear warm-up over 2 %% of the cap: 'plateau' constant, times "
                            "--lr-decay at every development evaluation that does not improve on the best (early "
                            "stopping decides when the run ends); 'linear' decays to 0 at the cap"),
    "--lr-decay": dict(type=float, default=0.5, help="the plateau schedule's factor per evaluation without "
                                                     "improvement"),
    "--kl-annealing-steps": dict(type=int, default=300,
                                 help="TCNLM's KL weight rises from 0 to 1 over these steps (not in the paper; "
                                      "without it the topic posterior collapsed to the prior on this data)"),
    "--alpha": dict(type=float, default=0.01, help="NCLM's topic-model loss share (paper: 0.01, APNEWS)"),
    "--topic-model-steps": dict(type=int, default=1000,
                                help="NCLM: topic-model-only steps on whole training documents before the joint "
                                     "ones (extra: the LM is not touched)"),
    "--topic-model-lr": dict(type=float, default=1e-2,
                             help="NCLM: the learning rate of the topic-model phase (its own Adam)"),
    "--min-freq": dict(type=int, default=10, help="LM vocabulary: words seen at least this often"),
    "--max-train-docs": dict(type=int, default=None, help="first N training documents (quick checks)"),
    "--max-valid-docs": dict(type=int, default=None, help="first N validation documents (quick checks)"),
    "--npmi-max-documents": dict(type=int, default=None, help="first N Wikipedia articles (quick checks)"),
    "--steer-topics": dict(type=int, default=10, help="topics sampled for the steering evaluation"),
    "--steer-samples": dict(type=int, default=20, help="texts per topic (and as many unconditioned)"),
    "--max-new-tokens": dict(type=int, default=30, help="the longest generated text"),
    "--lda-max-iter": dict(type=int, default=20, help="iterations of the LDA steering judge"),
    "--speed-repeats": dict(type=int, default=10, help="interleaved timing steps per model"),
    "--save-steps": dict(type=int, default=100, help="checkpoint every N steps (resume points)"),
    "--threads": dict(type=int, default=1, help="torch threads"),
    "--seed": dict(type=int, default=0),
    "--precision": dict(choices=("auto", "bf16", "fp32"), default="auto",
                        help="training precision: auto = bf16 autocast where the device runs it natively (a CPU "
                             "with AVX512-BF16 or AMX, a bf16 GPU), else float32 (topic_lm_hf.fast_path)"),
    "--compile-output-layer": dict(action=argparse.BooleanOptionalAction, default=True,
                                   help="compile the output layer and its loss (torch.compile; eager where no "
                                        "compiler works)"),
}
# the fast training path's flags: every script that trains takes them (benchmark_training.fast_path reads them)
TRAINING_FLAGS = ("--precision", "--compile-output-layer")
SCHEDULE_FLAGS = ("--schedule", "--lr-decay")  # runs stopped by their development perplexity


def add_common_arguments(parser: argparse.ArgumentParser, *flags: str, helps: dict | None = None,
                         **defaults) -> argparse.ArgumentParser:
    """Add the shared ``flags`` (keys of ``COMMON_ARGUMENTS``) to ``parser``. ``defaults`` and ``helps`` replace a
    flag's default or help by its destination name (``steps=1200``, ``helps={"batch_size": "..."}``)."""
    helps = dict(helps or {})
    for flag in flags:
        dest = flag[2:].replace("-", "_")
        options = {**COMMON_ARGUMENTS[flag]}
        if dest in defaults:
            options["default"] = defaults.pop(dest)
        if dest in helps:
            options["help"] = helps.pop(dest)
        parser.add_argument(flag, **options)
    if defaults or helps:
        raise ValueError(f"defaults or helps for flags not added: {sorted({**defaults, **helps})}")
    return parser


# ----------------------------------------------------------------------------------------------
# result folders
# ----------------------------------------------------------------------------------------------


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def write_json(path: Path, data) -> None:
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # per process: runs with disjoint --only may share
    tmp.write_text(json.dumps(jsonable(data), indent=1))     # an --out (settings.json is written by each)
    os.replace(tmp, path)  # never a half-written result file


def check_settings(out: Path, settings: dict, before: dict | None = None, may_grow: tuple = ()) -> None:
    """Record the run's settings in ``out/settings.json``; a rerun with other settings in the same folder is refused
    (its results would mix with the earlier ones). ``before``: the value of a setting added since a folder was
    written, as the runs in it had it (a folder without ``schedule`` was trained with the linear schedule).
    ``may_grow``: settings a rerun may raise (not lower), the larger value recorded (a step cap)."""
    previous = read_json(out / "settings.json")
    if previous is not None:
        previous = {**{k: v for k, v in jsonable(before or {}).items() if k in settings}, **previous}
        previous.update({k: settings[k] for k in may_grow if k in previous and previous[k] < settings[k]})
    if previous is not None and previous != jsonable(settings):
        now = jsonable(settings)
        diff = {k: (previous.get(k), now.get(k)) for k in {**previous, **now} if previous.get(k) != now.get(k)}
        sys.exit(f"{out} holds results of other settings (saved, now): {diff}; use another --out")
    write_json(out / "settings.json", settings)


def code_version() -> str:
    """The commit of the checkout these scripts run from, and a hash of the uncommitted changes under src/ if there
    are any."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--", "src"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{commit} + uncommitted src/ changes (diff sha1 {hashlib.sha1(diff).hexdigest()[:12]})" if diff else commit


def fmt(x, pattern="{:.2f}"):
    return "-" if x is None else pattern.format(x)


class Tee:
    """Everything printed also goes to the log file (appended)."""

    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "a", buffering=1)

    def write(self, text):
        self.stream.write(text)
        self.file.write(text)

    def flush(self):
        self.stream.flush()
        self.file.flush()


PUBLISHED_FILES = ("table.md", "results.json", "perplexity.png", "steering.png", "dev_curves.png")


def publish(out: Path, readme: Path, key: str) -> Path:
    """Copy a finished run's table, JSON and figures to ``<readme folder>/<key>/`` (tracked, so the page's images
    resolve) and put the table and the figures into ``readme`` (``results/README.md``) between the markers
    ``<!-- benchmark_all <key> start -->`` and ``<!-- benchmark_all <key> end -->``; a page without them gets the
    block after its last published block (or at its end). Running it again gives the same page."""
    if not (out / "table.md").exists():
        raise FileNotFoundError(f"{out / 'table.md'} does not exist: no finished run to publish")
    target = readme.parent / key
    target.mkdir(parents=True, exist_ok=True)
    copied = [name for name in PUBLISHED_FILES if (out / name).exists()]
    for name in copied:
        shutil.copyfile(out / name, target / name)
    start, end = f"<!-- benchmark_all {key} start -->", f"<!-- benchmark_all {key} end -->"
    images = [f"![{name[:-4]}]({key}/{name})" for name in copied if name.endswith(".png")]
    body = "\n".join([start, (out / "table.md").read_text().strip(), "", *images,
                      f"\n(`python scripts/benchmark_all.py` wrote this block and `{key}/`.)", end])
    text = readme.read_text() if readme.exists() else ""
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + body + rest.split(end, 1)[1]
    else:
        published = list(re.finditer(r"<!-- benchmark_all \S+ end -->\n?", text))
        if published:
            at = published[-1].end()
            text = text[:at].rstrip("\n") + "\n\n" + body + "\n" + text[at:]
        else:
            text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + body + "\n"
    readme.write_text(text)
    print(f"Published: {target} ({', '.join(copied)}); {readme} block {key}", flush=True)
    return target


# ----------------------------------------------------------------------------------------------
# models: seeded with args.seed, sized by args (embedding_size, hidden_size, num_topics, dropout, ...)
# ----------------------------------------------------------------------------------------------


def build_lstm(args, vocab_size: int, layers: int | None = None) -> LSTMLMForCausalLM:
    """The LSTM LM, ``layers`` layers (default ``args.layers``) of ``args.hidden_size`` units."""
    torch.manual_seed(args.seed)
    config = LSTMLMConfig(vocab_size=vocab_size, embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                          num_hidden_layers=args.layers if layers is None else layers, dropout=args.dropout)
    return LSTMLMForCausalLM(config)


def build_tcnlm(args, vocab_size: int, topic_vocab_size: int, lm_type: str = "tcnlm", **options) -> TCNLMForCausalLM:
    """TCNLM (``lm_type="naive_moe"``: the paper's naive mixture of experts), KL annealed over
    ``args.kl_annealing_steps``, ``args.num_factors`` factors; ``options``: more configuration values."""
    torch.manual_seed(args.seed)
    config = TCNLMConfig(vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, num_topics=args.num_topics,
                         embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                         num_hidden_layers=args.layers, num_factors=args.num_factors, dropout=args.dropout,
                         lm_type=lm_type, kl_annealing_steps=args.kl_annealing_steps, **options)
    return TCNLMForCausalLM(config)


def build_nclm(args, tok, topic_tok, variant: str, sentence_topics: bool = False, sdt_mode: str = "prefix",
               num_topics: int | None = None, **options) -> NCLMForCausalLM:
    """NCLM (``variant`` "lta", "eta" or "leta"), topic-model loss share ``args.alpha``; ``options``: more
    configuration values."""
    torch.manual_seed(args.seed)
    config = NCLMConfig.from_tokenizers(tok, topic_tok, variant=variant, sentence_topics=sentence_topics,
                                        sdt_mode=sdt_mode, num_topics=num_topics or args.num_topics,
                                        embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                                        num_hidden_layers=args.layers, dropout=args.dropout, alpha=args.alpha,
                                        **options)
    return NCLMForCausalLM(config)


def build_rgbn(args, tok, topic_tok, layers: int, recurrent: bool, loss_preset: str = "elbo",
               **options) -> RGBNRNNForCausalLM:
    """GBN-RNN (``recurrent=False``) or rGBN-RNN with ``layers`` topic layers: the first ``layers`` of
    ``args.topic_sizes`` topics, ``args.hidden_size`` LSTM units in every layer; ``options``: more configuration
    values."""
    torch.manual_seed(args.seed)
    config = RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=args.topic_sizes[:layers],
                                           hidden_sizes=[args.hidden_size] * layers,
                                           embedding_size=args.embedding_size, dropout=args.dropout,
                                           recurrent=recurrent, loss_preset=loss_preset, tlasgr_seed=args.seed,
                                           **options)
    return RGBNRNNForCausalLM(config)


# ----------------------------------------------------------------------------------------------
# the unified benchmark's models (scripts/benchmark_all.py; scripts/benchmark_speed.py times the same ones)
# ----------------------------------------------------------------------------------------------

# name -> family, label, training context, carry (the state carried across each document: trained and evaluated
# for causal-carry, see trains_with_carry_state); "published" = the family's name in PUBLISHED
MODELS = {
    "lstm": dict(family="lstm", label="LSTM", context="none", published="LSTM"),
    "lstm-carry": dict(family="lstm", label="LSTM, carried state", context="none", carry=True),
    "tcnlm": dict(family="tcnlm", label="TCNLM", context="others", published="TCNLM"),
    "tcnlm-carry": dict(family="tcnlm", label="TCNLM, carried state", context="preceding", carry=True),
    "topic-lstm": dict(family="topic_rnn", label="TopicLSTM", context="others", published="TopicRNN"),
    "topic-lstm-carry": dict(family="topic_rnn", label="TopicLSTM, carried state", context="preceding", carry=True),
    "topic-lstm-carry-recipe": dict(family="topic_rnn", label="TopicLSTM, carried state, steering recipe",
                                    context="preceding", carry=True, recipe=True),
    # the recipe with the shared prior's weight lambda starting at 0 (the recipe's 1.0 costs the LM part: the
    # model starts as the plain TopicLSTM and takes the pre-trained topics' prior in as far as it pays)
    "topic-lstm-carry-recipe-prior0": dict(family="topic_rnn", context="preceding", carry=True, recipe=True,
                                           label="TopicLSTM, carried state, steering recipe, prior weight from 0",
                                           config={"topic_prior_weight_init": 0.0}),
    # the recipe with the LM's own loss without its topics as a term (topic_free_loss_weight): does the LM part
    # trail the LSTM because the topic path stands in for part of its learning?
    "topic-lstm-carry-recipe-own-loss": dict(family="topic_rnn", context="preceding", carry=True, recipe=True,
                                             label="TopicLSTM, carried state, steering recipe, LM's own loss",
                                             config={"topic_free_loss_weight": 1.0}),
    # the recipe with the topic distribution mixed into the output (a gate per position) in place of the logit
    # prior and b_i^T theta, and the LM's own loss without topics as a term: the recurrent LM stays a language model
    # on its own, and a wrong document's topics cost at most -log(1 - g_t) per token
    "topic-lstm-carry-mixture": dict(family="topic_rnn", context="preceding", carry=True, recipe=True,
                                     label="TopicLSTM, carried state, topic mixture, LM's own loss",
                                     config={"topic_output_bias": "mixture", "topic_free_loss_weight": 1.0}),
    "nclm-lta": dict(family="nclm", label="NCLM LTA", context="others", nclm="lta", published="NCLM LTA"),
    "nclm-leta": dict(family="nclm", label="NCLM LETA", context="others", nclm="leta", published="NCLM LETA"),
    "nclm-leta-carry": dict(family="nclm", label="NCLM LETA, carried state", context="preceding", nclm="leta",
                            carry=True),
    "gbn": dict(family="rgbn", label="GBN-RNN", context="preceding", recurrent=False, published="GBN-RNN"),
    "rgbn": dict(family="rgbn", label="rGBN-RNN", context="preceding", recurrent=True, published="rGBN-RNN"),
    # rGBN-RNN with its LSTM state carried across each document's chunks inside its documents batches
    "rgbn-carry": dict(family="rgbn", label="rGBN-RNN, carried state", context="preceding", recurrent=True,
                       carry=True, config={"carry_token_state": True}),
    # the steering recipe (steering_recipe: topic-model pre-training, the shared topic output prior, the family's
    # terms): topic-lm train's default, beside each paper's exact model
    "tcnlm-recipe": dict(family="tcnlm", label="TCNLM, steering recipe", context="others", recipe=True),
    "topic-lstm-recipe": dict(family="topic_rnn", label="TopicLSTM, steering recipe", context="others", recipe=True),
    "nclm-leta-recipe": dict(family="nclm", label="NCLM LETA, steering recipe", context="others", nclm="leta",
                             recipe=True),
    "rgbn-recipe": dict(family="rgbn", label="rGBN-RNN, steering recipe", context="preceding", recurrent=True,
                        recipe=True),
    # started from this run's converged carried LSTM (``warm``: from_language_model of lstm-carry's best weights; its
    # gate passes 1.8 % of the topic candidate at the start), with and without the steering recipe
    "rgbn-carry-warm": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM",
                            context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                            config={"carry_token_state": True}),
    "rgbn-carry-warm-recipe": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, steering "
                                   "recipe", context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                                   recipe=True, config={"carry_token_state": True}),
    # the recipe from scratch (its topic model pre-trained, no warm start): the LM learns with its topics from the
    # first step, as rgbn-carry, which leans on them (the ablation), and from better topics
    "rgbn-carry-recipe": dict(family="rgbn", label="rGBN-RNN, carried state, steering recipe", context="preceding",
                              recurrent=True, carry=True, recipe=True, config={"carry_token_state": True}),
    "rgbn-carry-recipe-matched": dict(family="rgbn", label="rGBN-RNN, carried state, steering recipe, topics held "
                                      "uninformative", context="preceding", recurrent=True, carry=True, recipe=True,
                                      matched=True, config={"carry_token_state": True, "train_theta": "mean"}),
    # the warm start with the carried LSTM's weights held fixed (``freeze_lm``: freeze_language_model): only the topic
    # path trains, so that what the model gains over the LSTM comes through its topics, not from more LM training
    "rgbn-carry-warm-recipe-frozen": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM held "
                                          "fixed, steering recipe", context="preceding", recurrent=True, carry=True,
                                          warm="lstm-carry", freeze_lm=True, recipe=True,
                                          config={"carry_token_state": True}),
    # the warm start with a gate that reads the topics alone (``topic_only_gate``: U_z, U_r and U_h held at 0, so
    # a = (1 - z(theta)) h + z(theta) tanh(W_h theta + b_h)): with topics held constant the gate is an affine map of
    # h that the output layer could absorb, so it adds no capacity of its own, and what the model gains comes through
    # the topics or the LM's further training
    "rgbn-carry-warm-recipe-topic-gate": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                              "steering recipe, gate on the topics alone", context="preceding",
                                              recurrent=True, carry=True, warm="lstm-carry", topic_only_gate=True,
                                              recipe=True, config={"carry_token_state": True}),
    # the two warm starts at an eighth of the learning rate (``lr_scale``): a converged LSTM restarted at the full
    # rate is pushed away from its optimum (its rate had been halved nine times), and patience may stop the run
    # before it recovers
    "rgbn-carry-warm-recipe-lr8": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, steering "
                                       "recipe, lr / 8", context="preceding", recurrent=True, carry=True,
                                       warm="lstm-carry", recipe=True, lr_scale=1 / 8,
                                       config={"carry_token_state": True}),
    "rgbn-carry-warm-recipe-topic-gate-lr8": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried "
                                                  "LSTM, steering recipe, gate on the topics alone, lr / 8",
                                                  context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                                                  topic_only_gate=True, recipe=True, lr_scale=1 / 8,
                                                  config={"carry_token_state": True}),
    # the warm starts with a patience of 10 evaluations (``patience``): the restart at the full rate first raises the
    # development perplexity, and 3 evaluations may stop the run before it recovers
    "rgbn-carry-warm-recipe-topic-gate-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried "
                                                  "LSTM, steering recipe, gate on the topics alone, patience 10",
                                                  context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                                                  topic_only_gate=True, recipe=True, patience=10,
                                                  config={"carry_token_state": True}),
    "rgbn-carry-warm-recipe-matched-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                               "steering recipe, topics held uninformative, patience 10",
                                               context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                                               recipe=True, matched=True, patience=10,
                                               config={"carry_token_state": True, "train_theta": "mean"}),
    # the same twin under the schedule of ``-prior1-lrp3-p10`` (the rate decayed after 3 misses in a row)
    "rgbn-carry-warm-recipe-lrp3-p10-matched": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried "
                                                    "LSTM, steering recipe, topics held uninformative, rate decayed "
                                                    "after 3 misses, patience 10", context="preceding",
                                                    recurrent=True, carry=True, warm="lstm-carry", recipe=True,
                                                    matched=True, patience=10, lr_patience=3,
                                                    config={"carry_token_state": True, "train_theta": "mean"}),
    # the warm start with a patience of 10, as its matched twin above
    "rgbn-carry-warm-recipe-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, steering "
                                       "recipe, patience 10", context="preceding", recurrent=True, carry=True,
                                       warm="lstm-carry", recipe=True, patience=10,
                                       config={"carry_token_state": True}),
    # the warm start with the LSTM's weights at an eighth of the rate and the topic path at the full rate
    # (``lm_lr_scale``): between the frozen LSTM (its topics pay, the lead is small) and the joint restart (the lead
    # is large, mostly from the restart itself)
    "rgbn-carry-warm-recipe-lm-lr8-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                              "steering recipe, LSTM at lr / 8, patience 10", context="preceding",
                                              recurrent=True, carry=True, warm="lstm-carry", recipe=True,
                                              lm_lr_scale=1 / 8, patience=10, config={"carry_token_state": True}),
    # the warm start with 200 topics (``num_topics``): finer topics say more of what is particular to a document,
    # which the carried state may not keep
    "rgbn-carry-warm-recipe-k200-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                            "steering recipe, 200 topics, patience 10", context="preceding",
                                            recurrent=True, carry=True, warm="lstm-carry", recipe=True,
                                            num_topics=200, patience=10, config={"carry_token_state": True}),
    # the warm start with the learned topic term B theta^1 (``topic_output_bias="learned"``, B at 0) in place of the
    # shared prior, whose single weight the warm start leaves near 0: a term at every word that the topics drive
    "rgbn-carry-warm-recipe-learned-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                               "steering recipe, learned topic term, patience 10",
                                               context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                                               recipe=True, patience=10,
                                               config={"carry_token_state": True, "topic_output_bias": "learned"}),
    # the warm start with the shared prior's weight lambda held at the recipe's 1 (``topic_prior_weight_trainable``
    # False; the warm start sets a learned lambda to 0 and it stays near 0): the LSTM restarts under its pre-trained
    # topics' prior and learns around it, as TopicLSTM does around its pre-trained B
    "rgbn-carry-warm-recipe-prior1-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                              "steering recipe, prior weight held at 1, patience 10",
                                              context="preceding", recurrent=True, carry=True, warm="lstm-carry",
                                              recipe=True, patience=10, config={"carry_token_state": True,
                                                                                "topic_prior_weight_trainable": False}),
    # the prior held at 1 with the rate decayed after 3 evaluations in a row without improvement (``lr_patience``),
    # not after each: with the rate halved at every miss, the noisy development perplexity of the row above (its
    # topic-word matrix keeps moving under TLASGR-MCMC, whatever the rate) left the LSTM at 1/4096 of the rate by
    # step 5,600 while the topics kept improving the model for 11,000 more steps
    "rgbn-carry-warm-recipe-prior1-lrp3-p10": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried "
                                                   "LSTM, steering recipe, prior weight held at 1, rate decayed "
                                                   "after 3 misses, patience 10", context="preceding",
                                                   recurrent=True, carry=True, warm="lstm-carry", recipe=True,
                                                   patience=10, lr_patience=3,
                                                   config={"carry_token_state": True,
                                                           "topic_prior_weight_trainable": False}),
    # matched topic-free baselines (``matched``): the same model trained and evaluated the same way with every context
    # empty (uninformative topics, the same for every document); what its architecture brings without the topics.
    # rGBN-RNN's read the posterior mean in training too (train_theta="mean"): constant topics, not a Weibull draw's
    # noise, which would handicap the baseline
    "rgbn-carry-matched": dict(family="rgbn", label="rGBN-RNN, carried state, topics held uninformative",
                               context="preceding", recurrent=True, carry=True, matched=True,
                               config={"carry_token_state": True, "train_theta": "mean"}),
    "topic-lstm-carry-warm-recipe": dict(family="topic_rnn", label="TopicLSTM, carried state, from the carried LSTM, "
                                         "steering recipe", context="preceding", carry=True, warm="lstm-carry",
                                         recipe=True),
    "topic-lstm-carry-warm-recipe-matched": dict(family="topic_rnn", label="TopicLSTM, carried state, from the "
                                                 "carried LSTM, steering recipe, topics held uninformative",
                                                 context="preceding", carry=True, warm="lstm-carry", recipe=True,
                                                 matched=True),
    # both with a patience of 10, as the rGBN-RNN's twin: the restart's first rise in dev perplexity does not stop them
    "topic-lstm-carry-warm-recipe-p10": dict(family="topic_rnn", label="TopicLSTM, carried state, from the carried "
                                             "LSTM, steering recipe, patience 10", context="preceding", carry=True,
                                             warm="lstm-carry", recipe=True, patience=10),
    "topic-lstm-carry-warm-recipe-p10-matched": dict(family="topic_rnn", label="TopicLSTM, carried state, from the "
                                                     "carried LSTM, steering recipe, topics held uninformative, "
                                                     "patience 10", context="preceding", carry=True,
                                                     warm="lstm-carry", recipe=True, matched=True, patience=10),
    "tcnlm-carry-recipe": dict(family="tcnlm", label="TCNLM, carried state, steering recipe", context="preceding",
                               carry=True, recipe=True),
    "tcnlm-carry-recipe-matched": dict(family="tcnlm", label="TCNLM, carried state, steering recipe, topics held "
                                       "uninformative", context="preceding", carry=True, recipe=True, matched=True),
    # the chunk-trained recipe rows' matched twins (their own protocol: causal, or paper for the others-context rows)
    "tcnlm-recipe-matched": dict(family="tcnlm", label="TCNLM, steering recipe, topics held uninformative",
                                 context="others", recipe=True, matched=True),
    "topic-lstm-recipe-matched": dict(family="topic_rnn", label="TopicLSTM, steering recipe, topics held "
                                      "uninformative", context="others", recipe=True, matched=True),
    "rgbn-recipe-matched": dict(family="rgbn", label="rGBN-RNN, steering recipe, topics held uninformative",
                                context="preceding", recurrent=True, recipe=True, matched=True,
                                config={"train_theta": "mean"}),
    "rgbn-carry-warm-recipe-matched": dict(family="rgbn", label="rGBN-RNN, carried state, from the carried LSTM, "
                                           "steering recipe, topics held uninformative", context="preceding",
                                           recurrent=True, carry=True, warm="lstm-carry", recipe=True, matched=True,
                                           config={"carry_token_state": True, "train_theta": "mean"}),
}
# the benchmark's family names (Family.short_name) -> model_type and causal LM class, from the family registry
MODEL_TYPES = {f.short_name: f.model_type for f in FAMILIES.values() if f.is_topic_model}
SIZES = {"cpu": dict(embedding_size=128, hidden_size=128, num_topics=50),
         "paper": dict(embedding_size=300, hidden_size=600, num_topics=50)}
CLASSES = {f.short_name: f.causal_lm_class for f in FAMILIES.values()}


def trains_with_carry_state(name: str) -> bool:
    """Whether model ``name`` is trained (and timed) through ``TopicLMTrainer(carry_state=True)``
    (``carried_state_loss``): a ``carry`` row of a family that reads sentence chunks. A family that reads whole
    documents itself (``reads_documents``: rGBN-RNN, whose ``carry_token_state`` carries the LSTM state across a
    documents batch's chunks) is trained on its documents batches natively; either way a ``carry`` row is trained
    for, early-stopped and ablated under ``causal-carry``."""
    spec = MODELS[name]
    return bool(spec.get("carry")) and not CLASSES[spec["family"]].reads_documents


class DocumentChunks:
    """The chunks of a documents batch as one batch of chunks, each with its context (and sentence prefix): the
    chunk-trained models read exactly the tokens of the documents-trained ones. ``collator``: layout="sentences"."""

    def __init__(self, collator: TopicContextCollator):
        self.collator = collator

    def __call__(self, features):
        keys = [k for k in ("input_ids", "context_ids", "prefix_ids") if k in features[0]]
        return self.collator([{k: f[k][n] for k in keys} for f in features for n in range(len(f["input_ids"]))])


def make_collator(name: str, tok, topic_tok):
    """(documents collator that prepares the rows, the collator the trainer uses), from what the family declares
    it reads (TopicContextCollator.for_model) with the run's training context."""
    spec = MODELS[name]
    family = CLASSES[spec["family"]]
    documents = TopicContextCollator.for_model(family, tok, topic_tok, context=spec["context"], layout="documents")
    if spec.get("carry") or family.reads_documents:
        return documents, documents
    return documents, DocumentChunks(TopicContextCollator.for_model(family, tok, topic_tok, context=spec["context"]))


def prepared_rows(cache: dict, name: str, documents: TopicContextCollator, train_docs):
    """``documents.prepare(train_docs)`` for model ``name``, prepared once per context and sentence-prefix need
    (NCLM's rows carry the prefixes that TCNLM's ``others`` rows lack) and kept in ``cache``: every model reads the
    same documents in the same order."""
    kind = (documents.context, CLASSES[MODELS[name]["family"]].reads_sentence_prefix)
    if kind not in cache:
        cache[kind] = documents.prepare(train_docs)
    return cache[kind]


class OnDevice:
    """A collator whose tensors are moved to ``device`` (the interleaved timing runs the models there)."""

    def __init__(self, collator, device):
        self.collator, self.device = collator, device

    def __call__(self, features):
        batch = self.collator(features)
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class CarriedLoss(torch.nn.Module):
    """``model(**documents_batch).loss`` with the state carried (``carried_state_loss``), for the interleaved timing
    of the ``*-carry`` models trained with it (``trains_with_carry_state``): the same computation as their training
    step."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **batch):
        return carried_state_loss(self.model, batch)


def build_model(name: str, args, tok, topic_tok):
    """Model ``name`` of ``MODELS``, seeded with ``args.seed``, at the run's sizes (a ``recipe`` row: with
    ``steering_recipe``'s configuration values; a ``config`` row: with these values too)."""
    spec = MODELS[name]
    if spec.get("num_topics"):  # the row's own number of topics
        args = argparse.Namespace(**{**vars(args), "num_topics": spec["num_topics"],
                                     "topic_sizes": [spec["num_topics"], *args.topic_sizes[1:]]})
    recipe = steering_recipe(MODEL_TYPES[spec["family"]], variant=spec.get("nclm")) if spec.get("recipe") else {}
    recipe.update(spec.get("config", {}))  # the row's own configuration values
    if spec["family"] == "lstm":
        return build_lstm(args, len(tok))
    if spec["family"] == "tcnlm":
        if recipe:  # the shared prior needs the LM id of every topic word
            recipe["topic_word_ids"] = config_kwargs_from_tokenizers(tok, topic_tok)["topic_word_ids"]
        return build_tcnlm(args, len(tok), len(topic_tok), **recipe)
    if spec["family"] == "nclm":
        return build_nclm(args, tok, topic_tok, spec["nclm"], **recipe)
    if spec["family"] == "rgbn":
        return build_rgbn(args, tok, topic_tok, layers=1, recurrent=spec["recurrent"], **recipe)
    torch.manual_seed(args.seed)
    config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="lstm", embedding_size=args.embedding_size,
                                            hidden_size=args.hidden_size, num_topics=args.num_topics,
                                            dropout=args.dropout, **recipe)
    return TopicRNNForCausalLM(config)



# ----------------------------------------------------------------------------------------------
# measurements
# ----------------------------------------------------------------------------------------------


def evaluate_protocols(model, valid_docs, tok, topic_tok, mdir: Path, ablation: str | None = None,
                       leaky: bool = False, more_ablations: tuple[str, ...] = (), empty_context: bool = False) -> dict:
    """Perplexity under every protocol and, with ``ablation`` (a protocol), the mismatched-context ablation
    under it (``"mismatched"``), and under each of ``more_ablations`` (``"mismatched-<protocol>"``; the same
    figure where it is ``ablation``'s protocol); cached in ``mdir/eval.json``. A ``leaky`` model gets n/a (with
    the package's reason) where ``evaluate_perplexity`` refuses a protocol. ``empty_context``: every protocol with
    every context empty (a matched topic-free row)."""
    path = mdir / "eval.json"
    ev = read_json(path) or {}
    for protocol in PROTOCOLS:
        if protocol in ev:
            continue
        try:
            r = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                    empty_context=empty_context)
            print(f"   {r['protocol']}: perplexity {r['perplexity']:.2f} ({r['tokens']:,} tokens)", flush=True)
        except ValueError as e:
            if not leaky:
                raise
            r = {"n/a": str(e), "protocol": protocol}
            print(f"   {protocol}: n/a ({e})", flush=True)
        ev[protocol] = r
        write_json(path, ev)
    if ablation is None:
        return ev
    for key, protocol in [("mismatched", ablation)] + [(f"mismatched-{p}", p) for p in more_ablations]:
        if key in ev:
            continue
        if protocol == ablation and key != "mismatched":
            ev[key] = ev["mismatched"]
        else:
            r = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                    mismatched_context=True)
            r["base_protocol"] = protocol
            print(f"   {r['protocol']}, every chunk given another document's context (ablation): perplexity "
                  f"{r['perplexity']:.2f}", flush=True)
            ev[key] = r
        write_json(path, ev)
    return ev


# how a training step runs: (bf16 autocast, compiled output layer)
SPEED_MODES = {"fp32": (False, False), "bf16": (True, False), "bf16+compiled": (True, True),
               "fp32+compiled": (False, True)}


def speed_mode(precision_bf16: bool, compiled: bool) -> str:
    """The ``SPEED_MODES`` name of a run's training path."""
    return {v: k for k, v in SPEED_MODES.items()}[(bool(precision_bf16), bool(compiled))]


def _lm_of(model):
    return model.model if isinstance(model, CarriedLoss) else model


class OperationCounter(TorchDispatchMode):
    """Counts the operations dispatched while it is active (``with OperationCounter() as ops: ...``; ``ops.count``,
    and ``ops.by_name`` per aten operation): on a GPU each is at least one kernel launch, so a step that is bound by
    launches shows here without a GPU."""

    def __init__(self):
        super().__init__()
        self.count, self.by_name = 0, collections.Counter()
        self.syncs, self.syncs_by_name = 0, collections.Counter()

    def __enter__(self):
        # Tensor.tolist reads a tensor on the host without dispatching an operation on the CPU (on a GPU it is a
        # copy to the host): count it here
        self._tolist = torch.Tensor.tolist
        counter, tolist = self, self._tolist

        def counted(tensor, *args, **kwargs):
            counter.read_on_host(tensor)
            return tolist(tensor, *args, **kwargs)

        torch.Tensor.tolist = counted
        return super().__enter__()

    def read_on_host(self, tensor) -> None:
        """``tensor.tolist()`` was called: a host synchronisation."""
        self.syncs += 1
        self.syncs_by_name["tolist"] += 1

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.count += 1
        self.by_name[name] += 1
        if is_host_synchronisation(name, args, kwargs or {}):
            self.syncs += 1
            self.syncs_by_name[name] += 1
        return func(*args, **(kwargs or {}))


# operations whose result's shape or value the host must read before it can go on: on a GPU each one waits until
# the queue has drained (``nonzero`` and its users, ``.item()``, ``unique``, ...)
_SYNC_OPERATIONS = {"nonzero", "_local_scalar_dense", "unique", "_unique", "_unique2", "unique_consecutive",
                    "unique_dim", "masked_select", "is_nonzero", "equal", "allclose"}


def is_host_synchronisation(name: str, args, kwargs) -> bool:
    """Whether an aten operation makes the host wait for the device: the operations of ``_SYNC_OPERATIONS``,
    ``repeat_interleave`` with tensor counts and no ``output_size``, and indexing with a boolean mask (it runs
    ``nonzero`` inside, below the dispatcher)."""
    if name in _SYNC_OPERATIONS:
        return True
    if name == "repeat_interleave":
        return kwargs.get("output_size") is None and len(args) >= 1 and isinstance(args[0], torch.Tensor) and \
            (len(args) == 1 or isinstance(args[1], torch.Tensor))
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
    return False


def step_cost(model, batch: dict, bf16: bool = False) -> dict:
    """The operations dispatched and the floating-point operations (``FlopCounterMode``) of one training forward
    and backward of ``model`` on ``batch`` (eager, ``bf16`` autocast or not); the gradients are cleared after."""
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    device = next(model.parameters()).device
    lm = _lm_of(model)
    compiled, lm.output_layer_compiled = lm.output_layer_compiled, False  # eager: every operation is dispatched
    try:
        with FlopCounterMode(display=False) as flops, OperationCounter() as ops, \
                torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            model(**batch).loss.backward()
    finally:
        lm.output_layer_compiled = compiled
    model.zero_grad(set_to_none=True)
    base = getattr(lm, "model", None)
    if getattr(base, "_tlasgr_pending", None) is not None:  # rGBN-RNN: the step is not applied; nor its statistics
        base._tlasgr_pending = None
    return {"operations": ops.count, "host_synchronisations": ops.syncs, "gflop": flops.get_total_flops() / 1e9,
            "most_frequent": dict(ops.by_name.most_common(10)), "synchronisations": dict(ops.syncs_by_name)}


def interleaved_step_times(models: dict, collators: dict, rows: dict, args, repeats: int,
                           modes: dict | None = None) -> dict:
    """Median seconds per training step (fwd + bwd + Adam) of each model, steps interleaved on identical batches
    (``args.batch_size`` rows, clip ``args.clip``), after two warm-up rounds, with the device synchronised around
    each step; ``first_step_s``: the first step's seconds (compilation included). The steps update the models
    (Adam, lr 1e-6): measure last. ``modes``: name -> a ``SPEED_MODES`` key (default "fp32"): bf16 autocast and / or
    the compiled output layer for that entry's steps (entries may share one model under different modes)."""
    times = {name: [] for name in models}
    first = {}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-6) for name, m in models.items()}
    n = len(next(iter(rows.values())))
    for r in range(repeats + 2):
        idx = [(r * args.batch_size + i) % n for i in range(args.batch_size)]
        for name, model in models.items():
            batch = collators[name]([rows[name][i] for i in idx])
            bf16, compiled = SPEED_MODES[(modes or {}).get(name, "fp32")]
            lm = _lm_of(model)
            lm.output_layer_compiled = compiled and lm.compile_output_layer(True)
            device = next(model.parameters()).device
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            model.train()
            synchronize(device)  # on a GPU: time the step's kernels, not only their queueing
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            synchronize(device)
            if r == 0:
                first[name] = time.perf_counter() - start
            if r >= 2:  # two warm-up rounds
                times[name].append((time.perf_counter() - start, int((batch["labels"][..., 1:] != -100).sum())))
    model_times = {}
    for name, values in times.items():
        model_times[name] = {"step_s": statistics.median(t for t, _ in values),
                             "tokens_per_s": sum(k for _, k in values) / sum(t for t, _ in values),
                             "first_step_s": first[name]}
        models[name].eval()
    return model_times


def generation_speed(model, tok, new_tokens: int, device: str, **conditioning) -> dict:
    """Tokens/s of greedy ``generate()`` (one row, cache on, ``new_tokens`` tokens; with ``conditioning``, e.g.
    ``topic_ids=[1]``) and of a plain loop over the same model (``forward`` on the last token with the returned
    ``state``; the unconditioned prior or no topics), the device synchronised around each."""
    model.eval()
    bos = torch.tensor([[tok.bos_token_id]], device=device)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)

    def run_generate():
        torch.manual_seed(0)
        return model.generate(bos, **kwargs, **conditioning)

    def run_loop():
        torch.manual_seed(0)
        ids, state, extra = bos, None, {}
        with torch.no_grad():
            for _ in range(new_tokens):
                out = model(input_ids=ids[:, -1:], state=state, use_cache=True, **extra)
                state = out.state
                if getattr(out, "topic_representation", None) is not None and not extra:
                    extra = {"topic_representation": out.topic_representation}
                logits = out.logits[:, -1]
                logits[:, tok.unk_token_id] = float("-inf")  # as generate's default suppresses <unk>
                ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        return ids

    times = {"generate": [], "loop": []}
    for r in range(4):
        for name, fn in (("generate", run_generate), ("loop", run_loop)):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)  # on a GPU: the tokens generated, not only queued
            if r:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    g, loop = statistics.median(times["generate"]), statistics.median(times["loop"])
    return {"generate_tokens_per_s": new_tokens / g, "loop_tokens_per_s": new_tokens / loop,
            "overhead_ms_per_token": 1000 * (g - loop) / new_tokens}


def cached_lda_judge(path: Path, train_docs, topic_tok, num_topics: int, seed: int, **lda_settings):
    """The LDA judge fitted on ``train_docs``, cached in two files named ``path`` plus a suffix (read back when they
    are there: fitting takes minutes): ``<path>.safetensors`` holds the judge (``LDAJudge.save``: arrays and JSON,
    no pickle) and ``<path>.json`` what it was fitted with (``num_topics``, ``seed``, ``lda_settings``, the topic
    vocabulary); a cache fitted with anything else is fitted again. A ``<path>.pkl`` that earlier versions wrote is
    never read (unpickling a file runs whatever code it names, and results folders are shared): it is left alone,
    and the judge is fitted again. ``lda_settings`` (e.g. ``max_iter``) go to ``fit_lda_judge``."""
    stored, fitted_with, pickled = (path.with_name(path.name + suffix) for suffix in (".safetensors", ".json", ".pkl"))
    ids = topic_tok.get_vocab()
    settings = jsonable({"num_topics": num_topics, "seed": seed, "lda_settings": lda_settings,
                         "topic_vocabulary": sorted(ids, key=ids.get)})
    why = None
    if stored.exists() and read_json(fitted_with) == settings:
        try:
            return LDAJudge.load(stored)
        except ValueError as e:
            why = str(e)
    elif stored.exists():
        why = f"{fitted_with} does not name these settings and this topic vocabulary"
    elif pickled.exists():
        why = f"{pickled} is ignored: a pickle is never loaded (unpickling can run any code)"
    if why is not None:
        print(f"LDA judge: {why}; fitting it again", flush=True)
    start = time.perf_counter()
    judge = fit_lda_judge(train_docs, topic_tok, num_topics=num_topics, seed=seed, **lda_settings)
    fitted_with.unlink(missing_ok=True)  # the settings are written last: they mark a complete cache
    judge.save(stored)
    write_json(fitted_with, settings)
    print(f"LDA judge: {judge.description} ({time.perf_counter() - start:.0f} s)", flush=True)
    return judge


def steer(model, args, tok, topic_tok, judge, fluency_model, topic_guidance_scale=None, topic_layer=None) -> dict:
    """``evaluate_steering`` with the run's settings (``args.steer_topics``, ``args.steer_samples``,
    ``args.max_new_tokens``, ``args.seed``), at a decode-time guidance scale (None: plain conditioning), towards
    the topics of ``topic_layer`` of a hierarchy (None: the bottom layer)."""
    return evaluate_steering(model, num_topics_sampled=args.steer_topics, num_samples=args.steer_samples,
                             max_new_tokens=args.max_new_tokens, tokenizer=tok, topic_tokenizer=topic_tok,
                             judge=judge, fluency_model=fluency_model, seed=args.seed,
                             topic_guidance_scale=topic_guidance_scale, topic_layer=topic_layer)


# The steering setting a table reports: the most accurate (by the LDA judge) whose steered texts stay fluent.
MAX_FLUENCY_RATIO = 1.5


def fluent_setting(by_setting: dict[str, dict], max_fluency_ratio: float = MAX_FLUENCY_RATIO) -> tuple[str, str]:
    """``(key, why)``: of the steering results of one model at several settings (``evaluate_steering`` results
    keyed by a setting's name, e.g. the guidance scale), the one with the highest LDA-judge accuracy among those
    whose fluency ratio is at most ``max_fluency_ratio``; where none is, plain conditioning (the key ``"1"``, else
    the first setting), and ``why`` says so."""
    fluent = [k for k, v in by_setting.items() if (v.get("fluency_ratio") or float("inf")) <= max_fluency_ratio]
    if fluent:
        best = max(fluent, key=lambda k: by_setting[k].get("accuracy_lda") or 0.0)
        return best, f"the most accurate setting with a fluency ratio of at most {max_fluency_ratio:g}"
    plain = "1" if "1" in by_setting else next(iter(by_setting))
    return plain, f"plain conditioning: no setting kept the fluency ratio at most {max_fluency_ratio:g}"
