"""Machinery shared by every recurrent, topic-guided LM of the package.

This file is copied next to the weights when a model is shared with remote code, so it imports
nothing from the package (only torch and transformers) and model files import it as
``from .modeling_common import ...``.

Notation: b batch, s tokens, L recurrent layers, H hidden size, T topics, V_c topic vocabulary.

What lives here, and why it is shared:

* :class:`TopicLMOutput`: one output dataclass (``loss`` first) for every family.
* The batch-first recurrent state (``state``, a tuple of ``(b, L, H)`` tensors) and
  :func:`reorder_state` for beam search.
* :func:`run_rnn`: runs ``nn.LSTM``/``nn.GRU``/``nn.RNN`` on left- or right-padded batches so that
  padding never touches the state.
* :func:`normalize_topic_kwargs`: turns ``topic_ids`` / ``topic_mixture`` / ``context_bow`` given to
  ``generate()`` into validated ``(b, k)`` tensors, so that transformers' expansion for beams and
  ``num_return_sequences`` is right.
* :class:`RecurrentPreTrainedModel`: the ``PreTrainedModel`` flags every recurrent LM needs
  (see ../shared/docs/hf-notes.md §0).

Contract with the evaluation code: ``log_softmax(output.logits)`` is the model's predictive
distribution of the next token. A model with a marginal likelihood (TopicRNN's stop-word
indicator) returns log-probabilities as ``logits``.
"""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers.generation.stopping_criteria import StopStringCriteria
from transformers.utils import ModelOutput


@dataclass
class TopicLMOutput(ModelOutput):
    """Output of every causal LM in the package.

    Args:
        loss: the training objective that is minimised (LM loss plus every auxiliary term).
        logits: (b, s, V) next-token scores; ``log_softmax`` of them is the predictive distribution.
        state: tuple of (b, L, H) tensors, the recurrent state after the last real token.
        hidden_states: with ``output_hidden_states=True``, a tuple of L + 1 tensors as in every
            transformers model: the embeddings as fed to the first recurrent layer (after dropout),
            then the outputs of each recurrent layer l = 1..L at every position (b, s, H), zero at
            padding, before the dropout between layers; the last entry is the base model's
            ``last_hidden_state``. For a recurrent layer, its output at position i is its hidden
            state h_i (what the next layer reads). TCNLM's naive MoE gives (b, s, T, H) per layer
            (every expert's layer l).
        lm_loss: mean negative log-likelihood per predicted token (nats).
        kl_loss: KL divergence of the topic posterior from its prior, on the scale the model documents.
        bow_loss: reconstruction loss of the context bag of words.
        aux_loss: any other regulariser (diversity, stop-word indicator, ...).
        topic_mixture: (b, T) topic representation used for this batch.
    """

    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    state: Optional[tuple[torch.Tensor, ...]] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None
    lm_loss: Optional[torch.Tensor] = None
    kl_loss: Optional[torch.Tensor] = None
    bow_loss: Optional[torch.Tensor] = None
    aux_loss: Optional[torch.Tensor] = None
    topic_mixture: Optional[torch.Tensor] = None


@dataclass
class RecurrentModelOutput(ModelOutput):
    """Output of a base model (no output layer).

    Args:
        last_hidden_state: (b, s, H) outputs of the top recurrent layer (zero at padding).
        state: the batch-first recurrent state after each row's last real token (with ``use_cache``).
        hidden_states: the per-layer tuple of :class:`TopicLMOutput`, with ``output_hidden_states=True``.
    """

    last_hidden_state: Optional[torch.Tensor] = None
    state: Optional[tuple[torch.Tensor, ...]] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None


# Outputs that Trainer must not gather into eval predictions (hf-notes §4).
KEYS_TO_IGNORE_AT_INFERENCE = ["state", "hidden_states", "lm_loss", "kl_loss", "bow_loss", "aux_loss",
                               "topic_mixture"]


def check_integers(minimum: int, **values) -> None:
    """Configuration checks: each value must be an int (not a bool) >= ``minimum`` (1: "positive", 0:
    "non-negative"), else a ``ValueError`` naming it."""
    kind = {0: "non-negative", 1: "positive"}.get(minimum, f">= {minimum}")
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be a {kind} integer, got {value!r}")


def reorder_state(state, beam_idx: torch.Tensor):
    """Select batch rows of a (nested) tuple of batch-first tensors."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.index_select(0, beam_idx.to(state.device))
    return type(state)(*(reorder_state(s, beam_idx) for s in state)) if hasattr(state, "_fields") \
        else tuple(reorder_state(s, beam_idx) for s in state)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits at position i predict labels at i + 1; -100 is ignored."""
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
    shift_labels = labels[:, 1:].reshape(-1).to(logits.device)
    return nn.functional.cross_entropy(shift_logits.float(), shift_labels, ignore_index=-100)


# ----------------------------------------------------------------------------------------------
# running a recurrent layer on padded batches
# ----------------------------------------------------------------------------------------------


def _is_right_padded(mask: torch.Tensor) -> bool:
    return bool((mask[:, :-1] >= mask[:, 1:]).all())


def _to_layer_first(state):
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.transpose(0, 1).contiguous()
    return tuple(_to_layer_first(s) for s in state)


