"""NCLM: the Neural Composite Language Model (Chaudhary, Schütze & Gupta, ICML 2020).

Notation: b batch, s tokens, E embedding size, H hidden size, L layers, V vocabulary, V_c topic
vocabulary, K topics, H_tm the NVDM encoder's width, D the width of ETR's word vectors, S samples.
It follows the paper and its official TensorFlow code (``YatinChaudhary/NCLM`` on GitHub).

The model (paper §3):

* NTM: an NVDM with a Gaussian-softmax output. For a context bag of words d (b, V_c):
  pi = act(W_1 d + b_1), mu = W_mu pi + b_mu, log sigma = W_s pi + b_s;
  h = softmax(mu + sigma * eps) (K proportions); p(w | h) = softmax(W h + b) over the topic words;
  L_NTM = -sum_w d_w log p(w | h) + KL(N(mu, sigma^2) || N(0, I)). In training h is the mean of
  ``num_topic_samples`` softmaxed samples and the reconstruction their mean (the official code);
  in evaluation, generation and for features h = softmax(mu) (deterministic: the package's choice).
* LTR = h. ETR = sum_k w_k z_k, where z_k is the mean of the word vectors of topic k's top
  ``etr_top_n`` words (by the decoder row W_k) among the words present in the context, and
  w = h (or softmax(h), the official code's double softmax). Top-N selection has no gradient and
  the word vectors are read without one, so ETR trains only the encoder (through w), as in the paper.
* LM: an LSTM over the sentence, outputs o_t. Composition (eq. 6-7):
  o^_t = sigmoid([o_t; c] W_p + b_p), p(y_{t+1}) = softmax(U o^_t + a), with c = h (LTA), z (ETA)
  or [z; h] (LETA), computed from the context; with ``sentence_topics`` (SDT) c also holds the same
  representation of the current sentence, [c_doc; c_sent].
* Loss (the official code's weighting): alpha * sum_rows L_NTM(row) + (1 - alpha) * sum_rows sum_t
  NLL, both summed per chunk; here divided by the number of predicted tokens N of the batch, which
  keeps the relative weights and makes the LM part the usual mean NLL per token:

      loss = (1 - alpha) * lm_loss + alpha * (bow_loss + kl_loss)
      lm_loss  = mean NLL per predicted token
      bow_loss = sum_rows -log p(d_row | h_row) / N      (rows whose context is empty contribute 0)
      kl_loss  = sum_rows KL_row / N                     (same rows)

Sentence-level topics (SDT) and leakage. ``sdt_mode="prefix"`` (default) encodes, at the input
position of word t-1 (the one predicting word t), the topic words w_<t of the current sentence:
the linear first layer of the encoder makes that a cumulative sum of columns of W_1, exact and
O(s H_tm). Earlier chunks of the sentence come from the batch's ``sentence_prefix_bow`` (the
collator's ``sentence_prefix=True``) or from the carried ``state``; ``<bos>`` starts a new sentence.
``sdt_mode="minus_target"`` replicates the paper and the official code: the chunk's words minus the
target position, so it reads the words after the target; it is labelled leaky
(``config.leaky_modes()``), and ``evaluate_perplexity`` refuses to call its perplexity causal.
Document topics are causal when the context is (the collator's ``"preceding"``); the
``"others"`` context (the papers' protocol) is not.

State: ``(h, c)`` of the LSTM, each (b, L, H), plus with ``sentence_topics`` the running sum
(b, 1, H_tm) of the encoder's first-layer columns of the current sentence's topic words.

Generation goes through the shared ``TopicGenerationMixin``: the document part c (and, with
ETR and SDT, the K topic vectors z_k) is computed at the first step from ``context_bow`` /
``topic_ids`` / ``topic_mixture`` / the prior and reused (``topic_representation`` /
``topic_embeddings``); the sentence part is updated token by token through the state. ``topic_ids``
set h to the equal mixture of the topics and, with no document, every topic word counts as present
for ETR; the prior is the uniform mixture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin

from .configuration_nclm import NCLMConfig
from .modeling_conditioning import (TopicConditioning, angular_diversity, bags_of_words, broadcast_rows,
                                    lm_to_topic_index, topic_ids_to_mixture, topic_vocabulary)
from .modeling_generation import TopicGenerationMixin
from .modeling_document import DocumentClassifierMixin, DocumentRepresentationMixin
from .modeling_recurrent import (RecurrentBodyMixin, RecurrentPreTrainedModel, TopicLMOutput, effective_weight,
                                 last_columns, last_token_positions, state_from_aliases)
from .modeling_topic_family import LanguageModelPass, LossTerm, TopicFamilyForCausalLM

TRAINING_PHASES = ("joint", "lm", "topic_model")
_ROWS_PER_DENSE_BLOCK = 8  # rows of (K, V_c) scores at a time in the official code's ETR selection


def _present_topk_means(W: torch.Tensor, vectors: torch.Tensor, present: torch.Tensor, n: int) -> torch.Tensor:
    """For each row r of ``present`` (R, V_c) bool and each topic k: the mean of ``vectors`` (V_c, D) over the
    (at most) ``n`` present words with the largest W[k] (K, V_c); fewer when fewer are present, 0 when none is.
    (R, K, D).

    Each row's present words are gathered into a padded (R, P) index, P the most any row has, so that the scores
    are K x R x P, not K x R x V_c, and the selection is one top-k for the batch: a handful of operations whatever R
    is. A padding slot scores -inf, so a row's top words are the same as when it is scored alone."""
    R, K = present.shape[0], W.shape[0]
    counts = present.sum(1)  # (R,) present words per row
    longest = int(counts.max()) if R else 0
    if longest == 0:
        return vectors.new_zeros(R, K, vectors.shape[1])
    # a stable sort of each row's present words to the front: (R, P) word ids, in increasing order
    words = torch.argsort((~present).to(torch.int8), dim=1, stable=True)[:, :longest]
    real = torch.arange(longest, device=present.device) < counts.unsqueeze(1)  # (R, P)
    scores = W[:, words].masked_fill(~real, float("-inf"))  # (K, R, P)
    m = min(n, longest)
    top = scores.topk(m, dim=-1).indices  # (K, R, m) slots of `words`
    # each chosen slot weighs 1 / (the row's number of chosen words); a row with fewer than m present words has
    # -inf slots among its top m, which weigh 0
    share = 1.0 / counts.clamp(1, n).to(vectors.dtype)  # (R,)
    kept = (torch.arange(m, device=present.device) < counts.clamp(max=n).unsqueeze(1)).to(vectors.dtype)  # (R, m)
    weights = vectors.new_zeros(K, R, longest).scatter_(2, top, (kept * share.unsqueeze(1)).expand(K, -1, -1))
    return torch.bmm(weights.transpose(0, 1), vectors[words])  # (R, K, P) x (R, P, D) -> (R, K, D)


