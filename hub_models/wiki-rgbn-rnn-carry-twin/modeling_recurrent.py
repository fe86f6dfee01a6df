"""The recurrent machinery every family shares: outputs, running ``nn.LSTM``/``nn.GRU``/``nn.RNN`` on padded
batches, the batch-first state, and the ``PreTrainedModel`` base with the flags a recurrent LM needs.

Copied next to the weights with a family's own files when a model is shared with remote code, so it imports
only torch and transformers.

Notation: b batch, s tokens, L recurrent layers, H hidden size, E embedding size.

Contract with the evaluation code: ``log_softmax(output.logits)`` is the model's predictive distribution of
the next token. A model with a marginal likelihood (TopicRNN's stop-word indicator) returns
log-probabilities as ``logits``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.generation.stopping_criteria import StopStringCriteria
from transformers.utils import ModelOutput, logging

from .modeling_hub import HubUnreachableError, auto_map_for, is_network_error, unreachable_message

logger = logging.get_logger(__name__)


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
        topic_representation: the resolved topic conditioning, as ``forward`` takes it back under the same name
            (trusted, not re-validated): what generation caches after its first step.
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
    topic_representation: Optional[torch.Tensor] = None


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


def check_prompt(prompt) -> None:
    """``generate``'s prompt must hold a token: an empty one (shape (b, 0)) is refused with what to give instead
    (the recurrence has nothing to start from)."""
    if isinstance(prompt, torch.Tensor) and prompt.dim() > 0 and prompt.shape[-1] == 0:
        raise ValueError(f"the prompt is empty (input_ids of shape {tuple(prompt.shape)}): give at least one token, "
                         "e.g. the bos token (tokenizer([''], return_tensors='pt') makes it)")


def reorder_state(state, beam_idx: torch.Tensor):
    """Select batch rows of a (nested) tuple of batch-first tensors, or of a cache object with ``reorder``
    (generation's ``TopicLMCache``: the state with the resolved topic conditioning)."""
    if state is None:
        return None
    if hasattr(state, "reorder"):
        return state.reorder(beam_idx)
    if isinstance(state, torch.Tensor):
        return state.index_select(0, beam_idx.to(state.device))
    return type(state)(*(reorder_state(s, beam_idx) for s in state)) if hasattr(state, "_fields") \
        else tuple(reorder_state(s, beam_idx) for s in state)


# transformers' names of a model's cache (``past_key_values``; ``cache`` from 5.24): here the recurrent ``state``
CACHE_ALIASES = ("past_key_values", "cache")


def state_from_aliases(state, kwargs: dict):
    """The recurrent state a call continues from: ``state``, or the same given under transformers' cache names
    (:data:`CACHE_ALIASES`, popped from ``kwargs``), so that ``forward(past_key_values=...)`` and
    ``generate(past_key_values=...)`` continue as ``state=`` does. Giving it twice is a ``ValueError``."""
    given = {name: kwargs.pop(name) for name in CACHE_ALIASES if name in kwargs}
    given = {name: value for name, value in given.items() if value is not None}
    if state is not None:
        given = {"state": state, **given}
    if len(given) > 1:
        raise ValueError(f"The recurrent state was given {len(given)} times ({', '.join(given)}): give it once, as "
                         "state= (past_key_values= and cache= are other names of it)")
    return next(iter(given.values()), None)


def read_on_host(values: torch.Tensor) -> list:
    """The values of a small tensor as a Python list: one host synchronisation however many values it holds
    (gather what the host must know into one tensor and read it once)."""
    return values.tolist()


_HOST_READS = {"deferred": False}


@contextmanager
def host_reads_deferred() -> Iterator[None]:
    """Within it, a training step of the families that allow it reads nothing on the host (what a captured CUDA
    graph needs: ``topic_lm_hf.cuda_graphs``): the input checks are skipped, because the caller checked the batch
    before (:func:`check_token_ids`, ``check_counts``, :func:`check_right_padded`), the attention mask is taken as
    padding on the right without reading it, and the output layer's loss runs over every position, the ignored
    ones (label -100) adding nothing, instead of selecting the predicted positions (a shape the host must read).
    The loss and its gradients are the same."""
    before = _HOST_READS["deferred"]
    _HOST_READS["deferred"] = True
    try:
        yield
    finally:
        _HOST_READS["deferred"] = before


def host_reads_are_deferred() -> bool:
    """Whether :func:`host_reads_deferred` is on."""
    return _HOST_READS["deferred"]


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, bounds: Optional[Sequence[float]] = None) -> None:
    """A ``ValueError`` (a mismatched tokenizer) unless every id is in [0, vocab_size): one host read (none when
    ``bounds``, the ids' smallest and largest read by the caller, are given)."""
    if bounds is None:
        bounds = torch.stack(torch.aminmax(input_ids)).tolist() if input_ids.numel() else (0, 0)
    low, high = bounds
    if low < 0 or high >= vocab_size:
        raise ValueError(f"input_ids must be in [0, {vocab_size}): mismatched tokenizer?")