def run_rnn(rnn: nn.RNNBase, x: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
            state=None, need_state: bool = True):
    """Run a batch-first ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` on a padded batch.

    Args:
        rnn: a batch-first recurrent module.
        x: (b, s, E) inputs.
        attention_mask: (b, s), 1 for real tokens; padding may be on the left or the right.
        state: batch-first initial state: ``(h, c)`` for an LSTM, ``(h,)`` otherwise, each (b, L, H).
        need_state: return the final state; when False and padding is on the right (training),
            the fast unpacked path is used, since outputs at real positions do not depend on
            what follows them.

    Returns:
        ``(outputs (b, s, H), state)``: outputs at padded positions are zero, and the state is
        the one after each row's last real token (the initial state for rows with no token).
    """
    is_lstm = isinstance(rnn, nn.LSTM)
    hx = _to_layer_first(state)
    if hx is not None and not is_lstm:
        hx = hx[0]
    if attention_mask is None or bool(attention_mask.all()) or (not need_state and _is_right_padded(attention_mask)):
        out, hn = rnn(x, hx)
        if attention_mask is not None and not bool(attention_mask.all()):
            out = out * attention_mask.unsqueeze(-1).to(out.dtype)
    else:
        mask = attention_mask.bool()
        b, s = mask.shape
        lengths = mask.sum(1)
        # Move each row's real tokens to the front (stable), pack, run, move outputs back.
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
        x_front = x.gather(1, order.unsqueeze(-1).expand_as(x))
        packed = nn.utils.rnn.pack_padded_sequence(x_front, lengths.clamp(min=1).cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out_packed, hn = rnn(packed, hx)
        out_front, _ = nn.utils.rnn.pad_packed_sequence(out_packed, batch_first=True, total_length=s)
        out = torch.zeros_like(out_front).scatter(1, order.unsqueeze(-1).expand_as(out_front), out_front)
        out = out * mask.unsqueeze(-1).to(out.dtype)
        empty = lengths == 0
        if bool(empty.any()):
            # Rows without any token keep their initial state (zeros when none was given).
            hn_list = list(hn) if is_lstm else [hn]
            if hx is None:
                init = [torch.zeros_like(h) for h in hn_list]
            else:
                init = list(hx) if is_lstm else [hx]
            for i, h in enumerate(hn_list):
                hn_list[i] = torch.where(empty.view(1, -1, 1), init[i], h)
            hn = tuple(hn_list) if is_lstm else hn_list[0]
    new_state = tuple(h.transpose(0, 1) for h in (hn if is_lstm else (hn,)))
    return out, new_state


def single_layer_view(rnn: nn.RNNBase, layer: int) -> nn.RNNBase:
    """A one-layer module of the same kind whose parameters *are* layer ``layer`` of ``rnn`` (shared,
    not copied: gradients reach ``rnn``). Built on the meta device, so it costs no memory."""
    kwargs = {"num_layers": 1, "bias": rnn.bias, "batch_first": rnn.batch_first}
    if isinstance(rnn, nn.RNN):
        kwargs["nonlinearity"] = rnn.nonlinearity
    with torch.device("meta"):
        view = type(rnn)(rnn.input_size if layer == 0 else rnn.hidden_size, rnn.hidden_size, **kwargs)
    for name in view._flat_weights_names:  # weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0
        setattr(view, name, getattr(rnn, name[:-1] + str(layer)))
    return view.train(rnn.training)


def _run_one_layer(view, x, attention_mask, need_state, *state):
    out, new_state = run_rnn(view, x, attention_mask, state or None, need_state=need_state)
    return (out, *new_state)  # flat: a reentrant checkpoint only sees top-level tensors


def run_rnn_layers(rnn: nn.RNNBase, x: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, state=None,
                   need_state: bool = True, checkpoint_fn=None):
    """:func:`run_rnn` one layer at a time, for ``output_hidden_states`` and gradient checkpointing.

    Returns ``(outputs (b, s, H), state, layer_outputs)``, where ``layer_outputs`` holds the outputs of
    every layer (each (b, s, H), zero at padding; the last one is ``outputs``), taken before the dropout
    that ``nn.LSTM(dropout=p)`` applies between layers in training (applied here with
    ``F.dropout``, so with that dropout the masks are drawn differently from the fused module; in
    evaluation the outputs equal :func:`run_rnn`'s up to float rounding). With ``checkpoint_fn``
    (``model._gradient_checkpointing_func``) every layer is a checkpoint: only the layer inputs are
    kept for the backward pass, and each layer is recomputed there.
    """
    is_lstm = isinstance(rnn, nn.LSTM)
    hidden, states, layer_outputs = x, [], []
    for layer in range(rnn.num_layers):
        if layer > 0 and rnn.training and rnn.dropout > 0:
            hidden = nn.functional.dropout(hidden, rnn.dropout, training=True)
        view = single_layer_view(rnn, layer)
        layer_state = () if state is None else tuple(s[:, layer:layer + 1] for s in state)[:2 if is_lstm else 1]
        if checkpoint_fn is None:
            hidden, *new_state = _run_one_layer(view, hidden, attention_mask, need_state, *layer_state)
        else:
            hidden, *new_state = checkpoint_fn(_run_one_layer, view, hidden, attention_mask, need_state, *layer_state)
        layer_outputs.append(hidden)
        states.append(new_state)
    new_state = tuple(torch.cat([s[i] for s in states], dim=1) for i in range(len(states[0])))
    return hidden, new_state, tuple(layer_outputs)


def run_token_rnn(module, rnn: nn.RNNBase, input_ids=None, attention_mask=None, inputs_embeds=None, state=None,
                  need_state: bool = False, output_hidden_states: bool = False):
    """Embed tokens and run a stack of recurrent layers: the body of every family with an ``nn.LSTM`` /
    ``nn.GRU`` / ``nn.RNN`` (``module`` has ``embed_tokens``, ``dropout``, ``config.vocab_size`` and
    ``checkpoint_function``).

    (b, s) tokens (or (b, s, E) ``inputs_embeds``) -> ((b, s, H) top-layer outputs, zero at padding; the
    state after each row's last real token (when ``need_state``); the per-layer tuple of
    :class:`TopicLMOutput` ``hidden_states`` with ``output_hidden_states``, else None). The embeddings go
    through ``module.dropout``; ``attention_mask`` may cover the whole sequence (``generate()``): its last
    s columns are used."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Give exactly one of input_ids and inputs_embeds")
    if inputs_embeds is None:
        vocab_size = module.config.vocab_size
        if bool((input_ids >= vocab_size).any()) or bool((input_ids < 0).any()):
            raise ValueError(f"input_ids must be in [0, {vocab_size}): mismatched tokenizer?")
        inputs_embeds = module.embed_tokens(input_ids)  # (b, s, E)
    if attention_mask is not None and attention_mask.shape[1] != inputs_embeds.shape[1]:
        attention_mask = attention_mask[:, -inputs_embeds.shape[1]:]
    x = module.dropout(inputs_embeds)
    checkpoint_fn = module.checkpoint_function()
    if output_hidden_states or checkpoint_fn is not None:
        hidden, new_state, layers = run_rnn_layers(rnn, x, attention_mask, state, need_state, checkpoint_fn)
        return hidden, new_state, ((x, *layers) if output_hidden_states else None)
    rnn.flatten_parameters()
    return (*run_rnn(rnn, x, attention_mask, state, need_state=need_state), None)


class RecurrentBodyMixin:
    """``forward`` and the input-embedding accessors of a base model that is ``embed_tokens``, ``dropout`` and
    one ``nn.LSTM`` named ``lstm`` (the LSTM LM's and NCLM's bodies): ``forward`` returns a
    :class:`RecurrentModelOutput` with the top layer's outputs (b, s, H), zero at padding. Put it before
    the ``PreTrainedModel`` class in the bases."""

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, state=None, use_cache=None,
                output_hidden_states=None, return_dict=None, **kwargs) -> RecurrentModelOutput:
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        hidden, new_state, all_hidden = run_token_rnn(self, self.lstm, input_ids, attention_mask, inputs_embeds, state,
                                                      use_cache or state is not None, output_hidden_states)
        out = RecurrentModelOutput(last_hidden_state=hidden, state=new_state if use_cache else None,
                                   hidden_states=all_hidden)
        return out if return_dict is not False else out.to_tuple()


# ----------------------------------------------------------------------------------------------
# topic conditioning given to generate() / forward()
# ----------------------------------------------------------------------------------------------


def _batch_size_of(*tensors) -> Optional[int]:
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return t.shape[0]
    return None


def _broadcast_rows(x: torch.Tensor, batch_size: Optional[int], name: str) -> torch.Tensor:
    if batch_size is None or x.shape[0] == batch_size:
        return x
    if x.shape[0] == 1:
        return x.expand(batch_size, *x.shape[1:])
    if batch_size % x.shape[0] == 0:
        # generate() expanded the prompts (beams / num_return_sequences) but not this input.
        return x.repeat_interleave(batch_size // x.shape[0], dim=0)
    raise ValueError(f"{name} has {x.shape[0]} rows but the batch has {batch_size}")


_TOPIC_IDS_FORMS = "an int, a list of ints, a list of lists of ints or an integer tensor of shape (k,) or (b, k)"


def _is_integer_tensor(x: torch.Tensor) -> bool:
    return not (torch.is_floating_point(x) or torch.is_complex(x) or x.dtype == torch.bool)


def _topic_id(value, row: Optional[int] = None) -> int:
    """One topic id: a Python / NumPy int or a 0-d integer tensor; never a bool, float or string."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and _is_integer_tensor(value):
        return int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    where = "" if row is None else f" in row {row}"
    raise ValueError(f"topic_ids must be integer topic ids, got {value!r} ({type(value).__name__}){where}; "
                     f"give {_TOPIC_IDS_FORMS}")


def _is_topic_row(value) -> bool:
    return isinstance(value, (list, tuple)) or getattr(value, "ndim", None) == 1  # a list, 1-D tensor or array


def normalize_topic_ids(topic_ids, num_topics: int, batch_size: Optional[int] = None) -> torch.Tensor:
    """Validate ``topic_ids`` and return a (b, k) long tensor padded with -1.

    Accepted: an int (one topic for the whole batch), a flat list / 1-D tensor (one set of topics
    shared by the batch), a list of lists (one set per row, ragged allowed), a (b, k) tensor
    (-1 = padding); NumPy ints and arrays too. Every row needs at least one topic in
    ``[0, num_topics)``. Anything else (floats, bools, strings, deeper nesting) is a ``ValueError``
    that names the bad value: ``int()`` would silently turn 1.7 or True into topic 1, and a string
    "37" into the topics 3 and 7.
    """
    if isinstance(topic_ids, (str, bytes)):
        raise ValueError(f"topic_ids must be integer topic ids, got the string {topic_ids!r}; give {_TOPIC_IDS_FORMS} "
                         "(e.g. [3, 7])")
    if not isinstance(topic_ids, (torch.Tensor, list, tuple)) and hasattr(topic_ids, "__array__") \
            and getattr(topic_ids, "ndim", 0) > 0:
        try:
            topic_ids = torch.as_tensor(topic_ids)  # a NumPy array
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"topic_ids must be integer topic ids, got {topic_ids!r}") from error
    if isinstance(topic_ids, torch.Tensor):
        if not _is_integer_tensor(topic_ids):
            raise ValueError(f"topic_ids must be integer topic ids, got a tensor of dtype {topic_ids.dtype} "
                             f"({topic_ids!r:.80}); give {_TOPIC_IDS_FORMS}")
        ids = topic_ids.long()
        if ids.dim() == 0:
            ids = ids.view(1, 1)
        elif ids.dim() == 1:
            ids = ids.unsqueeze(0)
        elif ids.dim() != 2:
            raise ValueError(f"topic_ids must have 1 or 2 dimensions, got shape {tuple(ids.shape)}")
        rows = ids
    else:
        if not isinstance(topic_ids, (list, tuple)):
            topic_ids = [_topic_id(topic_ids)]  # a single id (or a clear error naming what it is)
        topic_ids = list(topic_ids)
        if len(topic_ids) == 0:
            raise ValueError("topic_ids is empty: give at least one topic id")
        nested = [_is_topic_row(r) for r in topic_ids]
        if not any(nested):
            topic_ids = [topic_ids]
        elif not all(nested):
            raise ValueError(f"topic_ids mixes single ids and lists ({topic_ids!r:.80}); give {_TOPIC_IDS_FORMS}")
        width = max(len(r) for r in topic_ids)
        if width == 0:
            raise ValueError("topic_ids has an empty row: give at least one topic id per row")
        rows = torch.full((len(topic_ids), width), -1, dtype=torch.long)
        for i, r in enumerate(topic_ids):
            for j, t in enumerate(r):
                t = _topic_id(t, i)
                if t < 0:
                    raise ValueError(f"topic_ids must be non-negative, got {t}")
                rows[i, j] = t
    if rows.numel() == 0:
        raise ValueError("topic_ids is empty: give at least one topic id")
    if bool((rows < -1).any()):
        raise ValueError(f"topic_ids must be in [0, {num_topics}) (-1 pads a row), got {rows.min().item()}")
    if bool((rows >= num_topics).any()):
        raise ValueError(f"topic_ids must be in [0, {num_topics}), got {rows.max().item()} "
                         f"(the model has {num_topics} topics)")
    if bool(((rows >= 0).sum(1) == 0).any()):
        raise ValueError("topic_ids has a row without any topic id")
    return _broadcast_rows(rows, batch_size, "topic_ids")