@dataclass
class NCLMOutput(TopicLMOutput):
    """:class:`TopicLMOutput` plus what NCLM composes with the LSTM output.

    Args:
        topic_representation: (b, |c_doc|) the document part c (LTR h, ETR z or [z; h]).
        topic_embeddings: (b, K, D) the topic vectors z_k ETR weighted (ETA / LETA with sentence topics).
    """

    topic_embeddings: Optional[torch.Tensor] = None


# ----------------------------------------------------------------------------------------------
# neural topic model: NVDM with a Gaussian-softmax output
# ----------------------------------------------------------------------------------------------


class NCLMTopicModel(nn.Module):
    """NVDM-GSM: encoder (V_c -> H_tm -> K, K), proportions h = softmax(sample), decoder W (V_c, K)."""

    def __init__(self, config: NCLMConfig):
        super().__init__()
        self.num_samples = config.num_topic_samples
        self.encoder = nn.Linear(config.topic_vocab_size, config.encoder_hidden_size)
        self.activation = {"sigmoid": torch.sigmoid, "relu": torch.relu, "tanh": torch.tanh}[config.encoder_activation]
        self.posterior_mean = nn.Linear(config.encoder_hidden_size, config.num_topics)
        self.posterior_log_sigma = nn.Linear(config.encoder_hidden_size, config.num_topics)
        self.decoder = nn.Linear(config.num_topics, config.topic_vocab_size)

    def posterior_from_pre_activation(self, pre: torch.Tensor):
        """(mu, log sigma) from the encoder's first-layer pre-activation (..., H_tm)."""
        hidden = self.activation(pre)
        return self.posterior_mean(hidden), self.posterior_log_sigma(hidden)

    def posterior(self, bow: torch.Tensor):
        return self.posterior_from_pre_activation(self.encoder(bow))

    def proportions(self, mean: torch.Tensor, log_sigma: torch.Tensor, sample: bool):
        """h (..., K): the mean of S softmaxed samples when ``sample`` (and S > 0), else softmax(mu).
        Also returns the (S, ..., K) samples (None without sampling)."""
        if not sample or self.num_samples == 0:
            return torch.softmax(mean.float(), -1).to(mean.dtype), None
        eps = torch.randn((self.num_samples, *mean.shape), device=mean.device, dtype=mean.dtype)
        samples = torch.softmax(mean + log_sigma.exp() * eps, dim=-1)
        return samples.mean(0), samples

    def word_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """log p(w | h) (..., V_c) over the topic words; ``<unk>`` (id 0) is excluded (-inf)."""
        logits = self.decoder(h).float()
        logits = torch.cat([torch.full_like(logits[..., :1], float("-inf")), logits[..., 1:]], dim=-1)
        return torch.log_softmax(logits, dim=-1)

    def reconstruction(self, bow: torch.Tensor, h: torch.Tensor, samples: Optional[torch.Tensor]) -> torch.Tensor:
        """-sum_w d_w log p(w | h) per row (b,), averaged over the samples when there are some."""
        log_probs = self.word_log_probs(samples if samples is not None else h)
        nll = -(bow[..., 1:].float() * log_probs[..., 1:]).sum(-1)  # column 0: <unk>, never counted
        return nll.mean(0) if samples is not None else nll

    def row_losses(self, bow: torch.Tensor, mean: torch.Tensor, log_sigma: torch.Tensor, h: torch.Tensor,
                   samples: Optional[torch.Tensor]):
        """(reconstruction, KL) per row (b,), both 0 for a row whose bag of words is empty (nothing to
        reconstruct: a first sentence's causal context)."""
        rows = (bow.sum(-1) > 0).float()
        return self.reconstruction(bow, h, samples) * rows, self.kl(mean, log_sigma) * rows

    @staticmethod
    def kl(mean: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
        """KL(N(mu, sigma^2) || N(0, I)) per row (b,)."""
        mean, log_sigma = mean.float(), log_sigma.float()
        return -0.5 * (1.0 + 2.0 * log_sigma - mean ** 2 - (2.0 * log_sigma).exp()).sum(-1)

    def topic_word_weights(self) -> torch.Tensor:
        """W (K, V_c): the decoder's rows, one per topic."""
        return effective_weight(self.decoder).T


# ----------------------------------------------------------------------------------------------
# pretrained-model classes
# ----------------------------------------------------------------------------------------------


class NCLMPreTrainedModel(RecurrentPreTrainedModel):
    config_class = NCLMConfig
    _no_split_modules = ["NCLMModel"]
    conditioning_inputs = ("context_bow", "topic_ids", "topic_mixture")
    training_context = "others"
    reads_sentence_prefix = True  # used when config.sentence_topics (SDT)

    def _init_weights(self, module):
        super()._init_weights(module)  # embeddings, linear layers, the LSTM: U(-r, r)
        if isinstance(module, NCLMTopicModel):
            # The official code: Glorot for the encoder, mu and the decoder (biases included), zeros for log sigma.
            for linear in (module.encoder, module.posterior_mean, module.decoder):
                nn.init.xavier_uniform_(linear.weight)
                bound = math.sqrt(6.0 / (1 + linear.bias.shape[0]))
                nn.init.uniform_(linear.bias, -bound, bound)
            nn.init.zeros_(module.posterior_log_sigma.weight)
            nn.init.zeros_(module.posterior_log_sigma.bias)
        elif isinstance(module, NCLMModel) and module.etr_word_embeddings is not None:
            module.etr_word_embeddings.zero_()  # set with set_etr_embeddings (or loaded with the weights)


class NCLMModel(DocumentRepresentationMixin, RecurrentBodyMixin, NCLMPreTrainedModel):
    """Embeddings, the LSTM and the NVDM (no composition, no output layer).

    ``forward`` returns the LSTM outputs o (b, s, H) as ``last_hidden_state`` (zero at padding) and the
    LSTM state; the topic representations are computed by the methods below.
    """

    _keys_to_ignore_on_load_unexpected = [*RecurrentPreTrainedModel._keys_to_ignore_on_load_unexpected,
                                          r"^(lm_head|compose)\.", r"^kl_annealing_step$"]

    def __init__(self, config: NCLMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(config.embedding_size, config.hidden_size, num_layers=config.num_hidden_layers,
                            dropout=config.dropout if config.num_hidden_layers > 1 else 0.0, batch_first=True)
        self.topic_model = NCLMTopicModel(config)
        if config.uses_etr and config.etr_embedding == "frozen":
            self.register_buffer("etr_word_embeddings",
                                 torch.zeros(config.topic_vocab_size, config.etr_embedding_size))
        else:
            self.etr_word_embeddings = None
        self.gradient_checkpointing = False
        self.post_init()

    # -- topics ------------------------------------------------------------------------------------

    def lm_to_topic_index(self, device) -> torch.Tensor:
        def validate():
            if self.config.topic_word_ids is None:
                raise ValueError("NCLM needs config.topic_word_ids (the LM id of every topic word) for ETR's word "
                                 "vectors and for sentence topics: build the config with "
                                 "NCLMConfig.from_tokenizers(tokenizer, topic_tokenizer, ...)")
        return lm_to_topic_index(self, self.config, device, validate)

    def topic_word_vectors(self) -> torch.Tensor:
        """E (V_c, D), the word vectors of ETR, without gradient; zero rows for words that have none."""
        cfg = self.config
        if cfg.etr_embedding == "decoder":
            return effective_weight(self.topic_model.decoder).detach()
        if cfg.etr_embedding == "frozen":
            if not getattr(self, "_etr_checked", False):
                if not bool(self.etr_word_embeddings.abs().sum() > 0):
                    raise ValueError("etr_embedding='frozen' but no word vectors were given: call "
                                     "model.set_etr_embeddings(matrix) with a (topic_vocab_size, "
                                     f"{cfg.etr_embedding_size}) matrix")
                self._etr_checked = True
            return self.etr_word_embeddings
        ids = self._topic_word_ids()
        if type(self.embed_tokens) is nn.Embedding:
            vectors = self.embed_tokens.weight.detach().index_select(0, ids.clamp_min(0))
        else:  # an adapter wraps the embeddings (a PEFT LoRA, whose weight is the frozen base): read through it
            vectors = self.embed_tokens(ids.clamp_min(0)).detach()
        return vectors * (ids >= 0).unsqueeze(1).to(vectors.dtype)

    def _topic_word_ids(self) -> torch.Tensor:
        """(V_c,) the LM id of every topic word (-1: none), from ``config.topic_word_ids``, cached like
        :func:`lm_to_topic_index` (ETR reads it at every forward)."""
        device = self.embed_tokens.weight.device
        self.lm_to_topic_index(device)  # validates (the clear error when topic_word_ids is missing)
        ids = self.config.topic_word_ids
        key = (id(ids), len(ids), str(device))
        cached = self.__dict__.get("_topic_word_ids_cache")
        if cached is None or cached[0] != key:
            cached = (key, torch.tensor(ids, dtype=torch.long, device=device))
            self.__dict__["_topic_word_ids_cache"] = cached
        return cached[1]

    def _etr_candidates(self) -> torch.Tensor:
        """(V_c,) bool: topic words that have a word vector (never the topic ``<unk>``)."""
        if self.config.etr_embedding == "lm":
            candidates = self._topic_word_ids() >= 0  # the topic <unk> has no LM id
        else:
            candidates = torch.ones(self.config.topic_vocab_size, dtype=torch.bool,
                                    device=self.embed_tokens.weight.device)
        candidates[0] = False
        return candidates

    @torch.no_grad()
    def topic_embeddings(self, present: torch.Tensor) -> torch.Tensor:
        """z_k (b, K, D): the mean vector of each topic's top-N words among the ``present`` ones (b, V_c) bool.

        ``etr_selection="masked_topk"``: the N present words with the largest W_k (fewer when fewer are
        present; z_k = 0 when none is). ``"multiply_mask"`` (the official code): the top N of present * W_k,
        where absent words score 0, all N averaged.
        """
        cfg = self.config
        W = self.topic_model.topic_word_weights().detach()  # (K, V_c)
        vectors = self.topic_word_vectors()  # (V_c, D)
        present = present & self._etr_candidates()
        b, (K, V_c) = present.shape[0], W.shape
        n = min(cfg.etr_top_n, V_c - 1)
        if cfg.etr_selection == "multiply_mask":
            out = []
            for start in range(0, b, _ROWS_PER_DENSE_BLOCK):
                block = present[start:start + _ROWS_PER_DENSE_BLOCK]
                scores = W.unsqueeze(0) * block.unsqueeze(1).to(W.dtype)  # (r, K, V_c)
                scores[..., 0] = float("-inf")  # the topic <unk> is never a word
                top = scores.topk(n, dim=-1).indices  # (r, K, n)
                out.append(vectors[top].mean(2))  # (r, K, D)
            return torch.cat(out, 0)
        # masked_topk, sparse: only a row's present words (<= its context's distinct words) are scored, all rows
        # at once. Rows with the same words (the chunks of one sentence) are computed once.
        unique, inverse = torch.unique(present, dim=0, return_inverse=True)
        return _present_topk_means(W, vectors, unique, n)[inverse]

    def etr_weights(self, h: torch.Tensor) -> torch.Tensor:
        """The weights of the topic vectors in ETR: h, or softmax(h) (the official code)."""
        return torch.softmax(h, dim=-1) if self.config.etr_weighting == "softmax_of_proportions" else h

    def compose_representation(self, h: torch.Tensor, z_k: Optional[torch.Tensor]) -> torch.Tensor:
        """c = h (LTA), z (ETA) or [z; h] (LETA) for proportions h (b, K) or (b, s, K)."""
        parts = []
        if self.config.uses_etr:
            weights = self.etr_weights(h).to(z_k.dtype)
            parts.append(weights @ z_k if h.dim() == 3 else (weights.unsqueeze(1) @ z_k).squeeze(1))
        if self.config.uses_ltr:
            parts.append(h)
        return torch.cat(parts, dim=-1)

    def document_topics(self, batch_size: int, device, context_bow=None, topic_ids=None, topic_mixture=None,
                        sample: bool = False, extra_present: Optional[torch.Tensor] = None):
        """The document part of c from the conditioning given (at most one of them), already validated: the
        batch-first tensors of ``normalize_topic_kwargs`` (the causal LM's ``resolve_conditioning``), used as is.

        Returns ``(c (b, |c_doc|), h (b, K), z_k (b, K, D) or None, (bow, mean, log sigma, samples) or None)``.
        ``context_bow`` (b, V_c): h from the NVDM (sampled when ``sample``), ETR over the words present in it
        (plus ``extra_present`` (b, V_c) bool); ``topic_mixture`` (b, K): h as given; ``topic_ids`` (b, k): the
        equal mixture of the topics; nothing: the uniform mixture. Without a bag of words every topic word
        counts as present for ETR.
        """
        cfg = self.config
        posterior = None
        dtype = self.topic_model.decoder.weight.dtype
        if context_bow is not None:
            bow = context_bow.to(device)
            mean, log_sigma = self.topic_model.posterior(bow.to(dtype))
            h, samples = self.topic_model.proportions(mean, log_sigma, sample)
            posterior = (bow, mean, log_sigma, samples)
            present = bow > 0
        else:
            if topic_mixture is not None:
                h = topic_mixture.to(device, dtype)
            elif topic_ids is not None:
                h = topic_ids_to_mixture(topic_ids.to(device), cfg.num_topics).to(dtype)
            else:
                h = torch.full((batch_size, cfg.num_topics), 1.0 / cfg.num_topics, device=device, dtype=dtype)
            present = torch.ones(1, cfg.topic_vocab_size, dtype=torch.bool, device=device).expand(h.shape[0], -1)
        z_k = None
        if cfg.uses_etr:
            if extra_present is not None:
                present = present | extra_present
            if extra_present is None and context_bow is None:
                z_k = self.topic_embeddings(present[:1]).expand(h.shape[0], -1, -1)  # the same for every row
            else:
                z_k = self.topic_embeddings(present)
        return self.compose_representation(h, z_k), h, z_k, posterior

    def sentence_pre_activations(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                 carried: Optional[torch.Tensor], sentence_prefix_bow: Optional[torch.Tensor],
                                 window_excludes_last: bool):
        """The NVDM encoder's first-layer input of the sentence topics at every position (b, s, H_tm), without
        its bias, and the running sum to carry (b, H_tm).

        ``sdt_mode="prefix"``: at position i, the sum of W_1's columns of the topic words among the sentence's
        tokens up to and including input i (the words before the target i + 1); it starts from
        ``sentence_prefix_bow`` (the sentence's words before this chunk) if given, else from ``carried``,
        and restarts at every ``<bos>``. ``"minus_target"`` (leaky, the official code): the chunk's words
        minus the word at position i + 1; the chunk is the inputs without each row's last real one when
        ``window_excludes_last`` (training: the last input is nobody's target).
        """
        cfg = self.config
        b, s = input_ids.shape
        device = input_ids.device
        W1 = effective_weight(self.topic_model.encoder)  # (H_tm, V_c)
        tm = self.lm_to_topic_index(device)[input_ids]  # (b, s), -1 for words outside the topic vocabulary
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        tm = tm.masked_fill(~mask, -1)
        x = F.embedding(tm.clamp_min(0), W1.T) * (tm >= 0).unsqueeze(-1).to(W1.dtype)  # (b, s, H_tm)
        if sentence_prefix_bow is not None:
            start = F.linear(sentence_prefix_bow.to(device, W1.dtype), W1)  # (b, H_tm)
        elif carried is not None:
            start = carried.reshape(b, -1).to(W1.dtype)
        else:
            start = x.new_zeros(b, W1.shape[0])
        is_bos = (input_ids == cfg.bos_token_id) & mask
        cum = x.cumsum(1)
        positions = torch.arange(s, device=device).expand(b, s)
        last_bos = torch.where(is_bos, positions, torch.full_like(positions, -1)).cummax(1).values  # (b, s)
        since_bos = cum - cum.gather(1, last_bos.clamp_min(0).unsqueeze(-1).expand_as(cum))  # x at <bos> is 0
        prefix = torch.where((last_bos >= 0).unsqueeze(-1), since_bos, start.unsqueeze(1) + cum)  # (b, s, H_tm)
        last = last_token_positions(attention_mask, s, b, device)
        carry = prefix.gather(1, last.view(b, 1, 1).expand(b, 1, prefix.shape[-1])).squeeze(1)
        carry = torch.where(mask.any(1, keepdim=True), carry, start)
        if cfg.sdt_mode == "prefix":
            return prefix, carry
        window = mask.clone()
        if window_excludes_last:
            window[torch.arange(b, device=device), last] = False
        win_x = x * window.unsqueeze(-1).to(x.dtype)
        target = F.pad(win_x[:, 1:], (0, 0, 0, 1))  # the word at position i + 1 (0 past the end)
        first_is_bos = is_bos[torch.arange(b, device=device), (~mask).long().argmin(1)]
        before = torch.where(first_is_bos.unsqueeze(-1), torch.zeros_like(start), start)
        return before.unsqueeze(1) + win_x.sum(1, keepdim=True) - target, carry

    def sentence_topics(self, pre_activations: torch.Tensor, z_k: Optional[torch.Tensor], sample: bool):
        """The sentence part of c at every position (b, s, |c_doc|) from :meth:`sentence_pre_activations`."""
        pre_activations = pre_activations + self.topic_model.encoder.bias
        mean, log_sigma = self.topic_model.posterior_from_pre_activation(pre_activations)
        h, _ = self.topic_model.proportions(mean, log_sigma, sample)
        return self.compose_representation(h, z_k)

    @property
    def document_topic_size(self) -> int:
        return self.config.document_topic_size

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """c (b, |c_doc|): the document topic representation of ``config.variant`` (h, z or [z; h]) from the
        NVDM's softmax(mu) (no sampling), ETR over the words present in ``context_bow``."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size)
        c, _, _, _ = self.document_topics(bow.shape[0], self.device, context_bow=bow, sample=False)
        return c

    def infer_topics(self, context_bow) -> torch.Tensor:
        """Topic proportions h = softmax(mu) (b, K) of documents given as bags of words (b, V_c)."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size)
        mean, _ = self.topic_model.posterior(bow.to(self.device, self.dtype))
        return torch.softmax(mean.float(), dim=-1)

    @torch.no_grad()
    def get_topics(self, top_n: int = 10, topic_tokenizer=None) -> list[list[str]]:
        """The ``top_n`` words of every topic by its decoder row W_k (the paper's topics); never ``<unk>``."""
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        words = topic_vocabulary(self, topic_tokenizer)
        W = self.topic_model.topic_word_weights().detach().clone()
        W[:, 0] = float("-inf")
        top = W.topk(min(top_n, W.shape[1] - 1), dim=-1).indices
        return [[words[i] for i in row] for row in top.tolist()]


class NCLMForCausalLM(TopicFamilyForCausalLM, NCLMPreTrainedModel, TopicGenerationMixin, GenerationMixin):
    """NCLM with the composition sigmoid([o; c] W_p + b_p), the output softmax, the joint loss and
    topic-steered generation.

    Conditioning (``forward`` and ``generate``; at most one): ``context_bow`` (b, V_c) counts over the
    topic vocabulary (encoded once per generation); ``topic_ids`` (an int, a list shared by the batch,
    a list of lists or a (b, k) tensor padded with -1): h = the equal mixture of the topics;
    ``topic_mixture`` (b, K) proportions on the simplex; nothing: the uniform mixture.
    ``sentence_prefix_bow`` (b, V_c): with ``sentence_topics``, the topic words of the current sentence
    before this chunk (the collator's ``sentence_prefix=True``).
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _cached_conditioning = ("topic_representation", "topic_embeddings")  # c_doc and, for ETR, the z_k
    output_class = NCLMOutput

    forward_inputs = {
        "context_bow": "(b, V_c) counts over the topic vocabulary: the document conditioning (see the class doc).",
        "topic_ids": "topics to steer towards instead of a bag of words (see the class doc).",
        "topic_mixture": "(b, K) proportions h on the simplex instead of a bag of words.",
        "sentence_prefix_bow": "(b, V_c) the topic words of the sentence before this chunk (sentence topics).",
        "topic_embeddings": "(b, K, D) the topic vectors that an earlier call returned (generation reuses them "
                            "with topic_representation, c_doc, instead of re-encoding).",
        "document_tokens": "the rows are the chunks of documents whose state is carried from chunk to chunk (one row "
                           "per real chunk): the LSTM runs over the documents' sequences in one call and each row's "
                           "o_t is read at ``positions`` of them (no ``state``; not with sentence topics).",
    }
    forward_returns = (":class:`NCLMOutput`: ``loss = (1 - alpha) lm_loss + alpha (bow_loss + kl_loss)`` (module doc), "
                       "``topic_mixture`` = h of the document part (LTA / LETA, or inferred), "
                       "``topic_representation`` = c_doc. In the ``topic_model`` training phase, the topic model's "
                       "own loss.")

    def __init__(self, config: NCLMConfig):
        super().__init__(config)
        self.model = NCLMModel(config)
        self.dropout = nn.Dropout(config.dropout)
        # W_p: (H + |c|) -> H; the columns of [o; c_doc; c_sent] in that order.
        self.compose = nn.Linear(config.hidden_size + config.topic_representation_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self._init_topic_word_prior()  # config.topic_output_bias == "beta": the shared topic output prior
        self.training_phase = "joint"
        self.post_init()

    # -- topics ------------------------------------------------------------------------------------

    def infer_topics(self, context_bow, *, layer=None) -> torch.Tensor:
        """Topic proportions h = softmax(mu) (b, K) of documents given as bags of words (b, V_c)."""
        self.check_layer(layer)
        return self.model.infer_topics(context_bow)

    def topic_word_scores(self, layer: int) -> torch.Tensor:
        """The decoder rows W_k (K, V_c): a topic's words are the largest entries of its row (the paper's topics)."""
        return self.model.topic_model.topic_word_weights()

    @torch.no_grad()
    def topic_word_distributions(self, *, layer=None) -> torch.Tensor:
        """p(w | topic k) = softmax(W_k + b) over the topic vocabulary (K, V_c): the decoder at h = e_k."""
        self.check_layer(layer)
        eye = torch.eye(self.config.num_topics, device=self.device, dtype=self.model.topic_model.decoder.weight.dtype)
        return self.model.topic_model.word_log_probs(eye).exp()

    def topic_word_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """log p(w | h) = log softmax(W h + b) (b, V_c), the NVDM decoder at the proportions h (the shared topic
        output prior's expert, ``topic_output_bias="beta"``)."""
        return self.model.topic_model.word_log_probs(h.to(self.model.topic_model.decoder.weight.dtype))

    def topic_diversity_term(self) -> torch.Tensor:
        """- diversity_weight * R(W rows): TCNLM's regulariser on the decoder's topics (0 when the weight is 0)."""
        if self.config.diversity_weight == 0:
            return torch.zeros((), device=self.device, dtype=torch.float32)
        return -self.config.diversity_weight * angular_diversity(self.model.topic_model.topic_word_weights())

    def topic_model_parameters(self) -> list[nn.Parameter]:
        """The NVDM's parameters (for a topic-model-only training phase)."""
        return list(self.model.topic_model.parameters())

    def topic_model_loss(self, context_bow: torch.Tensor, **inputs) -> torch.Tensor:
        """The NVDM's own objective on bags of words (b, V_c): (reconstruction + KL) per context word,
        over the rows that have words (samples in training mode, softmax(mu) otherwise)."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.device)
        topic_model = self.model.topic_model
        mean, log_sigma = topic_model.posterior(bow.to(topic_model.decoder.weight.dtype))
        h, samples = topic_model.proportions(mean, log_sigma, self.training)
        reconstruction, kl = topic_model.row_losses(bow, mean, log_sigma, h, samples)
        return (reconstruction + kl).sum() / bow.sum().clamp_min(1) + self.topic_diversity_term()

    def set_etr_embeddings(self, vectors) -> None:
        """Give ETR its frozen word vectors (``etr_embedding="frozen"``): a (topic_vocab_size, D) matrix, row i
        the vector of topic word i. Saved with the model."""
        if self.model.etr_word_embeddings is None:
            raise ValueError("set_etr_embeddings needs config.etr_embedding='frozen' and an ETR variant (eta, leta)")
        vectors = torch.as_tensor(vectors, dtype=self.model.etr_word_embeddings.dtype)
        if tuple(vectors.shape) != tuple(self.model.etr_word_embeddings.shape):
            raise ValueError(f"ETR word vectors must have shape {tuple(self.model.etr_word_embeddings.shape)} "
                             f"(topic_vocab_size, etr_embedding_size), got {tuple(vectors.shape)}")
        if not bool(torch.isfinite(vectors).all()):
            raise ValueError("ETR word vectors contain NaN or inf")
        self.model.etr_word_embeddings.copy_(vectors.to(self.model.etr_word_embeddings.device))
        self.model._etr_checked = False

    training_phases = TRAINING_PHASES

    def set_training_phase(self, phase: str) -> None:
        """What a training-mode ``forward`` optimises (evaluation is always the full model):

        * ``"joint"``: the full model and loss;
        * ``"lm"``: LM pre-training, the paper's first phase: c = 0 and no topic-model loss;
        * ``"topic_model"``: NVDM pre-training, its second phase: the loss is :meth:`topic_model_loss` of the
          batch's ``context_bow`` (reported as ``bow_loss``), the LSTM is not run.

        ``TopicLMTrainer(pretraining_phases=[("lm", n1), ("topic_model", n2)])`` switches it by step."""
        if phase not in TRAINING_PHASES:
            raise ValueError(f"training phase must be one of {TRAINING_PHASES}, got {phase!r}")
        self.training_phase = phase

    def leaky_modes(self) -> list[str]:
        """The options in use that let the model read the words it predicts (see :class:`NCLMConfig`)."""
        return self.config.leaky_modes()

    # -- forward -----------------------------------------------------------------------------------

    def language_model_features(self, topics: dict, topic_representation: Optional[torch.Tensor], *, input_ids,
                                attention_mask, inputs_embeds, state, labels, use_cache, output_hidden_states,
                                logits_to_keep, sentence_prefix_bow=None, topic_embeddings=None,
                                document_tokens=None, **inputs) -> LanguageModelPass:
        """The composition o^_t = sigmoid([o_t; c_doc; c_sent] W_p + b_p) of the LSTM's outputs with the document
        part c_doc (from ``topics``, or the trusted ``topic_representation`` and ``topic_embeddings``) and the
        sentence part c_sent; c = 0 in the LM pre-training phase. ``details`` holds h and the posterior."""
        if input_ids is None and self.config.sentence_topics:
            raise ValueError("NCLM with sentence_topics needs input_ids (the sentence topics read the words)")
        cfg = self.config
        b, s = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        attention_mask = last_columns(attention_mask, s)
        device = self.lm_head.weight.device
        lstm_state = None if state is None else tuple(state[:2])
        carried = None if state is None or len(state) < 3 else state[2]
        if document_tokens is not None:
            if state is not None or output_hidden_states or cfg.sentence_topics:
                raise ValueError("document_tokens reads the LSTM's run over whole documents: it takes no state, "
                                 "gives no per-layer hidden states and carries no sentence topics")
            base = self.model(document_tokens["input_ids"], document_tokens["attention_mask"])
            base.last_hidden_state = base.last_hidden_state.flatten(0, 1)[document_tokens["positions"]]
            base.state = None
        else:
            base = self.model(input_ids, attention_mask, inputs_embeds, lstm_state, use_cache,
                              output_hidden_states=output_hidden_states)
        o = self.dropout(base.last_hidden_state)  # (b, s, H)
        topics_on = self.training_phase == "joint" or not self.training

        # the document part c_doc (b, Cd) and, for ETR, the topic vectors z_k; the sentence part c_sent (b, s, Cd)
        # and the running sum to carry. None of it in the LM pre-training phase (c = 0).
        c_doc = h = z_k = posterior = c_sent = new_carry = None
        if topics_on:
            c_doc, h, z_k, posterior = self._document_part(b, device, input_ids, attention_mask, labels is not None,
                                                           topics, topic_representation, topic_embeddings)
            if cfg.sentence_topics:
                c_sent, new_carry = self._sentence_part(input_ids, attention_mask, labels, carried,
                                                        sentence_prefix_bow, z_k, logits_to_keep)

        if logits_to_keep and labels is None:
            o = o[:, -logits_to_keep:]
        H = cfg.hidden_size
        W = effective_weight(self.compose)
        pre_out = F.linear(o, W[:, :H], self.compose.bias)
        if topics_on:
            Cd = cfg.document_topic_size
            pre_out = pre_out + F.linear(c_doc.to(W.dtype), W[:, H:H + Cd]).unsqueeze(1)
            if c_sent is not None:
                pre_out = pre_out + F.linear(c_sent.to(W.dtype), W[:, H + Cd:])

        new_state = None
        if base.state is not None:
            new_state = tuple(base.state)
            if new_carry is not None:
                new_state = new_state + (new_carry.unsqueeze(1),)
        context = labels is not None and "context_bow" in topics and topics_on
        return LanguageModelPass(torch.sigmoid(pre_out), new_state, base.hidden_states,
                                 h.float() if h is not None else None, c_doc,
                                 outputs=dict(topic_embeddings=z_k if cfg.sentence_topics and cfg.uses_etr else None),
                                 details=dict(h=h, posterior=posterior if context else None))

    def output_bias(self, run: LanguageModelPass) -> Optional[torch.Tensor]:
        """The shared topic output prior (``topic_output_bias="beta"``) at the document's h, or None."""
        h = run.details["h"]
        return self.topic_word_prior(h) if self.topic_prior_weight is not None and h is not None else None

    def loss_terms(self, run: LanguageModelPass, labels: torch.Tensor) -> list[LossTerm]:
        """With a context (joint training): alpha (bow_loss + kl_loss - lambda R), each per predicted token."""
        posterior, h = run.details["posterior"], run.details["h"]
        if posterior is None:
            return []
        reconstruction, kl = self.model.topic_model.row_losses(*posterior[:3], h, posterior[3])
        tokens = self.predicted_tokens(labels).clamp_min(1).to(self.lm_head.weight.device)
        bow_loss, kl_loss = reconstruction.sum() / tokens, kl.sum() / tokens
        return [LossTerm(bow_loss + kl_loss + self.topic_diversity_term(), self.config.alpha,
                         reported=dict(bow_loss=bow_loss, kl_loss=kl_loss))]

    def carries_documents_in_one_call(self) -> bool:
        """The LSTM reads nothing but the tokens and the joint objective is a sum over rows divided by the predicted
        tokens (and the diversity term, the same in every call): carried-state training runs a documents batch in one
        call (``document_tokens``), except with sentence topics (carried from chunk to chunk) and in the topic-model
        phase (its loss is not per predicted token)."""
        return not self.config.sentence_topics and self.training_phase != "topic_model"

    def lm_loss_weight(self) -> float:
        """1 - alpha, the official code's weighting of the LM and the topic model."""
        return 1.0 - self.config.alpha

    def _document_part(self, b, device, input_ids, attention_mask, window_excludes_last, given, topic_representation,
                       topic_embeddings):
        """(c_doc, h, z_k, posterior) from the validated conditioning ``given`` (:meth:`resolve_conditioning`), or
        as given by an earlier call (generation)."""
        cfg = self.config
        if topic_representation is None:
            extra = None
            if cfg.uses_etr and cfg.etr_mask_includes_current_sentence and "context_bow" in given \
                    and input_ids is not None:
                extra = self._window_topic_words(input_ids, attention_mask, window_excludes_last)
            return self.model.document_topics(b, device, **given, sample=self.training, extra_present=extra)
        if topic_representation.dim() != 2 or topic_representation.shape[-1] != cfg.document_topic_size:
            raise ValueError(f"topic_representation must have shape (b, {cfg.document_topic_size}), got "
                             f"{tuple(topic_representation.shape)}")
        c_doc = broadcast_rows(topic_representation.to(device), b, "topic_representation")
        z_k = None if topic_embeddings is None else broadcast_rows(topic_embeddings.to(device), b, "topic_embeddings")
        if cfg.sentence_topics and cfg.uses_etr and z_k is None:
            raise ValueError("topic_embeddings are needed with topic_representation for ETR sentence topics")
        return c_doc, (c_doc[:, -cfg.num_topics:] if cfg.uses_ltr else None), z_k, None

    def _sentence_part(self, input_ids, attention_mask, labels, carried, sentence_prefix_bow, z_k, logits_to_keep):
        """(c_sent (b, s, Cd), the running sum to carry (b, H_tm))."""
        cfg = self.config
        b = input_ids.shape[0]
        if labels is not None and cfg.sdt_mode == "prefix" and sentence_prefix_bow is None and carried is None:
            first = input_ids[torch.arange(b, device=input_ids.device),
                              (attention_mask.long().argmax(1) if attention_mask is not None else 0)]
            if not bool((first == cfg.bos_token_id).all()):
                raise ValueError("NCLM's sentence topics need the words of the sentence before a chunk that does not "
                                 "start with <bos>: build the collator with TopicContextCollator(..., "
                                 "sentence_prefix=True) (it adds sentence_prefix_bow)")
        pre, carry = self.model.sentence_pre_activations(input_ids, attention_mask, carried, sentence_prefix_bow,
                                                         labels is not None)
        if logits_to_keep and labels is None:
            pre = pre[:, -logits_to_keep:]
        return self.model.sentence_topics(pre, z_k, self.training), carry

    def _window_topic_words(self, input_ids, attention_mask, excludes_last: bool) -> torch.Tensor:
        """(b, V_c) bool: the topic words among the chunk's inputs (without each row's last real one when
        ``excludes_last``), for ``etr_mask_includes_current_sentence``."""
        b, s = input_ids.shape
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool().clone()
        if excludes_last:
            mask[torch.arange(b, device=mask.device), last_token_positions(attention_mask, s, b, mask.device)] = False
        tm = self.model.lm_to_topic_index(input_ids.device)[input_ids].masked_fill(~mask, -1)
        present = torch.zeros(b, self.config.topic_vocab_size + 1, dtype=torch.bool, device=input_ids.device)
        present.scatter_(1, tm + 1, True)
        return present[:, 1:]


class NCLMForSequenceClassification(DocumentClassifierMixin, NCLMPreTrainedModel):
    """Document classifier on NCLM features: [o_N; c] with the MLP head, or the paper's CNN over [o_m; c]
    (``classifier_head="cnn"``), c = h, z or [z; h] of the whole document by ``config.variant`` (no sentence
    topics: no word is predicted). Loads the body of a saved :class:`NCLMForCausalLM` folder (see
    :class:`~.modeling_document.DocumentClassifierMixin`)."""

    def __init__(self, config: NCLMConfig):
        super().__init__(config)
        self._init_classifier(NCLMModel(config))


__all__ = ["NCLMForCausalLM", "NCLMForSequenceClassification", "NCLMModel", "NCLMOutput", "NCLMPreTrainedModel"]
