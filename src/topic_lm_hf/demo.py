"""``topic-lm demo``: the first thing a newcomer runs. A few minutes on 2 CPU cores.

It first loads the models that ship with the repository (``hub_models/``: the carried LSTM, the carried rGBN-RNN
started from it and the carried TCNLM, trained on ``wikipedia-sample`` until they stopped improving on the development
articles) and shows their perplexity under ``causal-carry`` with each topic model's ablation, its topics and text
steered by two of them. Then it
trains a topic model (``--family``; by default the family that did best under ``causal`` at the demo's budget,
measured by ``scripts/benchmark_demo.py``) and the same-size LSTM on ``wikipedia-sample`` (English Wikipedia articles
that ship with the package; ``--train_file`` names another corpus) under a wall-clock budget, then shows what the
topics do: their words and NPMI (against the shipped reference of other Wikipedia articles), text
generated from two different topics, a document-conditioned continuation, and perplexity under the three protocols
next to the mismatched-context ablation. It saves both models and reloads them with ``AutoModelForCausalLM``. One
line per phase, with timings.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback, TrainingArguments, set_seed

from . import data as data_lib
from .collator import TopicContextCollator, make_bow
from .evaluation import evaluate_perplexity, evaluate_steering, topic_diversity
from .devices import DeviceArguments
from .families import DEMO_TOPICS, family_of, topic_families
from .fast_path import FastPathArguments, resolve_compile, resolve_precision
from .models import LSTMLMConfig, LSTMLMForCausalLM
from .pretraining import pretrain_topic_model, steering_recipe
from .protocols import PROTOCOLS
from .trainer import TopicLMTrainer

# The demo's models: every topic family with demo sizes (Family.demo_sizes: DEMO_SIZES and DEMO_TOPICS topics in its
# configuration's own fields) beside the LSTM at its demo sizes. Every topic family is built with its steering recipe
# (steering_recipe: for TCNLM, the product of experts with its topic model, topic_output_bias="beta"; in
# scripts/benchmark_steering.py the paper's TCNLM did not steer at CPU budgets, this did).
BASELINE = family_of(LSTMLMConfig.model_type)  # the same-size LSTM
# The default family: the one with the best perplexity under causal at the demo's budget, measured by
# scripts/benchmark_demo.py (results/demo-budget; tests/test_benchmark_demo.py checks that this is the measured best).
DEMO_FAMILY = "nclm"
TOPIC_PRETRAINING_STEPS = 300
DEMO_MIN_FREQ = 25
CHUNKS_PER_STEP = 64
MIN_COMPARED_STEPS = 50  # the verdict compares the two models only when each took at least this many steps
MIN_TOPIC_WORDS_PER_TOPIC = 3  # a smaller topic vocabulary per topic is refused (the synthetic corpus has 69 words)


def demo_families() -> list[str]:
    """The topic families the demo trains (``--family``): the registered ones with demo sizes, by model_type."""
    return [family.model_type for family in topic_families() if family.demo_sizes]


@dataclass
class DemoArguments:
    train_file: Optional[str] = field(default=None, metadata={
        "help": "Your own corpus instead of wikipedia-sample (Lau .txt[.gz], .jsonl[.gz], .parquet with a "
                "'sentences' column); a tenth is held out."})
    synthetic: bool = field(default=False, metadata={
        "help": "Use the package's synthetic corpus (labelled SYNTHETIC) instead of real text."})
    family: str = field(default=DEMO_FAMILY, metadata={
        "help": f"The topic family trained beside the LSTM: one of {', '.join(demo_families())}. The default did best "
                "under causal at the demo's budget (scripts/benchmark_demo.py)."})
    output_dir: str = field(default="out/demo", metadata={"help": "Where both models are saved."})
    train_seconds: float = field(default=60.0, metadata={"help": "Wall-clock training budget of each model."})
    eval_documents: int = field(default=60, metadata={"help": "Validation documents evaluated."})
    npmi_documents: int = field(default=600, metadata={
        "help": "Articles of the NPMI reference that ships with the package (wikipedia-sample/npmi-reference: 600 "
                "Wikipedia articles that the sample does not hold; 0 skips NPMI)."})
    shipped_models: str = field(default="hub_models", metadata={
        "help": "The folder of the models that ship with the repository (wiki-lstm-carry, wiki-rgbn-rnn-carry, "
                "wiki-tcnlm-carry: "
                "trained to convergence on wikipedia-sample), shown first with the default corpus; 'none' skips "
                "them."})
    threads: int = field(default=1, metadata={
        "help": "torch threads. 1 by default: on a busy 2-core machine two threads ran these small recurrent models "
                "3.3x slower than one."})
    seed: int = field(default=0, metadata={"help": "Random seed."})


class TimeBudget(TrainerCallback):
    """Stops training after ``seconds`` of wall time (or ``max_steps``) and prints a progress line at the first
    logging step, then at the first logging step at least ``every`` seconds after the last line printed (a few
    lines per model, however fast its steps are). ``clock``: another clock than the wall's (scripts/benchmark_demo.py
    gives ``time.process_time``, the process's CPU time, so that other jobs on the machine do not shorten a budget)."""

    def __init__(self, seconds: float, label: str, every: float = 10.0, clock: Optional[Callable[[], float]] = None):
        self.seconds, self.label, self.every, self.clock = seconds, label, every, clock
        self.start = self.printed = None

    def now(self) -> float:
        return (self.clock or time.perf_counter)()

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.printed = self.now(), None

    def on_step_end(self, args, state, control, **kwargs):
        if self.now() - self.start >= self.seconds:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "lm_loss" in logs:
            elapsed = self.now() - self.start
            if self.printed is not None and elapsed - self.printed < self.every:
                return
            self.printed = elapsed
            print(f"       {self.label}: step {state.global_step:4d}, {elapsed:4.0f} s, LM loss {logs['lm_loss']:.2f} "
                  f"(perplexity {math.exp(logs['lm_loss']):.0f})", flush=True)


