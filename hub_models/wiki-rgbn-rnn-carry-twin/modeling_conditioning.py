"""Topic conditioning: what ``topic_ids`` / ``topic_mixture`` / ``context_bow`` may be and how they are
validated, the map between the LM and topic vocabularies, and the topic tokenizer. (Generation, which resolves the
conditioning once and carries it in its cache, is ``modeling_generation``.)

Copied next to the weights with a family's own files when a model is shared with remote code.

Notation: b batch, k topics asked for per row, T topics, V LM vocabulary, V_c topic vocabulary.
"""

from __future__ import annotations

import math

import numbers
from collections.abc import Mapping
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from .modeling_recurrent import host_reads_are_deferred

# Spread of the topic-word logits at initialisation where a topic is a softmax over words and the topic proportions
# are a distribution (TCNLM's beta, TopicRNN's columns of B with theta_transform="softmax"): topics start as
# distinct random distributions, so that log p(d | t) depends on t from the first step; near-uniform topics reward
# no posterior away from the prior, and the KL term collapses it (TCNLM on APNEWS: t constant within 50 steps).
TOPIC_LOGIT_INIT_STD = 1.5


# ----------------------------------------------------------------------------------------------
# topic conditioning given to generate() / forward()
# ----------------------------------------------------------------------------------------------


def broadcast_rows(x: torch.Tensor, batch_size: Optional[int], name: str) -> torch.Tensor:
    if batch_size is None or x.shape[0] == batch_size:
        return x
    if x.shape[0] == 1:
        return x.expand(batch_size, *x.shape[1:])
    # (generate() resolves the conditioning before it expands the prompts for beams and return sequences, and
    # expands it with them: any other mismatch is the caller's, and repeating rows would silently pair them wrong)
    raise ValueError(f"{name} has {x.shape[0]} rows but the batch has {batch_size}: give one row, or one per row of "
                     "the batch")


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
        rows = torch.full((len(topic_ids), width), -1, dtype=torch.long, device="cpu")  # parsed on the host
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
    return broadcast_rows(rows, batch_size, "topic_ids")


def topic_ids_to_mixture(topic_ids: torch.Tensor, num_topics: int) -> torch.Tensor:
    """(b, k) ids padded with -1 -> (b, T) equal mixture over each row's distinct topics."""
    onehot = torch.zeros(topic_ids.shape[0], num_topics + 1, device=topic_ids.device, dtype=torch.float32)
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


def check_counts(bow: torch.Tensor, bounds=None) -> None:
    """A ``ValueError`` unless the bags of words ``bow`` (any shape) hold finite, non-negative counts (``bounds``:
    their smallest and largest, when the caller has read them)."""
    if bow.numel() == 0:
        return
    # the smallest and the largest count, read at once (one host synchronisation); a NaN makes both NaN
    low, high = bounds if bounds is not None else torch.stack(torch.aminmax(bow.float())).tolist()
    if not (low >= 0 and high < math.inf):
        raise ValueError("context_bow must hold finite, non-negative counts")


class TopicConditioning(Mapping):
    """The topic conditioning of one call, validated: at most one batch-first tensor under the name of the keyword
    that takes it (``topic_ids`` (b, k), ``topic_mixture`` (b, K), ``context_bow`` (b, V_c)), or nothing.

    ``resolve_conditioning`` makes it from the raw keywords of ``forward`` / ``generate``, the one place they are
    checked; every method that receives one trusts it. ``generate`` resolves the raw keywords before its first step,
    and that step's ``forward`` gets them as ``topic_conditioning=``. It reads as a mapping of its one keyword
    (``conditioning.get("context_bow")``, ``**conditioning``)."""

    __slots__ = ("kind", "value")

    def __init__(self, kind: Optional[str] = None, value: Optional[torch.Tensor] = None):
        if (kind is None) != (value is None):
            raise ValueError("a TopicConditioning has both a kind and a value, or neither")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "value", value)

    @classmethod
    def of(cls, **named) -> "TopicConditioning":
        """The conditioning of the given (not None) keywords, taken as already validated (at most one)."""
        given = check_at_most_one(**named)
        return cls(given[0], named[given[0]]) if given else cls()

    def __setattr__(self, name, value):
        raise AttributeError("a TopicConditioning is immutable")

    def __getitem__(self, name: str) -> torch.Tensor:
        if name != self.kind or self.kind is None:
            raise KeyError(name)
        return self.value

    def __iter__(self):
        return iter(() if self.kind is None else (self.kind,))

    def __len__(self) -> int:
        return 0 if self.kind is None else 1

    def __repr__(self) -> str:
        if self.kind is None:
            return "TopicConditioning()"
        return f"TopicConditioning({self.kind}={tuple(self.value.shape)})"

    def to(self, device) -> "TopicConditioning":
        return self if self.kind is None else TopicConditioning(self.kind, self.value.to(device).contiguous())