def right_padding_holds(attention_mask: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor, on the mask's device (no host read): whether every row's padding follows its tokens."""
    return (attention_mask[:, :-1] >= attention_mask[:, 1:]).all()


def read_padding(attention_mask: torch.Tensor, lengths: bool = False) -> tuple[bool, bool, Optional[list[int]]]:
    """``(full, right_padded, row lengths)`` of a (b, s) attention mask in one host read: whether every position is
    a token, whether the padding follows each row's tokens (False when ``full``), and each row's number of tokens when
    ``lengths`` (else None). Under :func:`host_reads_deferred` nothing is read: ``(False, True, None)``, the padding
    taken as on the right, as the caller checked."""
    if host_reads_are_deferred():
        return False, True, None
    flags = torch.stack([attention_mask.bool().all(), right_padding_holds(attention_mask)])
    if lengths:
        flags = torch.cat([flags.long(), attention_mask.long().sum(1)])
    full, right_padded, *row_lengths = read_on_host(flags)
    return bool(full), bool(right_padded) and not full, row_lengths if lengths else None


def check_right_padded(attention_mask: torch.Tensor, holds: Optional[bool] = None) -> None:
    """A ``ValueError`` unless every row's padding (0 in ``attention_mask``) follows its tokens: one host read
    (none when ``holds``, :func:`right_padding_holds` read by the caller, is given)."""
    if holds is None:
        holds = bool(right_padding_holds(attention_mask))
    if not holds:
        raise ValueError("attention_mask must pad on the right (the collators' padding_side='right') here")


def embed_checked(embed_tokens: nn.Embedding, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(b, s) ids -> (b, s, E) embeddings; ids outside [0, vocab_size) are a ``ValueError`` (a mismatched
    tokenizer), not an index error deep in the embedding (unchecked under :func:`host_reads_deferred`)."""
    if not host_reads_are_deferred():
        check_token_ids(input_ids, vocab_size)
    return embed_tokens(input_ids)


def check_call(input_ids: Optional[torch.Tensor], inputs_embeds: Optional[torch.Tensor],
               attention_mask: Optional[torch.Tensor], state) -> None:
    """The inputs of a token-level ``forward`` against each other, each mistake a ``ValueError`` that says what to
    give: an empty input, an attention mask shorter than it (``generate`` passes a longer one: the whole sequence
    so far), and a ``state`` that is not this package's batch-first tuple of tensors with one row per input row
    (e.g. a transformers ``DynamicCache``, a string, the state of another batch)."""
    tokens = input_ids if input_ids is not None else inputs_embeds
    if tokens is None or tokens.dim() != (2 if input_ids is not None else 3):
        return  # a documents batch (b, chunks, length) or nothing: checked where it is read
    rows, length = tokens.shape[:2]
    if length == 0:
        raise ValueError(f"the input is empty (shape {tuple(tokens.shape)}): give at least one token")
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.shape[0] != rows
                                       or attention_mask.shape[1] < length):
        raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)} does not cover the input of shape "
                         f"{tuple(tokens.shape[:2])}: give one row per input row and a column per token")
    if state is None:
        return
    leaves, pending = [], [state]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            leaves.append(item)
        elif isinstance(item, (tuple, list)) and len(item) > 0:
            pending.extend(item)
        else:
            raise ValueError(f"state must be what this model's forward(use_cache=True) or generate returned (a tuple "
                             f"of batch-first tensors), got {type(state).__name__}")
    if any(leaf.dim() == 0 or leaf.shape[0] != rows for leaf in leaves):
        raise ValueError(f"state holds {[tuple(leaf.shape) for leaf in leaves][:2]}... for another batch: it must have "
                         f"one row per input row ({rows})")