SHIPPED_LSTM = "wiki-lstm-carry"
# each shipped topic model's folder: its family's name and how it was started
SHIPPED_TOPIC_MODELS = {"wiki-rgbn-rnn-carry": ("rGBN-RNN", " (started from that LSTM)"),
                        "wiki-tcnlm-carry": ("TCNLM", "")}
# a shipped topic model's topic-free twin (trained alike with every context empty), shown beside it where it ships
SHIPPED_TWINS = {"wiki-rgbn-rnn-carry": "wiki-rgbn-rnn-carry-twin"}


def show_shipped_models(folder: str, valid_docs, device, seed: int) -> bool:
    """The models that ship with the repository, loaded with ``AutoModelForCausalLM``: their perplexity on the sample's
    validation articles under ``causal-carry``, each topic model's ablation and, where its topic-free twin ships, the
    twin's (every context empty, as it was trained), its topics and steered text. False (and one line saying where
    they would be) when ``folder`` does not hold them (an installed package)."""
    paths = {name: os.path.join(folder, name) for name in (SHIPPED_LSTM, *SHIPPED_TOPIC_MODELS)}
    if not all(os.path.isfile(os.path.join(p, "config.json")) for p in paths.values()):
        print(f"       no trained models in {folder}/ (they ship with the repository's clone, not with the package): "
              "skipped", flush=True)
        return False
    twins = {name: twin for name, twin in SHIPPED_TWINS.items()
             if os.path.isfile(os.path.join(folder, twin, "config.json"))}
    paths.update({twin: os.path.join(folder, twin) for twin in twins.values()})
    models = {name: AutoModelForCausalLM.from_pretrained(p).to(device).eval() for name, p in paths.items()}
    ppl = {name: evaluate_perplexity(m, valid_docs, "causal-carry", empty_context=name in twins.values())
           ["perplexity"] for name, m in models.items()}
    ablation = {name: evaluate_perplexity(models[name], valid_docs, "causal-carry", mismatched_context=True)
                ["perplexity"] for name in SHIPPED_TOPIC_MODELS}
    print(f"       {', '.join(paths.values())}: each trained until it stopped improving on the development articles "
          "(their README.md: the command and the measurements)", flush=True)
    print(f"\n| model | causal-carry perplexity |\n|---|---|\n| carried LSTM | {ppl[SHIPPED_LSTM]:.2f} |")
    for name, (family, started) in SHIPPED_TOPIC_MODELS.items():
        if name in twins:
            print(f"| carried {family}'s topic-free twin{started}, trained alike with every context empty | "
                  f"{ppl[twins[name]]:.2f} |")
        print(f"| carried {family}{started} | {ppl[name]:.2f} |\n"
              f"| carried {family}, another document's topics (ablation) | {ablation[name]:.2f} |")
    print(flush=True)
    lstm = ppl[SHIPPED_LSTM]
    for name, (family, _) in SHIPPED_TOPIC_MODELS.items():
        own = ablation[name] - ppl[name]
        base, against = (ppl[twins[name]], "its topic-free twin, the strongest baseline") if name in twins else \
            (lstm, "the LSTM")
        gain = base - ppl[name]
        where = f"below {against} ({gain:.2f} points)" if gain >= 0 else f"above {against} ({-gain:.2f} points behind)"
        print(f"       on {len(valid_docs)} validation articles the {family} is {100 * abs(gain) / base:.1f} % "
              f"{where}; its document's own topics are worth {own:.2f} points (the ablation: another document's "
              "topics cost it that much)", flush=True)
    for name, (family, _) in SHIPPED_TOPIC_MODELS.items():
        topic_model, (tok, _) = models[name], data_lib.load_vocabularies(paths[name])
        topics = topic_model.get_topics(top_n=8)
        for k in range(2):
            print(f"       {family} topic {k:2d}  {' '.join(topics[k])}", flush=True)
        bos = torch.tensor([[tok.bos_token_id]], device=device)
        for k in range(2):
            torch.manual_seed(seed)
            out = topic_model.generate(bos, topic_ids=[k], max_new_tokens=20, min_new_tokens=8, do_sample=True,
                                       top_p=0.7, top_k=0, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            print(f"       {family} steered by topic {k}: {words(tok, out[0])}", flush=True)
    return True


def phase(number: int, total: int, text: str) -> float:
    print(f"[{number}/{total}] {text}", flush=True)
    return time.perf_counter()


def done(start: float) -> str:
    return f"{time.perf_counter() - start:.0f} s"


def locate_corpus(train_file: Optional[str], synthetic: bool = False):
    """(train, valid, label, stop list): ``topic-lm train``'s corpora (``--train_file`` with a tenth held
    out, else ``wikipedia-sample`` and its validation split, or the labelled synthetic corpus when asked for) and
    the papers' MALLET stop list."""
    from .data import DataArguments, load_corpora

    train, valid, source = load_corpora(DataArguments(train_file=train_file, synthetic=synthetic))
    return train, valid, source, "mallet"


def check_family(family: str) -> str:
    """``family`` if it is one of the demo's topic families (:func:`demo_families`); a one-line ``ValueError`` if
    not."""
    if family not in demo_families():
        raise ValueError(f"--family must be one of {', '.join(demo_families())}, got {family!r}")
    return family


def build_topic_model(family: str, tok, topic_tok):
    """The demo's model of topic family ``family`` (one of :func:`demo_families`) at its demo sizes, sized to the
    vocabularies."""
    record = family_of(check_family(family))
    config = record.config_class.from_tokenizers(tok, topic_tok, **record.demo_sizes, **steering_recipe(family))
    return record.causal_lm_class(config)


def pretrain(model, train_docs, tok, topic_tok, steps: int = TOPIC_PRETRAINING_STEPS) -> list[float]:
    """Pre-train ``model``'s topic model on its pre-training batches for ``steps``; the losses."""
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
    return pretrain_topic_model(model, collator.prepare(train_docs), collator, steps, learning_rate=3e-3).losses


def rows_per_step(model, rows) -> int:
    """Training rows per step: ``CHUNKS_PER_STEP`` sentence chunks, or as many whole documents as hold about that
    many chunks for a family that reads documents (rGBN-RNN)."""
    if not type(model).reads_documents:
        return CHUNKS_PER_STEP
    per_document = sum(len(row["input_ids"]) for row in rows) / max(1, len(rows))
    return max(1, round(CHUNKS_PER_STEP / per_document))


def speed_settings(fast: FastPathArguments, device: torch.device | str = "cpu") -> tuple[dict, str]:
    """The fast path the demo trains with on ``device`` (bf16 autocast, the compiled output layer: what ``fast``
    asks for, or what was measured to pay there) as :func:`train_for` keywords, and the sentence that says so."""
    if fast.cuda_graphs:
        raise ValueError("--cuda_graphs is a flag of topic-lm train: the demo trains eagerly")
    targs = training_arguments("unused", 3e-3, device=device)
    compiled = resolve_compile(targs, fast.compile_output_layer)
    bf16, sentence = resolve_precision(targs, fast.precision, compiled)
    return dict(bf16=bf16, compile_output_layer=compiled, device=device), sentence


def training_arguments(out_dir: str, learning_rate: float, max_steps: int = 100_000, bf16: bool = False,
                       device: torch.device | str = "cpu", batch_size: int = CHUNKS_PER_STEP):
    on_cpu = torch.device(device).type == "cpu"
    return TrainingArguments(output_dir=out_dir, max_steps=max_steps, per_device_train_batch_size=batch_size,
                             learning_rate=learning_rate, max_grad_norm=0.5, lr_scheduler_type="constant",
                             logging_steps=25, save_strategy="no", eval_strategy="no", report_to=[], use_cpu=on_cpu,
                             disable_tqdm=True, seed=0, dataloader_pin_memory=not on_cpu, bf16=bf16)


def train_for(model, rows, collator, seconds: float, out_dir: str, label: str, learning_rate: float,
              max_steps: int = 100_000, bf16: bool = False, compile_output_layer: bool = False,
              device: torch.device | str = "cpu", clock: Optional[Callable[[], float]] = None):
    """Train on ``device`` until ``seconds`` of wall time (of ``clock``) or ``max_steps`` have passed, with
    ``rows_per_step`` rows per step; returns the steps taken."""
    args = training_arguments(out_dir, learning_rate, max_steps, bf16, device, rows_per_step(model, rows))
    budget = TimeBudget(seconds, label, clock=clock)
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=rows, data_collator=collator, callbacks=[budget],
                             compile_output_layer=compile_output_layer)
    trainer.remove_callback(PrinterCallback)  # one line per logging step (TimeBudget), not the raw log dicts
    trainer.train()
    model.eval()
    return trainer.state.global_step


