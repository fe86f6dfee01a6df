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
(as one trusted :class:`TopicConditioning`, ``topic_conditioning=``); a ``topic_representation`` resolved by an
earlier step is used as it is.

What the package asks of a topic model is asked through these names only (``isinstance(model,
TopicFamilyForCausalLM)`` says whether a model has topics; nothing is probed with ``hasattr``). The optional parts
have defaults here: ``set_training_corpus_size`` (rGBN-RNN's TLASGR-MCMC scales its statistics to the corpus),
``training_phases`` (NCLM's phases before the joint objective), ``topic_model_inputs`` and
``topic_pretraining_batches`` (what the topic model reads when pre-trained alone), ``num_topic_layers`` (rGBN-RNN's
hierarchy), and one KL-annealing mechanism (``kl_annealing_weight``).

Every head's ``forward`` is one template, :meth:`TopicFamilyForCausalLM.forward`, that runs five numbered stages.
A family does not restate it: it declares its own keywords with what each is (``forward_inputs``) and what forward
returns (``forward_returns``), and its ``forward`` is the template with a signature and a docstring made of those
(``generate`` checks its keywords against that signature). The family implements the stages' small methods, and
overrides the one stage its maths does not fit (never a test of the family in the template); a training phase
named ``topic_model`` trains the topic model alone (``topic_model_loss``) for every family that has one:

1. ``resolve_conditioning`` (through ``conditioning``): the topic keywords validated once, or the
   ``topic_representation`` an earlier call resolved, trusted as it is;
2. ``language_model_features``: the family's recurrent body, with the resolved topics where it needs them, as a
   :class:`LanguageModelPass`;
3. ``output_logits``: the output layer with the family's ``output_bias`` (by default the shared
   ``output_layer`` with the topic output prior) -> the logits and the LM loss;
4. ``loss_terms``: the family's terms (KL, bag-of-words, auxiliary) as :class:`LossTerm` s, summed with their
   weights and ``lm_loss_weight`` (a term marked ``annealed`` is also weighted by ``kl_annealing_weight``);
5. the output (``output_class``, a :class:`~.modeling_recurrent.TopicLMOutput`).
"""

from __future__ import annotations

import inspect
import math
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
from torch import nn

from .modeling_conditioning import (TopicConditioning, check_resolved, check_topic_layer, lm_to_topic_index,
                                    normalize_topic_kwargs, topic_scores_to_vocab, topic_vocabulary, topic_word_mask)
from .modeling_document import DocumentRepresentationDelegate
from .modeling_recurrent import TopicLMOutput, check_call, detach_or_none, state_from_aliases


@dataclass
class LanguageModelPass:
    """What the language model of one ``forward`` produced (stage 2 of the template), for the stages after it.

    Args:
        features: the output layer's input, (b, s, F) (or what the family's ``output_logits`` reads).
        state: the recurrent state the output returns (None when none is returned).
        hidden_states: the per-layer tuple of :class:`TopicLMOutput` (with ``output_hidden_states``).
        topic_mixture: the ``topic_mixture`` of the output.
        topic_representation: the resolved topics, as ``forward`` takes them back; what the default output bias
            reads.
        outputs: the family's own output fields beyond :class:`TopicLMOutput`'s (e.g. NCLM's
            ``topic_embeddings``).
        details: what the family's later stages read (a posterior, its KL, ...), by name.
    """

    features: Optional[torch.Tensor] = None
    state: Optional[tuple] = None
    hidden_states: Optional[tuple] = None
    topic_mixture: Optional[torch.Tensor] = None
    topic_representation: Optional[torch.Tensor] = None
    outputs: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)


def _weighted(weight, value):
    """``weight * value``, without the operation (a kernel launch per step, forward and backward) where ``weight``
    is the number 1: the product would be ``value`` exactly."""
    return value if isinstance(weight, (int, float)) and weight == 1 else weight * value


@dataclass
class LossTerm:
    """One term of a family's objective (stage 4 of the template): ``weight * objective`` is added to the loss (times
    ``kl_annealing_weight`` when ``annealed``), and ``reported`` holds what the output reports of it, by output field
    (``kl_loss``, ``bow_loss``, ``aux_loss``; detached by the template)."""

    objective: torch.Tensor
    weight: Union[float, torch.Tensor] = 1.0
    annealed: bool = False
    reported: dict = field(default_factory=dict)


class TopicWordPriorMixin:
    """The shared topic output prior of every topic family (``config.topic_output_bias="beta"``; not in the papers).

    A product of experts of the LM with its own topic model: the logits of every topic word w get
    ``lambda * log(V_c p(w | t))``, where ``p(w | t)`` is the family's topic-word distribution at the topic
    representation t the LM is conditioned on (TCNLM: beta^T t; NCLM: the NVDM decoder softmax(W h + b);
    TopicRNN: softmax(B theta) over the topic words; rGBN-RNN: Phi^1 theta^1 normalised), V_c the number of topic
    words the LM has (the ratio is to the uniform distribution, so an uninformative topic model adds 0), and
    lambda one scalar (``topic_prior_weight``, from ``config.topic_prior_weight_init``; learned, or held there with
    ``config.topic_prior_weight_trainable=False``). Stop words get 0.
    With ``topic_ids`` the topic model's own topic k tilts the LM towards its words, which is what makes a
    topic steer when the LM alone has learnt to ignore t.

    ``topic_output_bias="learned"`` (TCNLM, rGBN-RNN) instead adds B t, a free B (V x K, ``topic_bias``) at zero
    at initialisation, t the topic mixture the LM reads: a linear topic term at every word, which the LM learns to
    use from the start of training rather than through one scalar.

    A family provides ``topic_word_log_probs(t) -> (b, V_c)`` and calls :meth:`_init_topic_word_prior` in its
    ``__init__`` (with ``learned_topics``, K, where it offers ``"learned"``); ``TopicFamilyForCausalLM._init_weights``
    sets lambda to its initial value and B to zero."""

    def _init_topic_word_prior(self, learned_topics: Optional[int] = None) -> None:
        kind = getattr(self.config, "topic_output_bias", None)
        self.topic_prior_weight = nn.Parameter(torch.zeros(())) if kind == "beta" else None
        if learned_topics is not None:
            self.topic_bias = nn.Linear(learned_topics, self.config.vocab_size, bias=False) \
                if kind == "learned" else None
        self.hold_configured_weights()

    def hold_configured_weights(self) -> None:
        """lambda learned, or held at its value by ``config.topic_prior_weight_trainable=False``."""
        super().hold_configured_weights()
        if self.topic_prior_weight is not None:
            self.topic_prior_weight.requires_grad_(self.config.topic_prior_weight_trainable)

    def topic_output_terms(self, mixture: Optional[torch.Tensor],
                           representation: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The (b, V) bias every position of a row gets: B ``mixture`` (``"learned"``) or the shared prior at
        ``representation`` (``"beta"``); None with neither."""
        learned = getattr(self, "topic_bias", None)
        if isinstance(learned, nn.Linear) and mixture is not None:
            return learned(mixture.to(learned.weight.dtype))
        if self.topic_prior_weight is not None and representation is not None:
            return self.topic_word_prior(representation)
        return None

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


