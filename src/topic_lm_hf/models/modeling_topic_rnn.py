"""TopicRNN, TopicLSTM and TopicGRU (Dieng, Wang, Gao & Paisley, ICLR 2017).

Notation: b batch, s tokens, E embedding size, H hidden size, L recurrent layers, V LM vocabulary,
V_c topic vocabulary, K topics. theta (b, K); B (V_c, K); stop-word indicator l (b, s).

The model (paper §3), for a sentence y_1..y_T whose context bag of words is X_c:

    theta ~ N(0, I)                                  a Gaussian vector, no softmax
    h_t = cell(x_t, h_{t-1}),  x_t = y_{t-1}        cell = RNN (tanh), LSTM or GRU
    l_t ~ Bernoulli(sigmoid(Gamma^T h_t))            stop-word indicator
    p(y_t = i | h_t, theta, l_t) ∝ exp(v_i^T h_t + c_i + (1 - l_t) b_i^T theta)

ONE softmax over the whole vocabulary V. Two decisions, both documented in the config too:

* The indicator is observed in training: ``l_t = 1`` exactly when the target ``y_t`` is not a word of
  the topic vocabulary (``config.topic_word_ids``): stop-list words, the most frequent words,
  non-alphabetic tokens, ``<eos>`` and ``<unk>``. It is the complement of what the inference
  network sees, as in the paper (X_c excludes the stop words).
* The topic term of a stop word is zero: b_i = 0 whenever word i is a stop word, so B is stored
  over the topic vocabulary only (``topic_head.weight``, (V_c, K)) and scattered into V. The paper
  draws B as K x C over all words; its stop-word rows only ever enter the normaliser of content-word
  predictions, and fixing them at zero makes "topics" exactly the rows of B.

q(theta | X_c) = N(mu, diag(sigma^2)) from an MLP with ReLU units on the context counts; a
reparameterised sample in training, theta = mu in eval mode. With ``config.theta_transform="softmax"``
(not in the paper) theta = softmax(W z + b) of that Gaussian z: topic proportions, with LDA's mixture
sum_k theta_k softmax(B[:, k]) as the bag-of-words likelihood, and the KL is the same, on z.

Loss, all terms on ONE per-token scale (n = predicted tokens of the batch, -100 labels excluded):

    lm_loss  = -(1/n) sum_t log p(y_t | h_t, theta, l_t)       (observed indicator)
    aux_loss = -(1/n) sum_t log p(l_t | h_t)                   (BCE with logits on Gamma^T h_t)
    kl_loss  =  (1/n) sum_rows KL(q(theta | X_c) || N(0, I))   (one theta per row)
    loss     = lm_loss + aux_loss + kl_weight * kl_loss   = -ELBO / n   when kl_weight = 1

(``config.kl_annealing_steps`` > 0 ramps the KL weight up from 0 over that many training forward
passes, counted in the saved buffer ``kl_annealing_step``; ``config.kl_free_bits`` > 0 replaces each
dimension's batch-mean KL by max(kl_free_bits, KL_k) in ``loss``; both are departures from the exact
ELBO against posterior collapse; ``kl_loss`` always reports the plain KL.)

Duplicating every row of a batch leaves all four numbers unchanged.

Evaluation marginalises the unknown indicator: ``logits`` are the log of
p(y_t) = sigmoid(z_t) p(y_t | l=1) + (1 - sigmoid(z_t)) p(y_t | l=0), z_t = Gamma^T h_t, already
normalised, so ``log_softmax(logits) == logits`` and every evaluator of the package reads the
marginal (in training mode with labels they are skipped: the objective does not need them).
``topic_mixture`` in the output is the theta that was used.

Usage::

    config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="gru", hidden_size=300, num_topics=50)
    model = TopicRNNForCausalLM(config)           # train with TopicLMTrainer + TopicContextCollator
    model.get_topics(top_n=10, topic_tokenizer=topic_tok)   # columns of B
    model.generate(**prompt, context_bow=bow)     # theta = E[q(theta | bow)], inferred once
    model.generate(topic_mixture=theta)           # any theta in R^K
    model.generate(topic_ids=[3])                 # theta = config.steering_scale * e_3 (proportions: e_3)
    features = model.document_representation(batch)   # [last state; mu; log sigma]
    clf = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin
from transformers.utils import ModelOutput

from .configuration_topic_rnn import TopicRNNConfig
from .modeling_conditioning import (TOPIC_LOGIT_INIT_STD, TopicConditioning, bags_of_words, lm_to_topic_index,
                                    topic_ids_to_mixture, topic_scores_to_vocab, topic_word_mask)
from .modeling_generation import TopicGenerationMixin
from .modeling_document import DocumentClassifierMixin, DocumentRepresentationMixin
from .modeling_recurrent import (RecurrentPreTrainedModel, TopicLMOutput, effective_weight, next_token_loss,
                                 run_token_rnn, state_from_aliases)
from .modeling_topic_family import LanguageModelPass, LossTerm, TopicFamilyForCausalLM, lstm_language_model_weights

# topic_output_bias="mixture": the gate's share g_t of the topic distribution at initialisation
TOPIC_GATE_INIT = 0.1

_CELLS = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


@dataclass
class TopicRNNModelOutput(ModelOutput):
    """Output of :class:`TopicRNNModel`.

    Args:
        last_hidden_state: (b, s, H) outputs of the top recurrent layer (zero at padding).
        state: batch-first recurrent state after each row's last real token: ``(h, c)`` for an
            LSTM, ``(h,)`` otherwise, each (b, L, H).
        topic_mean: (b, K) mean of q(theta | context_bow), when a context was given (of z, with
            ``theta_transform="softmax"``).
        topic_log_sigma: (b, K) log standard deviation of q(theta | context_bow).
        hidden_states: with ``output_hidden_states=True``, the embeddings fed to the first layer and every
            layer's outputs (see :class:`TopicLMOutput`).
    """

    last_hidden_state: Optional[torch.Tensor] = None
    state: Optional[tuple[torch.Tensor, ...]] = None
    topic_mean: Optional[torch.Tensor] = None
    topic_log_sigma: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None


def gaussian_kl(mean: torch.Tensor, log_sigma: torch.Tensor, per_dimension: bool = False) -> torch.Tensor:
    """KL(N(mean, sigma^2) || N(0, I)) per row: (b, K) -> (b,), or (b, K) with ``per_dimension``."""
    kl = 0.5 * (mean.pow(2) + torch.exp(2 * log_sigma) - 1.0 - 2 * log_sigma)
    return kl if per_dimension else kl.sum(-1)


class TopicRNNPreTrainedModel(RecurrentPreTrainedModel):
    config_class = TopicRNNConfig
    _no_split_modules = ["TopicRNNModel"]
    conditioning_inputs = ("context_bow", "topic_mixture", "topic_ids")
    training_context = "others"

    def _init_weights(self, module):
        super()._init_weights(module)
        if self.config.theta_transform == "softmax" and isinstance(getattr(module, "topic_head", None), nn.Linear):
            # B's columns are the topics' word logits: distinct random distributions from the start
            nn.init.normal_(module.topic_head.weight, 0.0, TOPIC_LOGIT_INIT_STD)
        if isinstance(getattr(module, "topic_gate", None), nn.Linear):
            # the topic distribution starts with a share of 0.1 of the content-word branch, wherever it is
            nn.init.zeros_(module.topic_gate.weight)
            nn.init.constant_(module.topic_gate.bias, math.log(TOPIC_GATE_INIT / (1 - TOPIC_GATE_INIT)))

    def set_topic_vocabulary(self, tokenizer, topic_tokenizer) -> None:
        """Set ``config.topic_word_ids`` (hence the stop-word indicator) from the two tokenizers."""
        if len(tokenizer) != self.config.vocab_size or len(topic_tokenizer) != self.config.topic_vocab_size:
            raise ValueError(f"The model has vocab_size={self.config.vocab_size}, topic_vocab_size="
                             f"{self.config.topic_vocab_size} but the tokenizers have {len(tokenizer)} and "
                             f"{len(topic_tokenizer)} entries: mismatched vocabularies")
        self.config.topic_word_ids = TopicRNNConfig.topic_word_ids_from_tokenizers(tokenizer, topic_tokenizer)
        self.config.validate_topic_word_ids()


class TopicRNNInferenceNetwork(nn.Module):
    """q(theta | X_c): an MLP with ReLU units on the context counts -> (mu, log sigma), each (b, K)."""

    def __init__(self, config: TopicRNNConfig):
        super().__init__()
        sizes = [config.topic_vocab_size] + [config.inference_hidden_size] * config.inference_num_layers
        self.layers = nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in zip(sizes[:-1], sizes[1:]))
        self.mean = nn.Linear(config.inference_hidden_size, config.num_topics)
        self.log_sigma = nn.Linear(config.inference_hidden_size, config.num_topics)
        if config.theta_transform == "softmax":  # theta = softmax(W z + b), the Gaussian softmax construction
            self.theta_proj = nn.Linear(config.num_topics, config.num_topics)
        self.input_transform = config.inference_input
        self.max_log_sigma = config.max_log_sigma

    def forward(self, context_bow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = context_bow.float()  # (b, V_c) counts
        if self.input_transform == "log1p":
            x = torch.log1p(x)
        elif self.input_transform == "frequencies":
            x = x / x.sum(-1, keepdim=True).clamp(min=1.0)
        x = x.to(self.mean.weight.dtype)  # the model's dtype (e.g. loaded with dtype=torch.bfloat16)
        for layer in self.layers:
            x = torch.relu(layer(x))
        log_sigma = self.log_sigma(x).clamp(-self.max_log_sigma, self.max_log_sigma)
        return self.mean(x), log_sigma


class TopicRNNModel(DocumentRepresentationMixin, TopicRNNPreTrainedModel):
    """The shared body: word embeddings, the recurrent cell and the inference network."""

    _keys_to_ignore_on_load_unexpected = [*RecurrentPreTrainedModel._keys_to_ignore_on_load_unexpected,
                                          r"^(lm_head|stop_head|topic_head|classifier)\.", r"^kl_annealing_step$"]

    def __init__(self, config: TopicRNNConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = _CELLS[config.cell](config.embedding_size, config.hidden_size, num_layers=config.num_hidden_layers,
                                       dropout=config.dropout if config.num_hidden_layers > 1 else 0.0,
                                       batch_first=True)
        self.inference_net = TopicRNNInferenceNetwork(config)
        self.gradient_checkpointing = False
        self.post_init()

    def run_tokens(self, input_ids=None, attention_mask=None, inputs_embeds=None, state=None, need_state=False,
                   output_hidden_states=False):
        """(b, s) tokens -> ((b, s, H) top-layer outputs, state after each row's last real token, and the
        per-layer tuple of :class:`TopicLMOutput` ``hidden_states`` with ``output_hidden_states``, else None)."""
        return run_token_rnn(self, self.rnn, input_ids, attention_mask, inputs_embeds, state, need_state,
                             output_hidden_states)

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None, state: Optional[tuple] = None,
                use_cache: Optional[bool] = None, context_bow: Optional[torch.Tensor] = None,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None,
                **kwargs) -> TopicRNNModelOutput:
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        hidden, new_state, all_hidden = self.run_tokens(input_ids, attention_mask, inputs_embeds, state,
                                                        need_state=use_cache or state is not None,
                                                        output_hidden_states=output_hidden_states)
        mean = log_sigma = None
        if context_bow is not None:
            mean, log_sigma = self.inference_net(context_bow.to(hidden.device))
        out = TopicRNNModelOutput(last_hidden_state=hidden, state=new_state if use_cache else None,
                                  topic_mean=mean, topic_log_sigma=log_sigma, hidden_states=all_hidden)
        return out if return_dict is not False else out.to_tuple()

    @property
    def document_topic_size(self) -> int:
        return self.config.num_topics * (2 if self.config.feature_log_sigma else 1)

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """c (b, K) = the mean of q(theta | context_bow), or (b, 2K) = [mean; log sigma] with
        ``config.feature_log_sigma`` (the paper's classifier reads both). With ``theta_transform="softmax"`` these
        are the mean and log sigma of the Gaussian z that theta = softmax(W z + b) is read from."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.embed_tokens.weight.device)
        mean, log_sigma = self.inference_net(bow)
        return torch.cat([mean, log_sigma], dim=-1) if self.config.feature_log_sigma else mean


class TopicRNNForCausalLM(TopicFamilyForCausalLM, TopicRNNPreTrainedModel, TopicGenerationMixin, GenerationMixin):
    """TopicRNN language model: ELBO training, marginal-likelihood evaluation, topic-steered generation.

    Conditioning (at most one; ``generate()`` takes the same names):

    * ``context_bow`` (b, V_c): counts over the topic vocabulary; theta is inferred from it
      (sampled in training, the posterior mean in eval mode). ``None`` = an empty bag of words.
      ``generate()`` infers theta once, at the prefill, and reuses it at every step.
    * ``topic_mixture`` (b, K) or (K,): theta given directly, any real vector (a distribution with
      ``theta_transform="softmax"``); no KL term.
    * ``topic_ids``: steer towards topics, theta = ``config.steering_scale`` * e_k (see
      :class:`TopicRNNConfig`; with ``theta_transform="softmax"`` the pure topic e_k); no KL term.
    """

    @property
    def _topic_mixture_on_simplex(self) -> bool:
        return self.config.theta_transform == "softmax"  # the paper's Gaussian theta is any real vector

    forward_inputs = {
        "context_bow": "(b, V_c) context counts for the inference network.",
        "topic_mixture": "(b, K) theta given directly (any real vector; a distribution with "
                         "``theta_transform=\"softmax\"``).",
        "topic_ids": "steer towards topics: theta = ``config.steering_scale`` * e_k (a set S of topics: the sum of "
                     "their e_k over sqrt(|S|)); with ``theta_transform=\"softmax\"`` the uniform mixture of the topics "
                     "of S; see :class:`TopicRNNConfig`.",
        "document_tokens": "the rows are the chunks of documents whose state is carried from chunk to chunk (one row "
                           "per real chunk): the RNN runs over the documents' sequences (``input_ids``, "
                           "``attention_mask`` (d, n)) in one call, and each row's h_t is read at ``positions`` (b, s) "
                           "of them (``state`` must be None); the rest reads each row as it is.",
    }
    forward_returns = (":class:`TopicLMOutput` with ``logits`` = log p(y_t) (indicator marginalised), "
                       "``loss``/``lm_loss``/``aux_loss`` (indicator BCE)/``kl_loss`` as in the module docstring, and "
                       "``topic_mixture`` = the theta used. In training mode with ``labels`` the objective needs only "
                       "the observed-indicator softmax, so ``logits`` is None there (computing the marginal as well "
                       "would double the cost of the output layer).")

    def __init__(self, config: TopicRNNConfig):
        super().__init__(config)
        self.model = TopicRNNModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)  # v_i^T h + c_i
        self.stop_head = nn.Linear(config.hidden_size, 1)  # Gamma^T h (+ bias)
        self.topic_head = nn.Linear(config.num_topics, config.topic_vocab_size, bias=False)  # B: (V_c, K)
        self._init_topic_word_prior()  # config.topic_output_bias == "beta": the shared topic output prior
        # config.topic_output_bias == "mixture": the gate g_t of p(w | theta)'s share in the content-word branch
        self.topic_gate = nn.Linear(config.hidden_size, 1) if config.topic_output_bias == "mixture" else None
        # Training forward passes seen so far, for KL annealing (saved, so that resuming goes on).
        self._register_kl_annealing()
        self.post_init()

    language_model_weights = lstm_language_model_weights("model.rnn.{name}_l{i}")

    @classmethod
    def from_language_model(cls, language_model, config):
        """See :meth:`TopicFamilyForCausalLM.from_language_model`; the cell must be the LSTM's (``cell="lstm"``,
        TopicLSTM)."""
        if config.cell != "lstm":
            raise ValueError(f"A TopicRNN with cell={config.cell!r} has no LSTM to take from a language model: "
                             "build it with cell=\"lstm\" (TopicLSTM)")
        return super().from_language_model(language_model, config)

    def start_from_language_model(self) -> None:
        """The shared topic output prior's weight starts at 0 and the topic mixture's gate (``topic_output_bias=
        "mixture"``) at sigmoid(-4) = 1.8 %, whatever h is; B keeps its initial topics (the topic model's pre-training
        and the joint objective learn them). The model's predictions are then the language model's plus its topic
        term b_i^T theta: exactly the language model's under ``topic_mixture`` zero (the paper's Gaussian theta)."""
        super().start_from_language_model()
        if self.topic_gate is not None:
            with torch.no_grad():
                self.topic_gate.weight.zero_()
                self.topic_gate.bias.fill_(-4.0)

    def carries_documents_in_one_call(self) -> bool:
        """The RNN reads nothing but the tokens: carried-state training runs a documents batch in one call
        (``document_tokens``). Every term that is a sum over rows per predicted token is the loop's exactly; free
        bits (a batch mean per dimension) and the bag-of-words term (per context word) are taken over the batch of
        all the documents' chunks, as chunk training takes them over its batch, where the loop took them over the
        batch of the documents' k-th chunks."""
        return True

    def kl_weight_target(self) -> float:
        """``config.kl_weight``: the KL weight once annealed."""
        return self.config.kl_weight

    # ------------------------------------------------------------------------------------------
    # vocabulary maps
    # ------------------------------------------------------------------------------------------

    def lm_to_topic_index(self, device=None) -> torch.Tensor:
        """(V,) topic id of every LM word, -1 for stop words (built from ``config.topic_word_ids``)."""
        device = device if device is not None else self.lm_head.weight.device
        return lm_to_topic_index(self, self.config, device, validate=self._validate_topic_vocabulary)

    def _validate_topic_vocabulary(self) -> None:
        self.config.validate_topic_word_ids()
        if self.config.topic_vocab_size != self.topic_head.weight.shape[0]:
            raise ValueError(f"topic_vocab_size is {self.config.topic_vocab_size} but B has "
                             f"{self.topic_head.weight.shape[0]} rows")

    @property
    def stop_word_mask(self) -> torch.Tensor:
        """(V,) bool: True where the stop-word indicator is 1 (the word is not a topic word)."""
        return self.lm_to_topic_index() < 0

    def topic_bias(self, theta: torch.Tensor) -> torch.Tensor:
        """b_i^T theta for every LM word: (b, K) -> (b, V), exactly zero at stop words."""
        topic_logits = self.topic_head(theta.to(self.topic_head.weight.dtype))  # (b, V_c)
        return topic_scores_to_vocab(topic_logits, self.lm_to_topic_index(theta.device))

    def topic_word_log_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """log p(w | theta) over the topic words (b, V_c): log softmax(B theta) (the paper's theta) or, with
        ``theta_transform="softmax"``, log sum_k theta_k softmax(B[:, k]) (LDA's mixture); -inf at the topic
        ``<unk>`` and at words the LM lacks. The bag-of-words likelihood of ``bow_loss_weight`` and of
        :meth:`topic_model_loss`, and the shared topic output prior's expert."""
        usable = topic_word_mask(self, self.config, theta.device)
        if self.config.theta_transform == "softmax":
            topics = torch.softmax(effective_weight(self.topic_head).float().T.masked_fill(~usable, float("-inf")),
                                   dim=-1)
            mixture = theta.float() @ topics  # (b, K) @ (K, V_c)
            return torch.log(mixture.clamp_min(1e-30)).masked_fill(~usable, float("-inf"))
        logits = self.topic_head(theta.to(self.topic_head.weight.dtype)).float()
        return torch.log_softmax(logits.masked_fill(~usable, float("-inf")), dim=-1)

    def bow_nll(self, context_bow: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(-sum_w n_w log p(w | theta) per row (b,), the number of words that counted): over the topic words of the
        bags of words (b, V_c); the topic ``<unk>`` and words the LM lacks do not count."""
        usable = topic_word_mask(self, self.config, context_bow.device)
        counts = context_bow.float() * usable
        log_probs = self.topic_word_log_probs(theta).masked_fill(~usable, 0.0)
        return -(counts * log_probs).sum(-1), counts.sum()

    def topic_model_parameters(self) -> list[nn.Parameter]:
        """The inference network and B, for :func:`~topic_lm_hf.pretrain_topic_model`."""
        return list(self.model.inference_net.parameters()) + list(self.topic_head.parameters())

    def topic_model_loss(self, context_bow: torch.Tensor, **inputs) -> torch.Tensor:
        """The topic model alone on bags of words (b, V_c): (-log p(d | theta) + KL(q(theta | d) || N(0, I))) per
        context word, with p(w | theta) = softmax(B theta) over the topic words (not the paper's ELBO, where B is
        trained only through the LM; see ``bow_loss_weight``). theta is sampled in training mode."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.lm_head.weight.device)
        theta, kl = self.infer_topic_vector(bow.shape[0], {"context_bow": bow})
        nll, words = self.bow_nll(bow, theta)
        return (nll.sum() + kl.sum()) / words.clamp_min(1)

    # ------------------------------------------------------------------------------------------
    # theta
    # ------------------------------------------------------------------------------------------

    def steering_vector(self, topic_ids: torch.Tensor) -> torch.Tensor:
        """theta (b, K) for the topic ids (b, k) of :meth:`resolve_conditioning` (-1 pads a row):
        ``config.steering_scale`` * sum_{k in S} e_k / sqrt(|S|) per row (with ``theta_transform="softmax"``: the
        distribution with 1/|S| on each topic of S)."""
        ids = topic_ids.to(self.lm_head.weight.device)
        mixture = topic_ids_to_mixture(ids, self.config.num_topics)  # 1/|S| on each listed topic
        if self.config.theta_transform == "softmax":
            return mixture
        return self.config.steering_scale * mixture / mixture.norm(dim=-1, keepdim=True)

    def _theta(self, z: torch.Tensor) -> torch.Tensor:
        """theta from the Gaussian vector z: z itself (the paper) or softmax(W z + b) (``theta_transform``)."""
        if self.config.theta_transform == "softmax":
            return torch.softmax(self.model.inference_net.theta_proj(z).float(), dim=-1)
        return z

    def infer_topic_vector(self, batch_size: int, cond: dict, device=None):
        """theta (b, K) and the KL of each row and dimension (b, K) (None when theta is given or steered by
        ``topic_ids``), from the conditioning ``cond`` as :meth:`resolve_conditioning` returns it (already
        validated: used as is); an empty ``cond`` is an empty bag of words."""
        device = device if device is not None else self.lm_head.weight.device
        if "topic_ids" in cond:
            return self.steering_vector(cond["topic_ids"]).to(device), None
        if "topic_mixture" in cond:
            return cond["topic_mixture"].to(device), None
        bow = cond.get("context_bow")
        bow = bow.to(device) if bow is not None else torch.zeros(batch_size, self.config.topic_vocab_size,
                                                                 device=device, dtype=torch.float32)
        mean, log_sigma = self.model.inference_net(bow)  # (b, K) each
        z = mean + torch.exp(log_sigma) * torch.randn_like(mean) if self.training else mean
        return self._theta(z), gaussian_kl(mean, log_sigma, per_dimension=True)

    # ------------------------------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------------------------------

    def language_model_features(self, topics: dict, topic_representation: Optional[torch.Tensor], *, input_ids,
                                attention_mask, inputs_embeds, state, labels, use_cache, output_hidden_states,
                                logits_to_keep, document_tokens=None, **inputs) -> LanguageModelPass:
        """The RNN's outputs h_t after dropout (with ``document_tokens``: read from its run over the documents'
        sequences), theta (inferred from ``topics``, or the trusted ``topic_representation``) and, in ``details``,
        the indicator logits Gamma^T h_t and the KL of each row and dimension (None when theta is given)."""
        if document_tokens is not None:
            if state is not None or output_hidden_states:
                raise ValueError("document_tokens reads the RNN's run over whole documents: it takes no state and "
                                 "gives no per-layer hidden states")
            hidden, _, _ = self.model.run_tokens(document_tokens["input_ids"], document_tokens["attention_mask"])
            hidden, new_state, all_hidden = hidden.flatten(0, 1)[document_tokens["positions"]], None, None
        else:
            hidden, new_state, all_hidden = self.model.run_tokens(input_ids, attention_mask, inputs_embeds, state,
                                                                  need_state=use_cache or state is not None,
                                                                  output_hidden_states=output_hidden_states)
        if topic_representation is not None:
            theta, kl = topic_representation.to(hidden.device), None
        else:
            theta, kl = self.infer_topic_vector(hidden.shape[0], topics, hidden.device)
        if logits_to_keep and labels is None:
            hidden = hidden[:, -logits_to_keep:]
        h = self.dropout(hidden)
        stop_logits = self.stop_head(h).squeeze(-1).float()  # (b, s): Gamma^T h_t
        return LanguageModelPass(h, new_state if use_cache else None, all_hidden, theta, theta,
                                 details=dict(stop_logits=stop_logits, kl=kl, context_bow=topics.get("context_bow"),
                                              observed=self._observed_stop(labels, h.device) if labels is not None
                                              else None))

    def output_bias(self, run: LanguageModelPass) -> torch.Tensor:
        """b_i^T theta (b, V), plus the shared topic output prior; both 0 at stop words. With the topic mixture
        (which replaces b_i^T theta), 0."""
        if self.topic_gate is not None:
            return run.features.new_zeros(run.features.shape[0], self.config.vocab_size, dtype=torch.float32)
        bias = self.topic_bias(run.topic_mixture).float()
        if self.topic_prior_weight is not None:
            bias = bias + self.topic_word_prior(run.topic_mixture)
        return bias

    def _observed_stop(self, labels: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(the targets y_t (b, s - 1), the observed indicator l_t: whether y_t is a stop word)."""
        targets = labels[:, 1:].to(device)  # y_t for the input at t (no off-by-one)
        return targets, self.lm_to_topic_index(device)[targets.clamp(min=0)] < 0

    def output_logits(self, run: LanguageModelPass, labels: Optional[torch.Tensor]):
        """The logits log p(y_t) with the indicator marginalised, and the LM loss under the observed indicator.
        In training mode with labels only the loss is computed, at the predicted positions (``logits`` None).
        With ``topic_output_bias="mixture"`` both are mixed with p(w | theta) by the gate (:meth:`_mixed_loss`)."""
        h, stop_logits, bias = run.features, run.details["stop_logits"], self.output_bias(run)
        # The full (b, s, V) scores v_i^T h_t + c_i only where the marginal is returned (not in training with labels)
        word_logits = None if self.training and labels is not None else self.lm_head(h).float()
        lm_loss = None
        if labels is not None:
            targets, is_stop = run.details["observed"]
            # p(y_t | h_t, theta, l_t): one softmax over V of v_i^T h_t + c_i, plus the topic bias where l_t = 0
            # (only at the predicted positions).
            bias_mask = (~is_stop).float()
            if self.topic_gate is not None:
                lm_loss = self._mixed_loss(run)
            elif word_logits is None:  # training: the output layer at the predicted positions only
                lm_loss = next_token_loss(h, labels, self.lm_head, bias, bias_mask,
                                          compiled=self.output_layer_compiled)
            else:  # the full scores are there already
                conditional = word_logits[:, :-1] + bias_mask.unsqueeze(-1) * bias.unsqueeze(1)  # (b, s-1, V)
                lm_loss = F.cross_entropy(conditional.reshape(-1, conditional.shape[-1]), targets.reshape(-1),
                                          ignore_index=-100, reduction="sum") / (targets != -100).sum().clamp(min=1)
        log_marginal = None
        if word_logits is not None:
            # p(y_t) = sigmoid(z_t) p(y_t | l = 1) + (1 - sigmoid(z_t)) p(y_t | l = 0), in log space.
            log_marginal = torch.logaddexp(
                F.logsigmoid(stop_logits).unsqueeze(-1) + torch.log_softmax(word_logits, dim=-1),
                F.logsigmoid(-stop_logits).unsqueeze(-1) + torch.log_softmax(word_logits + bias.unsqueeze(1), dim=-1))
            if self.topic_gate is not None:  # (1 - g_t) p(y_t) + g_t p(y_t | theta)
                gate = self.topic_gate(h).float()  # (b, s, 1): logit of g_t
                index = self.lm_to_topic_index(h.device)
                log_topic = topic_scores_to_vocab(self.topic_word_log_probs(run.topic_mixture), index)
                log_topic = log_topic.masked_fill(index < 0, float("-inf")).unsqueeze(1)  # (b, 1, V)
                log_marginal = torch.logaddexp(F.logsigmoid(-gate) + log_marginal, F.logsigmoid(gate) + log_topic)
        return log_marginal, lm_loss

    def _mixed_loss(self, run: LanguageModelPass) -> torch.Tensor:
        """The mean of -log((1 - g_t) softmax(V h_t + c)_{y_t} + g_t p(y_t | theta)) over the predicted positions
        (``topic_output_bias="mixture"``, which has no b_i^T theta; p(y | theta) = 0 at stop words), the output
        layer at those positions only, as :func:`next_token_loss`. The LM's own loss without its topics, which
        ``topic_free_loss_weight`` adds, comes from the same scores (``run.details["topic_free_loss"]``)."""
        h = run.features
        targets, _ = run.details["observed"]
        keep = targets != -100
        rows = torch.arange(targets.shape[0], device=h.device).unsqueeze(1).expand_as(targets)[keep]
        kept, selected = targets[keep], h[:, :-1][keep]
        scores = self.lm_head(selected).float()  # (n, V)
        log_lm = torch.log_softmax(scores, dim=-1).gather(-1, kept.unsqueeze(-1)).squeeze(-1)
        run.details["topic_free_loss"] = -log_lm.sum() / keep.sum().clamp_min(1)
        gate = self.topic_gate(selected).float().squeeze(-1)
        topic_index = self.lm_to_topic_index(h.device)[kept]
        log_topic = self.topic_word_log_probs(run.topic_mixture)[rows, topic_index.clamp_min(0)]
        log_topic = log_topic.masked_fill(topic_index < 0, float("-inf"))  # p(y | theta) = 0 at stop words
        mixed = torch.logaddexp(F.logsigmoid(-gate) + log_lm, F.logsigmoid(gate) + log_topic)
        return -mixed.sum() / keep.sum().clamp_min(1)

    def loss_terms(self, run: LanguageModelPass, labels: torch.Tensor) -> list[LossTerm]:
        """aux_loss (the indicator's cross-entropy), the KL (annealed; free bits in the objective), with
        ``bow_loss_weight`` the context's bag-of-words likelihood and with ``topic_free_loss_weight`` the LM's loss
        without its topics: each per predicted token (the bag of words per context word)."""
        device, kl = run.features.device, run.details["kl"]
        targets, is_stop = run.details["observed"]  # computed once per forward, with the features
        valid = targets != -100
        n_tokens = valid.sum().clamp(min=1)
        # log p(l_t | h_t): binary cross-entropy on the logits (never on sigmoid(logits)).
        bce = F.binary_cross_entropy_with_logits(run.details["stop_logits"][:, :-1], is_stop.float(),
                                                 reduction="none")
        aux_loss = (bce * valid).sum() / n_tokens
        kl_loss = kl.sum() / n_tokens if kl is not None else torch.zeros((), device=device, dtype=torch.float32)
        kl_objective = kl_loss
        if kl is not None and self.config.kl_free_bits > 0:
            # Free bits (Kingma et al. 2016): each dimension's batch-mean KL counts at least
            # kl_free_bits nats, so the optimiser gains nothing by pushing it below (not the ELBO).
            kl_objective = kl.mean(0).clamp(min=self.config.kl_free_bits).sum() * kl.shape[0] / n_tokens
        terms = [LossTerm(aux_loss, reported={"aux_loss": aux_loss}),
                 LossTerm(kl_objective, annealed=True, reported={"kl_loss": kl_loss})]
        bow = run.details["context_bow"]
        if self.config.bow_loss_weight > 0 and kl is not None and bow is not None:
            # Not the paper's ELBO: the bag-of-words likelihood of the context under softmax(B theta).
            nll, words = self.bow_nll(bow.to(device), run.topic_mixture)
            bow_loss = nll.sum() / words.clamp_min(1)  # per context word, as TCNLM's topic terms
            terms.append(LossTerm(bow_loss, self.config.bow_loss_weight, reported={"bow_loss": bow_loss}))
        if self.config.topic_free_loss_weight > 0:  # the LM on its own: softmax(V h_t + c), no topic in it
            own = run.details.get("topic_free_loss")  # the mixture's loss computed it already
            if own is None:
                own = next_token_loss(run.features, labels, self.lm_head, compiled=self.output_layer_compiled)
            terms.append(LossTerm(own, self.config.topic_free_loss_weight))
        return terms

    # ------------------------------------------------------------------------------------------
    # topics and features
    # ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def topic_word_scores(self, layer: int) -> torch.Tensor:
        """The columns of B (K, V_c): a topic's words are the largest entries of its column, among the words its
        topic bias can favour (``-inf`` at ``<unk>`` and at topic words the LM lacks)."""
        scores = effective_weight(self.topic_head).detach().float().T.clone()  # (K, V_c)
        ids = self.config.topic_word_ids
        if ids is not None:
            usable = torch.tensor([i >= 0 for i in ids], device="cpu")
            scores[:, ~usable.to(scores.device)] = float("-inf")
        scores[:, 0] = float("-inf")
        return scores

    @torch.no_grad()
    def topic_word_distributions(self, *, layer=None) -> torch.Tensor:
        """(K, V_c) one distribution over the topic vocabulary per topic: softmax of column k of B
        over the topic words (the words the topic bias can favour; ``<unk>`` and words the LM lacks
        get 0). The words of ``get_topics`` are the most probable ones."""
        self.check_layer(layer)
        return torch.softmax(self.topic_word_scores(1), dim=-1)

    @torch.no_grad()
    def infer_topics(self, context_bow, *, layer=None) -> torch.Tensor:
        """theta (b, K) of documents given as bags of words (b, V_c): theta at the posterior mean of
        q(z | X_c). The paper's theta is a real vector (not a distribution); with ``theta_transform="softmax"``
        it is a distribution. Its largest entry is the document's dominant topic in the sense of ``topic_ids``."""
        self.check_layer(layer)
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.lm_head.weight.device)
        mean, _ = self.model.inference_net(bow)
        return self._theta(mean)



class TopicRNNForSequenceClassification(DocumentClassifierMixin, TopicRNNPreTrainedModel):
    """Document classifier on TopicRNN features (see :class:`~.modeling_document.DocumentClassifierMixin`).

    The paper's recipe is the default: [last RNN state; mu; log sigma of q(theta)] -> MLP with 50 sigmoid units,
    trained on frozen features. ``AutoModelForSequenceClassification.from_pretrained(<a TopicRNNForCausalLM
    folder>, num_labels=2)`` loads the body (``model.*``) and initialises the head.
    """

    def __init__(self, config: TopicRNNConfig):
        super().__init__(config)
        self._init_classifier(TopicRNNModel(config))


__all__ = ["TopicRNNModel", "TopicRNNForCausalLM", "TopicRNNForSequenceClassification", "TopicRNNPreTrainedModel",
           "TopicRNNModelOutput", "gaussian_kl"]