def words(tokenizer, ids) -> str:
    """Generated ids as words (special tokens dropped), or "(empty)"."""
    special = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    text = " ".join(tokenizer.convert_ids_to_tokens([i for i in ids.tolist() if i not in special]))
    return text or "(empty)"


# The decodings the demo's steered samples may use, and how one is chosen: by measured fluency (the perplexity of
# the steered texts under the demo's LSTM), among those that stay about their topic and do not repeat themselves.
NO_REPEAT = {"no_repeat_ngram_size": 2}
DECODINGS = {
    "nucleus p = 0.9": dict(top_p=0.9),
    "nucleus p = 0.7, no repeated bigram": dict(top_p=0.7, generation_options=NO_REPEAT),
    "nucleus p = 0.5, no repeated bigram": dict(top_p=0.5, generation_options=NO_REPEAT),
}
MIN_LIFT, MIN_DISTINCT_2 = 2.0, 0.8
DECODING_RULE = (f"the most fluent with a topic-word lift of at least {MIN_LIFT:g} and at least {MIN_DISTINCT_2:.0%} "
                 "distinct bigrams")


def generate_keywords(decoding: dict) -> dict:
    """A ``DECODINGS`` entry as ``generate`` keywords (nucleus sampling alone: ``top_k=0``)."""
    return {"top_p": decoding["top_p"], "top_k": 0, **decoding.get("generation_options", {})}


