"""Configuration of NCLM, the Neural Composite Language Model (Chaudhary, Schütze & Gupta, ICML 2020)."""

from transformers import PretrainedConfig

from .configuration_common import (KEYS_TO_IGNORE_AT_INFERENCE, ClassifierConfigMixin, CompactReprMixin,
                                   TopicConfigMixin, check_integers, check_topic_output_prior)

VARIANTS = ("lta", "eta", "leta")
SDT_MODES = ("prefix", "minus_target")
ETR_WEIGHTINGS = ("proportions", "softmax_of_proportions")
ETR_SELECTIONS = ("masked_topk", "multiply_mask")
ETR_EMBEDDINGS = ("lm", "frozen", "decoder")
ENCODER_ACTIVATIONS = ("sigmoid", "relu", "tanh")


class NCLMConfig(TopicConfigMixin, ClassifierConfigMixin, CompactReprMixin, PretrainedConfig):
    r"""Configuration of :class:`NCLMModel` and :class:`NCLMForCausalLM`.

    The defaults are the paper's and its official code's (``YatinChaudhary/NCLM`` on GitHub): an NVDM
    with a Gaussian-softmax output, 150 topics, a 256-unit sigmoid encoder and 10 samples; the
    small LM (one LSTM layer of 600 units, 300-d embeddings, dropout 0.4); alpha = 0.01 (APNEWS);
    ETR from the top 20 words of each topic. Options marked *replicates the official code* or
    *leaky* exist to reproduce published numbers and are off by default.

    Args:
        vocab_size: LM vocabulary size V.
        topic_vocab_size: topic-model vocabulary size V_c (``len(topic_tokenizer)``; id 0 is ``<unk>``,
            never counted and never a topic word).
        num_topics: K, the NVDM's latent dimension (= number of topics).
        encoder_hidden_size: width of the NVDM encoder's hidden layer (256).
        encoder_activation: its non-linearity (``"sigmoid"``, the official code).
        num_topic_samples: Gaussian samples averaged in training (10): the reconstruction loss is their
            mean and the topic representation the mean of their softmaxes. Evaluation, generation and
            features use softmax(mu) (deterministic; the official code samples there too).
        embedding_size: E, the LM's word embeddings (300).
        hidden_size: H, the LSTM size (600 small, 900 large).
        num_hidden_layers: stacked LSTM layers (1 small, 2 large).
        dropout: on the input embeddings, between layers and on the LSTM output (0.4).
        variant: the topic representation c composed with the LSTM output:
            ``"lta"``: the latent topic representation h (the K proportions);
            ``"eta"``: the explainable one, z = sum_k w_k z_k, z_k the mean embedding of topic k's top
            ``etr_top_n`` words present in the context;
            ``"leta"``: both, [z; h] (the official code's order).
        sentence_topics: SDT, add the same representation computed from the current sentence.
        sdt_mode: what the sentence part reads when predicting word t of a sentence:
            ``"prefix"`` (default, causal): the words before t of the sentence (earlier chunks
            included when the batch has ``sentence_prefix_bow``, or through the carried state);
            ``"minus_target"`` (*leaky*, replicates the paper and the official code): the chunk's words
            minus the target position, i.e. it reads the words *after* the target.
            ``evaluate_perplexity`` refuses to call a perplexity causal in that mode.
        etr_top_n: N, words per topic in ETR (20 for APNEWS and IMDB in the official scripts).
        etr_weighting: ``"proportions"`` (z = sum_k h_k z_k, the paper's text applied to the GSM
            proportions) or ``"softmax_of_proportions"`` (*replicates the official code*: softmax of
            h, which is already a softmax; the weights then differ by at most a factor e).
        etr_selection: ``"masked_topk"`` (the top-N among the words present; fewer when fewer are
            present, none: z_k = 0) or ``"multiply_mask"`` (*replicates the official code*: top-N of
            mask * W_k, so absent words (score 0) outrank present words with negative weight).
        etr_embedding: the word vectors E of ETR (never trained through ETR, like the paper's frozen
            fastText): ``"lm"`` (default: the LM's own input embeddings, read without gradient; no
            pretrained vectors can be downloaded here), ``"frozen"`` (a matrix given with
            :meth:`NCLMForCausalLM.set_etr_embeddings`, saved with the model) or ``"decoder"`` (the
            NVDM decoder's columns, K-dimensional: the official code's ``--prior-emb-for-topics False``).
        etr_embedding_size: the width of a ``"frozen"`` matrix (needed to build the model before it is set).
        etr_mask_includes_current_sentence: *leaky*, *replicates the official code*: the words "present"
            for ETR are the context's plus the current chunk's own words (the whole sentence when it
            fits one chunk), so ETR reads the words being predicted.
        alpha: the loss is ``alpha * L_NTM + (1 - alpha) * L_LM`` with both terms summed per chunk as in
            the official code (0.01 for APNEWS and BNC, 0.1 for IMDB); see the modeling module.
        topic_word_ids: the LM id of every topic-vocabulary entry (-1 for the topic ``<unk>``); set by
            :meth:`from_tokenizers`. Needed by ``etr_embedding="lm"`` and by the sentence topics.
        diversity_weight: lambda of TCNLM's diversity regulariser (Wang et al. 2018), here on the decoder rows
            W_k: the loss gets ``- diversity_weight * (mean - variance)`` of the pairwise angles between topics,
            against the NVDM's redundant topics (the same topic learnt several times). Not in the NCLM paper;
            0 = the paper.
        topic_output_bias, topic_prior_weight_init: ``"beta"`` adds the shared topic output prior
            (:class:`~.modeling_topic_family.TopicWordPriorMixin`, not in the paper):
            lambda * log(V_c p(w | h)) at every topic word, p(w | h) = softmax(W h + b) the NVDM decoder at the
            document's proportions h, lambda learned from ``topic_prior_weight_init``. Needs h: the ``"lta"``
            and ``"leta"`` variants. ``None``: the paper.
        topic_prior_weight_trainable: whether lambda learns (True) or is held at ``topic_prior_weight_init``
            (False: not trained, and :meth:`from_language_model` leaves it there rather than at 0), a prior
            the LM learns around.
        initializer_range: scale r of the uniform initialisation U(-r, r) of the LM.
        tie_word_embeddings: share the input embeddings and the output matrix (needs E == H).
        classifier_*, freeze_backbone: the head of the ``*ForSequenceClassification`` model
            (:class:`~.configuration_common.ClassifierConfigMixin`: an MLP on [o_N; c] by
            default, ``classifier_head="cnn"`` for the NCLM paper's CNN over [o_m; c]).

    Example:
        >>> from topic_lm_hf import NCLMConfig, NCLMForCausalLM
        >>> config = NCLMConfig(vocab_size=1000, topic_vocab_size=300, num_topics=20, embedding_size=32,
        ...                     hidden_size=64, variant="leta", topic_word_ids=list(range(4, 304)))
        >>> model = NCLMForCausalLM(config)
    """

    model_type = "nclm"
    keys_to_ignore_at_inference = [*KEYS_TO_IGNORE_AT_INFERENCE, "topic_representation"]

    @staticmethod
    def output_prior_unavailable(variant="lta", **settings):
        """ETA has no latent proportions h for the shared prior to read."""
        return ("topic_output_bias='beta' reads the proportions h of the latent representation: use variant='lta' "
                "or 'leta' (ETA has none)") if variant == "eta" else None

    def __init__(self, vocab_size=10000, topic_vocab_size=2000, num_topics=150, encoder_hidden_size=256,
                 encoder_activation="sigmoid", num_topic_samples=10, embedding_size=300, hidden_size=600,
                 num_hidden_layers=1, dropout=0.4, variant="lta", sentence_topics=False, sdt_mode="prefix",
                 etr_top_n=20, etr_weighting="proportions", etr_selection="masked_topk", etr_embedding="lm",
                 etr_embedding_size=None, etr_mask_includes_current_sentence=False, alpha=0.01, topic_word_ids=None,
                 initializer_range=0.1, tie_word_embeddings=False, diversity_weight=0.0, topic_output_bias=None,
                 topic_prior_weight_init=0.0, topic_prior_weight_trainable=True, use_cache=True, pad_token_id=0,
                 bos_token_id=2, eos_token_id=3, unk_token_id=1, **kwargs):
        check_integers(1, vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, num_topics=num_topics,
                       encoder_hidden_size=encoder_hidden_size, embedding_size=embedding_size, hidden_size=hidden_size,
                       num_hidden_layers=num_hidden_layers, etr_top_n=etr_top_n)
        check_integers(0, num_topic_samples=num_topic_samples)  # 0: softmax(mu) in training too
        if topic_vocab_size < 2:
            raise ValueError(f"topic_vocab_size must be >= 2 (<unk> plus at least one word), got {topic_vocab_size}")
        for name, value, allowed in (("variant", variant, VARIANTS), ("sdt_mode", sdt_mode, SDT_MODES),
                                     ("etr_weighting", etr_weighting, ETR_WEIGHTINGS),
                                     ("etr_selection", etr_selection, ETR_SELECTIONS),
                                     ("etr_embedding", etr_embedding, ETR_EMBEDDINGS),
                                     ("encoder_activation", encoder_activation, ENCODER_ACTIVATIONS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha (the topic model's share of the loss) must be in [0, 1), got {alpha!r}")
        if not initializer_range > 0:
            raise ValueError(f"initializer_range must be positive, got {initializer_range!r}")
        if etr_embedding == "frozen" and variant != "lta":
            if isinstance(etr_embedding_size, bool) or not isinstance(etr_embedding_size, int) \
                    or etr_embedding_size < 1:
                raise ValueError("etr_embedding='frozen' needs etr_embedding_size, the width of the matrix given to "
                                 f"set_etr_embeddings, got {etr_embedding_size!r}")
        if not diversity_weight >= 0:
            raise ValueError(f"diversity_weight must be >= 0, got {diversity_weight!r}")
        topic_output_bias, topic_prior_weight_init, topic_prior_weight_trainable = check_topic_output_prior(
            topic_output_bias, topic_prior_weight_init,
            topic_prior_weight_trainable=topic_prior_weight_trainable)
        if topic_output_bias and self.output_prior_unavailable(variant=variant):
            raise ValueError(self.output_prior_unavailable(variant=variant))
        if tie_word_embeddings and embedding_size != hidden_size:
            raise ValueError(f"tie_word_embeddings needs embedding_size == hidden_size (the output layer reads the "
                             f"H-dimensional composition), got {embedding_size} and {hidden_size}")
        self.vocab_size = vocab_size
        self.topic_vocab_size = topic_vocab_size
        self.num_topics = num_topics
        self.encoder_hidden_size = encoder_hidden_size
        self.encoder_activation = encoder_activation
        self.num_topic_samples = num_topic_samples
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.dropout = dropout
        self.variant = variant
        self.sentence_topics = bool(sentence_topics)
        self.sdt_mode = sdt_mode
        self.etr_top_n = etr_top_n
        self.etr_weighting = etr_weighting
        self.etr_selection = etr_selection
        self.etr_embedding = etr_embedding
        self.etr_embedding_size = etr_embedding_size
        self.etr_mask_includes_current_sentence = bool(etr_mask_includes_current_sentence)
        self.alpha = float(alpha)
        self.topic_word_ids = self.checked_topic_word_ids(topic_word_ids, topic_vocab_size, vocab_size)
        self.initializer_range = initializer_range
        self.tie_word_embeddings = tie_word_embeddings
        self.diversity_weight = float(diversity_weight)
        self.topic_output_bias = topic_output_bias
        self.topic_prior_weight_init = topic_prior_weight_init
        self.topic_prior_weight_trainable = topic_prior_weight_trainable
        self.use_cache = use_cache
        kwargs = self._pop_classifier_settings(kwargs)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         unk_token_id=unk_token_id, **kwargs)

    @property
    def uses_ltr(self) -> bool:
        return self.variant in ("lta", "leta")

    @property
    def uses_etr(self) -> bool:
        return self.variant in ("eta", "leta")

    @property
    def etr_size(self) -> int:
        """D, the width of the explainable topic representation z (0 for LTA)."""
        if not self.uses_etr:
            return 0
        return {"lm": self.embedding_size, "decoder": self.num_topics}.get(self.etr_embedding,
                                                                            self.etr_embedding_size)

    @property
    def document_topic_size(self) -> int:
        """|c| of the document part: K (LTA), D (ETA) or D + K (LETA)."""
        return self.etr_size + (self.num_topics if self.uses_ltr else 0)

    @property
    def topic_representation_size(self) -> int:
        """|c| composed with the LSTM output: the document part, twice with sentence topics."""
        return self.document_topic_size * (2 if self.sentence_topics else 1)

    def leaky_modes(self) -> list[str]:
        """The options on which make the model read words it predicts (empty by default)."""
        leaky = []
        if self.sentence_topics and self.sdt_mode == "minus_target":
            leaky.append("sdt_mode=minus_target")
        if self.uses_etr and self.etr_mask_includes_current_sentence:
            leaky.append("etr_mask_includes_current_sentence")
        return leaky


__all__ = ["ENCODER_ACTIVATIONS", "ETR_EMBEDDINGS", "ETR_SELECTIONS", "ETR_WEIGHTINGS", "NCLMConfig", "SDT_MODES",
           "VARIANTS"]