# What every family's forward takes from the template (the family adds its own keywords, ``forward_inputs``).
TEMPLATE_INPUTS = {
    "input_ids": "(b, s) token ids, left- or right-padded.",
    "attention_mask": "(b, s), 1 for real tokens.",
    "inputs_embeds": "(b, s, E) embeddings instead of ``input_ids``.",
    "state": "the recurrent state to continue from (``past_key_values=`` and ``cache=`` are its other names; the "
             "family's layout is in its class docstring).",
    "labels": "(b, s) = ``input_ids`` with -100 at ignored positions; logits at position t predict "
              "``labels[:, t + 1]`` (shifted inside).",
    "use_cache": "return the state after the input (default: ``config.use_cache`` outside training).",
    "topic_representation": "the resolved topics that an earlier call returned under this name (what generation "
                            "caches), used as they are.",
    "output_hidden_states": "return every layer's outputs.",
    "return_dict": "False: a tuple instead of the output class.",
    "logits_to_keep": "compute logits for the last N positions only (0 = all).",
    "topic_conditioning": "the topic conditioning already validated (a :class:`TopicConditioning`, what "
                          ":meth:`resolve_conditioning` returns; ``generate``'s first step gets it), trusted as it is.",
}


def _declared_forward(cls) -> "Callable":
    """The ``forward`` of a family that declares ``forward_inputs``: the template's, with a signature of the template's
    parameters plus the family's keywords (keyword-only), which ``generate`` checks its keywords against and
    ``Trainer`` keeps its columns by, and a docstring of all of them."""
    template = TopicFamilyForCausalLM.forward

    def forward(self, *args, **kwargs):
        return template(self, *args, **kwargs)

    # the template's parameters in its order (made, not read from it: nothing probes a signature)
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    parameters += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                     default=0 if name == "logits_to_keep" else None) for name in TEMPLATE_INPUTS]
    parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
                   for name in cls.forward_inputs]
    parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    forward.__signature__ = inspect.Signature(parameters)
    lines = [f"{cls.__name__}'s forward: the template of every topic family "
             "(:meth:`TopicFamilyForCausalLM.forward`) with the family's own keywords.", "", "Args:"]
    for name, doc in {**TEMPLATE_INPUTS, **cls.forward_inputs}.items():
        lines += textwrap.wrap(f"{name}: {doc}", 116, initial_indent="    ", subsequent_indent="        ",
                               break_on_hyphens=False)
    lines += ["", "Returns:"] + textwrap.wrap(cls.forward_returns, 116, initial_indent="    ",
                                              subsequent_indent="    ", break_on_hyphens=False)
    forward.__doc__ = "\n".join(lines)
    forward.__name__, forward.__qualname__, forward.__module__ = "forward", f"{cls.__name__}.forward", cls.__module__
    return forward


