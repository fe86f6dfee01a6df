"""Generation with topics: the conditioning resolved once and carried with the recurrent state in one cache
(:class:`TopicLMCache`), decode-time topic guidance (:class:`TopicGuidanceLogitsProcessor`), and the ``generate``
of every topic family (:class:`TopicGenerationMixin`).

Copied next to the weights with a family's own files when a model is shared with remote code.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from .modeling_conditioning import TopicConditioning
from .modeling_recurrent import check_prompt, reorder_state, state_from_aliases


# The raw conditioning keywords generate() may be given; a family accepts those it declares in conditioning_inputs.
NO_TOPICS = TopicConditioning()  # the model under its prior (topic guidance's second run): no conditioning to check
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
        tokens, mask: the tokens the state has read (b, S) and their attention mask (None: all real), when known.
        prior_state: the state of the model under its prior (no conditioning) after the same tokens, kept by
            topic guidance (None: not kept; a guided continuation reads ``tokens`` again to make it).

    ``generate(..., return_dict_in_generate=True).past_key_values`` is this object: pass it back to continue with
    the same topics, either with the tokens after what it read (``generate(out.sequences[:, -1:],
    past_key_values=cache)``) or, as transformers does, with the whole sequence (``generate(out.sequences,
    past_key_values=cache)``: the part it read is not read again, and the output holds the whole sequence).
    """

    is_compileable = False

    def __init__(self, state, conditioning: dict, tokens: Optional[torch.Tensor] = None,
                 mask: Optional[torch.Tensor] = None, prior_state=None, model_type: Optional[str] = None):
        self.state = state
        self.conditioning = dict(conditioning)
        self.tokens, self.mask, self.prior_state = tokens, mask, prior_state
        self.model_type = model_type  # the family whose generation made it (its state means nothing to another)

    def reorder(self, beam_idx: torch.Tensor) -> "TopicLMCache":
        """The rows ``beam_idx`` of the state and of the conditioning (beam search)."""
        rows = lambda x: None if x is None else x.index_select(0, beam_idx.to(x.device))  # noqa: E731
        return TopicLMCache(reorder_state(self.state, beam_idx),
                            {name: rows(value) for name, value in self.conditioning.items()},
                            rows(self.tokens), rows(self.mask), reorder_state(self.prior_state, beam_idx),
                            self.model_type)

    def check_model(self, model) -> None:
        """Refuse to continue in ``model`` a generation that another family (or configuration) made."""
        if self.model_type is not None and self.model_type != model.config.model_type:
            raise ValueError(f"this cache comes from a {self.model_type} model's generation; {type(model).__name__} "
                             f"({model.config.model_type}) cannot continue it: continue with the model that made it")

    def read_prefix(self, input_ids: torch.Tensor) -> int:
        """How many leading tokens of ``input_ids`` this cache has already read: ``S`` when they begin with its
        tokens (the whole-sequence convention), else 0 (the tokens after them). Giving only what it read is an
        error: there is no token to read next."""
        if self.tokens is None or input_ids.shape[0] != self.tokens.shape[0] \
                or input_ids.shape[1] < self.tokens.shape[1]:
            return 0
        read = self.tokens.shape[1]
        if not torch.equal(input_ids[:, :read], self.tokens.to(input_ids.device)):
            return 0
        if input_ids.shape[1] == read:
            raise ValueError(f"the input is the {read} tokens the cache has already read: give the sequence with the "
                             "tokens after them (e.g. out.sequences), or only those tokens (out.sequences[:, -1:])")
        return read