def last_columns(attention_mask: Optional[torch.Tensor], length: int) -> Optional[torch.Tensor]:
    """The mask of a call's own ``length`` tokens: ``generate()`` passes the mask of the whole sequence so far."""
    if attention_mask is not None and attention_mask.shape[1] != length:
        return attention_mask[:, -length:]
    return attention_mask


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits at position i predict labels at i + 1; -100 is ignored."""
    shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
    shift_labels = labels[:, 1:].reshape(-1).to(logits.device)
    return nn.functional.cross_entropy(shift_logits.float(), shift_labels, ignore_index=-100)


# ----------------------------------------------------------------------------------------------
# the output layer in training: only at the predicted positions, optionally compiled
# ----------------------------------------------------------------------------------------------


def _biased_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, row_bias: Optional[torch.Tensor],
                          rows: Optional[torch.Tensor], row_bias_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """Summed NLL of ``targets`` (n,) under softmax(logits + s_i row_bias[rows_i]); the log-sum-exp runs in float32
    whatever the autocast dtype of the logits."""
    if row_bias is not None:
        extra = row_bias.to(logits.dtype)[rows]
        if row_bias_scale is not None:
            extra = extra * row_bias_scale.to(logits.dtype).unsqueeze(-1)
        logits = logits + extra
    return nn.functional.cross_entropy(logits.float(), targets, reduction="sum")


def _linear_cross_entropy(features: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          targets: torch.Tensor, row_bias: Optional[torch.Tensor], rows: Optional[torch.Tensor],
                          row_bias_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`_biased_cross_entropy` of features (n, F) W^T + b (what the compiled output layer compiles)."""
    return _biased_cross_entropy(nn.functional.linear(features, weight, bias), targets, row_bias, rows,
                                 row_bias_scale)


_COMPILED: dict = {}  # (variant, device type) -> the compiled function; ("error", device type): why compiling fails
# The compiled path pads its rows to a multiple of this on a GPU: inductor's padded matrix products guard on the
# alignment of the row count, and a row count that changes every batch hit the recompilation limit (8) there. On a
# CPU no guard depends on it (one graph for every row count, measured), so nothing is padded.
COMPILED_ROW_BUCKET = {"cpu": 1, "default": 64}


def compiled_linear_cross_entropy(variant: tuple = (False, False), device_type: str = "cpu"):
    """``_linear_cross_entropy`` under ``torch.compile`` for one ``variant`` (with a row bias?, with its mask?) on
    one device type, each compiled on its own so that their graphs do not share one recompilation budget (dynamic
    shapes: the number of predicted positions changes every batch; on a GPU it is padded to a multiple of
    ``COMPILED_ROW_BUCKET``); ``None`` with the reason in ``_COMPILED["error", device_type]`` where compiling fails
    there (no C++ compiler, an unsupported platform), tried once per process and device type on a tiny forward and
    backward on that device (never a CPU probe before a GPU run)."""
    error_key = ("error", device_type)
    if error_key not in _COMPILED:
        probe = torch.compile(_linear_cross_entropy, dynamic=True)
        try:
            weight = torch.zeros(5, 3, requires_grad=True, device=device_type)
            probe(torch.ones(4, 3, device=device_type), weight, None, torch.tensor([0, 1, 2, 3], device=device_type),
                  None, None, None).backward()
            _COMPILED[error_key] = None
        except Exception as error:  # the toolchain, not the model: fall back to eager
            _COMPILED[error_key] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    if _COMPILED[error_key] is not None:
        return None
    key = (variant, device_type)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(_VARIANTS[variant], dynamic=True)
    return _COMPILED[key]


def _pad_rows(device_type: str, targets: torch.Tensor, *tensors):
    """``targets`` (n,) and ``tensors`` (each (n, ...) or None) padded to the next multiple of the device's
    ``COMPILED_ROW_BUCKET`` rows: the targets with -100 (ignored by the loss), the rest with zeros; as they are
    where nothing is padded (the CPU)."""
    extra = -targets.shape[0] % COMPILED_ROW_BUCKET.get(device_type, COMPILED_ROW_BUCKET["default"])
    if extra == 0:
        return (targets, *tensors)
    return (torch.cat([targets, targets.new_full((extra,), -100)]),
            *[t if t is None else torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) for t in tensors])


# One function (one code object: torch.compile's cache and recompilation limit are per code object) per variant.
def _plain_linear_cross_entropy(features, weight, bias, targets, row_bias, rows, row_bias_scale):
    return _linear_cross_entropy(features, weight, bias, targets, None, None, None)


