"""Generation with topics: the conditioning resolved once and carried with the recurrent state in one cache
(:class:`TopicLMCache`), decode-time topic guidance (:class:`TopicGuidanceLogitsProcessor`), and the ``generate``
of every topic family (:class:`TopicGenerationMixin`).

Copied next to the weights with a family's own files when a model is shared with remote code.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from .modeling_recurrent import check_prompt, reorder_state, state_from_aliases


# The raw conditioning keywords generate() may be given; a family accepts those it declares in conditioning_inputs.
RAW_CONDITIONING = ("topic_ids", "topic_mixture", "context_bow", "theta")


# Above this the guided scores are the topic difference alone, scaled until the softmax is one-hot or overflows (an
# infinite scale gave empty texts and sampling errors): refused as a mistake.
MAX_GUIDANCE_SCALE = 100


class TopicLMCache:
    """What generation carries from one step to the next, as one field (``state`` in the generation kwargs, as
    Mamba carries one cache object): the recurrent state and the resolved topic conditioning.

    Args:
        state: the batch-first recurrent state (a tuple of (b, ...) tensors) or None.
        conditioning: the resolved topic representation as the ``forward`` keywords that take it (e.g.
            ``{"topic_representation": t}``), each (b, ...); resolved once, on the first step, never re-validated.

    ``generate(..., return_dict_in_generate=True).past_key_values`` is this object: pass it back as
    ``generate(next_tokens, state=cache)`` to continue with the same topics.
    """

    is_compileable = False

    def __init__(self, state, conditioning: dict):
        self.state = state
        self.conditioning = dict(conditioning)

    def reorder(self, beam_idx: torch.Tensor) -> "TopicLMCache":
        """The rows ``beam_idx`` of the state and of the conditioning (beam search)."""
        return TopicLMCache(reorder_state(self.state, beam_idx),
                            {name: value.index_select(0, beam_idx.to(value.device))
                             for name, value in self.conditioning.items()})


class TopicGuidanceLogitsProcessor:
    """Decode-time topic guidance (classifier-free guidance, Sanchez et al. 2024) for a recurrent topic LM:
    the next-token scores of the topic-conditioned run, ``l_cond``, become ``l_cond + (s - 1) (l_cond - l_prior)``,
    with ``l_prior`` those of the same model given no conditioning (its prior: no document, no topics) on the
    same tokens. ``s = 1`` leaves the scores as they are; ``s > 1`` pushes towards what the topics add.

    The prior run keeps its own recurrent state (with ``use_cache``) and follows beam search's reordering by
    matching each row's prefix to the previous step's rows; without ``use_cache`` it reads the whole sequence at
    every step. Tokens the conditioned run rules out (``-inf``) stay out. It runs first among the logits
    processors, on the model's own scores (before temperature, top-k and the rest)."""

    def __init__(self, model, scale: float, attention_mask: Optional[torch.Tensor], use_cache: bool = True):
        self.model, self.scale, self.use_cache = model, float(scale), bool(use_cache)
        self.prompt_mask = attention_mask
        self.state = self.sequences = None

    def _mask(self, input_ids: torch.Tensor) -> Optional[torch.Tensor]:
        if self.prompt_mask is None:
            return None
        prompt = self.prompt_mask.to(input_ids.device)
        prompt = prompt.repeat_interleave(input_ids.shape[0] // prompt.shape[0], dim=0)  # beams, return sequences
        new = input_ids.shape[1] - prompt.shape[1]
        return torch.cat([prompt, prompt.new_ones(input_ids.shape[0], new)], dim=1)

    def prior_scores(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``l_prior`` (n, V) of the last position of ``input_ids`` (n, t)."""
        mask = self._mask(input_ids)
        # The prior run is given no conditioning: there is nothing to validate (conditioning_resolved).
        if self.use_cache and self.sequences is not None and self.sequences.shape[1] == input_ids.shape[1] - 1:
            previous = self.sequences.to(input_ids.device)
            match = (input_ids[:, None, :-1] == previous[None]).all(-1)  # (n, n_previous): whose prefix it is
            if not bool(match.any(1).all()):
                raise RuntimeError("topic guidance lost track of the sequences (a row's prefix is no earlier row)")
            state = reorder_state(self.state, match.int().argmax(1))
            out = self.model(input_ids=input_ids[:, -1:], attention_mask=mask, state=state, use_cache=True,
                             return_dict=True, conditioning_resolved=True)
        else:
            out = self.model(input_ids=input_ids, attention_mask=mask, use_cache=self.use_cache, return_dict=True,
                             conditioning_resolved=True)
        if self.use_cache:
            self.state, self.sequences = out.state, input_ids
        return out.logits[:, -1].float()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        with torch.no_grad():
            prior = self.prior_scores(input_ids).to(scores.device, scores.dtype)
        finite = torch.isfinite(scores)
        difference = torch.where(finite & torch.isfinite(prior), scores - prior, torch.zeros_like(scores))
        return torch.where(finite, scores + (self.scale - 1.0) * difference, scores)


class TopicGenerationMixin:
    """``generate()`` with topic conditioning, for a ``*ForCausalLM`` that also inherits ``GenerationMixin``.

    Put it before ``GenerationMixin`` in the bases. What the model accepts is what it declares
    (``conditioning_inputs``, plus ``conditioning_options`` such as rGBN-RNN's ``topic_layer``); the
    conditioning is resolved once:

    * ``generate`` validates the raw conditioning (:meth:`prepare_generation_conditioning`, the model's
      ``resolve_conditioning``) and makes it batch-first tensors *before* transformers expands the batch for beams
      and ``num_return_sequences`` (a 1-D tensor would otherwise be repeat-interleaved, hf-notes §2); the first
      forward gets them with ``conditioning_resolved=True`` and does not validate them again. Without a prompt,
      one ``<bos>`` row is generated per conditioning row.
    * The first forward resolves it into the model's topic representation and returns it (the outputs named
      by ``_cached_conditioning``); :meth:`_update_model_kwargs_for_generation` keeps that representation
      with the recurrent state in one :class:`TopicLMCache`, and every later step reads it from there as the
      trusted ``forward`` keywords of the same names: the document is encoded and the conditioning
      checked once, not at every token (hf-notes §1.5).
    """

    # The outputs of the first forward that stand for the conditioning at every later step (forward takes them by
    # these names, trusted): the resolved topic representation (NCLM adds its topic vectors).
    _cached_conditioning = ("topic_representation",)
    conditioning_options: tuple[str, ...] = ()  # generate() keywords that only shape the conditioning
    _topic_guidance: Optional[TopicGuidanceLogitsProcessor] = None  # set by generate() while it runs

    def prepare_generation_conditioning(self, batch_size: Optional[int], do_sample: bool = False, **given) -> dict:
        """The raw conditioning of ``generate`` (at most one of ``conditioning_inputs``) validated as batch-first
        tensors of ``batch_size`` rows (the forward keywords that take them): the model's ``resolve_conditioning``.
        ``do_sample``: whether generation samples (a family that draws its conditioning when none is given draws it
        only then)."""
        return self.resolve_conditioning(batch_size, **given)

    def generate(self, inputs=None, generation_config=None, topic_guidance_scale: Optional[float] = None, **kwargs):
        """``GenerationMixin.generate`` with the family's topic conditioning (its ``conditioning_inputs``) and
        ``topic_guidance_scale=s``: decode-time topic guidance (:class:`TopicGuidanceLogitsProcessor`), which
        mixes the scores of the conditioned run with those of the same model under its prior (an empty prompt
        refused first, :func:`check_prompt`). ``past_key_values=`` (a returned ``past_key_values``) continues a
        generation as ``state=`` does."""
        check_prompt(inputs if inputs is not None else kwargs.get("input_ids"))
        state = state_from_aliases(kwargs.pop("state", None), kwargs)
        if state is not None:
            kwargs["state"] = state
        if topic_guidance_scale is None:
            return self._generate(inputs, generation_config, **kwargs)
        if isinstance(topic_guidance_scale, bool) or not isinstance(topic_guidance_scale, numbers.Real) \
                or not 0 <= topic_guidance_scale <= MAX_GUIDANCE_SCALE:
            raise ValueError(f"topic_guidance_scale must be a number in [0, {MAX_GUIDANCE_SCALE}] (1: no guidance; the "
                             f"package's steering used up to 3), got {topic_guidance_scale!r}")
        if not any(kwargs.get(name) is not None for name in RAW_CONDITIONING) and \
                not isinstance(kwargs.get("state"), TopicLMCache):
            raise ValueError(f"topic_guidance_scale guides towards a conditioning: give one of "
                             f"{list(self.conditioning_inputs)} (e.g. topic_ids=[3])")
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        use_cache = kwargs.get("use_cache", getattr(generation_config or self.generation_config, "use_cache", True))
        self._topic_guidance = TopicGuidanceLogitsProcessor(
            self, topic_guidance_scale, kwargs.get("attention_mask") if isinstance(prompt, torch.Tensor) else None,
            use_cache=use_cache is not False)
        try:
            return self._generate(inputs, generation_config, **kwargs)
        finally:
            self._topic_guidance = None

    def _get_logits_processor(self, *args, **kwargs):
        processors = super()._get_logits_processor(*args, **kwargs)
        if self._topic_guidance is not None:
            processors.insert(0, self._topic_guidance)  # on the model's own scores, before temperature, top-k, ...
        return processors

    def _generate(self, inputs=None, generation_config=None, **kwargs):
        prompt = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        batch_size = prompt.shape[0] if isinstance(prompt, torch.Tensor) else None
        given = {}
        for name in (*RAW_CONDITIONING, *self.conditioning_options):
            value = kwargs.pop(name, None)
            if value is None:
                continue
            if name not in self.conditioning_inputs and name not in self.conditioning_options:
                raise ValueError(f"{type(self).__name__} does not take {name}; it is conditioned by "
                                 f"{list(self.conditioning_inputs)}")
            given[name] = value
        cache = kwargs.get("state")
        if isinstance(cache, TopicLMCache):  # continuing an earlier generation (its past_key_values)
            kwargs["state"] = cache.state
            if not given:  # with the same topics, already resolved
                return super().generate(inputs, generation_config, **cache.conditioning, **kwargs)
        do_sample = kwargs.get("do_sample")
        if do_sample is None:
            do_sample = bool(getattr(generation_config or self.generation_config, "do_sample", False))
        resolved = self.prepare_generation_conditioning(batch_size, do_sample=bool(do_sample), **given)
        resolved = {name: value.to(self.device).contiguous() for name, value in resolved.items()}
        return super().generate(inputs, generation_config, **resolved, **kwargs)

    def prepare_inputs_for_generation(self, *args, **kwargs):
        inputs = super().prepare_inputs_for_generation(*args, **kwargs)
        cache = inputs.get("state")
        if isinstance(cache, TopicLMCache):
            inputs["state"] = cache.state
            inputs.update(cache.conditioning)
        else:  # the first step: its conditioning is what generate() validated (prepare_generation_conditioning)
            inputs["conditioning_resolved"] = True
        return inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        previous = model_kwargs.get("state")
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder,
                                                                   num_new_tokens)
        if isinstance(previous, TopicLMCache):
            conditioning = previous.conditioning
        else:
            conditioning = {name: model_kwargs.get(name) if model_kwargs.get(name) is not None
                            else getattr(outputs, name, None) for name in self._cached_conditioning}
            conditioning = {name: value for name, value in conditioning.items() if value is not None}
        for name in (*RAW_CONDITIONING, *self.conditioning_options, *self._cached_conditioning):
            model_kwargs.pop(name, None)
        state = getattr(outputs, "state", None)
        if state is None:  # use_cache=False: no cache; the next step reads the resolved conditioning as keywords
            model_kwargs.update(conditioning)
            model_kwargs["state"] = None
        else:
            model_kwargs["state"] = TopicLMCache(state, conditioning)
        return model_kwargs


__all__ = ["RAW_CONDITIONING", "TopicGenerationMixin", "TopicGuidanceLogitsProcessor", "TopicLMCache"]