def choose_decoding(model, fluency_model, topics, tok, topic_tok, seed: int) -> tuple[str, dict, dict]:
    """``(name, decoding, measured)``: every ``DECODINGS`` entry measured by ``evaluate_steering`` (6 texts per topic
    of ``topics``, 20 tokens, fluency judged by ``fluency_model``), and the one ``DECODING_RULE`` picks (the most
    fluent of all where none qualifies)."""
    measured = {name: evaluate_steering(model, topics=topics, num_samples=6, max_new_tokens=20, tokenizer=tok,
                                        topic_tokenizer=topic_tok, fluency_model=fluency_model, seed=seed, **decoding)
                for name, decoding in DECODINGS.items()}
    qualified = [n for n, r in measured.items() if qualifies(r)]
    # No fluency where every steered text came out empty (a small or short-trained model): such a decoding is last.
    name = min(qualified or measured, key=lambda n: _or(measured[n]["fluency_ppl_steered"], math.inf))
    return name, DECODINGS[name], measured


def qualifies(measured: dict) -> bool:
    """Whether one measured decoding meets ``DECODING_RULE``'s lift and distinct-bigram thresholds."""
    return (measured["lift"] or 0) >= MIN_LIFT and _or(measured["distinct_2"], 0) >= MIN_DISTINCT_2