def _row_bias_linear_cross_entropy(features, weight, bias, targets, row_bias, rows, row_bias_scale):
    return _linear_cross_entropy(features, weight, bias, targets, row_bias, rows, None)


def _masked_row_bias_linear_cross_entropy(features, weight, bias, targets, row_bias, rows, row_bias_scale):
    return _linear_cross_entropy(features, weight, bias, targets, row_bias, rows, row_bias_scale)


_VARIANTS = {(False, False): _plain_linear_cross_entropy, (True, False): _row_bias_linear_cross_entropy,
             (True, True): _masked_row_bias_linear_cross_entropy}


def effective_weight(layer: nn.Module) -> torch.Tensor:
    """The weight that ``layer`` (a linear or embedding layer) applies, for code that reads a layer by its weight
    rather than calling it (a slice of it, its transpose, its rows as topics): the layer's own weight, or, where an
    adapter wraps it (a PEFT LoRA layer, whose ``weight`` is only the frozen base weight), the base weight plus the
    delta of every active adapter that is not merged, with its gradient; an adapter wrapper that cannot say its delta
    is refused (its change would silently be skipped). The adapters' input dropout does not apply here."""
    base = getattr(layer, "base_layer", None)
    if base is None:
        return layer.weight
    weight = effective_weight(base)
    if getattr(layer, "merged", False) or getattr(layer, "disable_adapters", False):
        return weight
    delta = getattr(layer, "get_delta_weight", None)
    if delta is None:
        raise ValueError(f"{type(layer).__name__} wraps a layer that this model reads by its weight, and does not say "
                         "its change of the weight (get_delta_weight): target another layer, or merge it first")
    for name in getattr(layer, "active_adapters", ()):
        if name in getattr(layer, "lora_A", {}) or name in getattr(layer, "lora_embedding_A", {}):
            weight = weight + delta(name).to(weight.dtype)
    return weight


def runs_own_forward(output: nn.Module) -> bool:
    """Whether the output layer must be called as a module in training: it is not a plain ``nn.Linear`` (an
    adapter wraps it, e.g. a PEFT LoRA layer, whose ``weight`` is only the frozen base weight) or a forward hook or
    pre-hook is registered on it. Reading ``output.weight`` directly (the fused loss) would skip the adapter or the
    hook, and the adapter would get no gradient. (Hooks on every module, which tracing tools such as
    ``FlopCounterMode`` register, do not count: they observe the step, they do not change it.)"""
    return type(output) is not nn.Linear or bool(output._forward_hooks) or bool(output._forward_pre_hooks)