def topic_ids_to_mixture(topic_ids: torch.Tensor, num_topics: int) -> torch.Tensor:
    """(b, k) ids padded with -1 -> (b, T) equal mixture over each row's distinct topics."""
    onehot = torch.zeros(topic_ids.shape[0], num_topics + 1, device=topic_ids.device)
    onehot.scatter_(1, topic_ids.clamp(min=-1) % (num_topics + 1), 1.0)  # -1 -> the extra column
    onehot = onehot[:, :num_topics]
    return onehot / onehot.sum(1, keepdim=True)


def _float_rows(value, name: str, expected: str) -> torch.Tensor:
    """``value`` as a (b, n) float tensor (a 1-D input is one row); ``ValueError`` naming ``name`` otherwise."""
    try:
        x = value.float() if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{name} must be numbers of shape {expected}, got {value!r:.80}") from error
    if x.dim() == 1:
        x = x.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape {expected}; got shape {tuple(x.shape)}")
    return x


def normalize_topic_kwargs(num_topics: int, topic_vocab_size: int, batch_size: Optional[int] = None,
                           topic_ids=None, topic_mixture=None, context_bow=None,
                           mixture_on_simplex: bool = True) -> dict:
    """Validate the topic conditioning of ``generate()`` / ``forward()``; at most one may be given.

    Returns a dict with the one given input as a batch-first float/long tensor of ``batch_size``
    rows. ``mixture_on_simplex`` requires mixtures to be non-negative and sum to 1 (TCNLM's t);
    models with an unconstrained topic vector (TopicRNN's theta) pass False.
    """
    given = [n for n, v in (("topic_ids", topic_ids), ("topic_mixture", topic_mixture),
                            ("context_bow", context_bow)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"Give at most one of topic_ids, topic_mixture, context_bow (got {given})")
    if topic_ids is not None:
        return {"topic_ids": normalize_topic_ids(topic_ids, num_topics, batch_size)}
    if topic_mixture is not None:
        mix = _float_rows(topic_mixture, "topic_mixture", f"(b, {num_topics}) or ({num_topics},)")
        if mix.shape[-1] != num_topics:
            raise ValueError(f"topic_mixture must have shape (b, {num_topics}), got {tuple(mix.shape)}")
        if not bool(torch.isfinite(mix).all()):
            raise ValueError("topic_mixture contains NaN or inf")
        if mixture_on_simplex:
            if bool((mix < 0).any()):
                raise ValueError("topic_mixture must be non-negative (it is a distribution over topics)")
            sums = mix.sum(-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
                raise ValueError(f"each topic_mixture row must sum to 1, got sums {sums.tolist()}")
        return {"topic_mixture": _broadcast_rows(mix, batch_size, "topic_mixture")}
    if context_bow is not None:
        bow = _float_rows(context_bow, "context_bow", f"(b, {topic_vocab_size}) or ({topic_vocab_size},), one bag "
                          "of words over the topic vocabulary per row (flatten a documents-layout batch's "
                          "(b, chunks, V_c) bags to one row per chunk)")
        if bow.shape[-1] != topic_vocab_size:
            raise ValueError(f"context_bow must have {topic_vocab_size} columns (the topic vocabulary), "
                             f"got {bow.shape[-1]}: mismatched vocabularies?")
        if bool((bow < 0).any()) or not bool(torch.isfinite(bow).all()):
            raise ValueError("context_bow must hold finite, non-negative counts")
        return {"context_bow": _broadcast_rows(bow, batch_size, "context_bow")}
    return {}


# ----------------------------------------------------------------------------------------------
# stop strings
# ----------------------------------------------------------------------------------------------


class WordStopStringCriteria(StopStringCriteria):
    """transformers' ``StopStringCriteria`` for word-level vocabularies.

    transformers finds the text of each token by decoding it after the tokens of a probe word
    ("abcdef"); a word-level tokenizer turns the probe into ``<unk>``, and ``StopStringCriteria``
    fails with ``ValueError: substring not found``. Here the text of a token is its own decoding
    (the package's tokenizers decode every token independently: " said", ","), which is exact for
    them; tokenizers with which the probe works keep transformers' method.
    """

    @staticmethod
    def clean_tokenizer_vocab(tokenizer, static_prefix="abcdef", stop_string_matching_mode=None):
        probe = tokenizer(static_prefix, add_special_tokens=False)["input_ids"]
        if static_prefix in tokenizer.decode(probe):
            return StopStringCriteria.clean_tokenizer_vocab(tokenizer, static_prefix, stop_string_matching_mode)
        vocab = tokenizer.get_vocab()
        strings, indices = [], []
        for token, index in vocab.items():
            text = tokenizer.convert_tokens_to_string([token])
            strings.append(text.encode("utf-8") if stop_string_matching_mode is not None else text)
            indices.append(index)
        return tuple(strings), tuple(indices)


# ----------------------------------------------------------------------------------------------
# PreTrainedModel base
# ----------------------------------------------------------------------------------------------


class RecurrentPreTrainedModel(PreTrainedModel):
    """Flags every recurrent LM of the package needs under transformers 5.x (hf-notes §0)."""

    base_model_prefix = "model"
    _is_stateful = True  # assisted decoding cannot roll a recurrent state back
    accepts_loss_kwargs = False  # our loss is a mean per token: Trainer must scale for accumulation
    # model.gradient_checkpointing_enable() / Trainer(gradient_checkpointing=True): every recurrent layer is a
    # checkpoint (as the blocks of transformers' RWKV and Mamba); see checkpoint_function.
    supports_gradient_checkpointing = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # Without this, generate() passes an empty DynamicCache as past_key_values on every step.
        return False

    def checkpoint_function(self):
        """The checkpoint function for this module's recurrent layers (``None`` unless gradient
        checkpointing is on and the module is training). Base models set ``gradient_checkpointing``."""
        if getattr(self, "gradient_checkpointing", False) and self.training and torch.is_grad_enabled():
            return self._gradient_checkpointing_func
        return None

    def _reorder_cache(self, state, beam_idx):
        return reorder_state(state, beam_idx)

    def post_init(self):
        super().post_init()
        self._suppress_unk_in_generation()

    def _suppress_unk_in_generation(self) -> None:
        """``<unk>`` is never generated unless asked for: the default generation config suppresses
        ``config.unk_token_id``. ``generate(..., suppress_tokens=[])`` turns it back on."""
        unk = getattr(self.config, "unk_token_id", None)
        generation_config = getattr(self, "generation_config", None)
        if generation_config is not None and unk is not None and generation_config.suppress_tokens is None:
            generation_config.suppress_tokens = [int(unk)]

    def _get_stopping_criteria(self, generation_config, stopping_criteria, tokenizer=None, **kwargs):
        # generate(stop_strings=..., tokenizer=tok) with a word-level tokenizer: see WordStopStringCriteria.
        stop_strings = generation_config.stop_strings
        if stop_strings is None or tokenizer is None:
            return super()._get_stopping_criteria(generation_config, stopping_criteria, tokenizer, **kwargs)
        generation_config.stop_strings = None
        try:
            criteria = super()._get_stopping_criteria(generation_config, stopping_criteria, tokenizer, **kwargs)
        finally:
            generation_config.stop_strings = stop_strings
        criteria.append(WordStopStringCriteria(stop_strings=stop_strings, tokenizer=tokenizer))
        return criteria

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """``PreTrainedModel.from_pretrained``, but weights the checkpoint lacks are an error (see
        :meth:`check_missing_weights`), not a warning above a model that is partly random."""
        from safetensors import SafetensorError

        want_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True,
                                                  **kwargs)
        except SafetensorError as error:
            raise OSError(
                f"The weights in {pretrained_model_name_or_path} are corrupt or truncated ({error}). Copy or "
                "download the checkpoint again, or load an earlier one (the checkpoint-* folders of a training "
                "run).") from error
        model.check_missing_weights(info["missing_keys"], pretrained_model_name_or_path, info["unexpected_keys"])
        # A generation_config.json saved before <unk> was suppressed by default does not say so.
        model._suppress_unk_in_generation()
        return (model, info) if want_info else model

    @classmethod
    def _may_be_missing(cls, key: str) -> bool:
        """Weights a checkpoint may lack: the KL-annealing counter (older checkpoints have none; it
        starts at 0), and the task head of a ``*ForSequenceClassification`` /
        ``*ForTokenClassification`` model loaded from a language model (it starts untrained, as
        in transformers)."""
        if key == "kl_annealing_step":
            return True
        is_task_model = cls.__name__.endswith(("ForSequenceClassification", "ForTokenClassification"))
        return is_task_model and not key.startswith(cls.base_model_prefix + ".")

    def check_missing_weights(self, missing_keys, source, unexpected_keys=()) -> None:
        """Raise ``OSError`` when a checkpoint (``source``) lacks weights of this model.

        transformers only warns and initialises them at random, so a checkpoint of another model
        family, or a ``config.json`` next to another run's weights, gave a random model that still
        evaluated and generated. Tied weights and :meth:`_may_be_missing` keys are allowed."""
        tied = set(getattr(self, "all_tied_weights_keys", None) or {})
        missing = sorted(k for k in missing_keys if k not in tied and not self._may_be_missing(k))
        if not missing:
            return
        message = (f"{source} lacks {len(missing)} weight(s) of {type(self).__name__} (e.g. {missing[:4]}), which "
                   "would be left random.")
        unexpected = sorted(unexpected_keys)
        if unexpected:
            message += (f" It holds {len(unexpected)} weight(s) this model does not have (e.g. {unexpected[:4]}): is "
                        "it a checkpoint of another model, or a config.json next to another run's weights?")
        raise OSError(message + " Load it with the class it was saved from (a training run of another model needs "
                      "its own output_dir).")

    def _register_kl_annealing(self):
        """A saved counter of training forward passes (so that a resumed run goes on annealing)."""
        self.register_buffer("kl_annealing_step", torch.zeros((), dtype=torch.long))

    def kl_annealing_ramp(self, count: bool):
        """``min(1, passes / config.kl_annealing_steps)`` (1 when annealing is off). ``count=True`` in
        training mode first counts this forward pass; evaluation never counts."""
        if count and self.training:
            self.kl_annealing_step += 1
        steps = self.config.kl_annealing_steps
        if steps == 0:
            return 1.0
        return (self.kl_annealing_step.float() / steps).clamp(max=1.0)  # a tensor: no device sync

    def _init_weights(self, module):
        step = getattr(module, "kl_annealing_step", None)
        if isinstance(step, torch.Tensor):  # also when a checkpoint without it is loaded: never left uninitialised
            step.zero_()
        std = getattr(self.config, "initializer_range", 0.1)
        if isinstance(module, nn.Embedding):
            nn.init.uniform_(module.weight, -std, std)
        elif isinstance(module, (nn.Linear, nn.Conv1d)):
            nn.init.uniform_(module.weight, -std, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.RNNBase):
            for name, param in module.named_parameters():
                if "weight" in name:
                    nn.init.uniform_(param, -std, std)
                else:
                    nn.init.zeros_(param)


class TopicGenerationMixin:
    """``generate()`` with topic conditioning, for a ``*ForCausalLM`` that also inherits ``GenerationMixin``.

    Put it before ``GenerationMixin`` in the bases. The model's config needs ``num_topics`` and
    ``topic_vocab_size``; ``forward`` takes the conditioning kwargs it supports as named parameters
    and returns the topic representation it used as ``topic_mixture``.

    * ``generate`` validates ``topic_ids`` / ``topic_mixture`` / ``context_bow`` and makes them
      batch-first tensors *before* transformers expands the batch for beams and
      ``num_return_sequences`` (a 1-D tensor would otherwise be repeat-interleaved, hf-notes §2).
      Without a prompt, one ``<bos>`` row is generated per conditioning row.
    * ``generate`` rejects a conditioning kwarg that ``forward`` does not name (TopicRNN's theta is
      not a mixture of topics, so it has no ``topic_ids``) instead of letting it be ignored.
    * ``_update_model_kwargs_for_generation`` replaces whatever the first forward resolved
      (``context_bow``, ``topic_ids`` or the prior) by what it returned for it (the outputs named by
      ``_cached_conditioning``: ``topic_mixture``, or NCLM's ``topic_representation``), so the
      document is encoded and the conditioning checked once, not at every token (hf-notes §1.5).
    """

    _topic_mixture_on_simplex = True  # TCNLM's t is a distribution; TopicRNN's theta is any vector
    # The outputs of the first forward that stand for the conditioning at every later step (forward takes them
    # by these names): the topic mixture, or NCLM's composed document representation and topic vectors.
    _cached_conditioning = ("topic_mixture",)

    def generate(self, inputs=None, generation_config=None, topic_ids=None, topic_mixture=None, context_bow=None,
                 **kwargs):
        prompt = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        batch_size = prompt.shape[0] if isinstance(prompt, torch.Tensor) else None
        accepted = inspect.signature(self.forward).parameters
        for name, value in (("topic_ids", topic_ids), ("topic_mixture", topic_mixture), ("context_bow", context_bow)):
            if value is not None and name not in accepted:
                raise ValueError(f"{type(self).__name__} does not take {name}; it is conditioned by "
                                 f"{[n for n in ('topic_ids', 'topic_mixture', 'context_bow') if n in accepted]}")
        given = normalize_topic_kwargs(self.config.num_topics, self.config.topic_vocab_size, batch_size,
                                       topic_ids=topic_ids, topic_mixture=topic_mixture, context_bow=context_bow,
                                       mixture_on_simplex=self._topic_mixture_on_simplex)
        given = {name: value.to(self.device).contiguous() for name, value in given.items()}
        return super().generate(inputs, generation_config, **given, **kwargs)

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder,
                                                                   num_new_tokens)
        names = self._cached_conditioning
        if all(model_kwargs.get(name) is None for name in names):
            values = {name: getattr(outputs, name, None) for name in names}
            if values[names[0]] is not None:
                for name in ("context_bow", "topic_ids", "topic_mixture"):
                    model_kwargs.pop(name, None)
                model_kwargs.update({name: value for name, value in values.items() if value is not None})
        return model_kwargs