def chosen_line(name: str, measured: dict) -> str:
    """The demo's line for the decoding :func:`choose_decoding` picked, saying whether it met the rule."""
    if qualifies(measured[name]):
        return f"       chosen: {name} ({DECODING_RULE})"
    return (f"       chosen: {name}, the most fluent; no decoding met the rule ({DECODING_RULE}): the model is too "
            "small or too briefly trained for its topics to steer")


def _or(value, default):
    return default if value is None else value


def decoding_line(candidate: str, measured: dict) -> str:
    """One measured decoding of :func:`choose_decoding` as a line of the demo ("n/a" for a measure it could not take:
    no fluency nor lift where the steered texts are empty)."""
    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)

    return (f"       {candidate}: fluency {fmt(measured['fluency_ppl_steered'], '.0f')} (perplexity of the steered "
            f"texts under the LSTM), topic-word lift {fmt(measured['lift'], '.1f')}, distinct bigrams "
            f"{fmt(measured['distinct_2'], '.2f')}")


def verdict(topic: float, lstm: float, ablation: float, steps: dict, seconds: float, label: str) -> str:
    """One paragraph on the protocol that generation uses (``causal``: only the sentences before): is the topic model
    ``label`` at least as good as the LSTM trained for the same wall time, and how much of its perplexity its
    document's own topics bring (``ablation``: ``causal`` with another document's context); where the LSTM is ahead,
    why, and which topic family does best at the demo's budget (``budget_line``)."""
    own = ablation - topic
    head = (f"       Under causal (what generation sees: only the sentences before), after {seconds:.0f} s of "
            f"training each ({label} {steps[label]} steps, the LSTM {steps[BASELINE.label]}): {label} {topic:.2f}, the LSTM "
            f"{lstm:.2f} ({100 * (topic - lstm) / lstm:+.1f} %). The document's own topics are worth {own:.2f} "
            f"perplexity points to {label} (with another document's topics it scores {ablation:.2f}).")
    if min(steps.values()) < MIN_COMPARED_STEPS:
        body = (f" With fewer than {MIN_COMPARED_STEPS} training steps, neither model has learned enough for this "
                "comparison to say which is better: give more --train_seconds.")
    elif topic <= lstm:
        body = " The topic model is at least as good as the LSTM" + (
            ", through its document's own topics." if own >= lstm - topic else
            ", but more by its architecture than by its document's own topics.")
    else:
        body = (" So the topic model is not as good as the LSTM here. Why: in the same time it takes fewer steps "
                "(each is slower), and it has more weights to learn (its topic model and the weights through which "
                "the topics reach the LM), so a budget this short favours the LSTM; "
                + ("its topics help, but by less than the LSTM's lead." if own > 0 else "its topics do not help yet."))
    return (head + body + " " + budget_line(label) + " results/README.md compares the families trained until their "
            "development perplexity stops improving.")


def budget_line(label: str) -> str:
    """What the demo's budget measurement (scripts/benchmark_demo.py) says of the topic family ``label``."""
    best = family_of(DEMO_FAMILY).label
    where = "scripts/benchmark_demo.py; results/README.md, \"The demo on a 2-core CPU\""
    if label == best:
        return f"{label} is the family that did best of the package's topic families at this budget ({where})."
    return f"Of the package's topic families, {best} did best at this budget ({where}): the demo's default."


def run_demo(args: DemoArguments, fast: FastPathArguments | None = None, device: DeviceArguments | None = None) -> None:
    """The demo (see the module docstring); ``topic-lm demo`` parses ``args``, ``fast`` (default: the fast path
    measured for the device) and ``device`` (default: the GPU when there is one). The package's log messages below
    errors are silenced while it runs: it prints its own line per phase."""
    package_logger = logging.getLogger("topic_lm_hf")
    previous = package_logger.level
    package_logger.setLevel(logging.ERROR)
    try:
        _run_demo(args, fast if fast is not None else FastPathArguments(), (device or DeviceArguments()).torch_device)
    finally:
        package_logger.setLevel(previous)