def _module_cross_entropy(features: torch.Tensor, output: nn.Module, targets: torch.Tensor,
                          row_bias: Optional[torch.Tensor], rows: Optional[torch.Tensor],
                          row_bias_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`_biased_cross_entropy` with the output layer called as a module (its adapters and hooks run)."""
    return _biased_cross_entropy(output(features), targets, row_bias, rows, row_bias_scale)


def next_token_loss(features: torch.Tensor, labels: torch.Tensor, output: nn.Linear,
                    row_bias: Optional[torch.Tensor] = None, row_bias_mask: Optional[torch.Tensor] = None,
                    compiled: bool = False) -> torch.Tensor:
    """Mean next-token NLL of ``output(features)`` (+ a per-row bias) computed only at the predicted positions.

    The same value as ``causal_lm_loss(output(features) + row_bias[:, None], labels)`` without the (b, s, V)
    logits of padding and of the last column, which is what makes it the training path of every family.

    Args:
        features: (b, s, F) inputs of the output layer (after dropout).
        labels: (b, s) with -100 at ignored positions; position t predicts ``labels[:, t + 1]``.
        output: the ``nn.Linear`` output layer.
        row_bias: (b, V) added to every position of its row (a topic bias).
        row_bias_mask: (b, s - 1), aligned with the shifted labels: the bias is scaled by it per position.
        compiled: run the output layer and its loss as one ``torch.compile``'d function (eager where compiling
            is not possible here; ``compiled_linear_cross_entropy``).

    Where an adapter or a hook wraps ``output`` (:func:`runs_own_forward`: a PEFT LoRA on ``lm_head``), the layer
    is called as a module instead, eager, so that the adapter takes part in training; the value is the same.
    """
    targets = labels[:, 1:].to(features.device)
    keep = targets != -100
    rows = scale = None
    if host_reads_are_deferred():  # every position (no shape read on the host); ignored targets add nothing
        selected, kept = features[:, :-1].reshape(-1, features.shape[-1]), targets.reshape(-1)
        if row_bias is not None:
            rows = torch.arange(targets.shape[0], device=features.device).repeat_interleave(targets.shape[1])
            scale = row_bias_mask.reshape(-1) if row_bias_mask is not None else None
        compiled = False
    else:
        selected, kept = features[:, :-1][keep], targets[keep]  # (n, F), (n,)
        if row_bias is not None:
            rows = torch.arange(targets.shape[0], device=features.device).unsqueeze(1).expand_as(targets)[keep]
            scale = row_bias_mask[keep] if row_bias_mask is not None else None
    if runs_own_forward(output):
        return _module_cross_entropy(selected, output, kept, row_bias, rows, scale) / keep.sum().clamp_min(1)
    fn = compiled and compiled_linear_cross_entropy((row_bias is not None, scale is not None), features.device.type)
    if fn:  # padded rows: feature 0, target -100 (ignored by the loss), bias row 0, scale 0
        kept, selected, rows, scale = _pad_rows(features.device.type, kept, selected, rows, scale)
    total = (fn or _linear_cross_entropy)(selected, output.weight, output.bias, kept, row_bias, rows, scale)
    return total / keep.sum().clamp_min(1)


# ----------------------------------------------------------------------------------------------
# running a recurrent layer on padded batches
# ----------------------------------------------------------------------------------------------


def _to_layer_first(state):
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.transpose(0, 1).contiguous()
    return tuple(_to_layer_first(s) for s in state)


def _run_by_length(rnn: nn.RNNBase, x: torch.Tensor, lengths: Sequence[int], hx):
    """``rnn`` (unidirectional) on a right-padded batch whose rows hold ``lengths`` real tokens (read on the host),
    with the state after each row's last real token, in one call of the fused kernel per distinct row length instead
    of a packed sequence (which the CPU runs one time step at a time): the rows sorted by length, longest first, the
    first call runs every row up to the shortest length, the next continues the longer rows from their states up to
    the next length, and so on. Returns ``(outputs (b, s, H) with zeros at padding, the layer-first state)`` as
    ``rnn`` returns them; a row without a token keeps its initial state."""
    b, s, _ = x.shape
    is_lstm = isinstance(rnn, nn.LSTM)
    host_order = sorted(range(b), key=lambda i: -lengths[i])  # longest first, ties in row order (stable)
    order = torch.tensor(host_order, device=x.device)
    sorted_lengths = [lengths[i] for i in host_order]
    out_size = rnn.proj_size or rnn.hidden_size
    if hx is None:
        h0 = x.new_zeros(rnn.num_layers, b, out_size)
        hx = (h0, x.new_zeros(rnn.num_layers, b, rnn.hidden_size)) if is_lstm else h0
    x = x.index_select(0, order)
    states = [h.index_select(1, order) for h in (hx if is_lstm else (hx,))]
    rows = sum(1 for n in sorted_lengths if n > 0)  # the rows still running
    finals = [[h[:, rows:]] for h in states]  # per state tensor, the rows' final states by segment, last rows first
    outputs, start = [], 0
    for end in sorted({n for n in sorted_lengths if n > 0}):
        running = tuple(h[:, :rows] for h in states)
        out, hn = rnn(x[:rows, start:end], running if is_lstm else running[0])
        outputs.append(nn.functional.pad(out, (0, 0, 0, 0, 0, b - rows)))
        still = sum(1 for n in sorted_lengths if n > end)
        states = hn if is_lstm else (hn,)
        for final, h in zip(finals, states):
            final.insert(0, h[:, still:rows])  # the rows of exactly this length are done
        rows, start = still, end
    out = torch.cat(outputs, dim=1) if outputs else x.new_zeros(b, 0, out_size)
    inverse = torch.argsort(order)
    out = nn.functional.pad(out, (0, 0, 0, s - out.shape[1])).index_select(0, inverse)
    hn = tuple(torch.cat(final, dim=1).index_select(1, inverse) for final in finals)
    return out, (hn if is_lstm else hn[0])


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
    # the padding's shape, and each row's length where the state is wanted (the rows then run by length): one read
    full, right_padded, lengths = (True, False, None) if attention_mask is None else \
        read_padding(attention_mask, lengths=need_state)
    if full or (not need_state and right_padded):
        out, hn = rnn(x, hx)
        if not full:
            out = out * attention_mask.unsqueeze(-1).to(out.dtype)
    elif right_padded and not rnn.bidirectional:
        if lengths is None:  # deferred host reads (a captured step never wants the state)
            lengths = read_on_host(attention_mask.long().sum(1))
        out, hn = _run_by_length(rnn, x, lengths, hx)
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
        inputs_embeds = embed_checked(module.embed_tokens, input_ids, module.config.vocab_size)  # (b, s, E)
    attention_mask = last_columns(attention_mask, inputs_embeds.shape[1])
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


def leaky_modes_of(model) -> list[str]:
    """The options in use that let ``model`` read the words it predicts (``model.leaky_modes()``; none for a
    model that does not declare any): such a model's perplexity is only reported under ``paper``, labelled."""
    return list(model.leaky_modes()) if isinstance(model, RecurrentPreTrainedModel) else []