def check_resolved(conditioning, raw: dict) -> TopicConditioning:
    """``conditioning`` given as ``topic_conditioning=``: a :class:`TopicConditioning`, and no raw topic keyword
    beside it (``raw``: the raw keywords of the same call); a ``ValueError`` otherwise."""
    if not isinstance(conditioning, TopicConditioning):
        raise ValueError(f"topic_conditioning must be a TopicConditioning (what resolve_conditioning returns), got "
                         f"{type(conditioning).__name__}; or give the raw keywords (topic_ids=, context_bow=, ...)")
    given = [name for name, value in raw.items() if value is not None]
    if given:
        raise ValueError(f"Give the topic conditioning once: topic_conditioning or {given}, not both")
    return conditioning


def check_at_most_one(**named) -> list[str]:
    """The names of the given (non-None) values; more than one is a ``ValueError`` naming them."""
    given = [name for name, value in named.items() if value is not None]
    if len(given) > 1:
        raise ValueError(f"Give at most one of {', '.join(named)} (got {given})")
    return given


def check_topic_layer(layer, num_layers: int) -> int:
    """``layer`` (1 = the bottom layer; ``None``: 1) checked against a hierarchy of ``num_layers`` topic layers."""
    if layer is None:
        return 1
    if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= num_layers:
        raise ValueError(f"topic_layer must be an integer in [1, {num_layers}] (1 = the bottom layer), got {layer!r}")
    return layer


def normalize_topic_kwargs(num_topics: int, topic_vocab_size: int, batch_size: Optional[int] = None,
                           topic_ids=None, topic_mixture=None, context_bow=None,
                           mixture_on_simplex: bool = True) -> TopicConditioning:
    """Validate the topic conditioning of ``generate()`` / ``forward()``; at most one may be given.

    Returns the :class:`TopicConditioning` of the one given input as a batch-first float/long tensor of
    ``batch_size`` rows. ``mixture_on_simplex`` requires mixtures to be non-negative and sum to 1 (TCNLM's t);
    models with an unconstrained topic vector (TopicRNN's theta) pass False.
    """
    check_at_most_one(topic_ids=topic_ids, topic_mixture=topic_mixture, context_bow=context_bow)
    if topic_ids is not None:
        return TopicConditioning("topic_ids", normalize_topic_ids(topic_ids, num_topics, batch_size))
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
        return TopicConditioning("topic_mixture", broadcast_rows(mix, batch_size, "topic_mixture"))
    if context_bow is not None:
        return TopicConditioning("context_bow", bags_of_words(context_bow, topic_vocab_size, batch_size))
    return TopicConditioning()


def bags_of_words(context_bow, topic_vocab_size: int, batch_size: Optional[int] = None) -> torch.Tensor:
    """``context_bow`` validated as a (b, V_c) float tensor of counts over the topic vocabulary (a 1-D input is one
    row; ``batch_size`` rows where given): what every method that reads documents as bags of words takes
    (``infer_topics``, ``topic_model_loss``, the classifiers' document representation, the conditioning)."""
    bow = _float_rows(context_bow, "context_bow", f"(b, {topic_vocab_size}) or ({topic_vocab_size},), one bag "
                      "of words over the topic vocabulary per row (flatten a documents-layout batch's "
                      "(b, chunks, V_c) bags to one row per chunk)")
    if bow.shape[-1] != topic_vocab_size:
        raise ValueError(f"context_bow must have {topic_vocab_size} columns (the topic vocabulary), "
                         f"got {bow.shape[-1]}: mismatched vocabularies?")
    if not host_reads_are_deferred():  # else checked by the caller before (a captured step reads nothing)
        check_counts(bow)
    return broadcast_rows(bow, batch_size, "context_bow")


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
    topic_word_ids = torch.tensor(ids, dtype=torch.long, device="cpu")  # built on the host, then moved once
    real = topic_word_ids >= 0
    lm_to_topic = torch.full((config.vocab_size,), -1, dtype=torch.long, device="cpu")
    lm_to_topic[topic_word_ids[real]] = torch.arange(len(ids), device="cpu")[real]
    lm_to_topic = lm_to_topic.to(device)
    module.__dict__["_lm_to_topic_cache"] = (key, lm_to_topic)
    return lm_to_topic