def lstm_language_model_weights(lstm_parameter: str) -> dict[str, str]:
    """``language_model_weights`` of a family that has the LSTM LM's embeddings and output layer, and its LSTM
    weights under ``lstm_parameter`` (``{name}``: weight_ih, weight_hh, bias_ih or bias_hh; ``{i}``: the layer), e.g.
    ``"model.rnn.{name}_l{i}"`` for one multi-layer ``nn.LSTM``."""
    names = {lstm_parameter.format(name=name, i="{i}"): f"model.lstm.{name}_l{{i}}"
             for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    return {"model.embed_tokens.weight": "model.embed_tokens.weight", **names, "lm_head.weight": "lm_head.weight",
            "lm_head.bias": "lm_head.bias"}


class TopicFamilyForCausalLM(DocumentRepresentationDelegate, TopicWordPriorMixin):
    """The topic API of every topic family's causal LM (see the module docstring)."""

    # The family's own keywords of forward beyond the template's (name -> what it is), its conditioning_inputs and
    # conditioning_options among them, and what forward returns: a family declares them and the template's forward
    # is its forward (``_declared_forward``), never restated.
    forward_inputs: dict[str, str] = {}
    forward_returns: str = ":class:`TopicLMOutput`."

    # The weights a family shares with the LSTM LM of its sizes (``lstm_lm``), for :meth:`from_language_model`: its
    # parameter names -> the LSTM LM's, ``{i}`` standing for a layer's index. Empty where the family has no LSTM of
    # the LSTM LM's form (TCNLM's weights are factorised by topic).
    language_model_weights: dict[str, str] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "forward_inputs" in vars(cls) and "forward" not in vars(cls):
            cls.forward = _declared_forward(cls)

    @classmethod
    def from_language_model(cls, language_model, config):
        """A model of this family built from ``config`` that starts from a trained LSTM language model: its
        embeddings, LSTM layers and output layer are ``language_model``'s, the rest as initialised, and the topic
        path is set (:meth:`start_from_language_model`) so that the model's predictions start at or near the
        language model's: the shared topic output prior's weight at 0 (unless held); rGBN-RNN's gates let 1.8 % of
        their topic candidate through; TopicRNN adds its topic term b_i^T theta (zero under ``topic_mixture`` zero).

        Args:
            language_model: an ``lstm_lm`` causal LM (``LSTMLMForCausalLM``) or the folder / Hub name of one.
            config: this family's configuration, built with the language model's tokenizer and sizes
                (``vocab_size``, ``embedding_size``, ``hidden_size``, the number of LSTM layers).

        Raises:
            ValueError: the family has no LSTM to take, ``language_model`` is not an LSTM LM, or a size differs
                (named, with both shapes).
        """
        if not cls.language_model_weights:
            raise ValueError(f"{cls.__name__} has no LSTM of the LSTM LM's form to take from a language model; "
                             "start it from its configuration")
        if isinstance(language_model, (str, bytes)) or hasattr(language_model, "__fspath__"):
            from transformers import AutoModelForCausalLM
            language_model = AutoModelForCausalLM.from_pretrained(language_model)
        if getattr(getattr(language_model, "config", None), "model_type", None) != "lstm_lm":
            found = getattr(getattr(language_model, "config", None), "model_type", type(language_model).__name__)
            raise ValueError(f"from_language_model takes an LSTM language model (model_type 'lstm_lm'), got {found!r}")
        if getattr(language_model, "proj", None) is not None:
            raise ValueError("This language model projects its LSTM's outputs to the embedding size before its output "
                             f"layer (tied embeddings with embedding_size != hidden_size); {cls.__name__} has no such "
                             "layer to take it: start from an LSTM LM with embedding_size == hidden_size")
        model = cls(config)
        source, own = language_model.state_dict(), model.state_dict()
        taken = {}
        for own_pattern, source_pattern in cls.language_model_weights.items():
            layers = range(language_model.config.num_hidden_layers) if "{i}" in own_pattern else [0]
            for i in layers:
                own_name, source_name = own_pattern.format(i=i), source_pattern.format(i=i)
                if own_name not in own:
                    raise ValueError(f"The language model has {language_model.config.num_hidden_layers} LSTM "
                                     f"layer(s) and this {cls.__name__} has no {own_name}: give it as many")
                if own[own_name].shape != source[source_name].shape:
                    raise ValueError(f"The language model's {source_name} is {tuple(source[source_name].shape)} and "
                                     f"this {cls.__name__}'s {own_name} is {tuple(own[own_name].shape)}: build the "
                                     "configuration with the language model's tokenizer and sizes")
                taken[own_name] = source[source_name]
            extra = own_pattern.format(i=len(layers)) if "{i}" in own_pattern else None
            if extra is not None and extra in own:
                raise ValueError(f"This {cls.__name__} has more LSTM layers than the language model's "
                                 f"{len(layers)}: give it as many")
        model.load_state_dict(taken, strict=False)
        model.start_from_language_model()
        return model

    def language_model_parameters(self) -> list[nn.Parameter]:
        """The parameters :meth:`from_language_model` takes from an LSTM LM (embeddings, LSTM layers, output layer);
        empty for a family without them."""
        own = dict(self.named_parameters())
        names = set()
        for pattern in self.language_model_weights:
            if "{i}" not in pattern:
                names.add(pattern)
                continue
            i = 0
            while pattern.format(i=i) in own:
                names.add(pattern.format(i=i))
                i += 1
        return [own[name] for name in sorted(names) if name in own]

    def freeze_language_model(self, frozen: bool = True) -> None:
        """Hold the language-model weights (:meth:`language_model_parameters`) fixed in training (``frozen=False``
        trains them again): a model started by :meth:`from_language_model` then learns its topic path alone, so that
        whatever it gains over that language model comes through the topics, not from more training of the LM. An
        option beside the papers' joint training; ``Trainer`` leaves parameters without gradients out of its
        optimizer."""
        parameters = self.language_model_parameters()
        if not parameters:
            raise ValueError(f"{type(self).__name__} has no LSTM language model's weights to freeze")
        for parameter in parameters:
            parameter.requires_grad_(not frozen)

    def start_from_language_model(self) -> None:
        """Set the topic path after :meth:`from_language_model` took the LSTM LM's weights, so that the model's
        predictions start at the language model's: the shared topic output prior's weight lambda starts at 0 (it
        is learned from there; a lambda held by ``config.topic_prior_weight_trainable=False`` stays at its value, a
        prior the language model then learns around), the rest is the family's."""
        if self.topic_prior_weight is not None and self.config.topic_prior_weight_trainable:
            with torch.no_grad():
                self.topic_prior_weight.zero_()

    # What the topic model reads when pre-trained alone (the keywords of topic_model_loss), and its batches:
    # "train" = the family's training batches' context bags, "document" = one row per document with its whole bag.
    topic_model_inputs: tuple[str, ...] = ("context_bow",)
    topic_pretraining_batches: str = "train"
    # Phases TopicLMTrainer(pretraining_phases=...) may run before the joint objective (NCLM: "lm", "topic_model").
    training_phases: tuple[str, ...] = ()
    # Whether a topic_mixture must be a distribution: TCNLM's t is; TopicRNN's theta is any real vector.
    _topic_mixture_on_simplex = True
    # The output of forward (stage 5): a TopicLMOutput, or the family's subclass of it.
    output_class = TopicLMOutput

    def carries_documents_in_one_call(self) -> bool:
        """Whether carried-state training may run a documents batch as one call: the recurrence over each
        document's sequence, and the rest on the batch of its chunks (``forward(document_tokens=...)``, one row
        per real chunk), with the loss of chunk after chunk. A family whose
        recurrence reads its topics (TCNLM), or whose objective is not a sum over chunk rows, runs the chunks in
        turn."""
        return False

    # -- the template forward ----------------------------------------------------------------------

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None, state: Optional[tuple] = None,
                labels: Optional[torch.LongTensor] = None, use_cache: Optional[bool] = None,
                topic_representation: Optional[torch.Tensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: Optional[bool] = None, logits_to_keep: int = 0,
                topic_conditioning: Optional[TopicConditioning] = None, **inputs) -> TopicLMOutput:
        """The template of every family's ``forward`` (see the module docstring); the family's own ``forward``
        documents the keywords. ``inputs`` holds the raw topic keywords (the class's ``conditioning_inputs`` and
        ``conditioning_options``) and the family's other inputs, which go to :meth:`language_model_features`."""
        raw = {name: inputs.pop(name) for name in (*self.conditioning_inputs, *self.conditioning_options)
               if name in inputs}
        # past_key_values= is the state; generation's cache (TopicLMCache) also holds the resolved conditioning
        state = state_from_aliases(state, inputs)
        # the family's own inputs; other keywords (transformers' cache_position, ...) are not the model's
        inputs = {name: value for name, value in inputs.items() if name in self.forward_inputs}
        if self.training and getattr(self, "training_phase", None) == "topic_model":  # the topic model alone
            if raw.get("context_bow") is None:
                raise ValueError("The topic_model training phase needs batches with context_bow")
            loss = self.topic_model_loss(raw["context_bow"])
            out = self.output_class(loss=loss, bow_loss=loss.detach())
            return out if return_dict is not False else out.to_tuple()
        given = [name for name in self.conditioning_inputs if raw.get(name) is not None]
        if topic_representation is not None and given:
            raise ValueError(f"Give topic_representation or one of {', '.join(self.conditioning_inputs)}, not both "
                             f"(got {given})")
        if hasattr(state, "conditioning") and hasattr(state, "state"):
            state.check_model(self)
            if topic_representation is None and not any(v is not None for v in raw.values()):
                inputs.update(state.conditioning)
                topic_representation = inputs.pop("topic_representation", None)
            state = state.state
        check_call(input_ids, inputs_embeds, attention_mask, state)
        # 1. The conditioning, validated once (or by generate), or the topic representation resolved before.
        topics = TopicConditioning()
        if topic_representation is None:
            topics = self.conditioning(input_ids, inputs_embeds, topic_conditioning, **raw)
        # 2. The language model's features, with the resolved topics where the body needs them.
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        run = self.language_model_features(topics, topic_representation, input_ids=input_ids,
                                           attention_mask=attention_mask, inputs_embeds=inputs_embeds, state=state,
                                           labels=labels, use_cache=use_cache,
                                           output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep,
                                           **inputs)
        # 3. The output layer with the family's output bias: the logits and the LM loss.
        logits, lm_loss = self.output_logits(run, labels)
        # 4. The family's loss terms, summed with their weights.
        loss, reported = None, {}
        if lm_loss is not None:
            terms = self.loss_terms(run, labels)
            annealing = self.kl_annealing_weight(count=True) if any(term.annealed for term in terms) else None
            loss = lm_loss if not terms else _weighted(self.lm_loss_weight(), lm_loss)
            for term in terms:
                weight = _weighted(term.weight, annealing) if term.annealed else term.weight
                loss = loss + _weighted(weight, term.objective)
                reported.update({name: value.detach() for name, value in term.reported.items()})
        # 5. The output.
        out = self.output_class(loss=loss, logits=logits, state=run.state, hidden_states=run.hidden_states,
                                lm_loss=detach_or_none(lm_loss), **reported, topic_mixture=run.topic_mixture,
                                topic_representation=run.topic_representation, **run.outputs)
        return out if return_dict is not False else out.to_tuple()

    def conditioning(self, input_ids, inputs_embeds, resolved: Optional[TopicConditioning],
                     **raw) -> TopicConditioning:
        """Stage 1: the raw topic keywords as :meth:`resolve_conditioning` returns them, for a batch of the tokens'
        rows; the ``resolved`` conditioning as it is (``generate`` validated it before its first step)."""
        if resolved is not None:
            return check_resolved(resolved, raw)
        tokens = input_ids if input_ids is not None else inputs_embeds
        return self.resolve_conditioning(None if tokens is None else tokens.shape[0], **raw)

    def language_model_features(self, topics: dict, topic_representation: Optional[torch.Tensor], *, input_ids,
                                attention_mask, inputs_embeds, state, labels, use_cache, output_hidden_states,
                                logits_to_keep, **inputs) -> LanguageModelPass:
        """Stage 2: the family's recurrent body on the tokens, conditioned by the resolved ``topics`` (or by the
        trusted ``topic_representation``), with logits kept for the last ``logits_to_keep`` positions when no
        labels are given. ``use_cache`` and ``output_hidden_states`` are resolved (the config's defaults)."""
        raise NotImplementedError

    def output_bias(self, run: LanguageModelPass) -> Optional[torch.Tensor]:
        """The (b, V) bias every position of a row gets (:meth:`TopicWordPriorMixin.topic_output_terms`): B t or
        the shared topic output prior at the topic representation (None without either)."""
        return self.topic_output_terms(run.topic_mixture, run.topic_representation)

    def output_logits(self, run: LanguageModelPass, labels: Optional[torch.Tensor]):
        """Stage 3: ``(logits, lm_loss)`` of the shared output layer on the features, with :meth:`output_bias`."""
        return self.output_layer(run.features, labels, self.output_bias(run))

    def loss_terms(self, run: LanguageModelPass, labels: torch.Tensor) -> list[LossTerm]:
        """Stage 4: the family's terms beyond the LM loss (none by default)."""
        return []

    def lm_loss_weight(self) -> float:
        """The LM loss's weight in the objective when there are other terms (1 but for NCLM's 1 - alpha)."""
        return 1.0

    @staticmethod
    def predicted_tokens(labels: torch.Tensor) -> torch.Tensor:
        """The number of predicted tokens of ``labels`` (position t predicts ``labels[:, t + 1]``; -100 ignored)."""
        return (labels[:, 1:] != -100).sum()

    # -- the conditioning --------------------------------------------------------------------------

    def resolve_conditioning(self, batch_size: Optional[int], **given) -> TopicConditioning:
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
        ramp = 1.0 if steps == 0 else (self.kl_annealing_step.float() / steps).clamp(max=1.0)  # no device sync
        return _weighted(self.kl_weight_target(), ramp)

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, nn.Linear) and module is getattr(self, "topic_bias", None):  # B t starts at 0
            nn.init.zeros_(module.weight)
        if module is self:  # the head's own values (also when a checkpoint without them is loaded)
            step = self._buffers.get("kl_annealing_step")
            if step is not None:
                step.zero_()
            if self.topic_prior_weight is not None:  # the shared topic output prior's lambda
                nn.init.constant_(self.topic_prior_weight, self.config.topic_prior_weight_init)


__all__ = ["LanguageModelPass", "LossTerm", "TopicFamilyForCausalLM", "TopicWordPriorMixin", "lstm_language_model_weights"]
