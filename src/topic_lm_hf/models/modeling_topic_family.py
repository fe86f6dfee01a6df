"""The base of every topic family's causal LM: the topic API declared once, with one signature each.

Copied next to the weights with a family's own files when a model is shared with remote code.

A topic family's ``*ForCausalLM`` lists :class:`TopicFamilyForCausalLM` first among its bases (before its
``*PreTrainedModel``, then ``TopicGenerationMixin`` and ``GenerationMixin``) and implements a handful of methods:

* ``topic_word_scores(layer)`` (K, V_c): what ranks the words of each topic (its distribution, or the decoder
  weights the paper reads its topics from), ``-inf`` where a word must never be shown;
* ``topic_word_distributions(*, layer=None)`` (K, V_c): each topic's distribution over the topic vocabulary;
* ``infer_topics(context_bow, *, layer=None)`` (b, K): a document's topic proportions (deterministic);
* ``topic_model_parameters()`` and ``topic_model_loss(context_bow, **inputs)``: the topic model alone, for
  :func:`~topic_lm_hf.pretrain_topic_model`.

The topic keywords of ``forward`` and ``generate`` are validated in one place, ``resolve_conditioning``, once per
call: ``forward`` calls it first and hands the batch-first tensors it returns to the helpers that use them, which
trust them and do not check them again; ``generate`` calls it before its first step and tells that step so
(``conditioning_resolved=True``); a ``topic_representation`` resolved by an earlier step is used as it is.

What the package asks of a topic model is asked through these names only (``isinstance(model,
TopicFamilyForCausalLM)`` says whether a model has topics; nothing is probed with ``hasattr``). The optional parts
have defaults here: ``set_training_corpus_size`` (rGBN-RNN's TLASGR-MCMC scales its statistics to the corpus),
``training_phases`` (NCLM's phases before the joint objective), ``topic_model_inputs`` and
``topic_pretraining_batches`` (what the topic model reads when pre-trained alone), ``num_topic_layers`` (rGBN-RNN's
hierarchy), and one KL-annealing mechanism (``kl_annealing_weight``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .modeling_conditioning import (check_topic_layer, lm_to_topic_index, normalize_topic_kwargs, topic_scores_to_vocab,
                                    topic_vocabulary, topic_word_mask)
from .modeling_document import DocumentRepresentationDelegate


class TopicWordPriorMixin:
    """The shared topic output prior of every topic family (``config.topic_output_bias="beta"``; not in the papers).

    A product of experts of the LM with its own topic model: the logits of every topic word w get
    ``lambda * log(V_c p(w | t))``, where ``p(w | t)`` is the family's topic-word distribution at the topic
    representation t the LM is conditioned on (TCNLM: beta^T t; NCLM: the NVDM decoder softmax(W h + b);
    TopicRNN: softmax(B theta) over the topic words; rGBN-RNN: Phi^1 theta^1 normalised), V_c the number of topic
    words the LM has (the ratio is to the uniform distribution, so an uninformative topic model adds 0), and
    lambda one learned scalar (``topic_prior_weight``, from ``config.topic_prior_weight_init``). Stop words get 0.
    With ``topic_ids`` the topic model's own topic k tilts the LM towards its words, which is what makes a
    topic steer when the LM alone has learnt to ignore t.

    A family provides ``topic_word_log_probs(t) -> (b, V_c)`` and calls :meth:`_init_topic_word_prior` in its
    ``__init__``; ``TopicFamilyForCausalLM._init_weights`` sets lambda to its initial value."""

    def _init_topic_word_prior(self) -> None:
        on = getattr(self.config, "topic_output_bias", None) == "beta"
        self.topic_prior_weight = nn.Parameter(torch.zeros(())) if on else None

    def topic_word_log_probs(self, representation: torch.Tensor) -> torch.Tensor:
        """log p(w | t) over the topic vocabulary (b, V_c) for the family's topic representation (b, .)."""
        raise NotImplementedError

    def topic_word_prior(self, representation: torch.Tensor) -> torch.Tensor:
        """lambda * log(V_c p(w | t)) at every topic word of the LM vocabulary, 0 elsewhere: (b, .) -> (b, V)."""
        if self.config.topic_word_ids is None:
            raise ValueError("topic_output_bias='beta' needs config.topic_word_ids (the LM id of every topic word): "
                             f"build the config with {type(self.config).__name__}.from_tokenizers(tokenizer, "
                             "topic_tokenizer, ...)")
        device = representation.device
        n_words = topic_word_mask(self, self.config, device).sum()  # a tensor: no device sync, no loop over V_c
        log_ratio = self.topic_word_log_probs(representation).float().clamp_min(math.log(1e-10)) + n_words.log()
        prior = topic_scores_to_vocab(log_ratio, lm_to_topic_index(self, self.config, device))
        return self.topic_prior_weight.float() * prior