def check_demo_arguments(args: DemoArguments) -> None:
    """Every flag of the demo checked before anything is read or trained (each used to fail, or be ignored, minutes
    later): one ``ValueError`` naming the flag."""
    cores = os.cpu_count() or 1
    if not 1 <= args.threads <= cores:
        raise ValueError(f"--threads must be in 1..{cores} (this machine's cores), got {args.threads}")
    if not (math.isfinite(args.train_seconds) and args.train_seconds > 0):  # NaN or inf would never stop
        raise ValueError(f"--train_seconds must be a positive number of seconds, got {args.train_seconds}")
    data_lib.check_positive_flags(eval_documents=args.eval_documents)
    if args.npmi_documents < 0:
        raise ValueError(f"--npmi_documents must be >= 0 (0 skips NPMI), got {args.npmi_documents}")
    if args.synthetic and args.train_file is not None:
        raise ValueError("give one of --synthetic and --train_file: the synthetic corpus would replace the file")
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        raise ValueError(f"--output_dir {args.output_dir} is a file: give a folder (it is created if missing)")


def check_topic_vocabulary(size: int, documents: int, min_freq: int) -> None:
    """Refuse, in one line, a corpus whose topic vocabulary is too small for the demo's topics (a few dozen
    documents: topics of one or two words, which NPMI cannot even score)."""
    needed = MIN_TOPIC_WORDS_PER_TOPIC * DEMO_TOPICS
    if size < needed:
        raise ValueError(
            f"the {documents} training documents give a topic vocabulary of {size} words (seen >= {min_freq} times, "
            f"stop words left out), too few for {DEMO_TOPICS} topics (at least {needed}): give a larger --train_file "
            "(wikipedia-sample, the default, has 900 articles)")


def distinct_topics_warning(topics: list[list[str]], least: float = 0.5) -> Optional[str]:
    """A warning line when the topics share most of their top words (their ``topic_diversity`` of the unique
    variant below ``least``): a corpus too small or a training too short for distinct topics. None otherwise."""
    distinct = topic_diversity(topics, k=min(len(topic) for topic in topics))
    if distinct >= least:
        return None
    return (f"       warning: the {len(topics)} topics share most of their top words ({distinct:.0%} of them distinct): "
            "the corpus is too small, or training too short, for distinct topics")


