"""The `topic-lm` command: train, evaluate, generate, topics, steer, classify, retrieve and demo.

Arguments are dataclasses parsed by `HfArgumentParser`, as in transformers' `run_clm.py`: every
`TrainingArguments` flag works with `topic-lm train`. Each subcommand is one entry of `COMMANDS`
(its argument dataclasses and its handler), so a new subcommand is one more entry. The dataclasses
are in `topic_lm_hf.arguments` (`topic_lm_hf.tasks.commands` for the tasks'), the handlers in
`topic_lm_hf.commands` (and the tasks', the demo's). Examples:

    topic-lm train --train_file wikipedia-sample --model_type lstm_lm \\
        --config_overrides "embedding_size=128,hidden_size=128" --output_dir out/lstm-wiki --max_steps 400
    topic-lm train --train_file $TOPIC_LM_DATA/apnews/train.txt --validation_file $TOPIC_LM_DATA/apnews/valid.txt \\
        --model_type lstm_lm --config_overrides "embedding_size=300,hidden_size=600" \\
        --output_dir out/lstm-apnews --max_steps 2000 --per_device_train_batch_size 64
    topic-lm evaluate --model_name_or_path out/lstm-apnews --validation_file $TOPIC_LM_DATA/apnews/valid.txt
    topic-lm generate --model_name_or_path out/lstm-apnews --prompt "the senate" --max_new_tokens 20
    topic-lm demo     # the README's main job: train, evaluate, save, reload, generate
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

from transformers import HfArgumentParser, TrainingArguments

from .arguments import (EvaluateArguments, ExportArguments, GenerateArguments, ModelArguments, SteerArguments,
                        TopicsArguments, UsageError)  # noqa: F401 (UsageError: topic_lm_hf.cli's before)
from .commands import run_evaluate, run_export, run_generate, run_steer, run_topics, run_train
from .data import DataArguments
from .demo import DEMO_FAMILY, DemoArguments, run_demo
from .devices import DeviceArguments
from .families import family_of
from .fast_path import FastPathArguments
from .tasks.commands import (ClassifyArguments, RetrieveArguments, TaskDataArguments, WSDEvaluateArguments,
                             WSDTrainArguments, run_classify, run_retrieve, run_wsd_evaluate, run_wsd_train)


@dataclass(frozen=True)
class Command:
    """A subcommand: what it does (``summary`` for ``topic-lm --help``, ``help`` for its own
    ``--help``), the dataclasses of its flags, the handler that gets one instance of each, and
    defaults that differ from the dataclasses' own."""

    summary: str
    arguments: tuple
    handler: Callable[..., None]
    help: str = ""
    defaults: dict = field(default_factory=dict)


COMMANDS: dict[str, Command] = {
    "train": Command(
        "Train a model on a corpus and save it with its tokenizers.",
        (DataArguments, ModelArguments, TrainingArguments, FastPathArguments), run_train,
        help="Resumes from the last checkpoint-* in --output_dir. Every TrainingArguments flag works; defaults that "
             "differ from TrainingArguments: --learning_rate 1e-3, --logging_steps 50, progress bar on "
             "(--disable_tqdm true turns it off; the logs are then printed as lines). Trains on the GPU when "
             "there is one (--use_cpu true: the CPU), topic-model pre-training included; in bf16 autocast with a "
             "compiled output layer on a CPU with native bf16, in float32 eager on a GPU (measured faster there; one "
             "log line says which and why; --precision and --compile_output_layer force either).",
        defaults={"learning_rate": 1e-3, "logging_steps": 50, "disable_tqdm": False}),
    "evaluate": Command(
        "Perplexity of a saved model under each context protocol.", (EvaluateArguments, DeviceArguments), run_evaluate,
        help="Logs a line when each protocol starts and ends (with its time), then prints a table."),
    "generate": Command(
        "Generate text from a saved model: from a prompt, from topics or from a document's topics.",
        (GenerateArguments, DeviceArguments), run_generate),
    "topics": Command("Print the top words of every topic of a saved topic model.", (TopicsArguments, DeviceArguments),
                      run_topics),
    "export": Command(
        "Write a saved model as an upload-ready Hub folder: weights, code, tokenizers and a card with its results.",
        (ExportArguments,), run_export,
        help="The folder loads with every Auto class and trust_remote_code=True, without the package. The card "
             "reports the rows of --results or of the model folder's perplexity.json (topic-lm evaluate writes it)."),
    "steer": Command(
        "Does generate(topic_ids=[k]) write about topic k? Topic accuracy, topic-word lift, fluency, Dist-n.",
        (SteerArguments, DeviceArguments), run_steer,
        help="The protocol of topic_lm_hf.evaluate_steering (PPLM-style, judged by the model's own encoder and by an "
             "LDA fitted on --judge_corpus)."),
    "classify": Command(
        "Document classification with a saved model's features: train a head (or fine-tune) and report accuracy.",
        (TaskDataArguments, ClassifyArguments, DeviceArguments), run_classify,
        help="Splits --dataset (stratified, seeded), loads the model folder with AutoModelForSequenceClassification "
             "and trains through Trainer; prints accuracy next to the majority class and tf-idf + logistic "
             "regression."),
    "retrieve": Command(
        "Document retrieval with a saved model's [o_N; c]: precision@k of cosine search, labels as relevance.",
        (TaskDataArguments, RetrieveArguments, DeviceArguments), run_retrieve,
        help="Queries = the held-out documents of --dataset, corpus = the rest; prints precision next to tf-idf "
             "and LDA cosine retrieval."),
    "demo": Command(
        f"The first thing to run: train a topic model ({family_of(DEMO_FAMILY).label} unless --family says) and the "
        "same-size LSTM, show topics, steered text and perplexity.",
        (DemoArguments, FastPathArguments, DeviceArguments), run_demo,
        help="Trains on wikipedia-sample (English Wikipedia articles that ship with the package), or on "
             "--train_file. About 4 minutes on 2 CPU cores."),
    # two-word commands: "topic-lm wsd train ..." (main joins the words)
    "wsd train": Command(
        "Train a BiLSTM word sense tagger (optionally with a frozen topic model's document topics) and save it.",
        (WSDTrainArguments, TrainingArguments), run_wsd_train,
        help="Every TrainingArguments flag works; defaults that differ from TrainingArguments: --learning_rate 1e-3 "
             "and --per_device_train_batch_size 32 (the paper's), --num_train_epochs 5, --logging_steps 100.",
        defaults={"learning_rate": 1e-3, "per_device_train_batch_size": 32, "num_train_epochs": 5,
                  "logging_steps": 100, "report_to": "none"}),
    "wsd evaluate": Command(
        "Tag a WSD set with a trained sense tagger, write the key file(s) and print P / R / F1 per output mode.",
        (WSDEvaluateArguments, DeviceArguments), run_wsd_evaluate),
}