class TopicGuidanceLogitsProcessor:
    """Decode-time topic guidance (classifier-free guidance, Sanchez et al. 2024) for a recurrent topic LM:
    the next-token scores of the topic-conditioned run, ``l_cond``, become ``l_cond + (s - 1) (l_cond - l_prior)``,
    with ``l_prior`` those of the same model given no conditioning (its prior: no document, no topics) on the
    same tokens. ``s = 1`` leaves the scores as they are; ``s > 1`` pushes towards what the topics add.

    The prior run keeps its own recurrent state (with ``use_cache``) and follows beam search's reordering by
    matching each row's prefix to the previous step's rows; without ``use_cache`` it reads the whole sequence at
    every step. Tokens the conditioned run rules out (``-inf``) stay out. It runs first among the logits
    processors, on the model's own scores (before temperature, top-k and the rest)."""

    def __init__(self, model, scale: float, attention_mask: Optional[torch.Tensor], use_cache: bool = True,
                 initial_state=None):
        self.model, self.scale, self.use_cache = model, float(scale), bool(use_cache)
        self.prompt_mask = attention_mask
        self.initial_state = initial_state  # the prior's state after the tokens before the prompt (a continuation)
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
        if self.use_cache and self.sequences is not None and self.sequences.shape[1] == input_ids.shape[1] - 1:
            previous = self.sequences.to(input_ids.device)
            match = (input_ids[:, None, :-1] == previous[None]).all(-1)  # (n, n_previous): whose prefix it is
            if not bool(match.any(1).all()):
                raise RuntimeError("topic guidance lost track of the sequences (a row's prefix is no earlier row)")
            state = reorder_state(self.state, match.int().argmax(1))
            out = self.model(input_ids=input_ids[:, -1:], attention_mask=mask, state=state, use_cache=True,
                             return_dict=True, topic_conditioning=NO_TOPICS)
        else:
            initial = None if self.initial_state is None else \
                reorder_state(self.initial_state, self._rows(input_ids.shape[0], self.initial_state))
            out = self.model(input_ids=input_ids, attention_mask=mask, state=initial,
                             use_cache=self.use_cache or initial is not None, return_dict=True,
                             topic_conditioning=NO_TOPICS)
        if self.use_cache:
            self.state, self.sequences = out.state, input_ids
        return out.logits[:, -1].float()

    @staticmethod
    def _rows(n: int, state) -> torch.Tensor:
        """Each of ``n`` rows' row of ``state`` (the rows of generate's expansion for beams and return sequences)."""
        first = state[0] if isinstance(state, tuple) else state
        while isinstance(first, tuple):
            first = first[0]
        return torch.arange(n, device=first.device) // (n // first.shape[0])

    def state_after(self, sequences: torch.Tensor):
        """The prior's state after ``sequences`` minus their last token (what the model's cache has read), its rows
        matched to them by prefix; None when it did not keep one or cannot tell."""
        if not self.use_cache or self.sequences is None or self.sequences.shape[1] != sequences.shape[1] - 1:
            return None
        match = (sequences[:, None, :-1] == self.sequences.to(sequences.device)[None]).all(-1)
        if not bool(match.any(1).all()):
            return None
        return reorder_state(self.state, match.int().argmax(1))

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
      and ``num_return_sequences`` (it repeat-interleaves dim 0 of every tensor keyword: a 1-D ``[3, 7]`` would
      become ``[3, 3, 7, 7]``); the first forward gets them as one trusted ``topic_conditioning``
      (:class:`TopicConditioning`) and does not validate them again. Without a prompt, one ``<bos>`` row is
      generated per conditioning row.
    * The first forward resolves it into the model's topic representation and returns it (the outputs named
      by ``_cached_conditioning``); :meth:`_update_model_kwargs_for_generation` keeps that representation
      with the recurrent state in one :class:`TopicLMCache`, and every later step reads it from there as the
      trusted ``forward`` keywords of the same names: the document is encoded and the conditioning
      checked once, not at every token.
    """

    # The outputs of the first forward that stand for the conditioning at every later step (forward takes them by
    # these names, trusted): the resolved topic representation (NCLM adds its topic vectors).
    _cached_conditioning = ("topic_representation",)
    conditioning_options: tuple[str, ...] = ()  # generate() keywords that only shape the conditioning
    _topic_guidance: Optional[TopicGuidanceLogitsProcessor] = None  # set by generate() while it runs

    def prepare_generation_conditioning(self, batch_size: Optional[int], do_sample: bool = False,
                                        **given) -> TopicConditioning:
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
        read = 0
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        if isinstance(state, TopicLMCache):
            state.check_model(self)
        if isinstance(state, TopicLMCache) and isinstance(prompt, torch.Tensor):
            read = state.read_prefix(prompt)  # the whole-sequence convention: what the cache read is not read again
            mask = kwargs.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.dim() == 2 and \
                    state.tokens is not None and mask.shape[1] == state.tokens.shape[1] + prompt.shape[1] - read:
                kwargs["attention_mask"] = mask[:, state.tokens.shape[1]:]  # a mask of the whole sequence
            if read:
                prompt = prompt[:, read:]
                if inputs is not None:
                    inputs = prompt
                else:
                    kwargs["input_ids"] = prompt
        if topic_guidance_scale is None:
            return self._after_generation(self._generate(inputs, generation_config, **kwargs), state, read,
                                          kwargs.get("attention_mask"))
        if isinstance(topic_guidance_scale, bool) or not isinstance(topic_guidance_scale, numbers.Real) \
                or not 0 <= topic_guidance_scale <= MAX_GUIDANCE_SCALE:
            raise ValueError(f"topic_guidance_scale must be a number in [0, {MAX_GUIDANCE_SCALE}] (1: no guidance; the "
                             f"package's steering used up to 3), got {topic_guidance_scale!r}")
        if not any(kwargs.get(name) is not None for name in RAW_CONDITIONING) and \
                not isinstance(kwargs.get("state"), TopicLMCache):
            raise ValueError(f"topic_guidance_scale guides towards a conditioning: give one of "
                             f"{list(self.conditioning_inputs)} (e.g. topic_ids=[3])")
        use_cache = kwargs.get("use_cache", getattr(generation_config or self.generation_config, "use_cache", True))
        self._topic_guidance = guidance = TopicGuidanceLogitsProcessor(
            self, topic_guidance_scale, kwargs.get("attention_mask") if isinstance(prompt, torch.Tensor) else None,
            use_cache=use_cache is not False, initial_state=self._prior_state(state))
        try:
            return self._after_generation(self._generate(inputs, generation_config, **kwargs), state, read,
                                          kwargs.get("attention_mask"), guidance)
        finally:
            self._topic_guidance = None

    def _prior_state(self, cache):
        """The state of the model under its prior after what ``cache`` has read (a guided continuation): the one the
        cache kept, else read again from its tokens; None when not continuing."""
        if cache is None:
            return None
        if not isinstance(cache, TopicLMCache) or (cache.prior_state is None and cache.tokens is None):
            raise ValueError("topic guidance continues only from a cache returned by generate(..., "
                             "return_dict_in_generate=True) (its past_key_values): this state does not say what it "
                             "read")
        if cache.prior_state is not None:
            return cache.prior_state
        with torch.no_grad():
            return self(input_ids=cache.tokens, attention_mask=cache.mask, use_cache=True, return_dict=True,
                        topic_conditioning=NO_TOPICS).state

    def _after_generation(self, out, cache, read: int, mask, guidance=None):
        """``generate``'s result with what its cache has read recorded (tokens, mask, the guidance prior's state),
        and, where the input was the whole sequence, the part that the given cache had read put back in front.
        ``mask``: the attention mask of the prompt generate was given (after that part), or None."""
        sequences = out if isinstance(out, torch.Tensor) else getattr(out, "sequences", None)
        if not isinstance(sequences, torch.Tensor):
            return out
        n = sequences.shape[0]
        expand = lambda x: None if x is None else x.to(sequences.device).repeat_interleave(  # noqa: E731
            n // x.shape[0], dim=0)
        continued = isinstance(cache, TopicLMCache)
        before = expand(cache.tokens) if continued else None
        whole = torch.cat([before, sequences], 1) if before is not None else sequences
        if read:  # the whole-sequence convention: the output holds the whole sequence
            if isinstance(out, torch.Tensor):
                return whole
            out.sequences = whole
        new_cache = getattr(out, "past_key_values", None)
        if isinstance(new_cache, TopicLMCache):
            known = before is not None or not continued
            new_cache.tokens = whole[:, :-1] if known else None
            if known and ((continued and cache.mask is not None) or isinstance(mask, torch.Tensor)):
                empty = sequences.new_ones(n, 0)
                parts = [expand(cache.mask) if continued and cache.mask is not None else
                         torch.ones_like(before) if before is not None else empty,
                         expand(mask) if isinstance(mask, torch.Tensor) else empty]
                rest = whole.shape[1] - sum(part.shape[1] for part in parts)  # the tokens after: all real
                new_cache.mask = torch.cat([*parts, sequences.new_ones(n, rest)], 1)[:, :-1]
            new_cache.prior_state = guidance.state_after(sequences) if guidance is not None else None
        return out

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
            inputs["topic_conditioning"] = TopicConditioning.of(
                **{name: inputs.pop(name, None) for name in dict.fromkeys((*RAW_CONDITIONING, *self.conditioning_inputs))})
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
            model_kwargs["state"] = TopicLMCache(state, conditioning, model_type=self.config.model_type)
        return model_kwargs


__all__ = ["NO_TOPICS", "RAW_CONDITIONING", "TopicGenerationMixin", "TopicGuidanceLogitsProcessor", "TopicLMCache"]