class TopicFamilyForCausalLM(DocumentRepresentationDelegate, TopicWordPriorMixin):
    """The topic API of every topic family's causal LM (see the module docstring)."""

    # What the topic model reads when pre-trained alone (the keywords of topic_model_loss), and its batches:
    # "train" = the family's training batches' context bags, "document" = one row per document with its whole bag.
    topic_model_inputs: tuple[str, ...] = ("context_bow",)
    topic_pretraining_batches: str = "train"
    # Phases TopicLMTrainer(pretraining_phases=...) may run before the joint objective (NCLM: "lm", "topic_model").
    training_phases: tuple[str, ...] = ()
    # Whether a topic_mixture must be a distribution: TCNLM's t is; TopicRNN's theta is any real vector.
    _topic_mixture_on_simplex = True

    # -- the conditioning --------------------------------------------------------------------------

    def resolve_conditioning(self, batch_size: Optional[int], **given) -> dict:
        """The raw topic keywords of ``forward`` / ``generate`` (at most one of ``conditioning_inputs``) validated
        and made batch-first tensors of ``batch_size`` rows, under the same names (an empty dict when none is
        given). The one place they are checked: ``forward`` calls it once and passes what it returns down, and
        ``generate`` once before its first step; a bad value is a ``ValueError`` that names it."""
        return normalize_topic_kwargs(self.config.num_topics, self.config.topic_vocab_size, batch_size, **given,
                                      mixture_on_simplex=self._topic_mixture_on_simplex)

    # -- topic layers ------------------------------------------------------------------------------

    @property
    def num_topic_layers(self) -> int:
        """The number of topic layers (1 but for rGBN-RNN's hierarchy)."""
        return 1

    def check_layer(self, layer) -> int:
        """``layer`` (1 = bottom; ``None``: 1) checked against :attr:`num_topic_layers`."""
        return check_topic_layer(layer, self.num_topic_layers)

    # -- the topics --------------------------------------------------------------------------------

    def topic_word_scores(self, layer: int) -> torch.Tensor:
        """(K, V_c) scores that rank the words of each topic of ``layer``; ``-inf`` at words never shown."""
        raise NotImplementedError

    def topic_word_distributions(self, *, layer=None) -> torch.Tensor:
        """(K, V_c): each topic's distribution over the topic vocabulary."""
        raise NotImplementedError

    def infer_topics(self, context_bow, *, layer=None) -> torch.Tensor:
        """(b, K): the topic proportions of documents given as bags of words (b, V_c), deterministic."""
        raise NotImplementedError

    @torch.no_grad()
    def get_topics(self, top_n: int = 10, *, layer=None, topic_tokenizer=None) -> list[list[str]]:
        """The ``top_n`` words of every topic (of ``layer``, for a hierarchy; 1 = bottom), best first; never
        ``<unk>``. Words come from ``topic_tokenizer``, or from the ``topic_tokenizer/`` folder saved next to
        the model."""
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise ValueError(f"top_n must be a positive integer, got {top_n!r}")
        words = topic_vocabulary(self, topic_tokenizer)
        scores = self.topic_word_scores(self.check_layer(layer)).detach().float().clone()
        scores[:, 0] = float("-inf")  # the topic <unk> is never a word
        shown = int(torch.isfinite(scores[0]).sum())
        top = scores.topk(min(top_n, shown), dim=-1).indices
        return [[words[i] for i in row] for row in top.tolist()]

    # -- the topic model alone ---------------------------------------------------------------------

    def topic_model_parameters(self) -> list[nn.Parameter]:
        """The topic model's parameters (what :func:`~topic_lm_hf.pretrain_topic_model` trains)."""
        raise NotImplementedError

    def topic_model_loss(self, context_bow: torch.Tensor, **inputs) -> torch.Tensor:
        """The topic model's own objective per context word on bags of words (b, V_c) (and the
        ``topic_model_inputs`` beyond ``context_bow``)."""
        raise NotImplementedError

    def set_training_phase(self, phase: str) -> None:
        """Switch what a training-mode ``forward`` optimises to ``phase`` (one of ``training_phases``)."""
        raise ValueError(f"{type(self).__name__} has no training phases: it always trains jointly")

    def set_training_corpus_size(self, rows: int) -> None:
        """The number of training rows (rGBN-RNN scales its sampler's statistics to it); nothing by default."""

    # -- KL annealing ------------------------------------------------------------------------------

    def _register_kl_annealing(self) -> None:
        """A saved counter of training forward passes (so that a resumed run goes on annealing)."""
        self.register_buffer("kl_annealing_step", torch.zeros((), dtype=torch.long))

    def kl_weight_target(self) -> float:
        """The KL weight once annealed (1 but for TopicRNN's ``kl_weight``)."""
        return 1.0

    def kl_annealing_weight(self, count: bool = False):
        """The KL weight now: ``kl_weight_target() * min(1, passes / config.kl_annealing_steps)`` (no ramp when
        annealing is off). ``count=True`` in training mode first counts this forward pass; evaluation never
        counts."""
        if count and self.training:
            self.kl_annealing_step += 1
        steps = self.config.kl_annealing_steps
        if steps == 0:
            return self.kl_weight_target() * 1.0
        return self.kl_weight_target() * (self.kl_annealing_step.float() / steps).clamp(max=1.0)  # no device sync

    def _init_weights(self, module):
        super()._init_weights(module)
        if module is self:  # the head's own values (also when a checkpoint without them is loaded)
            step = self._buffers.get("kl_annealing_step")
            if step is not None:
                step.zero_()
            if self.topic_prior_weight is not None:  # the shared topic output prior's lambda
                nn.init.constant_(self.topic_prior_weight, self.config.topic_prior_weight_init)


__all__ = ["TopicFamilyForCausalLM", "TopicWordPriorMixin"]