def topic_word_ids_from_tokenizers(tokenizer, topic_tokenizer) -> list[int]:
    """The LM id of every topic-tokenizer entry (-1 for its ``<unk>`` and for words the LM lacks)."""
    lm_vocab = tokenizer.get_vocab()
    topic_vocab = topic_tokenizer.get_vocab()
    unk = getattr(topic_tokenizer, "unk_token", None)
    ids = [-1] * len(topic_vocab)
    for word, index in topic_vocab.items():
        if word != unk and word in lm_vocab:
            ids[index] = lm_vocab[word]
    return ids


def lm_to_topic_index(module: nn.Module, config, device, validate=None) -> torch.Tensor:
    """(V,) topic id of every LM word, -1 for words outside the topic vocabulary (stop words), from
    ``config.topic_word_ids``; cached on ``module``, and ``validate()`` is called whenever it is rebuilt.
    ``vocab_size`` is part of the cache key: ``resize_token_embeddings`` changes it (the new words are
    stop words)."""
    ids = config.topic_word_ids
    key = (id(ids), len(ids) if ids is not None else -1, config.vocab_size, str(device))
    cached = module.__dict__.get("_lm_to_topic_cache")
    if cached is not None and cached[0] == key:
        return cached[1]
    if validate is not None:
        validate()
    topic_word_ids = torch.tensor(ids, dtype=torch.long)
    real = topic_word_ids >= 0
    lm_to_topic = torch.full((config.vocab_size,), -1, dtype=torch.long)
    lm_to_topic[topic_word_ids[real]] = torch.arange(len(ids))[real]
    lm_to_topic = lm_to_topic.to(device)
    module.__dict__["_lm_to_topic_cache"] = (key, lm_to_topic)
    return lm_to_topic