def saved_model_type(name_or_path: Optional[str]) -> Optional[str]:
    """The ``model_type`` in the ``config.json`` of a local folder or of a Hub repository already in the local
    cache (no download); None where there is none to read."""
    import json
    import os

    if not name_or_path:
        return None
    path = os.path.join(name_or_path, "config.json")
    if not os.path.isfile(path):
        from huggingface_hub import try_to_load_from_cache

        try:
            path = try_to_load_from_cache(name_or_path, "config.json")
        except ValueError:  # not a repository id either
            return None
        if not isinstance(path, str):
            return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def adapter_base_model(adapter: str) -> Optional[str]:
    """The ``base_model_name_or_path`` recorded in a local adapter folder's ``adapter_config.json`` (None where it
    has none, or the adapter is not a local folder)."""
    import json
    import os

    try:
        with open(os.path.join(adapter, "adapter_config.json"), encoding="utf-8") as f:
            return json.load(f).get("base_model_name_or_path")
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _check_loaded_adapters(module, state_dict, *args) -> None:
    """``load_state_dict`` pre-hook: every PEFT adapter config on ``module`` names a model of its family."""
    for config in (getattr(module, "peft_config", None) or {}).values():
        module.check_adapter_family(getattr(config, "base_model_name_or_path", None))


