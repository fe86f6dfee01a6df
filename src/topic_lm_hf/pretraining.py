"""Pre-training a model's topic model on bags of words before joint training.

A topic-guided LM trained jointly from scratch starts with random topics, and its LM learns early
on to ignore topic proportions that carry no information. Training the topic model alone first
(a few hundred Adam steps on the context bags of words, seconds on a CPU) gives the LM informative
proportions from its first step; ``scripts/benchmark_steering.py`` measures what that does to
steering and perplexity. Works for every model with ``topic_model_loss(context_bow)`` and
``topic_model_parameters()`` (TCNLM).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch


def pretrain_topic_model(model, dataset, collator, steps: int, learning_rate: float = 2e-3, batch_size: int = 64,
                         max_grad_norm: float = 5.0, seed: int = 0,
                         callback: Optional[Callable[[int, float], None]] = None) -> list[float]:
    """Train only the topic model of ``model`` on the ``context_bow`` of ``collator`` batches.

    Args:
        model: a topic model with ``topic_model_loss`` and ``topic_model_parameters``.
        dataset: rows prepared by ``collator.prepare(documents)`` (with a context mode other than "none").
        collator: the :class:`~topic_lm_hf.TopicContextCollator` that prepared them.
        steps: Adam steps; each reads ``batch_size`` rows drawn at random (seeded).
        callback: called as ``callback(step, loss)`` after every step (progress display).

    Returns:
        The loss of every step. The LM's weights are untouched; the model is left in training mode.
    """
    for method in ("topic_model_loss", "topic_model_parameters"):
        if not hasattr(model, method):
            raise ValueError(f"{type(model).__name__} has no {method}(): its topic model cannot be pre-trained")
    if steps < 0 or batch_size < 1:
        raise ValueError(f"steps must be >= 0 and batch_size >= 1, got {steps}, {batch_size}")
    if len(dataset) == 0:
        raise ValueError("pretrain_topic_model needs a non-empty dataset")
    params = model.topic_model_parameters()
    optimizer = torch.optim.Adam(params, lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for step in range(steps):
        rows = torch.randint(len(dataset), (batch_size,), generator=generator).tolist()
        batch = collator([dataset[i] for i in rows])
        if "context_bow" not in batch:
            raise ValueError("The collator gives no context_bow: build it with a context mode other than 'none'")
        loss = model.topic_model_loss(batch["context_bow"])
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"Topic-model pre-training loss is {value} at step {step}: lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        losses.append(value)
        if callback is not None:
            callback(step, value)
    return losses
