"""Configuration of the plain LSTM language model (the baseline every paper compares against)."""

from transformers import PretrainedConfig

from .configuration_common import (KEYS_TO_IGNORE_AT_INFERENCE, ClassifierConfigMixin, CompactReprMixin,
                                   check_integers)


class LSTMLMConfig(ClassifierConfigMixin, CompactReprMixin, PretrainedConfig):
    r"""Configuration of :class:`LSTMLMForCausalLM`.

    Args:
        vocab_size: LM vocabulary size (special tokens included).
        embedding_size: word embedding size E (300 in the papers).
        hidden_size: LSTM hidden size H (600 for the papers' small models).
        num_hidden_layers: stacked LSTM layers.
        dropout: dropout on embeddings, between layers and before the softmax (0.4 in Zheng et al.).
        tie_word_embeddings: share the input embedding and the output matrix; when E != H a
            linear projection H -> E is inserted before the softmax.
        initializer_range: weights are initialised uniformly in [-r, r].
        classifier_*, freeze_backbone: the head of the ``*ForSequenceClassification`` model
            (:class:`~.configuration_common.ClassifierConfigMixin`: an MLP on [o_N; c] by
            default, ``classifier_head="cnn"`` for the NCLM paper's CNN over [o_m; c]).

    Example:
        >>> from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM
        >>> model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=1000, embedding_size=32, hidden_size=64))
    """

    model_type = "lstm_lm"
    keys_to_ignore_at_inference = [*KEYS_TO_IGNORE_AT_INFERENCE]

    def __init__(self, vocab_size=10000, embedding_size=300, hidden_size=600, num_hidden_layers=1, dropout=0.4,
                 tie_word_embeddings=False, initializer_range=0.1, use_cache=True, pad_token_id=0, bos_token_id=2,
                 eos_token_id=3, unk_token_id=1, **kwargs):
        check_integers(1, vocab_size=vocab_size, embedding_size=embedding_size, hidden_size=hidden_size,
                       num_hidden_layers=num_hidden_layers)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.dropout = dropout
        self.tie_word_embeddings = tie_word_embeddings
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        kwargs = self._pop_classifier_settings(kwargs)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         unk_token_id=unk_token_id, **kwargs)


__all__ = ["LSTMLMConfig"]