class RecurrentPreTrainedModel(PreTrainedModel):
    """The flags and hooks every recurrent LM of the package needs under transformers 5.x (each says why where it
    is set)."""

    base_model_prefix = "model"
    # The causal LM's topic output prior (its weight, saved at the top of a causal LM's folder): the base model and
    # the classifiers loaded from that folder do not use it, and it is not a weight they lack.
    _keys_to_ignore_on_load_unexpected = [r"(^|\.)topic_prior_weight$"]
    _is_stateful = True  # assisted decoding cannot roll a recurrent state back
    accepts_loss_kwargs = False  # our loss is a mean per token: Trainer must scale for accumulation
    # model.activation_checkpointing_enable() / TrainingArguments(activation_checkpointing=True): every recurrent layer is a
    # checkpoint (as the blocks of transformers' RWKV and Mamba); see checkpoint_function.
    supports_gradient_checkpointing = True

    # What the model reads, declared as transformers declares what a model supports (never probed from
    # signatures). ``TopicContextCollator.for_model`` builds the batches of training and of every evaluation
    # protocol from these, and ``generate`` accepts exactly ``conditioning_inputs``.
    conditioning_inputs: tuple[str, ...] = ()  # the topic keywords of forward()/generate(): "context_bow", ...
    training_context: str = "none"  # the context mode of the documented training batches ("others": the papers')
    reads_sentence_prefix: bool = False  # forward() takes sentence_prefix_bow (NCLM's sentence-level topics)
    reads_documents: bool = False  # forward() takes whole documents (b, c, l) with chunk_mask (rGBN-RNN)
    # a training step on chunk batches reads nothing on the host under host_reads_deferred and trains when a CUDA
    # graph captures it (the package's cuda_graphs module); the package's tests check every family that declares it
    supports_cuda_graphs: bool = False

    def leaky_modes(self) -> list[str]:
        """The options in use that let the model read the words it predicts (NCLM's replication modes); none."""
        return []

    # compile_output_layer(): the training loss's output layer runs as one torch.compile'd function
    output_layer_compiled: bool = False

    def compile_output_layer(self, enabled: bool = True) -> bool:
        """Compute the training loss's output layer and cross-entropy as one ``torch.compile``'d function (with
        bf16 autocast it ran 2.5 times faster than eager on a 2-core CPU with AVX512-BF16).

        It applies in training mode with ``labels``, where every family computes the output layer only at the
        predicted positions and returns ``logits=None``; evaluation and generation are unchanged. Where
        ``torch.compile`` does not work (no C++ compiler), logs one warning and stays eager. Returns whether the
        output layer is compiled. ``TopicLMTrainer(compile_output_layer=True)`` calls it."""
        if enabled and compiled_linear_cross_entropy(device_type=self.device.type) is None:
            logger.warning("The output layer stays eager: torch.compile does not work here (%s).",
                           _COMPILED["error", self.device.type])
            enabled = False
        self.output_layer_compiled = bool(enabled)
        return self.output_layer_compiled

    def output_layer(self, features: torch.Tensor, labels: Optional[torch.Tensor] = None,
                     row_bias: Optional[torch.Tensor] = None) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(logits, lm_loss)`` of ``self.lm_head`` on ``features`` (b, s, F), plus ``row_bias`` (b, V) at every
        position. In training mode with ``labels`` only the loss is computed, at the predicted positions
        (``next_token_loss``: the same value), and ``logits`` is None; otherwise the full (b, s, V) logits and,
        with ``labels``, ``causal_lm_loss``."""
        if labels is not None and self.training:
            return None, next_token_loss(features, labels, self.lm_head, row_bias,
                                         compiled=self.output_layer_compiled)
        logits = self.lm_head(features)
        if row_bias is not None:
            logits = logits + row_bias.to(logits.dtype).unsqueeze(1)
        return logits, (causal_lm_loss(logits, labels) if labels is not None else None)

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

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, is_encoder_decoder=False, num_new_tokens=1):
        # The recurrent state is the cache: the next step continues from it. transformers carried an output named
        # ``state`` forward itself until 5.23 (RWKV's name), from 5.24 only ``cache``: where nothing above carried
        # it (the topic families' TopicGenerationMixin wraps it with their conditioning), it is carried here.
        previous = model_kwargs.get("state")
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder,
                                                                   num_new_tokens)
        if model_kwargs.get("state") is previous:
            model_kwargs["state"] = getattr(outputs, "state", None)
        return model_kwargs

    def post_init(self):
        super().post_init()
        self._suppress_unk_in_generation()
        # PeftModel.from_pretrained loads an adapter's weights through load_state_dict, by module name and shape
        # only: the hook refuses an adapter trained on another family (see check_adapter_family).
        self.register_load_state_dict_pre_hook(_check_loaded_adapters)

    def load_adapter(self, peft_model_id=None, *args, **kwargs):
        """transformers' ``load_adapter``, refusing an adapter trained on another family (``check_adapter_family``)."""
        if peft_model_id is not None:
            self.check_adapter_family(adapter_base_model(peft_model_id))
        return super().load_adapter(peft_model_id, *args, **kwargs)

    def check_adapter_family(self, base_model: Optional[str]) -> None:
        """Refuse an adapter saved from a model of another ``model_type`` (a LoRA of an LSTM loaded into a TCNLM):
        PEFT matches an adapter's weights by module name and shape, which families share (``lm_head``,
        ``embed_tokens``). ``base_model`` is the adapter's ``base_model_name_or_path``; where that folder (or its
        cached Hub copy) holds no ``config.json`` there is nothing to check against."""
        model_type = saved_model_type(base_model)
        if model_type is not None and model_type != self.config.model_type:
            raise ValueError(f"This adapter was trained on {base_model}, a {model_type} model; this model is a "
                             f"{self.config.model_type}: load the adapter into a {model_type} model")

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

    def save_pretrained(self, save_directory, *args, **kwargs):
        """``PreTrainedModel.save_pretrained``, with the family's full ``auto_map`` in ``config.json`` (every Auto
        class of the family, not only the saved one's), so that every saved folder (Trainer checkpoints
        included) loads with any of them as remote code, without the package. (A class not registered for an Auto
        class, e.g. a user's subclass, saves no code and no ``auto_map``.)"""
        if type(self)._auto_class is not None:  # its code is saved with it (the package registers every class)
            self.config.auto_map = auto_map_for(self)
        return super().save_pretrained(save_directory, *args, **kwargs)

    def push_to_hub(self, repo_id: str, *args, **kwargs):
        """``PreTrainedModel.push_to_hub``; where the Hub cannot be reached, the model is saved to
        ``./<repo name>-hub`` instead and :class:`HubUnreachableError` says in one line where, and how to upload
        it later."""
        try:
            return super().push_to_hub(repo_id, *args, **kwargs)
        except Exception as error:
            if not is_network_error(error):
                raise
            folder = f"{repo_id.rsplit('/', 1)[-1]}-hub"
            self.save_pretrained(folder)
            raise HubUnreachableError(unreachable_message(repo_id, folder, error)) from None

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
        model.hold_configured_weights()
        return (model, info) if want_info else model

    def hold_configured_weights(self) -> None:
        """Hold the weights the configuration holds fixed (a classifier's frozen body, a held topic output prior's
        weight): no gradient, so ``Trainer`` leaves them out of its optimizer. Run when the model is built and again
        by :meth:`from_pretrained`, whose loading makes every floating-point weight trainable. Nothing by default."""

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

    def _init_weights(self, module):
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