def topic_scores_to_vocab(scores: torch.Tensor, lm_to_topic: torch.Tensor) -> torch.Tensor:
    """Scores over the topic vocabulary (b, V_c) -> the LM vocabulary (b, V), 0 at words that are not topic words."""
    return F.pad(scores, (1, 0)).index_select(1, lm_to_topic + 1)  # column 0: the stop words' zero


def config_kwargs_from_tokenizers(tokenizer, topic_tokenizer, **kwargs) -> dict:
    """Config arguments sized to an LM tokenizer and a topic tokenizer: ``vocab_size``,
    ``topic_vocab_size``, ``topic_word_ids`` and the special-token ids (unless given); ``kwargs`` pass on."""
    vocab = tokenizer.get_vocab()
    for name, token in (("pad_token_id", tokenizer.pad_token), ("bos_token_id", tokenizer.bos_token),
                        ("eos_token_id", tokenizer.eos_token), ("unk_token_id", tokenizer.unk_token)):
        if token is not None and token in vocab:
            kwargs.setdefault(name, vocab[token])
    return {"vocab_size": len(tokenizer), "topic_vocab_size": len(topic_tokenizer),
            "topic_word_ids": topic_word_ids_from_tokenizers(tokenizer, topic_tokenizer), **kwargs}


class TopicConfigMixin:
    """What every topic model's config has: sizing to an LM tokenizer and a topic tokenizer. Put it before
    ``PretrainedConfig`` in the bases."""

    topic_word_ids_from_tokenizers = staticmethod(topic_word_ids_from_tokenizers)

    @staticmethod
    def checked_topic_word_ids(topic_word_ids, topic_vocab_size: int) -> Optional[list[int]]:
        """``topic_word_ids`` as a list of ints (``None`` stays ``None``), one per topic-vocabulary entry."""
        if topic_word_ids is None:
            return None
        ids = [int(i) for i in topic_word_ids]
        if len(ids) != topic_vocab_size:
            raise ValueError(f"topic_word_ids has {len(ids)} entries but topic_vocab_size is {topic_vocab_size}: "
                             "mismatched vocabularies")
        return ids

    @classmethod
    def from_tokenizers(cls, tokenizer, topic_tokenizer, **kwargs):
        """A config sized to an LM tokenizer and a topic tokenizer (vocabulary sizes, special-token ids,
        ``topic_word_ids``); other arguments are passed on."""
        return cls(**config_kwargs_from_tokenizers(tokenizer, topic_tokenizer, **kwargs))