def command_parser(name: str) -> HfArgumentParser:
    """The parser of one subcommand: its usage line names it and it lists only its own flags."""
    command = COMMANDS[name]
    parser = HfArgumentParser(command.arguments, prog=f"topic-lm {name}",
                              description=f"{command.summary} {command.help}".strip(), allow_abbrev=False)
    parser.set_defaults(**command.defaults)
    return parser


def parse_command(name: str, argv: list[str]) -> tuple:
    """One instance of each argument dataclass of ``name``; an unknown flag is an error (exit 2)."""
    parser = command_parser(name)
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        hint = ""
        if any(a == "--device" or a.startswith("--device=") for a in remaining):
            hint = {"train": " (topic-lm train places the model as transformers' Trainer does: on the GPU when there "
                             "is one; --use_cpu true keeps it on the CPU, CUDA_VISIBLE_DEVICES picks a GPU)",
                    "export": " (topic-lm export only copies the weights: it needs no device)"}.get(name, "")
        parser.error(f"unrecognized arguments: {' '.join(remaining)}{hint}")
    return tuple(parsed)


def usage() -> str:
    """``topic-lm --help``: the subcommands and what each does."""
    width = max(map(len, COMMANDS))
    lines = [f"usage: topic-lm {{{','.join(COMMANDS)}}} [-h] ...", "",
             "Topic-guided neural language models as Hugging Face transformers models.", "", "commands:"]
    lines += [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    lines += ["", "Run 'topic-lm COMMAND --help' for the flags of a command."]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    """``topic-lm COMMAND [flags]``. A user error (a bad value, a missing file or folder, input the package
    refuses: ``ValueError`` and ``OSError``) is one line on stderr and exit code 2; ``--debug`` (anywhere, or
    ``TOPIC_LM_DEBUG=1``) shows its traceback instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("TOPIC_LM_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    name, argv = argv[0], argv[1:]
    if argv and f"{name} {argv[0]}" in COMMANDS:  # a two-word command: topic-lm wsd train ...
        name, argv = f"{name} {argv[0]}", argv[1:]
    group = [c for c in COMMANDS if c.startswith(f"{name} ")]
    if name not in COMMANDS and group:  # topic-lm wsd, topic-lm wsd --help
        lines = [f"usage: topic-lm {name} {{{','.join(c.split(' ', 1)[1] for c in group)}}} [-h] ...", ""]
        lines += [f"  {c:<{max(map(len, group))}}  {COMMANDS[c].summary}" for c in group]
        wants_help = bool(argv) and argv[0] in ("-h", "--help")
        print("\n".join(lines), file=sys.stdout if wants_help else sys.stderr)
        sys.exit(0 if wants_help else 2)
    if name not in COMMANDS:
        print(usage(), file=sys.stderr)
        sys.exit(f"topic-lm: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("datasets", "transformers.trainer", "transformers.configuration_utils", "transformers.modeling_utils"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    parsed = parse_command(name, argv)
    try:
        for part in parsed:  # a device this machine lacks is refused before any data or model is loaded
            if isinstance(part, DeviceArguments):
                part.torch_device
        COMMANDS[name].handler(*parsed)
    except (ValueError, OSError) as error:  # the package's user errors: what to do is in the message
        if debug:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"topic-lm {name}: error: {message}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:  # noqa: BLE001 (a full disk, in the words of the library that was writing)
        if debug or not disk_full(error):
            raise
        print(f"topic-lm {name}: error: the disk is full (no space left on device) while writing "
              f"({type(error).__name__}): free some space or write to another disk, then run the command again "
              f"(a training run resumes from its last complete checkpoint)", file=sys.stderr)
        sys.exit(2)


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) says the disk is full: an OSError ENOSPC, or a library's own
    error that wraps it (torch.save's "file write failed", safetensors' "No space left on device")."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in text \
                or "file write failed" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


if __name__ == "__main__":
    main()
