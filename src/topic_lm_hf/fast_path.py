"""The fast training path: bf16 autocast where the device runs it fast, and the compiled output layer, chosen per
device by measurement.

On a CPU with native bf16 (AVX512-BF16 or AMX) the default is bf16 autocast with the compiled output layer (2.5
times faster than eager float32 on this package's 2-core benchmark machine). On a CUDA GPU the default is float32,
eager: on one H200 at the papers' size every family's training step was bound by kernel launches, bf16 autocast was
1.0 to 1.7 times slower than float32 (it adds casts) and the compiled output layer gained at most 8 % while its
compilation delayed the first step by about a minute (``GPU_MEASUREMENT``). ``--precision`` and
``--compile_output_layer`` force either choice on any device.

``TrainingArguments(bf16=True)`` runs every family under the Trainer's own autocast (accelerate's, on a CPU as on a
GPU); the parts that are numerically sensitive stay in float32 or float64 inside the models (the topic simplex and
KL terms, the output layer's log-sum-exp, TLASGR-MCMC's sampler state). On a CPU bf16 is fast only with native
bf16 instructions (AVX512-BF16 or AMX); elsewhere it is emulated and slower than float32, so ``precision="auto"``
checks. ``TopicLMTrainer(compile_output_layer=True)`` compiles the output layer and its loss
(:meth:`~topic_lm_hf.models.modeling_recurrent.RecurrentPreTrainedModel.compile_output_layer`).

``topic-lm train``, ``topic-lm demo`` and the benchmark scripts take this path by default (``--precision fp32``
and ``--compile_output_layer false`` turn it off)::

    args = fast_training_arguments(TrainingArguments(output_dir="out"))   # bf16 where it helps, one log line
    TopicLMTrainer(model=model, args=args, compile_output_layer=True, ...)
"""

from __future__ import annotations

import dataclasses
import logging
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp32")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic


@dataclass
class FastPathArguments:
    """The ``--precision``, ``--compile_output_layer`` and ``--cuda_graphs`` flags of ``topic-lm train`` and
    ``topic-lm demo``."""

    precision: str = field(default="auto", metadata={
        "choices": PRECISIONS, "help": "auto: bf16 autocast where the device runs it fast (a CPU with AVX512-BF16 or AMX, a GPU with bf16), "
                "float32 elsewhere; bf16: always (on a CPU without those instructions it is slower); fp32: never. "
                "--bf16 true is the same as bf16."})
    compile_output_layer: Optional[bool] = field(default=None, metadata={
        "help": "Compile the output layer and its loss with torch.compile (eager, with a one-line warning, where "
                "no compiler works). Default: on a CPU, off on a GPU (measured: no faster there, and the first step "
                "would wait for the compiler)."})
    cuda_graphs: bool = field(default=False, metadata={
        "help": "On one CUDA GPU, in float32: replay each training step's forward and backward from a CUDA graph "
                "captured once per batch shape (topic_lm_hf.cuda_graphs; the LSTM LM and TCNLM, chunk-trained). "
                "Off by default; refused on a CPU."})


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The native bf16 instruction sets of this CPU (``CPU_BF16_FLAGS`` found in ``/proc/cpuinfo``); empty where
    there are none or the file does not exist (not Linux)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [f for f in CPU_BF16_FLAGS if f in flags]


# What the GPU defaults rest on: one H200 (torch 2.11, CUDA 13), the papers' size (E = 300, H = 600, K = 50), APNEWS,
# 4 documents per step, median step with the device synchronised around it.
GPU_MEASUREMENT = ("measured on an H200 at the papers' size: bf16 autocast 1.0 to 1.7 times slower than float32 "
                   "(the steps are bound by kernel launches, autocast adds casts), the compiled output layer at most "
                   "8 % faster and about a minute before the first step")


def on_gpu(training_args) -> bool:
    """Whether ``training_args`` train on a CUDA GPU (not ``use_cpu``, and one is there)."""
    return not training_args.use_cpu and torch.cuda.is_available()


def bf16_is_fast(training_args, cpuinfo: str | None = None) -> tuple[bool, str]:
    """(whether bf16 autocast speeds up training on the device of ``training_args``, why in a few words)."""
    if on_gpu(training_args):
        return False, f"on {torch.cuda.get_device_name()} float32 is the faster ({GPU_MEASUREMENT})"
    flags = cpu_bf16_flags(cpuinfo)
    if flags:
        return True, f"this CPU has {' and '.join(f.upper().replace('_', '-') for f in flags)}"
    return False, (f"this CPU ({platform.machine()}) lacks AVX512-BF16 and AMX: bf16 would be emulated, slower "
                   "than float32")


def resolve_compile(training_args, compile_output_layer: Optional[bool] = None) -> bool:
    """Whether to compile the output layer: ``compile_output_layer`` when given, else on a CPU and not on a GPU
    (``GPU_MEASUREMENT``)."""
    if compile_output_layer is not None:
        return bool(compile_output_layer)
    return not on_gpu(training_args)


def resolve_precision(training_args, precision: str = "auto", compile_output_layer: bool | None = None,
                      cpuinfo: str | None = None) -> tuple[bool, str]:
    """(whether to train in bf16 autocast, the one sentence that says so and why): ``precision="auto"`` where it
    is fast, ``"bf16"`` always, ``"fp32"`` never; an explicit ``bf16=True`` in ``training_args`` counts as
    ``"bf16"``. ``compile_output_layer``, when given, is named in the sentence."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if training_args.bf16 and precision == "fp32":
        raise ValueError("--precision fp32 contradicts --bf16 true: drop one of them")
    compiled = {True: " with the compiled output layer", False: " with the output layer eager"}.get(
        None if compile_output_layer is None else bool(compile_output_layer), "")
    if training_args.fp16:
        return False, f"Training in fp16 mixed precision{compiled} (--fp16)."
    fast, why = bf16_is_fast(training_args, cpuinfo)
    if training_args.bf16 or precision == "bf16":
        how = "--bf16 true" if training_args.bf16 else "--precision bf16"
        return True, f"Training in bf16 autocast{compiled} ({how}; --precision fp32 turns it off)."
    if precision == "fp32":
        return False, f"Training in float32{compiled} (--precision fp32)."
    if fast:
        return True, f"Training in bf16 autocast{compiled} ({why}; --precision fp32 turns it off)."
    return False, f"Training in float32{compiled}: {why} (--precision bf16 forces bf16)."


def fast_training_arguments(training_args, precision: str = "auto", compile_output_layer: bool | None = None,
                            cpuinfo: str | None = None, say: Callable[[str], None] = logger.info):
    """``training_args`` with bf16 autocast where ``resolve_precision`` chooses it, after passing its sentence to
    ``say`` (default: this module's logger at INFO). Returns new arguments (``dataclasses.replace``: their checks
    run again); on a CPU ``use_cpu`` is set, as transformers requires for bf16 there."""
    bf16, sentence = resolve_precision(training_args, precision, compile_output_layer, cpuinfo)
    say(sentence)
    if bf16 == training_args.bf16:
        return training_args
    return dataclasses.replace(training_args, bf16=True, use_cpu=training_args.use_cpu or not on_gpu(training_args))
