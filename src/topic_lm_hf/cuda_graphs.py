"""Training steps replayed from captured CUDA graphs (``TopicLMTrainer(cuda_graphs=True)``, ``topic-lm train
--cuda_graphs true``).

On a GPU the recurrent families are bound by kernel launches, not by arithmetic: one TCNLM training step at the
papers' size issues over a thousand small kernels while the GPU is busy a few milliseconds of it. A CUDA graph
records a step's forward and backward kernels once and replays them in one launch. :class:`GraphedTrainingStep`
captures one graph per batch shape (``torch.cuda.make_graphed_callables`` on the model's loss): the batches' token
columns padded on the right to a multiple of ``sequence_bucket`` (padding changes neither the loss nor its
gradients: ignored labels, right padding), at most ``max_graphs`` shapes (a batch of another shape past that runs
eagerly), the optimizer step, gradient clipping and the scheduler outside the graph, as in eager training.

What a captured step needs from the model: nothing read on the host during the step (``host_reads_deferred``:
the input checks run before, on the batch, and the output layer's loss runs over every position), and the same
shapes at every replay. The families whose training step meets this declare ``supports_cuda_graphs``: TCNLM,
chunk-trained (its recurrence is the package's own). The LSTM LM's step reads nothing on the host either, but cuDNN's
LSTM did not train under capture on an H200 (the captured model learnt nothing, or the replay hit an illegal memory
access), so it is refused. So are the other families, carried-state training (documents of changing lengths),
gradient accumulation (a replay overwrites the gradients the previous micro-batch left), bf16 / fp16 autocast and a
CPU, each in one line. The model's buffers (the KL-annealing counter) are restored after the capture's warm-up
passes, so they count only real steps. The loss terms that eager training logs beside the loss (``lm_loss``,
``kl_loss``, ...) are not computed on the host in a replayed step: only ``loss`` is logged.

Measured on one H200 (torch 2.11, ``scripts/gpu_check.py``, the papers' size E = 300, H = 600, 50 topics, 32 APNEWS
sentence chunks per step): TCNLM's step took 6.0 ms replayed against 24.5 ms eager (4.1 times as fast, 100,000
tokens/s), and 40 steps trained both ways from the same weights ended 0.07 % apart in loss; ``topic-lm train`` for
300 steps reached a validation perplexity of 161.9 captured and 159.9 eager (their dropout draws differ). It stays
off by default: ``--cuda_graphs true`` turns it on.
"""

from __future__ import annotations

import gc
import logging
from typing import Optional

import torch
from torch import nn

from .models.modeling_conditioning import check_counts
from .models.modeling_recurrent import (check_right_padded, check_token_ids, host_reads_deferred, read_on_host,
                                        right_padding_holds)

logger = logging.getLogger(__name__)

# the batch keys a captured step takes (TopicContextCollator's chunk batches); a batch with another tensor runs
# eagerly, since its padding would not be known
PADDED_KEYS = {"input_ids": "pad", "labels": -100, "attention_mask": 0}
UNPADDED_KEYS = ("context_bow",)


def pad_batch(batch: dict, sequence_bucket: int, pad_token_id: Optional[int]) -> Optional[dict[str, torch.Tensor]]:
    """A chunk batch's tensors with their token columns padded on the right to a multiple of ``sequence_bucket``
    (``input_ids`` with ``pad_token_id``, ``labels`` with -100, ``attention_mask`` with 0, added if absent), or
    None if it holds a key whose padding is not known here (then the step runs eagerly)."""
    given = {k: v for k, v in batch.items() if v is not None}
    if set(given) - set(PADDED_KEYS) - set(UNPADDED_KEYS) or "input_ids" not in given or "labels" not in given \
            or not all(isinstance(v, torch.Tensor) for v in given.values()):
        return None
    extra = -given["input_ids"].shape[1] % sequence_bucket
    if not extra:
        return given
    if "attention_mask" not in given:
        given["attention_mask"] = torch.ones_like(given["input_ids"])
    fills = {**PADDED_KEYS, "input_ids": pad_token_id if pad_token_id is not None else 0}
    return {k: nn.functional.pad(v, (0, extra), value=fills[k]) if k in PADDED_KEYS else v for k, v in given.items()}


def check_batch(batch: dict[str, torch.Tensor], vocab_size: int) -> None:
    """The checks a model runs inside its step, on a chunk batch before a replay (a ``ValueError``: ids outside the
    vocabulary, counts that are negative or not finite, padding on the left), their values read on the host at once:
    one synchronisation per step."""
    values = [torch.stack(torch.aminmax(batch["input_ids"]))]
    if "context_bow" in batch:
        values.append(torch.stack(torch.aminmax(batch["context_bow"].float())))
    if "attention_mask" in batch:
        values.append(right_padding_holds(batch["attention_mask"]).view(1))
    read = read_on_host(torch.cat([v.double() for v in values]))
    check_token_ids(batch["input_ids"], vocab_size, bounds=read[:2])
    if "context_bow" in batch:
        check_counts(batch["context_bow"], bounds=read[2:4])
    if "attention_mask" in batch:
        check_right_padded(batch["attention_mask"], holds=bool(read[-1]))