def last_token_positions(attention_mask: Optional[torch.Tensor], seq_len: int, batch_size: int,
                         device) -> torch.Tensor:
    """Index of each row's last real token (left or right padding)."""
    if attention_mask is None:
        return torch.full((batch_size,), seq_len - 1, dtype=torch.long, device=device)
    positions = torch.arange(seq_len, device=device).expand(batch_size, seq_len)
    return (positions * attention_mask.to(device).long()).max(1).values


def detach_or_none(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``x.detach()``, ``None`` for ``None`` (the loss terms a model reports beside its loss)."""
    return x.detach() if x is not None else None


def select_state_rows(state: Optional[Sequence[torch.Tensor]], rows: int):
    """Keep the first ``rows`` rows of a batch-first state (documents that still have chunks)."""
    if state is None:
        return None
    return tuple(s[:rows] for s in state)


TOPIC_TOKENIZER_SUBFOLDER = "topic_tokenizer"


def load_topic_tokenizer(source, **kwargs):
    """The topic tokenizer saved in ``<source>/topic_tokenizer/`` (``source``: a local folder or a Hub id).

    Raises ``OSError`` saying so when the folder has none (transformers' own error there asks
    for sentencepiece or tiktoken, which would not help).
    """
    import os

    from transformers import AutoTokenizer

    folder = os.path.join(str(source), TOPIC_TOKENIZER_SUBFOLDER)
    if os.path.isdir(str(source)) and not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise OSError(f"{source} has no topic tokenizer (no {TOPIC_TOKENIZER_SUBFOLDER}/tokenizer.json in it): pass "
                      "topic_tokenizer=, or save one there with topic_lm_hf.save_vocabularies(tokenizer, "
                      "topic_tokenizer, folder)")
    try:
        return AutoTokenizer.from_pretrained(source, subfolder=TOPIC_TOKENIZER_SUBFOLDER, **kwargs)
    except (OSError, ValueError) as error:
        raise OSError(f"Could not load the topic tokenizer of {source} (its {TOPIC_TOKENIZER_SUBFOLDER}/ subfolder): "
                      f"{error}") from error


def topic_vocabulary(model, topic_tokenizer=None) -> list[str]:
    """Topic-vocabulary words by id (``<unk>`` at id 0), for ``get_topics``.

    Uses ``topic_tokenizer`` if given, else the ``topic_tokenizer/`` subfolder saved next to the
    model (``model.name_or_path``: a local folder or a Hub id).
    """
    if topic_tokenizer is None:
        source = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
        if not source:
            raise ValueError("This model was not loaded from a folder with a topic_tokenizer/: pass topic_tokenizer=")
        topic_tokenizer = load_topic_tokenizer(source)
    vocab = topic_tokenizer.get_vocab()
    expected = getattr(model.config, "topic_vocab_size", None)
    if expected is not None and len(vocab) != expected:
        raise ValueError(f"The topic tokenizer has {len(vocab)} entries but the model's topic_vocab_size is "
                         f"{expected}: mismatched vocabularies")
    words = [""] * len(vocab)
    for word, index in vocab.items():
        words[index] = word
    return words


# ------------------------------------------------------------------------------------------------
# Downstream: one document representation and one sequence classifier for every family
# ------------------------------------------------------------------------------------------------

CLASSIFIER_HEADS = ("mlp", "cnn")
CLASSIFIER_ACTIVATIONS = ("sigmoid", "tanh", "relu")
CLASSIFIER_DEFAULTS = {"classifier_head": "mlp", "classifier_hidden_size": 50, "classifier_activation": "sigmoid",
                       "classifier_dropout": None, "classifier_kernel_sizes": (3, 4, 5),
                       "classifier_num_filters": 100, "classifier_max_norm": 3.0, "freeze_backbone": True}


class ClassifierConfigMixin:
    """The settings of every family's ``*ForSequenceClassification`` head (put it before ``PretrainedConfig``).

    * ``classifier_head``: ``"mlp"`` (TopicRNN's recipe: one hidden layer of ``classifier_hidden_size`` units
      with ``classifier_activation``, on the pooled document vector [o_N; c]) or ``"cnn"`` (NCLM's recipe,
      Kim 2014: filters of widths ``classifier_kernel_sizes`` with ``classifier_num_filters`` maps each, ReLU,
      max over time, over the per-token vectors [o_m; c]; the output layer's rows are kept at L2 norm <=
      ``classifier_max_norm``).
    * ``classifier_dropout``: dropout on the head's inputs and penultimate layer; ``None`` = 0.5 for the CNN
      (Kim) and 0 for the MLP.
    * ``freeze_backbone``: train the head on frozen features (the papers' recipe) or fine-tune everything.

    A config's ``__init__`` calls :meth:`_pop_classifier_settings` on its ``**kwargs``."""

    def _pop_classifier_settings(self, kwargs: dict) -> dict:
        values = {name: kwargs.pop(name, default) for name, default in CLASSIFIER_DEFAULTS.items()}
        if values["classifier_head"] not in CLASSIFIER_HEADS:
            raise ValueError(f"classifier_head must be one of {CLASSIFIER_HEADS}, got {values['classifier_head']!r}")
        if values["classifier_activation"] not in CLASSIFIER_ACTIVATIONS:
            raise ValueError(f"classifier_activation must be one of {CLASSIFIER_ACTIVATIONS}, "
                             f"got {values['classifier_activation']!r}")
        check_integers(1, classifier_hidden_size=values["classifier_hidden_size"],
                       classifier_num_filters=values["classifier_num_filters"])
        sizes = values["classifier_kernel_sizes"]
        if isinstance(sizes, numbers.Integral):
            sizes = (sizes,)
        sizes = tuple(sizes)
        if not sizes:
            raise ValueError("classifier_kernel_sizes must name at least one filter width")
        check_integers(1, **{f"classifier_kernel_sizes[{i}]": k for i, k in enumerate(sizes)})
        values["classifier_kernel_sizes"] = [int(k) for k in sizes]
        dropout = values["classifier_dropout"]
        if dropout is not None and not 0.0 <= dropout < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1) or None, got {dropout}")
        max_norm = values["classifier_max_norm"]
        if max_norm is not None and not max_norm > 0:
            raise ValueError(f"classifier_max_norm must be positive or None, got {max_norm}")
        values["freeze_backbone"] = bool(values["freeze_backbone"])
        for name, value in values.items():
            setattr(self, name, value)
        return kwargs


class DocumentRepresentationMixin:
    """What a document is to the downstream tasks, the same for every family (mixed into the base models).

    * :meth:`document_topic_representation` ``c`` (b, |c|): the document's topic vector from its bag of
      words, deterministic (no sampling). Each family says which (NCLM: h, z or [z; h]; TCNLM: the topic
      proportions t; TopicRNN: the posterior mean of theta [and log sigma]; the LSTM LM: none, |c| = 0).
    * :meth:`document_representation`: [o_N; c] (b, H + |c|), o_N the top recurrent layer's output after the
      document's last token (the NCLM paper's retrieval vector), or with ``per_token=True`` [o_m; c] at every
      position (b, n, H + |c|), the input of NCLM's CNN classifier (zero at padding).

    A family implements ``document_topic_representation`` and ``document_topic_size``; a family whose
    recurrent outputs depend on the topics (TCNLM) overrides :meth:`_document_token_states`."""

    @property
    def document_topic_size(self) -> int:
        return 0

    @property
    def document_representation_sizes(self) -> tuple[int, int]:
        """(H, |c|): the widths of the two blocks of :meth:`document_representation`."""
        return self.config.hidden_size, self.document_topic_size

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """c (b, |c|) of documents given as bags of words (b, V_c)."""
        context_bow = torch.as_tensor(context_bow)
        return torch.zeros(context_bow.shape[0] if context_bow.dim() > 1 else 1, 0, device=self.device)

    def _document_token_states(self, input_ids, attention_mask, context_bow):
        """(o (b, n, H) zero at padding, o_N (b, H)) of one sequence per document."""
        out = self(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, return_dict=True)
        return out.last_hidden_state, out.state[0][:, -1]

    def document_representation(self, batch: Optional[dict] = None, *, input_ids=None, attention_mask=None,
                                context_bow=None, per_token: bool = False) -> torch.Tensor:
        """[o_N; c] (b, H + |c|), or [o_m; c] at every position (b, n, H + |c|) with ``per_token``.

        ``batch``: one sequence per document with its bag of words, as ``TopicContextCollator(...,
        context="document", layout="sequence")`` makes them (extra keys such as ``labels`` are ignored), or the
        tensors by name. A missing ``context_bow`` is an empty bag of words. Call it in eval mode for
        deterministic features (the classifiers do)."""
        if batch is not None:
            input_ids = batch.get("input_ids", input_ids)
            attention_mask = batch.get("attention_mask", attention_mask)
            context_bow = batch.get("context_bow", context_bow)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("document_representation takes one sequence per document, input_ids of shape (b, n) "
                             "(TopicContextCollator(..., context='document', layout='sequence') makes them)")
        device = self.device
        b = input_ids.shape[0]
        input_ids = input_ids.to(device)
        attention_mask = None if attention_mask is None else attention_mask.to(device)
        topic_vocab_size = getattr(self.config, "topic_vocab_size", None)
        if context_bow is None and topic_vocab_size:
            context_bow = torch.zeros(b, topic_vocab_size, device=device)
        if context_bow is not None and topic_vocab_size:
            context_bow = _broadcast_rows(torch.as_tensor(context_bow, device=device), b, "context_bow")
        states, last = self._document_token_states(input_ids, attention_mask, context_bow)
        c = (self.document_topic_representation(context_bow) if self.document_topic_size
             else last.new_zeros(b, 0)).to(device, last.dtype)
        if not per_token:
            return torch.cat([last, c], dim=-1)
        if attention_mask is not None:
            states = states * attention_mask.unsqueeze(-1).to(states.dtype)
        return torch.cat([states, c.unsqueeze(1).expand(-1, states.shape[1], -1)], dim=-1)


class DocumentRepresentationDelegate:
    """The document methods of a causal LM or classifier, read from its base model ``self.model``."""

    @property
    def document_topic_size(self) -> int:
        return self.model.document_topic_size

    @property
    def document_representation_sizes(self) -> tuple[int, int]:
        return self.model.document_representation_sizes

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """See :meth:`DocumentRepresentationMixin.document_topic_representation`."""
        return self.model.document_topic_representation(context_bow)

    def document_representation(self, batch: Optional[dict] = None, **kwargs) -> torch.Tensor:
        """See :meth:`DocumentRepresentationMixin.document_representation`."""
        return self.model.document_representation(batch, **kwargs)


class DocumentClassificationHead(nn.Module):
    """The head of every ``*ForSequenceClassification`` (see :class:`ClassifierConfigMixin`).

    ``"mlp"``: features (b, F) -> dropout -> Linear(F, hidden) -> activation -> dropout -> Linear(hidden, labels).
    ``"cnn"``: features (b, n, F) and their mask -> Conv1d of each width -> ReLU -> max over the windows that lie
    inside the document (a document shorter than a filter is zero-padded to its width) -> concat -> dropout ->
    Linear(maps * widths, labels) with rows renormalised to L2 norm <= ``classifier_max_norm``."""

    def __init__(self, config, in_features: int):
        super().__init__()
        self.kind = config.classifier_head
        dropout = config.classifier_dropout
        if dropout is None:
            dropout = 0.5 if self.kind == "cnn" else 0.0
        self.dropout = nn.Dropout(dropout)
        self.max_norm = config.classifier_max_norm if self.kind == "cnn" else None
        if self.kind == "mlp":
            self.dense = nn.Linear(in_features, config.classifier_hidden_size)
            self.activation = {"sigmoid": nn.Sigmoid(), "tanh": nn.Tanh(), "relu": nn.ReLU()}[
                config.classifier_activation]
            self.out_proj = nn.Linear(config.classifier_hidden_size, config.num_labels)
        else:
            self.kernel_sizes = list(config.classifier_kernel_sizes)
            self.convs = nn.ModuleList(nn.Conv1d(in_features, config.classifier_num_filters, k)
                                       for k in self.kernel_sizes)
            self.out_proj = nn.Linear(config.classifier_num_filters * len(self.kernel_sizes), config.num_labels)

    @property
    def per_token(self) -> bool:
        return self.kind == "cnn"

    def forward(self, features: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.kind == "mlp":
            if features.dim() != 2:
                raise ValueError(f"The MLP head takes one vector per document (b, F), got shape {tuple(features.shape)}")
            return self.out_proj(self.dropout(self.activation(self.dense(self.dropout(features)))))
        if features.dim() != 3:
            raise ValueError(f"The CNN head takes one vector per token (b, n, F), got shape {tuple(features.shape)}")
        b, n, _ = features.shape
        lengths = (attention_mask.long().sum(-1) if attention_mask is not None
                   else torch.full((b,), n, device=features.device))
        x = self.dropout(features).transpose(1, 2)  # (b, F, n)
        width = max(self.kernel_sizes)
        if n < width:
            x = F.pad(x, (0, width - n))
        pooled = []
        for k, conv in zip(self.kernel_sizes, self.convs):
            y = torch.relu(conv(x))  # (b, maps, n' - k + 1)
            starts = torch.arange(y.shape[-1], device=y.device)
            # windows lying inside the document; a document shorter than k keeps its first (zero-padded) window
            valid = (starts.unsqueeze(0) + k <= lengths.clamp_min(k).unsqueeze(1))  # (b, windows)
            pooled.append(y.masked_fill(~valid.unsqueeze(1), float("-inf")).amax(-1))
        if self.max_norm is not None:
            with torch.no_grad():  # Kim (2014): the output rows are rescaled to norm <= s after every update
                self.out_proj.weight.copy_(torch.renorm(self.out_proj.weight, 2, 0, self.max_norm))
        return self.out_proj(self.dropout(torch.cat(pooled, dim=-1)))


class DocumentClassifierMixin(DocumentRepresentationDelegate):
    """``*ForSequenceClassification`` of every family: the family's base model (``model.*``, loaded from a
    saved ``*ForCausalLM`` folder) and a :class:`DocumentClassificationHead` on
    :meth:`~DocumentRepresentationMixin.document_representation`.

    With ``config.freeze_backbone`` (the default, the papers' recipe) only the head is trained: the body stays
    in eval mode and receives no gradient, and precomputed ``document_features`` can be passed instead of
    tokens (the MLP head: (b, H + |c|); the CNN head: (b, n, H + |c|) with ``attention_mask``).
    ``freeze_backbone=False`` fine-tunes everything. Put it first in the bases; ``__init__`` calls
    :meth:`_init_classifier` with the family's base model."""

    def _init_classifier(self, base_model) -> None:
        self.num_labels = self.config.num_labels
        self.model = base_model
        self.classifier = DocumentClassificationHead(self.config, sum(base_model.document_representation_sizes))
        self.post_init()
        self.set_backbone_frozen(self.config.freeze_backbone)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        # Loading replaces the parameters, so the body's requires_grad flags are set again here.
        model.set_backbone_frozen(model.config.freeze_backbone)
        return model

    def set_backbone_frozen(self, frozen: bool = True) -> None:
        """Train only the head on frozen features (``True``) or fine-tune everything (``False``)."""
        self.config.freeze_backbone = bool(frozen)
        self.model.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.config.freeze_backbone:
            self.model.eval()  # frozen features: no dropout, no sampling in the body
        return self

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                context_bow: Optional[torch.Tensor] = None, document_features: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: Optional[bool] = None, **kwargs):
        r"""
        Args:
            input_ids: (b, n) one sequence per document (right-padded), with ``attention_mask``.
            context_bow: (b, V_c) the document's bag of topic words.
            document_features: precomputed :meth:`document_representation` (frozen-feature training) instead of
                ``input_ids``/``context_bow``: (b, F) for the MLP head, (b, n, F) with ``attention_mask`` for
                the CNN.
            labels: (b,) class ids, or floats for regression / multi-label (``config.problem_type``).
        """
        from transformers.modeling_outputs import SequenceClassifierOutput

        if document_features is None:
            if input_ids is None:
                raise ValueError("Give input_ids (with context_bow) or precomputed document_features")
            frozen = self.config.freeze_backbone
            with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
                document_features = self.model.document_representation(
                    input_ids=input_ids, attention_mask=attention_mask, context_bow=context_bow,
                    per_token=self.classifier.per_token)
        weight = self.classifier.out_proj.weight
        features = document_features.to(weight.device, weight.dtype)
        mask = attention_mask.to(weight.device) if (attention_mask is not None and self.classifier.per_token) else None
        logits = self.classifier(features, mask)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels.to(logits.device), pooled_logits=logits, config=self.config)
        out = SequenceClassifierOutput(loss=loss, logits=logits,
                                       hidden_states=(features,) if output_hidden_states else None)
        return out if return_dict is not False else out.to_tuple()