def _fed_tokens(attention_mask: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
    """(b, c * l) bool: the chunk tokens a documents batch's carried sequences hold (:func:`document_layout`)."""
    b, c, _ = attention_mask.shape
    real = attention_mask.bool() & chunk_mask.bool().to(attention_mask.device).unsqueeze(-1)
    fed = torch.cat([real[..., 1:], real.new_zeros(b, c, 1)], dim=-1).flatten(1)
    last = real.flatten(1).cumsum(1).argmax(1)  # the first position of the running count's maximum
    fed[torch.arange(b, device=fed.device), last] = True
    return fed


def carried_sequence_lengths(attention_mask: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
    """(b,) the length of each document's carried token sequence (:func:`document_layout`)."""
    return _fed_tokens(attention_mask, chunk_mask).sum(1)


def document_layout(attention_mask: torch.Tensor, chunk_mask: torch.Tensor, longest: Optional[int] = None):
    """Where the tokens of a documents batch are in its documents' token sequences: what a recurrence reads when
    its state is carried from each chunk of a document to the next.

    Consecutive chunks share a token (the last input of chunk k is the first of chunk k + 1; a sentence's last chunk
    ends with ``<eos>``, the next sentence's first starts with ``<bos>``), and a carried chunk feeds its tokens but its
    last. So a document's sequence is every chunk's real tokens but its last, then the document's final token.

    Args:
        attention_mask: (b, c, l), 1 at the real tokens of each chunk (right padding).
        chunk_mask: (b, c), each document's chunks a prefix.
        longest: the longest sequence (``carried_sequence_lengths``' maximum) when the host knows it already; else it
            is read (one host synchronisation).

    Returns:
        ``(order, mask, fed, index)``: ``order`` (b, n), the index in its document's flattened chunks (c * l) of each
        token of its sequence (n the longest sequence; 0 at padding); ``mask`` (b, n) bool, the sequences' real
        tokens; ``fed`` (b, c * l) bool, the chunk tokens the sequences hold (a real token followed by a real one in
        its chunk, and the document's last one); ``index`` (b, c * l), each such token's index in the flattened
        sequences (b * n), 0 elsewhere.
    """
    fed = _fed_tokens(attention_mask, chunk_mask)
    b = fed.shape[0]
    lengths = fed.sum(1)
    n = int(lengths.max()) if longest is None else longest
    # a stable sort of each row's held positions to the front keeps them in document order
    order = torch.argsort((~fed).to(torch.int8), dim=1, stable=True)[:, :n]
    mask = torch.arange(n, device=fed.device) < lengths.unsqueeze(1)
    index = (fed.long().cumsum(1) - 1 + n * torch.arange(b, device=fed.device).unsqueeze(1)).masked_fill(~fed, 0)
    return order, mask, fed, index


def select_state_rows(state: Optional[Sequence[torch.Tensor]], rows: int):
    """Keep the first ``rows`` rows of a batch-first state (documents that still have chunks)."""
    if state is None:
        return None
    return tuple(s[:rows] for s in state)


__all__ = ["RecurrentBodyMixin", "RecurrentModelOutput", "RecurrentPreTrainedModel", "TopicLMOutput",
           "WordStopStringCriteria", "carried_sequence_lengths", "causal_lm_loss", "check_call", "check_prompt",
           "check_right_padded", "check_token_ids", "compiled_linear_cross_entropy", "detach_or_none",
           "document_layout", "effective_weight", "embed_checked", "host_reads_are_deferred", "host_reads_deferred",
           "last_columns", "last_token_positions", "leaky_modes_of", "next_token_loss", "read_on_host",
           "read_padding", "reorder_state", "right_padding_holds", "run_rnn", "run_rnn_layers", "run_token_rnn",
           "select_state_rows", "state_from_aliases"]
