"""Where the package computes: the GPU when there is one, else the CPU, and one ``--device`` flag to say otherwise.

Every command that loads a model outside the ``Trainer`` (``evaluate``, ``generate``, ``topics``, ``steer``,
``retrieve``, ``wsd evaluate``, ``export``'s evaluation, ``demo``) takes :class:`DeviceArguments`; ``topic-lm
train``, ``classify`` and ``wsd train`` follow ``TrainingArguments`` (``--use_cpu true`` keeps them on the CPU), as
the ``Trainer`` does. The evaluation functions (``evaluate_perplexity``, ``evaluate_steering``, the task functions)
run on the device of the model they are given::

    model = AutoModelForCausalLM.from_pretrained(path).to(default_device())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

__all__ = ["DeviceArguments", "default_device", "resolve_device", "synchronize"]


def default_device() -> torch.device:
    """The first CUDA GPU when one is there (``torch.cuda.is_available()``), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(name: Optional[str | torch.device] = None) -> torch.device:
    """``name`` as a ``torch.device`` (``None``: :func:`default_device`). A device this machine does not have is a
    ``ValueError`` that says what to pass instead."""
    if name is None or (isinstance(name, str) and name.strip() in ("", "auto")):
        return default_device()
    try:
        device = torch.device(name.strip() if isinstance(name, str) else name)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device takes cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: this machine has no CUDA GPU (torch {torch.__version__}); "
                             "pass --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: there are {torch.cuda.device_count()} CUDA GPU(s), numbered from 0")
    elif device.type == "meta":
        raise ValueError(f"--device {name}: the meta device holds shapes, not numbers (nothing could run there); "
                         "pass cpu" + (" or cuda" if torch.cuda.is_available() else ""))
    elif device.type != "cpu" and device.type != getattr(torch.accelerator.current_accelerator(), "type", None):
        raise ValueError(f"--device {name}: not a device of this machine (pass cpu"
                         f"{' or cuda' if torch.cuda.is_available() else ''})")
    return device


def synchronize(device: Optional[str | torch.device] = None) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU): a timing on a GPU must synchronise before it
    reads the clock, or it measures only the time to queue the kernels."""
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"cannot synchronise {device}: this machine has no CUDA device (give 'cpu')")
        torch.cuda.synchronize(device)
    elif device.type not in ("cpu", "meta") and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


@dataclass
class DeviceArguments:
    """The ``--device`` flag of the commands that load a model outside the ``Trainer``."""

    device: Optional[str] = field(default=None, metadata={
        "help": "Where the model runs: cpu, cuda or cuda:N (default: the GPU when there is one, else the CPU)."})

    @property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)
