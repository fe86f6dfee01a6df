"""Configuration of GBN-RNN and rGBN-RNN (Guo, Chen, Lu & Zhou, ICML 2020)."""

from transformers import PretrainedConfig

from .configuration_common import (KEYS_TO_IGNORE_AT_INFERENCE, ClassifierConfigMixin, CompactReprMixin,
                                   TopicConfigMixin, check_integers, check_topic_output_prior)

COUPLINGS = ("same", "reversed")
GATES = ("paper", "official")
THETA_NORMALIZATIONS = ("max", "none")
TOPIC_LEARNINGS = ("tlasgr", "gradient")
LOSS_PRESETS = {
    # the paper's ELBO (eq. 6): every term with weight 1
    "elbo": (1.0, (1.0, 1.0, 1.0)),
    # the official code: loss = LM + 1e-3 * (-(Poisson - 0.1 KL1 - 0.01 KL2 - 0.001 KL3)), against summed token NLL
    "official": (1e-3, (1e-4, 1e-5, 1e-6)),
}
EVAL_THETAS = ("mean", "sample")


class RGBNRNNConfig(TopicConfigMixin, ClassifierConfigMixin, CompactReprMixin, PretrainedConfig):
    r"""Configuration of :class:`RGBNRNNModel` and :class:`RGBNRNNForCausalLM`.

    Paper = the ICLR text of Guo et al. 2020 (https://arxiv.org/abs/1912.10337), "code" = the official TensorFlow
    code (``BoChenGroup/rGBN_RNN`` on GitHub). Defaults are the paper's; options marked *official code* replicate the
    trained TensorFlow model.

    Args:
        vocab_size: LM vocabulary size V.
        topic_vocab_size: V_c (``len(topic_tokenizer)``; id 0, ``<unk>``, is never counted).
        topic_sizes: K_1..K_L, topics per layer, bottom first (1 to 3 layers, non-increasing): [100, 80, 50].
        hidden_sizes: H_1..H_L, the stacked LSTM's sizes, bottom first (one per topic layer): [600, 512, 256].
        embedding_size: E (300).
        dropout: on the embeddings and on every gated layer output a^l (0.4; keep 0.6 in the code).
        recurrent: True: rGBN-RNN (transition matrices Pi^l, eq. 2); False: GBN-RNN (Pi = 0, gamma prior
            Gam(1, tau0) at the top for every sentence).
        recurrent_encoder: the Weibull encoder's recurrence over sentences (eq. 8); ``None`` follows
            ``recurrent``. False is the trained code's feed-forward encoder.
        coupling: which topic layer gates which LSTM layer: ``"same"`` (paper: LSTM l <-> theta^l) or
            ``"reversed"`` (*official code*: LSTM l <-> theta^{L+1-l}).
        gate: ``"paper"`` a = (1 - z) h + z h~ or ``"official"`` a = (1 - z) h~ + z h (*official code*). The z bias
            is initialised so that both pass sigmoid(1) = 73 % of h at the start (the code's bias of 1).
        theta_normalization: ``"max"`` (*official code*; the paper is silent): the gate reads theta / max_k theta_k;
            ``"none"``: the raw theta.
        topic_learning: how Phi and Pi are learned: ``"tlasgr"`` (paper: TLASGR-MCMC on the simplex, buffers
            updated after every optimizer step) or ``"gradient"`` (*alternative*: softmax-parameterised columns
            trained by the loss's gradient).
        tau0: the gamma rate (and shape scale) tau0 (1).
        eta_phi, eta_pi: Dirichlet prior pseudo-counts of the columns of Phi (0.1) and Pi (1).
        tlasgr_step_tau, tlasgr_step_kappa, tlasgr_step_epsilon: the step size
            eps_t = epsilon ((tau + t + 1) / (tau + 1))^-kappa (20, 0.7, 1).
        tlasgr_fisher_kappa: the Fisher estimate M is averaged with rho_t = (t + 1)^-kappa (0.9).
        tlasgr_corpus_size: rows (documents) of the training set; the statistics of a minibatch of n rows are scaled
            by corpus_size / n. ``TopicLMTrainer`` sets it from the training set; ``None`` scales by 1.
        tlasgr_seed: seeds the Langevin noise of step t (the same on every process, so that all hold the same Phi).
        loss_preset: weights of the topic-model terms: ``"elbo"`` (paper eq. 6, all 1) or ``"official"``
            (*official code*: Poisson 1e-3, KL 1e-4 / 1e-5 / 1e-6 relative to the summed token NLL).
        k_min, k_max: clamps of the Weibull shape k (0.1, 10, PyDPM's WHAI).
        eval_theta: theta outside training: ``"mean"`` (lambda Gamma(1 + 1/k), deterministic) or ``"sample"``
            (one Weibull draw, as the code).
        train_theta: theta the language model reads in training: ``"sample"`` (one Weibull draw, the paper) or
            ``"mean"`` (deterministic, and so are the topic terms of the same pass). A model whose topics are held
            uninformative (a matched topic-free baseline) then reads the same topics in training as in evaluation,
            not noise.
        carry_token_state: a documents batch (training) runs the LSTM of every layer with its state carried across
            each document's chunks, in order, as ``evaluate_perplexity(..., "causal-carry")`` feeds them, rather
            than every chunk from a zero state (False: the paper). Chunk batches carry it with ``state`` either way.
        initializer_range: r of the uniform initialisation U(-r, r) of the LM and gate weights (0.05, the code's).
        topic_output_bias, topic_prior_weight_init: ``"beta"`` adds the shared topic output prior
            (:class:`~.modeling_topic_family.TopicWordPriorMixin`, not in the paper):
            lambda * log(V_c p(w | theta^1)) at every topic word, p(w | theta^1) = Phi^1 theta^1 normalised (the
            first layer's Poisson rate of the sentence's words as a distribution), lambda learned from
            ``topic_prior_weight_init``; ``"learned"``: B theta^1 instead, theta^1 normalised, a free B
            (V x K_1) zero at initialisation (TCNLM's option). ``None``: the paper.
        topic_prior_weight_trainable: whether lambda learns (True) or is held at ``topic_prior_weight_init``
            (False: not trained, and :meth:`from_language_model` leaves it there rather than at 0), a prior
            the LM learns around.
        tie_word_embeddings: not supported (the output layer reads sum_l H_l features).
        classifier_*, freeze_backbone: the head of :class:`RGBNRNNForSequenceClassification`
            (:class:`~.configuration_common.ClassifierConfigMixin`).

    Example:
        >>> config = RGBNRNNConfig(vocab_size=1000, topic_vocab_size=300, topic_sizes=[10, 6],
        ...                        hidden_sizes=[32, 16], embedding_size=16)
        >>> model = RGBNRNNForCausalLM(config)
    """

    model_type = "rgbn_rnn"
    keys_to_ignore_at_inference = [*KEYS_TO_IGNORE_AT_INFERENCE, "theta"]

    def __init__(self, vocab_size=10000, topic_vocab_size=2000, topic_sizes=(100, 80, 50), hidden_sizes=(600, 512, 256),
                 embedding_size=300, dropout=0.4, recurrent=True, recurrent_encoder=None, coupling="same", gate="paper",
                 theta_normalization="max", topic_learning="tlasgr", tau0=1.0, eta_phi=0.1, eta_pi=1.0,
                 tlasgr_step_tau=20.0, tlasgr_step_kappa=0.7, tlasgr_step_epsilon=1.0, tlasgr_fisher_kappa=0.9,
                 tlasgr_corpus_size=None, tlasgr_seed=0, loss_preset="elbo", k_min=0.1, k_max=10.0, eval_theta="mean",
                 train_theta="sample",
                 topic_word_ids=None, initializer_range=0.05, tie_word_embeddings=False, topic_output_bias=None,
                 topic_prior_weight_init=0.0, topic_prior_weight_trainable=True, carry_token_state=False,
                 use_cache=True,
                 pad_token_id=0, bos_token_id=2, eos_token_id=3, unk_token_id=1, **kwargs):
        for name, instead in (("num_topics", "topic_sizes"), ("hidden_size", "hidden_sizes"),
                              ("num_hidden_layers", "len(topic_sizes)")):
            if name in kwargs:  # the other families' names: a per-layer list here, not one number
                raise ValueError(f"RGBNRNNConfig has no {name} (got {kwargs[name]!r}); give {instead} (one entry per "
                                 "layer, bottom first)")
        for name, value in (("topic_sizes", topic_sizes), ("hidden_sizes", hidden_sizes)):
            if not isinstance(value, (list, tuple)):  # a scalar: one entry per layer is wanted
                raise ValueError(f"{name} takes one size per layer, bottom first (a list such as [{value!r}]), got "
                                 f"{value!r}")
        topic_sizes, hidden_sizes = list(topic_sizes), list(hidden_sizes)
        check_integers(1, vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, embedding_size=embedding_size)
        check_integers(0, tlasgr_seed=tlasgr_seed)
        if not 1 <= len(topic_sizes) <= 3:
            raise ValueError(f"topic_sizes must have 1 to 3 layers, got {topic_sizes}")
        if len(hidden_sizes) != len(topic_sizes):
            raise ValueError(f"hidden_sizes needs one LSTM size per topic layer ({len(topic_sizes)}), got "
                             f"{hidden_sizes}")
        for i, (k, h) in enumerate(zip(topic_sizes, hidden_sizes)):
            check_integers(1, **{f"topic_sizes[{i}]": k, f"hidden_sizes[{i}]": h})
        if any(a < b for a, b in zip(topic_sizes, topic_sizes[1:])):
            raise ValueError(f"topic_sizes must be non-increasing from the bottom layer up, got {topic_sizes}")
        if topic_vocab_size < 2:
            raise ValueError(f"topic_vocab_size must be >= 2 (<unk> plus at least one word), got {topic_vocab_size}")
        for name, value, allowed in (("coupling", coupling, COUPLINGS), ("gate", gate, GATES),
                                     ("theta_normalization", theta_normalization, THETA_NORMALIZATIONS),
                                     ("topic_learning", topic_learning, TOPIC_LEARNINGS),
                                     ("loss_preset", loss_preset, tuple(LOSS_PRESETS)),
                                     ("eval_theta", eval_theta, EVAL_THETAS),
                                     ("train_theta", train_theta, EVAL_THETAS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        for name, value in (("tau0", tau0), ("eta_phi", eta_phi), ("eta_pi", eta_pi), ("k_min", k_min),
                            ("tlasgr_step_epsilon", tlasgr_step_epsilon), ("tlasgr_fisher_kappa", tlasgr_fisher_kappa),
                            ("initializer_range", initializer_range)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not (isinstance(tlasgr_step_tau, (int, float)) and tlasgr_step_tau >= 0 and tlasgr_step_kappa >= 0):
            raise ValueError(f"tlasgr_step_tau and tlasgr_step_kappa must be >= 0, got {tlasgr_step_tau!r}, "
                             f"{tlasgr_step_kappa!r}")
        if not k_max > k_min:
            raise ValueError(f"k_max must exceed k_min, got k_min={k_min!r}, k_max={k_max!r}")
        if tlasgr_corpus_size is not None:
            check_integers(1, tlasgr_corpus_size=tlasgr_corpus_size)
        topic_output_bias, topic_prior_weight_init, topic_prior_weight_trainable = check_topic_output_prior(
            topic_output_bias, topic_prior_weight_init, allowed=(None, "beta", "learned"),
            topic_prior_weight_trainable=topic_prior_weight_trainable)
        if not isinstance(carry_token_state, bool):
            raise ValueError(f"carry_token_state must be a bool, got {carry_token_state!r}")
        if tie_word_embeddings:
            raise ValueError("tie_word_embeddings is not supported: the output layer reads the concatenation of all "
                             "layers' outputs (sum of hidden_sizes), not an embedding")
        self.vocab_size = vocab_size
        self.topic_vocab_size = topic_vocab_size
        self.topic_sizes = topic_sizes
        self.hidden_sizes = hidden_sizes
        self.embedding_size = embedding_size
        self.dropout = float(dropout)
        self.recurrent = bool(recurrent)
        self.recurrent_encoder = self.recurrent if recurrent_encoder is None else bool(recurrent_encoder)
        self.coupling = coupling
        self.gate = gate
        self.theta_normalization = theta_normalization
        self.topic_learning = topic_learning
        self.tau0 = float(tau0)
        self.eta_phi = float(eta_phi)
        self.eta_pi = float(eta_pi)
        self.tlasgr_step_tau = float(tlasgr_step_tau)
        self.tlasgr_step_kappa = float(tlasgr_step_kappa)
        self.tlasgr_step_epsilon = float(tlasgr_step_epsilon)
        self.tlasgr_fisher_kappa = float(tlasgr_fisher_kappa)
        self.tlasgr_corpus_size = tlasgr_corpus_size
        self.tlasgr_seed = tlasgr_seed
        self.loss_preset = loss_preset
        self.k_min = float(k_min)
        self.k_max = float(k_max)
        self.eval_theta = eval_theta
        self.train_theta = train_theta
        self.topic_word_ids = self.checked_topic_word_ids(topic_word_ids, topic_vocab_size, vocab_size)
        self.initializer_range = float(initializer_range)
        self.tie_word_embeddings = False
        self.topic_output_bias = topic_output_bias
        self.topic_prior_weight_init = topic_prior_weight_init
        self.topic_prior_weight_trainable = topic_prior_weight_trainable
        self.carry_token_state = carry_token_state
        self.use_cache = use_cache
        kwargs = self._pop_classifier_settings(kwargs)
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         unk_token_id=unk_token_id, **kwargs)

    @property
    def num_layers(self) -> int:
        return len(self.topic_sizes)

    @property
    def num_topics(self) -> int:
        """K_1, the bottom layer's topics (what shared code that asks for ``num_topics`` gets)."""
        return self.topic_sizes[0]

    @property
    def loss_weights(self) -> tuple[float, tuple[float, ...]]:
        """(weight of the Poisson term, weight of each layer's KL)."""
        poisson, kl = LOSS_PRESETS[self.loss_preset]
        return poisson, kl[:self.num_layers]

    def topic_layer_of_lstm(self, layer: int) -> int:
        """The topic layer (0-based) that gates LSTM layer ``layer`` (0-based)."""
        return layer if self.coupling == "same" else self.num_layers - 1 - layer


__all__ = ["COUPLINGS", "EVAL_THETAS", "GATES", "LOSS_PRESETS", "RGBNRNNConfig", "THETA_NORMALIZATIONS",
           "TOPIC_LEARNINGS"]
