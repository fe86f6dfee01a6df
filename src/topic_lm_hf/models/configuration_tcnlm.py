"""Configuration of TCNLM, the Topic Compositional Neural Language Model (Wang et al., AISTATS 2018)."""

from transformers import PretrainedConfig

from .configuration_common import (KEYS_TO_IGNORE_AT_INFERENCE, ClassifierConfigMixin, CompactReprMixin,
                                   TopicConfigMixin, check_integers, check_topic_output_prior)

LM_TYPES = ("tcnlm", "naive_moe")
TOPIC_LOSS_NORMALIZATIONS = ("context_tokens", "lm_tokens")
LM_TOPIC_INPUTS = ("mixture", "gumbel")
TOPIC_OUTPUT_BIASES = (None, "learned", "beta")


class TCNLMConfig(TopicConfigMixin, ClassifierConfigMixin, CompactReprMixin, PretrainedConfig):
    r"""Configuration of :class:`TCNLMModel` and :class:`TCNLMForCausalLM`.

    The paper's settings (section 5): a 2-layer 256-unit ReLU encoder, lambda = 0.1, dropout 0.4,
    50 / 100 / 150 topics; small LM = 1 layer of 600 units, large LM = 2 layers of 900 units. The paper
    does not give the embedding size nor the number of factors n_f; we use E = 300 (Lau et al. 2017) and n_f = H.

    Args:
        vocab_size: LM vocabulary size V (special tokens included).
        topic_vocab_size: topic vocabulary size V_c = ``len(topic_tokenizer)``; id 0 is ``<unk>``,
            never counted in a bag of words and never a topic word.
        num_topics: number of topics T (also the dimension of the Gaussian latent theta).
        embedding_size: word embedding size E.
        hidden_size: LSTM hidden size H.
        num_hidden_layers: stacked topic-compositional LSTM layers (each conditioned on t).
        num_factors: n_f, the number of factors of eq. 12 (``None``: equal to ``hidden_size``).
        dropout: dropout on embeddings, between layers and before the softmax (0.4 in the paper).
        encoder_hidden_size: width of the two ReLU layers of the inference network q(theta | d).
        topic_embedding_size: D of the topic and word vectors whose dot products are beta's logits.
        prior_mean, prior_std: mu_0 and sigma_0 of the prior theta ~ N(mu_0, sigma_0^2 I).
        diversity_weight: lambda, the weight of the topic diversity regulariser R (eq. 18).
        lm_type: ``"tcnlm"`` (factorised topic-compositional LSTM, eq. 12-15) or ``"naive_moe"``
            (T separate LSTM experts mixed at the output by t, eq. 7-8; the paper's Table 6).
        kl_annealing_steps: the KL weight grows linearly from 0 to 1 over this many training
            forward passes (0 = no annealing).
        topic_loss_normalization: what the per-document topic-model terms (BoW reconstruction and
            KL) are divided by: ``"context_tokens"``, the number of context words in the batch (an
            NTM loss per topic word, next to the LM loss per predicted token), or ``"lm_tokens"``, the
            number of predicted tokens (the sum is then exactly a per-token ELBO). See the modeling
            module's docstring for why the default is the first.
        tie_word_embeddings: share the input embedding and the output matrix (a projection H -> E
            is inserted when E != H).
        initializer_range: scale r of the uniform initialisation U(-r, r); the factor matrices are
            scaled so that W_a diag(W_b t) W_c starts at the same scale as a plain LSTM's weights.
        topic_factor_spread: W_b and U_b (the topic factors) start as U(1 - s, 1 + s); ``None`` uses
            ``initializer_range``. With a small s, W_b t is close to 1 for every t, so every topic
            starts as the same LSTM, and the topics' LSTMs differ only as training moves W_b and U_b apart.
        lm_topic_input: what the LM is conditioned on in training: ``"mixture"``, the proportions t
            (the paper), or ``"gumbel"``, a one-hot topic drawn from t with the straight-through
            Gumbel-softmax (forward: one-hot; gradient: that of the soft sample), so that training sees
            the one-hot t that generation from a topic uses. Not in the paper. Evaluation and
            generation use t (the posterior mean) either way.
        topic_output_bias: a topic term added to the output logits; not in the TCNLM paper, whose
            topics act only through the LSTM's weights (``lm_type="tcnlm"`` only):
            ``None`` (the paper); ``"learned"``: B t with a free B (V x T, zero at initialisation), the
            way TopicRNN and TDLM condition their softmax; ``"beta"``: a product of experts with the
            topic model, lambda * log(V_c (beta^T t)_w) for every topic word w (0 for other words),
            with one learned lambda starting at 0: the topic model's own word distribution, relative
            to uniform, tilts the LM towards the words of the current topics. Needs ``topic_word_ids``.
        topic_prior_weight_init: the initial lambda of ``topic_output_bias="beta"`` (0: training starts
            from the paper's model; 1: from the plain product of the LM and a pre-trained topic model).
        topic_prior_weight_trainable: whether lambda learns (True) or is held at ``topic_prior_weight_init``
            (False: not trained, and :meth:`from_language_model` leaves it there rather than at 0), a prior
            the LM learns around.
        topic_word_ids: the LM id of every topic-vocabulary entry (-1 for the topic ``<unk>``), as in
            :class:`TopicRNNConfig`; set by :meth:`from_tokenizers` (needed by ``topic_output_bias="beta"``).
        classifier_*, freeze_backbone: the head of the ``*ForSequenceClassification`` model
            (:class:`~.configuration_common.ClassifierConfigMixin`: an MLP on [o_N; c] by
            default, ``classifier_head="cnn"`` for the NCLM paper's CNN over [o_m; c]).

    Example:
        >>> from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM
        >>> config = TCNLMConfig(vocab_size=1000, topic_vocab_size=300, num_topics=20,
        ...                      embedding_size=32, hidden_size=64)
        >>> model = TCNLMForCausalLM(config)
    """

    model_type = "tcnlm"
    keys_to_ignore_at_inference = [*KEYS_TO_IGNORE_AT_INFERENCE]

    @staticmethod
    def output_prior_unavailable(lm_type="tcnlm", **settings):
        """The naive mixture of experts has no topic-conditioned output to add a topic term to."""
        return None if lm_type == "tcnlm" else f"topic_output_bias needs lm_type='tcnlm', got {lm_type!r}"

    def __init__(self, vocab_size=10000, topic_vocab_size=2000, num_topics=50, embedding_size=300, hidden_size=600,
                 num_hidden_layers=1, num_factors=None, dropout=0.4, encoder_hidden_size=256,
                 topic_embedding_size=256, prior_mean=0.0, prior_std=1.0, diversity_weight=0.1, lm_type="tcnlm",
                 kl_annealing_steps=0, topic_loss_normalization="context_tokens", tie_word_embeddings=False,
                 initializer_range=0.1, topic_factor_spread=None, lm_topic_input="mixture", topic_output_bias=None,
                 topic_word_ids=None, topic_prior_weight_init=0.0, topic_prior_weight_trainable=True, use_cache=True,
                 pad_token_id=0, bos_token_id=2, eos_token_id=3, unk_token_id=1,
                 **kwargs):
        num_factors = hidden_size if num_factors is None else num_factors
        check_integers(1, vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, num_topics=num_topics,
                       embedding_size=embedding_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                       num_factors=num_factors, encoder_hidden_size=encoder_hidden_size,
                       topic_embedding_size=topic_embedding_size)
        if topic_vocab_size < 2:
            raise ValueError(f"topic_vocab_size must be >= 2 (<unk> plus at least one word), got {topic_vocab_size}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if not prior_std > 0:
            raise ValueError(f"prior_std must be positive, got {prior_std!r}")
        if diversity_weight < 0:
            raise ValueError(f"diversity_weight must be >= 0, got {diversity_weight!r}")
        if lm_type not in LM_TYPES:
            raise ValueError(f"lm_type must be one of {LM_TYPES}, got {lm_type!r}")
        check_integers(0, kl_annealing_steps=kl_annealing_steps)
        if topic_loss_normalization not in TOPIC_LOSS_NORMALIZATIONS:
            raise ValueError(f"topic_loss_normalization must be one of {TOPIC_LOSS_NORMALIZATIONS}, "
                             f"got {topic_loss_normalization!r}")
        if not initializer_range > 0:
            raise ValueError(f"initializer_range must be positive, got {initializer_range!r}")
        if topic_factor_spread is not None and not 0 <= topic_factor_spread:
            raise ValueError(f"topic_factor_spread must be >= 0 or None, got {topic_factor_spread!r}")
        if topic_output_bias is True:  # configs saved when this was a flag
            topic_output_bias = "learned"
        topic_output_bias, topic_prior_weight_init, topic_prior_weight_trainable = check_topic_output_prior(
            topic_output_bias, topic_prior_weight_init, TOPIC_OUTPUT_BIASES,
            topic_prior_weight_trainable=topic_prior_weight_trainable)
        if topic_output_bias and self.output_prior_unavailable(lm_type=lm_type):
            raise ValueError(self.output_prior_unavailable(lm_type=lm_type))
        if lm_topic_input not in LM_TOPIC_INPUTS:
            raise ValueError(f"lm_topic_input must be one of {LM_TOPIC_INPUTS}, got {lm_topic_input!r}")
        self.vocab_size = vocab_size
        self.topic_vocab_size = topic_vocab_size
        self.num_topics = num_topics
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_factors = num_factors
        self.dropout = dropout
        self.encoder_hidden_size = encoder_hidden_size
        self.topic_embedding_size = topic_embedding_size
        self.prior_mean = float(prior_mean)
        self.prior_std = float(prior_std)
        self.diversity_weight = float(diversity_weight)
        self.lm_type = lm_type
        self.kl_annealing_steps = kl_annealing_steps
        self.topic_loss_normalization = topic_loss_normalization
        self.tie_word_embeddings = tie_word_embeddings
        self.initializer_range = initializer_range
        self.topic_factor_spread = None if topic_factor_spread is None else float(topic_factor_spread)
        self.lm_topic_input = lm_topic_input
        self.topic_output_bias = topic_output_bias
        self.topic_prior_weight_init = topic_prior_weight_init
        self.topic_prior_weight_trainable = topic_prior_weight_trainable
        self.topic_word_ids = self.checked_topic_word_ids(topic_word_ids, topic_vocab_size, vocab_size)
        self.use_cache = use_cache
        kwargs = self._pop_classifier_settings(kwargs)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         unk_token_id=unk_token_id, **kwargs)


__all__ = ["LM_TOPIC_INPUTS", "LM_TYPES", "TCNLMConfig", "TOPIC_LOSS_NORMALIZATIONS", "TOPIC_OUTPUT_BIASES"]