def _run_demo(args: DemoArguments, fast: FastPathArguments, device: torch.device) -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    check_demo_arguments(args)
    check_family(args.family)  # before the data is read
    torch.set_num_threads(args.threads)
    set_seed(args.seed)
    t0 = time.perf_counter()
    shipped = args.shipped_models != "none" and args.train_file is None and not args.synthetic
    total, first = (8, 2) if shipped else (7, 1)
    if shipped:
        start = phase(1, total, "the trained models that ship with the repository (wikipedia-sample)")
        show_shipped_models(args.shipped_models, data_lib.load_documents("wikipedia-sample/validation"), device,
                            args.seed)
        print(f"       ({done(start)}); next, training from scratch for a few minutes", flush=True)

    start = phase(first, total, "data and vocabularies")
    train_docs, valid_docs, source, stopwords = locate_corpus(args.train_file, args.synthetic)
    valid_docs = valid_docs.select(range(min(args.eval_documents, len(valid_docs))))
    source = f"{source}; the first {len(valid_docs)} validation documents evaluated"
    synthetic = "SYNTHETIC" in source
    # Words seen at least 25 times (wikipedia-sample: 1,952 instead of 4,825 at the papers' 10; APNEWS: 2,360 instead
    # of 4,926): half the softmax cost per step, so twice the steps in the budget. Perplexities are therefore not
    # comparable with results/README.md.
    tok, topic_tok = data_lib.build_vocabularies(train_docs, min_freq=1 if synthetic else DEMO_MIN_FREQ,
                                                 stopwords=stopwords)
    print(f"       {source}; LM vocabulary "
          f"{len(tok):,} words (frequency >= {1 if synthetic else DEMO_MIN_FREQ}), topic vocabulary {len(topic_tok):,} "
          f"({done(start)})", flush=True)

    check_topic_vocabulary(len(topic_tok), len(train_docs), 1 if synthetic else DEMO_MIN_FREQ)
    label, baseline = family_of(args.family).label, BASELINE.label
    lstm = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), **BASELINE.demo_sizes)).to(device)
    topic_model = build_topic_model(args.family, tok, topic_tok).to(device)
    lm_collator = TopicContextCollator.for_model(lstm, tok)
    topic_collator = TopicContextCollator.for_model(topic_model, tok, topic_tok)  # the family's training context
    topic_rows = topic_collator.prepare(train_docs)

    start = phase(first + 1, total,
                  f"pre-training {label}'s topic model on bags of words ({TOPIC_PRETRAINING_STEPS} steps)")
    losses = pretrain(topic_model, train_docs, tok, topic_tok)
    print(f"       topic-model loss per word {losses[0]:.2f} -> {losses[-1]:.2f} ({done(start)})", flush=True)

    start = phase(first + 2, total, f"training {label} ({DEMO_TOPICS} topics), then the same-size LSTM, for "
                            f"{args.train_seconds:.0f} s each")
    speed, sentence = speed_settings(fast, device)
    print(f"       {sentence} Device: {device}.", flush=True)
    steps = {}
    steps[label] = train_for(topic_model, topic_rows, topic_collator, args.train_seconds,
                             os.path.join(args.output_dir, args.family), label, 3e-3, **speed)
    steps[baseline] = train_for(lstm, lm_collator.prepare(train_docs), lm_collator, args.train_seconds,
                                os.path.join(args.output_dir, BASELINE.short_name), f"{baseline} ", 3e-3, **speed)
    sizes = {name: sum(p.numel() for p in model.parameters()) / 1e6
             for name, model in ((label, topic_model), (baseline, lstm))}
    batches = (f"of {CHUNKS_PER_STEP} sentence chunks each" if not type(topic_model).reads_documents else
               f"the LSTM's of {CHUNKS_PER_STEP} sentence chunks, {label}'s of "
               f"{rows_per_step(topic_model, topic_rows)} whole documents (about as many chunks)")
    print(f"       {label} {steps[label]} steps ({sizes[label]:.1f} M parameters), the LSTM {steps[baseline]} "
          f"({sizes[baseline]:.1f} M), {batches} ({done(start)})", flush=True)

    start = phase(first + 3, total, "saving, and reloading with AutoModelForCausalLM")
    reloaded = {}
    for name, model in ((args.family, topic_model), (BASELINE.short_name, lstm)):
        path = os.path.join(args.output_dir, name)
        model.save_pretrained(path)
        data_lib.save_vocabularies(tok, topic_tok, path)
        reloaded[name] = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
        probe = tok(["the"], return_tensors="pt").to(device)
        with torch.no_grad():
            difference = float((model(**probe).logits - reloaded[name](**probe).logits).abs().max())
        same = difference <= 1e-4  # float32 rounding only (the copies' weights may be laid out differently)
        print(f"       {path}: same logits after reloading: {same} (largest difference {difference:.1e})", flush=True)
    topic_model, lstm = reloaded[args.family], reloaded[BASELINE.short_name]
    print(f"       ({done(start)})", flush=True)

    start = phase(first + 4, total,
                  "the topics (top words from beta" + (", NPMI on Wikipedia)" if args.npmi_documents else ")"))
    topics = topic_model.get_topics(top_n=10)
    npmi = None
    if args.npmi_documents and not synthetic:
        from .evaluation.topic_eval import evaluate_topics

        # Other articles than the training ones: the shipped reference holds none of wikipedia-sample's
        result = evaluate_topics(topic_model, "wikipedia-sample/npmi-reference", max_documents=args.npmi_documents)
        npmi = result["npmi_per_topic"]
        print(f"       mean NPMI {result['npmi']:.3f} ({result['coherence']['preset']} preset, "
              f"{result['coherence']['reference']}); diversity {result['diversity']:.2f}", flush=True)
    warning = distinct_topics_warning(topics)
    if warning:
        print(warning, flush=True)
    order = sorted(range(len(topics)), key=lambda k: -(npmi[k] if npmi else 0.0))
    for k in order[:8]:
        score = f"NPMI {npmi[k]:+.3f}  " if npmi else ""
        print(f"       topic {k:2d}  {score}{' '.join(topics[k])}", flush=True)
    print(f"       ({done(start)})", flush=True)

    start = phase(first + 5, total,
                  "generation steered by topics (decoding chosen by measured fluency), and by a document")
    name, decoding, measured = choose_decoding(topic_model, lstm, order[:4], tok, topic_tok, args.seed)
    for candidate, r in measured.items():
        print(decoding_line(candidate, r), flush=True)
    print(chosen_line(name, measured), flush=True)
    for row in measured[name]["per_topic"][:2]:
        print(f"       topic {row['topic']} ({' '.join(topics[row['topic']][:6])}):", flush=True)
        for text in row["texts"]:
            print(f"         - {text or '(empty)'}", flush=True)
    vocab = tok.get_vocab()
    # The first validation document whose opening words are all in the vocabulary (no <unk> in the prompt).
    document = next((d for d in valid_docs["sentences"] if len(d) > 1 and all(w in vocab for w in d[0][:4])),
                    valid_docs[0]["sentences"])
    context = [w for s in document[1:] for w in s]
    prompt = document[0][:4]
    print(f"       a validation document: \"{' '.join(w for s in document[:2] for w in s)[:160]} ...\"", flush=True)
    inputs = tok([" ".join(prompt)], return_tensors="pt").to(device)
    bow = make_bow([context], topic_tok).to(device)
    t = topic_model.infer_topics(bow)[0]
    top = t.topk(2)
    print("       its topics (inferred from the rest of the document): " + "; ".join(
        f"topic {k} ({weight:.0%}: {' '.join(topics[k][:5])})" for weight, k in zip(top.values.tolist(),
                                                                                   top.indices.tolist())), flush=True)
    torch.manual_seed(args.seed)
    out = topic_model.generate(**inputs, context_bow=bow, max_new_tokens=20, min_new_tokens=8, do_sample=True,
                         **generate_keywords(decoding), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    print(f"       continue \"{' '.join(prompt)}\" with the document's topics: {words(tok, out[0])}", flush=True)
    # What the document's topics do to the next word: probability mass on the document's own topic words.
    doc_words = sorted({vocab[w] for w in context if w in vocab and w in topic_tok.get_vocab()})
    with torch.no_grad():
        mass = {name: float(torch.softmax(topic_model(**inputs, **kw).logits[0, -1].float(), -1)[doc_words].sum())
                for name, kw in (("with", {"context_bow": bow}), ("without", {}))}
    print(f"       next word after \"{' '.join(prompt)}\": probability that it is one of the document's own "
          f"{len(doc_words)} topic words: {mass['with']:.1%} with its topics, {mass['without']:.1%} without", flush=True)
    print(f"       ({done(start)})", flush=True)

    start = phase(first + 6, total, f"perplexity on {len(valid_docs)} validation documents under each protocol")
    rows = []
    for name, model in ((baseline, lstm), (label, topic_model)):
        for protocol in PROTOCOLS:
            rows.append((name, protocol, evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok,
                                                             topic_tokenizer=topic_tok)["perplexity"]))
    # the ablation under the protocols that reset the state: each chunk's context is all another document gives it
    ablation = {protocol: evaluate_perplexity(topic_model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                              mismatched_context=True)["perplexity"]
                for protocol, record in PROTOCOLS.items() if not record.carry_state}
    print("\n| model | protocol | context of sentence j, state | perplexity |\n|---|---|---|---|")
    for name, protocol, ppl in rows:
        print(f"| {name} | {protocol} | {PROTOCOLS[protocol].description} | {ppl:.2f} |")
    for protocol, ppl in ablation.items():
        print(f"| {label} | {protocol}, another document's context (ablation) | another document's | {ppl:.2f} |")
    ppl = {(name, protocol): value for name, protocol, value in rows}
    print("\n" + verdict(ppl[(label, "causal")], ppl[(baseline, "causal")], ablation["causal"], steps,
                         args.train_seconds, label))
    print(f"\n       ({done(start)}) each model trained for {args.train_seconds:.0f} s; "
          f"{source}; vocabulary of words seen >= {1 if synthetic else DEMO_MIN_FREQ} times, so these perplexities "
          "are not comparable with the tables of results/README.md")
    print(f"\n[demo] finished in {time.perf_counter() - t0:.0f} s")