def topic_scores_to_vocab(scores: torch.Tensor, lm_to_topic: torch.Tensor) -> torch.Tensor:
    """Scores over the topic vocabulary (b, V_c) -> the LM vocabulary (b, V), 0 at words that are not topic words."""
    return F.pad(scores, (1, 0)).index_select(1, lm_to_topic + 1)  # column 0: the stop words' zero


def angular_diversity(topic_rows: torch.Tensor) -> torch.Tensor:
    """TCNLM's diversity regulariser R (Wang et al. 2018) of topic vectors (T, V_c): mean - variance of the pairwise
    angles arccos(|a_i . a_j| / |a_i| |a_j|), i != j (0 for a single topic). Larger is more diverse."""
    if topic_rows.shape[0] < 2:
        return topic_rows.new_zeros(())  # no pair of topics: nothing to keep apart (T = 1)
    # In float32 even under autocast: in bf16 the cosine of two nearly coinciding topics rounds to 1.0, past the
    # clamp below, and arccos' gradient there is infinite (a NaN gradient).
    with torch.autocast(device_type=topic_rows.device.type, enabled=False):
        rows = F.normalize(topic_rows.float(), dim=-1)
        cosine = (rows @ rows.T).abs()  # (T, T)
        pairs = cosine.shape[0] * (cosine.shape[0] - 1)
        off_diagonal = (1 - torch.eye(cosine.shape[0], device=cosine.device, dtype=cosine.dtype)) / pairs  # weights (no host read)
        # Clamp below 1: arccos has an infinite derivative there (two identical topics; the diagonal, weight 0).
        angles = torch.arccos(cosine.clamp(max=1.0 - 1e-6))
        mean = (angles * off_diagonal).sum()
        return mean - ((angles - mean).square() * off_diagonal).sum()


def topic_word_mask(module: nn.Module, config, device) -> torch.Tensor:
    """(V_c,) bool: the topic-vocabulary entries that are LM words (not the topic ``<unk>``, not words the LM
    lacks), from :func:`lm_to_topic_index`; cached with it (the output layer reads it at every step)."""
    lm_to_topic = lm_to_topic_index(module, config, device)
    cached = module.__dict__.get("_topic_word_mask_cache")
    if cached is not None and cached[0] is lm_to_topic:
        return cached[1]
    mask = torch.zeros(config.topic_vocab_size, dtype=torch.bool, device=device)
    mask[lm_to_topic[lm_to_topic >= 0]] = True
    module.__dict__["_topic_word_mask_cache"] = (lm_to_topic, mask)
    return mask


TOPIC_TOKENIZER_SUBFOLDER = "topic_tokenizer"


def load_topic_tokenizer(source, **kwargs):
    """The topic tokenizer saved in ``<source>/topic_tokenizer/`` (``source``: a local folder or a Hub id).

    Raises ``OSError`` saying so when the folder has none (transformers' own error there asks
    for sentencepiece or tiktoken, which would not help).
    """
    import os

    from transformers import PreTrainedTokenizerFast

    folder = os.path.join(str(source), TOPIC_TOKENIZER_SUBFOLDER)
    if os.path.isdir(str(source)) and not os.path.isfile(os.path.join(folder, "tokenizer.json")):
        raise OSError(f"{source} has no topic tokenizer (no {TOPIC_TOKENIZER_SUBFOLDER}/tokenizer.json in it): pass "
                      "topic_tokenizer=, or save one there with topic_lm_hf.save_vocabularies(tokenizer, "
                      "topic_tokenizer, folder)")
    try:
        # Not AutoTokenizer: it first reads the subfolder's config.json, which a Hub repo does not have, and
        # fails offline on a Hub id; the topic tokenizer is always a word-level fast tokenizer.
        return PreTrainedTokenizerFast.from_pretrained(source, subfolder=TOPIC_TOKENIZER_SUBFOLDER, **kwargs)
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


__all__ = ["TOPIC_LOGIT_INIT_STD", "TOPIC_TOKENIZER_SUBFOLDER", "TopicConditioning", "angular_diversity",
           "bags_of_words", "broadcast_rows", "check_at_most_one", "check_counts", "check_resolved",
           "check_topic_layer", "lm_to_topic_index", "load_topic_tokenizer", "normalize_topic_ids",
           "normalize_topic_kwargs", "topic_ids_to_mixture", "topic_scores_to_vocab", "topic_vocabulary",
           "topic_word_mask"]
