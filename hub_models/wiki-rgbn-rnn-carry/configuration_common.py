"""What the configurations of every family share: integer checks, sizing to the two tokenizers, the
classifier head's settings and the outputs Trainer leaves out of predictions.

A configuration-side file: it imports nothing but transformers' configuration machinery, so every
``configuration_*.py`` stays a leaf (as in transformers) and a saved folder's remote code copies it with them.
"""

from __future__ import annotations

import numbers
from typing import Optional

# Outputs that Trainer must not gather into eval predictions (it concatenates every output but ``loss`` and these
# into them); a family adds its own extra outputs.
KEYS_TO_IGNORE_AT_INFERENCE = ("state", "hidden_states", "lm_loss", "kl_loss", "bow_loss", "aux_loss",
                               "topic_mixture")


def check_integers(minimum: int, **values) -> None:
    """Configuration checks: each value must be an int (not a bool) >= ``minimum`` (1: "positive", 0:
    "non-negative"), else a ``ValueError`` naming it."""
    kind = {0: "non-negative", 1: "positive"}.get(minimum, f">= {minimum}")
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be a {kind} integer, got {value!r}")


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


def config_kwargs_from_tokenizers(tokenizer, topic_tokenizer, **kwargs) -> dict:
    """Config arguments sized to an LM tokenizer and a topic tokenizer: ``vocab_size``,
    ``topic_vocab_size``, ``topic_word_ids`` and the special-token ids (unless given); ``kwargs`` pass on.
    Without a topic tokenizer (a family without topics) only the first and the last."""
    vocab = tokenizer.get_vocab()
    for name, token in (("pad_token_id", tokenizer.pad_token), ("bos_token_id", tokenizer.bos_token),
                        ("eos_token_id", tokenizer.eos_token), ("unk_token_id", tokenizer.unk_token)):
        if token is not None and token in vocab:
            kwargs.setdefault(name, vocab[token])
    if topic_tokenizer is None:
        return {"vocab_size": len(tokenizer), **kwargs}
    return {"vocab_size": len(tokenizer), "topic_vocab_size": len(topic_tokenizer),
            "topic_word_ids": topic_word_ids_from_tokenizers(tokenizer, topic_tokenizer), **kwargs}


def check_topic_output_prior(topic_output_bias, topic_prior_weight_init, allowed=(None, "beta"),
                             topic_prior_weight_trainable=True):
    """``(topic_output_bias, float(topic_prior_weight_init), topic_prior_weight_trainable)`` checked: the value must
    be one of ``allowed`` (``"beta"`` is the shared topic output prior, ``TopicWordPriorMixin`` of
    ``modeling_topic_family.py``; a config saved with ``False`` reads as ``None``), lambda's initial value a finite
    number, and whether lambda learns a bool."""
    if topic_output_bias is False:  # configs saved when this was a flag
        topic_output_bias = None
    if topic_output_bias not in allowed:
        raise ValueError(f"topic_output_bias must be one of {tuple(allowed)}, got {topic_output_bias!r}")
    if isinstance(topic_prior_weight_init, bool) or not isinstance(topic_prior_weight_init, numbers.Real) \
            or topic_prior_weight_init != topic_prior_weight_init or abs(topic_prior_weight_init) == float("inf"):
        raise ValueError(f"topic_prior_weight_init must be a finite number, got {topic_prior_weight_init!r}")
    if not isinstance(topic_prior_weight_trainable, bool):
        raise ValueError("topic_prior_weight_trainable must be True (lambda learns) or False (held at "
                         f"topic_prior_weight_init), got {topic_prior_weight_trainable!r}")
    return topic_output_bias, float(topic_prior_weight_init), topic_prior_weight_trainable


class CompactReprMixin:
    """``print(config)`` shows a long list (``topic_word_ids``, a sense inventory) by its first entries and its
    length, so the printed form stays readable; ``save_pretrained`` and ``to_dict`` keep every entry."""

    def __repr__(self):
        import json

        shown = self.to_diff_dict()
        for key, value in shown.items():
            if isinstance(value, list) and len(value) > 16:
                shown[key] = f"[{', '.join(map(str, value[:8]))}, ... ({len(value):,} entries)]"
        return f"{self.__class__.__name__} {json.dumps(shown, indent=2, sort_keys=True)}\n"


class TopicConfigMixin:
    """What every topic model's config has: sizing to an LM tokenizer and a topic tokenizer. Put it before
    ``PretrainedConfig`` in the bases."""

    topic_word_ids_from_tokenizers = staticmethod(topic_word_ids_from_tokenizers)

    @staticmethod
    def output_prior_unavailable(**settings) -> Optional[str]:
        """Why a configuration with these ``settings`` cannot have ``topic_output_bias`` (one line), or None when it
        can. The configuration's own check and ``steering_recipe`` both ask it."""
        return None

    @staticmethod
    def checked_topic_word_ids(topic_word_ids, topic_vocab_size: int, vocab_size: Optional[int] = None
                               ) -> Optional[list[int]]:
        """``topic_word_ids`` as a list of ints (``None`` stays ``None``), one per topic-vocabulary entry, each an LM
        id below ``vocab_size`` or -1."""
        if topic_word_ids is None:
            return None
        if isinstance(topic_word_ids, (str, bytes)) or not hasattr(topic_word_ids, "__iter__"):
            raise ValueError(f"topic_word_ids is a list (the LM id of every topic word), got {topic_word_ids!r}")
        ids = [int(i) for i in topic_word_ids]
        if len(ids) != topic_vocab_size:
            raise ValueError(f"topic_word_ids has {len(ids)} entries but topic_vocab_size is {topic_vocab_size}: "
                             "mismatched vocabularies")
        bad = [(j, i) for j, i in enumerate(ids) if i < -1 or (vocab_size is not None and i >= vocab_size)]
        if bad:
            (j, i), top = bad[0], vocab_size - 1 if vocab_size is not None else "V - 1"
            raise ValueError(f"topic_word_ids[{j}] = {i} is not an LM id (0 .. {top}, or -1 for a word the LM lacks); "
                             f"{len(bad)} entries are out of range: build the config with "
                             "from_tokenizers(tokenizer, topic_tokenizer)")
        return ids

    @classmethod
    def from_tokenizers(cls, tokenizer, topic_tokenizer, **kwargs):
        """A config sized to an LM tokenizer and a topic tokenizer (vocabulary sizes, special-token ids,
        ``topic_word_ids``); other arguments are passed on."""
        return cls(**config_kwargs_from_tokenizers(tokenizer, topic_tokenizer, **kwargs))


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


__all__ = ["CLASSIFIER_ACTIVATIONS", "CLASSIFIER_DEFAULTS", "CLASSIFIER_HEADS", "ClassifierConfigMixin",
           "CompactReprMixin", "KEYS_TO_IGNORE_AT_INFERENCE", "TopicConfigMixin", "check_integers",
           "check_topic_output_prior", "config_kwargs_from_tokenizers", "topic_word_ids_from_tokenizers"]
