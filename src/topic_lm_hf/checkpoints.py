"""Checkpoint hygiene of a training run: which checkpoint a run resumes from (:func:`last_complete_checkpoint`
skips one cut short), whether a checkpoint belongs to this run (:func:`config_differences`, the
:func:`model_settings` it must share), whether the run is already finished (:func:`finished_run`), and the lock
that keeps a second run out of its ``output_dir`` (:class:`OutputDirLock`). ``TopicLMTrainer``, ``topic-lm train``
and the topic model's pre-training (``pretrain_topic_model``'s settings digest) read them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re

from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

logger = logging.getLogger(__name__)

WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


def last_complete_checkpoint(output_dir) -> str | None:
    """The newest ``checkpoint-<N>`` folder in ``output_dir`` that training can resume from (None if none).

    ``Trainer`` writes ``trainer_state.json`` last, so a run killed while writing a checkpoint
    leaves a folder without it (or with it truncated); transformers' ``get_last_checkpoint``
    still picks that folder, and resuming failed with ``FileNotFoundError``. Such folders are
    skipped with a warning naming them."""
    if not os.path.isdir(output_dir):
        return None
    steps = {}
    for name in os.listdir(output_dir):
        match = re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps[int(match.group(1))] = os.path.join(output_dir, name)
    for step in sorted(steps, reverse=True):
        problem = _incomplete_checkpoint(steps[step])
        if problem is None:
            return steps[step]
        logger.warning("Not resuming from %s: %s (was the run stopped while writing it?)", steps[step], problem)
    return None


# Config entries that differ between a run and its own checkpoints without changing the model.
RUN_ONLY_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "architectures", "auto_map", "dtype",
                                  "torch_dtype", "use_cache", "output_hidden_states", "output_attentions",
                                  "return_dict", "_commit_hash"})
LOCK_NAME = ".training.lock"


def config_differences(checkpoint: str, config) -> list[str]:
    """``field: checkpoint value != run value`` for every model-config field in which ``checkpoint``'s
    ``config.json`` differs from ``config`` (empty when the checkpoint has no config or matches)."""
    path = os.path.join(checkpoint, "config.json")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    if model_type != config.model_type:
        return [f"model_type: {model_type!r} in the checkpoint, {config.model_type!r} in this run"]
    return dict_differences(model_settings(type(config).from_json_file(path)), model_settings(config),
                            "in the checkpoint", "in this run")


def model_settings(config) -> dict:
    """The fields of a model config that define the model (every field but :data:`RUN_ONLY_CONFIG_KEYS`), as JSON
    values: what a checkpoint must share with the run that resumes it."""
    return {key: value for key, value in json.loads(config.to_json_string(use_diff=False)).items()
            if key not in RUN_ONLY_CONFIG_KEYS}


def dict_differences(saved: dict, current: dict, there: str, here: str) -> list[str]:
    """``key: saved value <there>, current value <here>`` for every key whose values differ."""
    return [f"{key}: {saved.get(key, '(unset)')!r} {there}, {current.get(key, '(unset)')!r} {here}"
            for key in sorted(saved.keys() | current.keys()) if saved.get(key) != current.get(key)]


class OutputDirInUseError(OSError):
    """Raised when another live training run holds the ``output_dir``."""


class OutputDirLock:
    """An exclusive lock on a training ``output_dir`` (``fcntl.flock`` on ``<output_dir>/.training.lock``), held
    while a run trains: a second run on the same folder is refused instead of resuming from, and overwriting, the
    first one's checkpoints. The lock goes with the process, so a killed run leaves none behind. Where ``fcntl``
    does not exist (Windows) there is no guard."""

    def __init__(self, output_dir: str):
        self.path, self._file = os.path.join(output_dir, LOCK_NAME), None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise OutputDirInUseError(f"Another training run ({holder}) is writing to {os.path.dirname(self.path)}: "
                                      f"wait for it to end, or give this run another output_dir") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.remove(self.path)  # while still held: the saved model folder keeps no lock file
            self._file.close()  # closing drops the flock
            self._file = None


def _incomplete_checkpoint(path: str) -> str | None:
    """What a checkpoint folder lacks to be resumed from, or None when it is complete."""
    state = os.path.join(path, TRAINER_STATE_NAME)
    if not os.path.isfile(state):
        return f"it has no {TRAINER_STATE_NAME}"
    try:
        with open(state, encoding="utf-8") as f:
            json.load(f)
    except ValueError:
        return f"its {TRAINER_STATE_NAME} is truncated"
    if not any(os.path.isfile(os.path.join(path, name)) for name in WEIGHTS_FILES):
        return "it has no model weights"
    for name in sorted(os.listdir(path)):  # a file cut short by the kill (weights, optimizer, scheduler, RNG)
        problem = _unreadable(os.path.join(path, name))
        if problem:
            return f"its {name} is truncated or unreadable ({problem})"
    return None


def _unreadable(path: str) -> str | None:
    """Why the weights or torch.save file at ``path`` cannot be loaded (None: it can, or it is another kind of
    file). Only the headers are read: a safetensors header must cover the whole file, a torch.save zip archive
    must have its central directory (written last)."""
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt"):
                pass
        elif path.endswith((".pt", ".pth", ".bin")):
            import zipfile

            with zipfile.ZipFile(path):
                pass
    except Exception as error:  # noqa: BLE001 (the libraries' own error types: SafetensorError, BadZipFile, OSError)
        return " ".join(str(error).split()) or type(error).__name__
    return None


def finished_run(output_dir, args, config=None) -> str | None:
    """A line saying that the run of ``args`` in ``output_dir`` is already finished (its last complete checkpoint
    reached ``max_steps``, or ``num_train_epochs`` without ``max_steps``, and the final model is saved), or None.
    Rerunning it must change nothing: resuming from that checkpoint trained one step past the end and overwrote
    the saved model. ``config``: the model configuration of the rerun; one that differs from the checkpoint's is
    not this run (None here: resuming refuses it, naming the fields)."""
    last = last_complete_checkpoint(output_dir)
    if last is None or not any(os.path.isfile(os.path.join(output_dir, name)) for name in WEIGHTS_FILES):
        return None
    if config is not None and config_differences(last, config):
        return None
    with open(os.path.join(last, TRAINER_STATE_NAME), encoding="utf-8") as f:
        state = json.load(f)
    step = state.get("global_step", 0)
    if args.max_steps is not None and args.max_steps > 0:
        done = step >= args.max_steps
    else:
        done = step >= state.get("max_steps", math.inf) and state.get("num_train_epochs", 0) >= args.num_train_epochs
    stopped = _stopped_early(state)
    if not (done or stopped):
        return None
    how = "stopped by its validation loss" if stopped and not done else "finished"
    return (f"{output_dir} already holds this run, {how} at step {step} ({os.path.basename(last)}): nothing to "
            f"do (a larger --max_steps trains on from it; another --output_dir starts a new run)")


def _stopped_early(state: dict) -> bool:
    """Whether a checkpoint's trainer state says early stopping ended the run (``EarlyStoppingCallback``'s counter
    reached its patience)."""
    early = (state.get("stateful_callbacks") or {}).get("EarlyStoppingCallback")
    if not isinstance(early, dict):
        return False
    patience = (early.get("args") or {}).get("early_stopping_patience")
    counter = (early.get("attributes") or {}).get("early_stopping_patience_counter", 0)
    return patience is not None and counter >= patience

