"""Configuration of TopicRNN / TopicLSTM / TopicGRU (Dieng et al., ICLR 2017)."""

from __future__ import annotations

from typing import Optional, Sequence

from transformers import PretrainedConfig

from .configuration_common import (KEYS_TO_IGNORE_AT_INFERENCE, ClassifierConfigMixin, CompactReprMixin,
                                   TopicConfigMixin, check_integers, check_topic_output_prior)

CELLS = ("rnn", "lstm", "gru")


class TopicRNNConfig(TopicConfigMixin, ClassifierConfigMixin, CompactReprMixin, PretrainedConfig):
    r"""Configuration of :class:`TopicRNNForCausalLM` and :class:`TopicRNNForSequenceClassification`.

    Args:
        cell: the recurrent cell: ``"rnn"`` (TopicRNN, tanh), ``"lstm"`` (TopicLSTM) or ``"gru"`` (TopicGRU).
        vocab_size: LM vocabulary size V (special tokens included).
        topic_vocab_size: width V_c of the context bag of words (the topic tokenizer's length,
            ``<unk>`` at id 0 included).
        topic_word_ids: the LM id of every topic-vocabulary entry (length ``topic_vocab_size``; -1 for
            the topic ``<unk>`` at id 0). It decides the stop-word indicator: ``l_t = 1`` exactly when
            the target ``y_t`` is *not* a topic word (stop-list words, the most frequent words,
            non-alphabetic tokens, ``<eos>``, ``<unk>``). Set it with :meth:`from_tokenizers` or
            ``model.set_topic_vocabulary(tokenizer, topic_tokenizer)``; a causal LM without it refuses
            to run.
        embedding_size: word embedding size E.
        hidden_size: recurrent hidden size H.
        num_hidden_layers: stacked recurrent layers.
        num_topics: K, the dimension of the Gaussian topic vector theta.
        theta_transform: ``None`` (the paper): theta is the Gaussian vector itself, any real vector.
            ``"softmax"``: theta = softmax(W z + b) of the Gaussian sample z (the Gaussian softmax construction of
            Miao et al. 2017, TCNLM's topic proportions; not in the paper): theta is a distribution over the K
            topics, a document's largest entry is its dominant topic, ``topic_ids=[k]`` is the pure topic
            theta = e_k (a set S: 1/|S| on each) and ``topic_mixture`` must be a distribution. The KL is the
            Gaussian one, on z. The bag-of-words likelihood (``bow_loss_weight``, ``topic_model_loss``, the shared
            topic output prior) is then LDA's mixture p(w | theta) = sum_k theta_k softmax(B[:, k]) over the
            topic words, TCNLM's topic model: column k of B is topic k's word distribution (in log space), and
            the LM's topic bias B theta moves the logits towards the same words. It makes the columns of B read
            as topics, and ``topic_ids=[k]`` steers generation towards topic k's words.
        inference_hidden_size: units of each hidden layer of the inference network (200 in the
            paper's PTB experiments, 500 for IMDB).
        inference_num_layers: hidden layers of the inference network (2 in the paper).
        inference_input: how the context counts enter the inference network: ``"counts"`` (the
            paper's raw term frequencies), ``"log1p"`` or ``"frequencies"`` (counts / their sum).
        max_log_sigma: log sigma of q(theta) is clamped to [-max, max] so that exp() stays finite.
        kl_weight: weight of the KL term in ``loss`` (1 = the ELBO).
        kl_annealing_steps: the KL weight grows linearly from 0 to ``kl_weight`` over this many
            training forward passes (0 = no annealing, the paper). A training device against the
            posterior collapse of short runs; the model is unchanged.
        kl_free_bits: free bits (Kingma et al. 2016), in nats per topic dimension and document: in
            ``loss`` each dimension's batch-mean KL counts as max(kl_free_bits, KL_k), so the optimiser
            gains nothing by collapsing a dimension below it. 0 = the exact ELBO (the paper).
        bow_loss_weight: w of a bag-of-words likelihood term added to the loss, w * -sum_w n_w log p(w | theta)
            over the context's topic words with p(w | theta) = softmax(B theta) over the topic words, per
            context word (as TCNLM's topic terms; a context has ten times as many words as a chunk has
            tokens, so per predicted token it would swamp the LM's loss). Not in the paper's ELBO (a departure, like NCLM's alpha term): it gives
            the inference network and B a signal from the document's words themselves, against the posterior
            collapse. 0 = the paper. :meth:`TopicRNNForCausalLM.topic_model_loss` is this term plus the KL, per
            context word, the objective of :func:`~topic_lm_hf.pretrain_topic_model`.
        topic_output_bias, topic_prior_weight_init: ``"beta"`` adds the shared topic output prior
            (:class:`~.modeling_topic_family.TopicWordPriorMixin`, not in the paper):
            lambda * log(V_c p(w | theta)) at every topic word, p(w | theta) = softmax(B theta) over the topic
            words, lambda learned from ``topic_prior_weight_init``. ``"mixture"``: the topic distribution mixed
            into the output in place of the paper's b_i^T theta, (1 - g_t) softmax(V h_t + c) + g_t p(w | theta)
            (p(w | theta) = 0 at stop words), with a gate g_t = sigmoid(a^T h_t + b) learned per position (b
            starts at logit(0.1)): a wrong document's topics cost it at most -log(1 - g_t) per token, where a
            logit prior can cost any amount (``topic_prior_weight_init`` is unused). ``None``: the paper.
        topic_prior_weight_trainable: whether lambda learns (True) or is held at ``topic_prior_weight_init``
            (False: not trained, and :meth:`from_language_model` leaves it there rather than at 0), a prior
            the LM learns around.
        topic_free_loss_weight: w of the LM's own loss without its topics, w * -log softmax(V h_t + c)_{y_t} per
            predicted token, added to the objective (not in the paper): the recurrent LM is trained to be a
            language model on its own, so that the topics add to it rather than stand in for part of it (what
            the mismatched-context ablation measures). 0 = the paper.
        dropout: dropout on embeddings, between recurrent layers and before the output layers
            (the paper uses none).
        feature_log_sigma: the document topic representation (``document_topic_representation``, the
            classifier's c) is [mean; log sigma] of q(theta) rather than the mean alone.
        classifier_*, freeze_backbone: :class:`TopicRNNForSequenceClassification`'s head
            (:class:`~.configuration_common.ClassifierConfigMixin`); the defaults are the
            paper's MLP with 50 sigmoid units (after Le & Mikolov 2014) on frozen features.
        initializer_range: weights are initialised uniformly in [-r, r].
        steering_scale: what ``topic_ids`` mean for the paper's real-valued theta (``theta_transform=None``):
            ``topic_ids=[k]`` is
            theta = ``steering_scale`` * e_k, and a set S of topics is
            theta = ``steering_scale`` * sum_{k in S} e_k / sqrt(|S|) (the same norm). The prior is
            N(0, I), so the default 3.0 is three prior standard deviations along topic k: the topic
            bias B theta then adds 3 B[:, k] to the logits of topic words, favouring topic k's top
            words (the largest entries of column k, :meth:`get_topics`).

    Example:
        >>> from topic_lm_hf import TopicRNNConfig, TopicRNNForCausalLM
        >>> config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="gru", hidden_size=300, num_topics=50)
        >>> model = TopicRNNForCausalLM(config)
    """

    model_type = "topic_rnn"
    keys_to_ignore_at_inference = [*KEYS_TO_IGNORE_AT_INFERENCE]

    def __init__(self, cell: str = "rnn", vocab_size: int = 10000, topic_vocab_size: int = 5000,
                 topic_word_ids: Optional[Sequence[int]] = None, embedding_size: int = 300, hidden_size: int = 300,
                 num_hidden_layers: int = 1, num_topics: int = 50, inference_hidden_size: int = 200,
                 inference_num_layers: int = 2, inference_input: str = "counts", max_log_sigma: float = 10.0,
                 kl_weight: float = 1.0, kl_annealing_steps: int = 0, kl_free_bits: float = 0.0,
                 dropout: float = 0.0, bow_loss_weight: float = 0.0, topic_output_bias: Optional[str] = None,
                 topic_prior_weight_init: float = 0.0, topic_prior_weight_trainable: bool = True,
                 topic_free_loss_weight: float = 0.0,
                 feature_log_sigma: bool = True, initializer_range: float = 0.1,
                 use_cache: bool = True, pad_token_id: int = 0, bos_token_id: int = 2, eos_token_id: int = 3,
                 unk_token_id: int = 1, steering_scale: float = 3.0, theta_transform: Optional[str] = None,
                 **kwargs):
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
        check_integers(1, vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, embedding_size=embedding_size,
                       hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, num_topics=num_topics,
                       inference_hidden_size=inference_hidden_size, inference_num_layers=inference_num_layers)
        if inference_input not in ("counts", "log1p", "frequencies"):
            raise ValueError(f"inference_input must be 'counts', 'log1p' or 'frequencies', got {inference_input!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if not max_log_sigma > 0:
            raise ValueError(f"max_log_sigma must be positive, got {max_log_sigma}")
        if theta_transform not in (None, "softmax"):
            raise ValueError(f"theta_transform must be None (the paper's Gaussian theta) or 'softmax', "
                             f"got {theta_transform!r}")
        if not steering_scale > 0:
            raise ValueError(f"steering_scale must be positive, got {steering_scale!r}")
        if not kl_free_bits >= 0:
            raise ValueError(f"kl_free_bits must be >= 0, got {kl_free_bits!r}")
        if not bow_loss_weight >= 0:
            raise ValueError(f"bow_loss_weight must be >= 0, got {bow_loss_weight!r}")
        if isinstance(topic_free_loss_weight, bool) or not isinstance(topic_free_loss_weight, (int, float)) \
                or not 0 <= topic_free_loss_weight < float("inf"):
            raise ValueError(f"topic_free_loss_weight must be a finite number >= 0, got {topic_free_loss_weight!r}")
        topic_output_bias, topic_prior_weight_init, topic_prior_weight_trainable = check_topic_output_prior(
            topic_output_bias, topic_prior_weight_init, allowed=(None, "beta", "mixture"),
            topic_prior_weight_trainable=topic_prior_weight_trainable)
        if not kl_weight >= 0:
            raise ValueError(f"kl_weight must be >= 0, got {kl_weight}")
        check_integers(0, kl_annealing_steps=kl_annealing_steps)
        self.cell = cell
        self.vocab_size = vocab_size
        self.topic_vocab_size = topic_vocab_size
        self.topic_word_ids = self.checked_topic_word_ids(topic_word_ids, topic_vocab_size, vocab_size)
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_topics = num_topics
        self.inference_hidden_size = inference_hidden_size
        self.inference_num_layers = inference_num_layers
        self.inference_input = inference_input
        self.max_log_sigma = float(max_log_sigma)
        self.kl_weight = float(kl_weight)
        self.kl_annealing_steps = kl_annealing_steps
        self.kl_free_bits = float(kl_free_bits)
        self.dropout = dropout
        self.bow_loss_weight = float(bow_loss_weight)
        self.topic_free_loss_weight = float(topic_free_loss_weight)
        self.topic_output_bias = topic_output_bias
        self.topic_prior_weight_init = topic_prior_weight_init
        self.topic_prior_weight_trainable = topic_prior_weight_trainable
        self.feature_log_sigma = feature_log_sigma
        self.initializer_range = initializer_range
        self.steering_scale = float(steering_scale)
        self.theta_transform = theta_transform
        self.use_cache = use_cache
        kwargs = self._pop_classifier_settings(kwargs)
        kwargs.pop("tie_word_embeddings", None)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         unk_token_id=unk_token_id,
                         tie_word_embeddings=False, **kwargs)
        if self.topic_word_ids is not None:
            self.validate_topic_word_ids()

    def validate_topic_word_ids(self) -> None:
        """Raise ``ValueError`` unless ``topic_word_ids`` fits ``vocab_size`` and ``topic_vocab_size``."""
        ids = self.topic_word_ids
        if ids is None:
            raise ValueError(
                "topic_word_ids is not set, so the stop-word indicator is unknown: build the config with "
                "TopicRNNConfig.from_tokenizers(tokenizer, topic_tokenizer, ...) or call "
                "model.set_topic_vocabulary(tokenizer, topic_tokenizer) before training or evaluating")
        if len(ids) != self.topic_vocab_size:
            raise ValueError(f"topic_word_ids has {len(ids)} entries but topic_vocab_size is "
                             f"{self.topic_vocab_size}: mismatched vocabularies")
        bad = [i for i in ids if i < -1 or i >= self.vocab_size]
        if bad:
            raise ValueError(f"topic_word_ids must be LM ids in [0, {self.vocab_size}) or -1, got {bad[:5]}")
        real = [i for i in ids if i >= 0]
        if len(set(real)) != len(real):
            raise ValueError("topic_word_ids maps two topic words to the same LM id")
        if not real:
            raise ValueError("topic_word_ids has no topic word: every target would be a stop word")


__all__ = ["CELLS", "TopicRNNConfig"]