def why_not_capturable(model: nn.Module) -> Optional[str]:
    """None when ``model``'s training step can be captured, else the reason in a few words."""
    if not getattr(model, "supports_cuda_graphs", False):
        return (f"{type(model).__name__} cannot train from a captured step (it reads values on the host during "
                "a step, or runs cuDNN's LSTM, which does not train under capture); captured steps support TCNLM")
    if getattr(model, "output_layer_compiled", False):
        return "the compiled output layer cannot be captured: give compile_output_layer=False"
    if getattr(model, "gradient_checkpointing", False):
        return "gradient checkpointing recomputes outside the graph: turn it off"
    return None


class _StepLoss(nn.Module):
    """The model's training loss as a function of the batch's tensors in a fixed order (what is captured)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        with host_reads_deferred():
            return self.model(**dict(zip(self.keys, tensors))).loss


class GraphedTrainingStep:
    """Forward and backward of ``model``'s training loss replayed from CUDA graphs, one per batch shape.

    ``step.loss(batch)`` returns the loss (its ``backward()`` replays the captured backward and leaves the
    gradients in the parameters' ``.grad``, as an eager step does), or None for a batch that is run eagerly
    instead (more than ``max_graphs`` shapes, a key it does not know). ``sequence_bucket``: token columns are
    padded on the right to a multiple of it (fewer shapes, fewer captures). ``warmup_steps``: eager passes before
    each capture (``make_graphed_callables``' warm-up; they do not change the weights)."""

    def __init__(self, model: nn.Module, sequence_bucket: int = 32, max_graphs: int = 8, warmup_steps: int = 3):
        reason = why_not_capturable(model)
        if reason:
            raise ValueError(f"cuda_graphs: {reason}")
        if not torch.cuda.is_available() or next(model.parameters()).device.type != "cuda":
            raise ValueError("cuda_graphs replays captured CUDA graphs: it needs the model on a CUDA GPU")
        if sequence_bucket < 1 or max_graphs < 1 or warmup_steps < 1:
            raise ValueError("sequence_bucket, max_graphs and warmup_steps must be positive")
        self.model, self.sequence_bucket, self.max_graphs, self.warmup_steps = model, sequence_bucket, max_graphs, \
            warmup_steps
        self.graphs: dict[tuple, nn.Module] = {}
        self.replays = self.eager_steps = 0

    def loss(self, batch: dict) -> Optional[torch.Tensor]:
        tensors = pad_batch(batch, self.sequence_bucket, self.model.config.pad_token_id)
        if tensors is None:
            self.eager_steps += 1
            return None
        check_batch(tensors, self.model.config.vocab_size)
        keys = tuple(sorted(tensors))
        shape = tuple((k, tuple(tensors[k].shape), tensors[k].dtype) for k in keys)
        graphed = self.graphs.get(shape)
        if graphed is None:
            if len(self.graphs) >= self.max_graphs:
                self.eager_steps += 1
                return None
            graphed = self.graphs[shape] = self._capture(keys, tensors)
        self.replays += 1
        return graphed(*(tensors[k] for k in keys))

    def _capture(self, keys: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> nn.Module:
        logger.info("cuda_graphs: capturing the training step for batches of shape %s",
                    {k: tuple(v.shape) for k, v in tensors.items()})
        buffers = {name: b.detach().clone() for name, b in self.model.named_buffers()}
        step = _StepLoss(self.model, keys)
        sample = tuple(tensors[k].clone() for k in keys)
        # Python's cyclic collector must not run during the capture: the graphs of an earlier GraphedTrainingStep
        # (or any make_graphed_callables) that became garbage are freed by it, and freeing a graph while a stream is
        # capturing invalidates the capture (the allocator then aborts the process). Collect first, then hold it.
        gc.collect()
        gc.disable()
        try:
            graphed = torch.cuda.make_graphed_callables(step, sample, num_warmup_iters=self.warmup_steps,
                                                        allow_unused_input=True)
        finally:
            gc.enable()
        with torch.no_grad():  # the warm-up and captured passes counted as steps: undo it
            for name, b in self.model.named_buffers():
                b.copy_(buffers[name])
        return graphed


__all__ = ["GraphedTrainingStep", "check_batch", "pad_batch", "why_not_capturable"]
