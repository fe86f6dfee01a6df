"""GBN-RNN and rGBN-RNN: deep (recurrent) gamma belief networks guiding a stacked LSTM (Guo et al., ICML 2020).

Notation: b batch (documents), c chunks of a document, s tokens, J sentence slots of a document, L layers,
K_l topics of layer l (bottom l = 1), H_l LSTM size of layer l, V vocabulary, V_c topic vocabulary.
Equation numbers are those of the ICLR text (https://arxiv.org/abs/1912.10337); "code" is the official
TensorFlow code (``BoChenGroup/rGBN_RNN`` on GitHub).

Generative model (eq. 2), tau0 the gamma rate, Gam(shape, rate):

    theta^L_j ~ Gam(tau0 Pi^L theta^L_{j-1}, tau0)                       (Gam(1, tau0) at j = 1)
    theta^l_j ~ Gam(tau0 (Phi^{l+1} theta^{l+1}_j + Pi^l theta^l_{j-1}), tau0)   (theta_0 = 0)
    d_j       ~ Pois(Phi^1 theta^1_j)

d_j is sentence j's context bag of words (the collator's ``context``: ``"preceding"`` for the causal model).
GBN-RNN (``recurrent=False``) is the same with Pi = 0 and Gam(1, tau0) at the top for every sentence.

* Encoder (eq. 7-8): per layer a tanh RNN cell over the sentences of a document, h_{j,l} = RNN_l(h_{j-1,l},
  h_{j,l-1}), h_{j,0} = ln(1 + d_j); q(theta^l_j) = Weibull(k, lambda) with one shape k per (sentence, layer)
  and a scale per topic. Samples are reparameterised; the KL to the gamma prior is closed-form, with the
  prior's shape built from the *sampled* theta of the layer above and of the previous sentence.
* LM (eq. 3-4, App. B): LSTM layer l reads the gated output a^{l-1} of the layer below; a^l = g(h^l_t, theta~)
  with a GRU-like gate; the softmax reads [a^1; ...; a^L]. theta~ is theta / max_k theta_k (``theta_normalization``).
  Every chunk starts from a zero LSTM state (the paper); ``state`` carries it (causal-carry, generation).
  ``carry_token_state``: a documents batch carries it across each document's chunks, as causal-carry feeds them
  (every layer in one call over the document's token sequence, each position gated by its own sentence's theta).
* Phi, Pi: ``topic_learning="tlasgr"``: float64 buffers on the simplex learned by TLASGR-MCMC (App. C). A
  training forward augments the latent counts (multinomial and CRT, vectorised, under ``no_grad``) with the
  same theta samples it used, and adds them to pending sufficient statistics; the first optimizer step that
  updates this model's parameters then applies one TLASGR update (a global optimizer step post-hook; see
  :meth:`RGBNRNNModel.tlasgr_step`), so plain ``Trainer``, Accelerate and gradient accumulation (statistics of
  the micro-batches add up to one minibatch) all work. Under ``torch.distributed`` the statistics are summed
  over processes and the Langevin noise is seeded by the step counter, so every process holds the same Phi, Pi.
  ``"gradient"``: softmax-parameterised columns trained by the loss (an alternative, labelled as such).

Loss, divided by the number N of predicted tokens (so the LM part is the usual mean NLL per token):

    loss = lm_loss + (w_P * sum_sentences PoissonNLL(d_j) + sum_l w_l sum_sentences KL^l_j) / N

``bow_loss`` and ``kl_loss`` report the unweighted sums / N. ``loss_preset="elbo"``: all weights 1 (eq. 6);
``"official"``: the official code's 1e-3 and 1e-4 / 1e-5 / 1e-6. Each sentence counts once (at its first
chunk; padding slots never).

Inputs: a documents batch (``input_ids`` (b, c, s), ``context_bow`` (b, c, V_c), ``chunk_mask`` (b, c),
``sentence_index`` (b, c): ``TopicContextCollator(layout="documents")``) runs the sentence recurrence over each
document; a chunk batch (b, s) treats each row as the first sentence of a document unless ``state`` carries
the recurrence. State (batch-first, per layer): LSTM h and c (b, 1, H_l), the encoder's hidden (b, 1, K_l) and
the raw theta of the current sentence (b, 1, K_l) — 4 L tensors. A chunk that starts with ``<bos>`` starts a new
sentence (the encoder advances); another one continues the current sentence's theta.
"""

from __future__ import annotations

import logging
import re
import warnings
import weakref
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin

from .configuration_rgbn_rnn import RGBNRNNConfig
from .modeling_conditioning import (TopicConditioning, bags_of_words, broadcast_rows, check_at_most_one, check_counts,
                                    check_resolved, check_topic_layer, normalize_topic_kwargs)
from .modeling_generation import TopicGenerationMixin
from .modeling_document import DocumentClassifierMixin, DocumentRepresentationMixin
from .modeling_recurrent import (RecurrentModelOutput, RecurrentPreTrainedModel, TopicLMOutput,
                                 carried_sequence_lengths, document_layout, embed_checked, last_columns,
                                 last_token_positions, read_on_host, run_rnn, state_from_aliases)
# the probability machinery
from .modeling_rgbn_sampler import (ALPHA_MIN, LAMBDA_MIN, augment_counts, kl_weibull_gamma, poisson_nll, tlasgr_update,
                                    weibull_mean, weibull_sample)
from .modeling_topic_family import LanguageModelPass, LossTerm, TopicFamilyForCausalLM, lstm_language_model_weights

logger = logging.getLogger(__name__)

# Models with pending TLASGR statistics are updated after the optimizer step that updates their parameters.
_TLASGR_MODELS: "weakref.WeakSet" = weakref.WeakSet()
_TLASGR_HOOK = None


def _after_optimizer_step(optimizer, args, kwargs):
    if not len(_TLASGR_MODELS):
        return
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in list(_TLASGR_MODELS):
        if model._tlasgr_pending is not None and any(id(p) in ids for p in model.parameters()):
            model.tlasgr_step()


def _register_for_tlasgr(model) -> None:
    global _TLASGR_HOOK
    _TLASGR_MODELS.add(model)
    if _TLASGR_HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _TLASGR_HOOK = register_optimizer_step_post_hook(_after_optimizer_step)


# ----------------------------------------------------------------------------------------------
# modules
# ----------------------------------------------------------------------------------------------


@dataclass
class RGBNRNNOutput(TopicLMOutput):
    """:class:`TopicLMOutput` plus ``theta``: the raw theta of every layer, concatenated (..., sum_l K_l), that
    the LM was conditioned on: (b, sum K) for a chunk batch, (b, J, sum K) per sentence slot for documents.
    ``topic_mixture`` is theta^1 normalised to sum 1."""

    theta: Optional[torch.Tensor] = None


@dataclass
class _TopicPass:
    """What the topic side of one forward produced (internal)."""

    thetas: list  # per layer, per row or (b, J, K)
    shapes: Optional[list] = None  # Weibull k
    scales: Optional[list] = None  # Weibull lambda
    prev: Optional[list] = None  # theta of the previous sentence, per layer (zeros where none)
    has_prev: Optional[torch.Tensor] = None  # bool, rows / slots whose sentence has a predecessor
    counts: Optional[torch.Tensor] = None  # the bags of words encoded
    rows: Optional[torch.Tensor] = None  # bool, rows / slots that count in the topic model's loss
    hidden: Optional[list] = None  # encoder hidden after this sentence, per layer
    total: Optional[int] = None  # a bound on the counts' sum known to the host (None: read it when needed)


@dataclass
class _Slots:
    """A documents batch's sentences (internal; :meth:`RGBNRNNModel.sentence_slots`)."""

    slot: torch.Tensor  # (b, c) the sentence slot of every chunk
    slot_mask: torch.Tensor  # (b, J) the real sentence slots
    bows: torch.Tensor  # (b, J, V_c) each slot's bag of words
    rows: torch.Tensor  # (real chunks,) their documents, in order
    cols: torch.Tensor  # (real chunks,) their chunk positions
    total: int  # the sum of the bags' counts
    longest: int  # the longest carried token sequence (0 unless asked)


class RGBNRNNEncoder(nn.Module):
    """The Weibull encoder: per layer l an RNN cell of size K_l over sentences, k (one per sentence and layer) and
    lambda (per topic) from its output (eq. 7-8)."""

    def __init__(self, config: RGBNRNNConfig):
        super().__init__()
        sizes = [config.topic_vocab_size, *config.topic_sizes]
        self.cells = nn.ModuleList(nn.RNNCell(sizes[l], sizes[l + 1]) for l in range(config.num_layers))
        self.shape = nn.ModuleList(nn.Linear(k, 1) for k in config.topic_sizes)
        self.scale = nn.ModuleList(nn.Linear(k, k) for k in config.topic_sizes)
        self.recurrent = config.recurrent_encoder
        self.k_min, self.k_max = config.k_min, config.k_max
        # The cells keep torch's own initialisation (RNNCell.reset_parameters); built on the meta device they have
        # none, and the model's _init_weights gives it to them once they are on a real device.
        self.cells_initialised = not any(p.is_meta for p in self.cells.parameters())

    def forward(self, bows: torch.Tensor, hidden: Optional[list] = None):
        """Every sentence of every document: bows (n, J, V_c), hidden per layer (n, K_l) before the first sentence or
        None -> (k list (n, J, 1), lambda list (n, J, K_l), hidden after the last sentence per layer (n, K_l)).

        Each layer's recurrence over the sentences is one fused call (it reads the layer below and the bags of
        words, never the samples), and k, lambda come from all sentences at once."""
        x = torch.log1p(bows)
        shapes, scales, last = [], [], []
        for l, cell in enumerate(self.cells):
            x = x.to(cell.weight_ih.dtype)
            if self.recurrent:
                h0 = (hidden[l] if hidden is not None else x.new_zeros(x.shape[0], cell.hidden_size)).unsqueeze(0)
                x, h_n = torch._VF.rnn_tanh(x, h0.to(x.dtype), [cell.weight_ih, cell.weight_hh, cell.bias_ih,
                                                                 cell.bias_hh], True, 1, 0.0, self.training, False,
                                            True)
                last.append(h_n.squeeze(0))
            else:  # every sentence from a zero hidden state: tanh(W_ih x + b_ih + b_hh)
                x = torch.tanh(F.linear(x, cell.weight_ih, cell.bias_ih + cell.bias_hh))
                last.append(x[:, -1])
            shapes.append(F.softplus(self.shape[l](x)).clamp(self.k_min, self.k_max))
            scales.append(F.softplus(self.scale[l](x)) + LAMBDA_MIN)
        return shapes, scales, last

    def step(self, bow: torch.Tensor, hidden: Optional[list]):
        """One sentence: bow (n, V_c), hidden per layer (n, K_l) or None -> (k list (n, 1), lambda list (n, K_l),
        new hidden list)."""
        shapes, scales, last = self(bow.unsqueeze(1), hidden)
        return [k.squeeze(1) for k in shapes], [lam.squeeze(1) for lam in scales], last


# |b_z| of a gate started from a language model (from_language_model): z = sigmoid(-4) = 1.8 % of the topic candidate
LANGUAGE_MODEL_GATE_BIAS = 4.0


class RGBNRNNGate(nn.Module):
    """The GRU-like coupling of theta (K) and the LSTM output h (H), App. B:
    z = s(W_z theta + U_z h + b_z), r = s(W_r theta + U_r h + b_r), h~ = tanh(W_h theta + U_h (r h) + b_h);
    ``"paper"``: a = (1 - z) h + z h~; ``"official"``: a = (1 - z) h~ + z h."""

    def __init__(self, num_topics: int, hidden_size: int, kind: str):
        super().__init__()
        self.theta_proj = nn.Linear(num_topics, 3 * hidden_size, bias=False)  # W_z, W_r, W_h
        self.bias = nn.Parameter(torch.zeros(3 * hidden_size))  # b_z, b_r, b_h (initialised by the model)
        self.hidden_proj = nn.Linear(hidden_size, 2 * hidden_size, bias=False)  # U_z, U_r
        self.candidate_proj = nn.Linear(hidden_size, hidden_size, bias=False)  # U_h
        self.kind = kind

    def forward(self, h: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        # h (n, s, H), theta (n, K): the theta side is computed once per row; or (n, s, K): one per position
        projected = self.theta_proj(theta.to(h.dtype)) + self.bias
        tz, tr, th = (projected if projected.dim() == h.dim() else projected.unsqueeze(1)).chunk(3, dim=-1)
        uz, ur = self.hidden_proj(h).chunk(2, dim=-1)
        z, r = torch.sigmoid(tz + uz), torch.sigmoid(tr + ur)
        candidate = torch.tanh(th + self.candidate_proj(r * h))
        if self.kind == "paper":
            return (1 - z) * h + z * candidate
        return (1 - z) * candidate + z * h


def _run_gated_layer(lstm, gate, x, attention_mask, theta, need_state, *state):
    """One LSTM layer and its topic gate: (a (n, s, H) zero at padding, h, c) (flat, for checkpointing)."""
    lstm.flatten_parameters()
    h, new = run_rnn(lstm, x, attention_mask, state or None, need_state=need_state)
    a = gate(h, theta)
    if attention_mask is not None:
        a = a * attention_mask.unsqueeze(-1).to(a.dtype)
    return (a, *new)


def initial_topic_matrices(config: RGBNRNNConfig) -> list[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """(Phi^l, Pi^l or None) per layer at initialisation: float64 CPU draws seeded by ``config.tlasgr_seed``, so
    that the same configuration starts from the same topics on any device (the meta device included)."""
    generator = torch.Generator().manual_seed(config.tlasgr_seed)
    rows = [config.topic_vocab_size, *config.topic_sizes[:-1]]
    matrices = []
    for R, K in zip(rows, config.topic_sizes):
        # the code: U(0, 1) columns, normalised
        phi = torch.rand(R, K, dtype=torch.float64, generator=generator, device="cpu")
        phi = phi / phi.sum(0)
        pi = None
        if config.recurrent:
            # Pi: Dir(1) columns, normalised Exp(1) draws (the code's Pi = I is nearly absorbing: its multinomial
            # never routes counts to a zero entry)
            pi = -torch.log1p(-torch.rand(K, K, dtype=torch.float64, generator=generator, device="cpu"))
            pi = pi / pi.sum(0)
        matrices.append((phi, pi))
    return matrices


# TLASGR-MCMC's sampler state: float64 buffers whatever the model's dtype (Phi^l, Pi^l and their Fisher weights)
_SAMPLER_STATE = re.compile(r"(^|\.)(phi|pi)(_fisher)?_\d+$")


class RGBNRNNPreTrainedModel(RecurrentPreTrainedModel):
    config_class = RGBNRNNConfig
    _no_split_modules = ["RGBNRNNModel"]
    conditioning_inputs = ("context_bow", "topic_mixture", "topic_ids")
    training_context = "preceding"  # the sentence recurrence reads the sentences before each one
    reads_documents = True

    def _init_weights(self, module):
        super()._init_weights(module)  # embeddings, linear layers, LSTMs: U(-r, r), zero biases
        if isinstance(module, nn.LSTM):
            with torch.no_grad():
                H = module.hidden_size
                for name, param in module.named_parameters():
                    if name.startswith("bias_ih"):
                        param[H:2 * H].fill_(1.0)  # forget-gate bias 1 (the code's BasicLSTMCell)
        elif isinstance(module, RGBNRNNGate):
            with torch.no_grad():
                H = module.candidate_proj.weight.shape[0]
                bias = module.bias
                bias.zero_()
                # both gate forms pass sigmoid(1) = 73 % of h at the start, as the code's bias of 1 does
                bias[:H].fill_(-1.0 if module.kind == "paper" else 1.0)
                bias[H:2 * H].fill_(1.0)
        elif isinstance(module, RGBNRNNModel):
            # Phi, Pi and the sampler state, on whatever device they are (a model built on the meta device and
            # moved with to_empty gets them here); weights loaded from a checkpoint are skipped (init's flag).
            # (Here, not on the encoder: transformers skips modules without parameters of their own.)
            from transformers import initialization as init

            encoder = module.encoder
            if not encoder.cells_initialised and not any(p.is_meta for p in encoder.cells.parameters()):
                for cell in encoder.cells:  # RNNCell.reset_parameters' U(-1/sqrt(K), 1/sqrt(K))
                    bound = cell.hidden_size ** -0.5
                    for param in cell.parameters():
                        init.uniform_(param, -bound, bound)
                encoder.cells_initialised = True
            config = module.config
            for l, (phi, pi) in enumerate(initial_topic_matrices(config), start=1):
                if config.topic_learning == "tlasgr":
                    init.copy_(getattr(module, f"phi_{l}"), phi)
                    init.zeros_(getattr(module, f"phi_fisher_{l}"))
                    if pi is not None:
                        init.copy_(getattr(module, f"pi_{l}"), pi)
                        init.zeros_(getattr(module, f"pi_fisher_{l}"))
                else:
                    init.copy_(getattr(module, f"phi_logits_{l}"), phi.log())
                    if pi is not None:
                        init.copy_(getattr(module, f"pi_logits_{l}"), pi.log())
            if config.topic_learning == "tlasgr":
                init.zeros_(module.tlasgr_step_count)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """``from_pretrained``; from a ``state_dict`` without a requested dtype (``dtype="auto"``, the default) and
        a configuration that names none, the dtype is the weights' (the default dtype where there are none), not
        that of TLASGR-MCMC's float64 sampler buffers, which transformers would otherwise take for the whole model.
        The sampler buffers stay float64 in any dtype."""
        state_dict, config = kwargs.get("state_dict"), kwargs.get("config")
        requested = kwargs.get("dtype", kwargs.get("torch_dtype"))
        if state_dict is not None and requested in (None, "auto") and getattr(config, "dtype", None) is None:
            weights = [v for k, v in state_dict.items() if v.is_floating_point() and not _SAMPLER_STATE.search(k)]
            kwargs.pop("torch_dtype", None)
            kwargs["dtype"] = weights[0].dtype if weights else torch.get_default_dtype()
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


class RGBNRNNModel(DocumentRepresentationMixin, RGBNRNNPreTrainedModel):
    """Embeddings, the stacked LSTM with its topic gates, the Weibull encoder and the topic matrices Phi^l, Pi^l.

    ``forward`` returns the concatenated gated outputs [a^1; ...; a^L] (b, s, sum H) as ``last_hidden_state``.
    """

    _keys_to_ignore_on_load_unexpected = [*RecurrentPreTrainedModel._keys_to_ignore_on_load_unexpected,
                                          r"^lm_head\."]

    def __init__(self, config: RGBNRNNConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        inputs = [config.embedding_size, *config.hidden_sizes[:-1]]
        self.lstms = nn.ModuleList(nn.LSTM(i, h, batch_first=True) for i, h in zip(inputs, config.hidden_sizes))
        self.gates = nn.ModuleList(RGBNRNNGate(config.topic_sizes[config.topic_layer_of_lstm(i)], h, config.gate)
                                   for i, h in enumerate(config.hidden_sizes))
        self.encoder = RGBNRNNEncoder(config)
        # Seeded CPU draws (explicit device: from_pretrained builds the model under a meta-device context and
        # then loads the saved values over these); _init_weights draws them again on the buffers' own device.
        for l, (phi, pi) in enumerate(initial_topic_matrices(config), start=1):
            K = phi.shape[1]
            if config.topic_learning == "tlasgr":
                self.register_buffer(f"phi_{l}", phi)
                self.register_buffer(f"phi_fisher_{l}", torch.zeros(K, dtype=torch.float64))
                if pi is not None:
                    self.register_buffer(f"pi_{l}", pi)
                    self.register_buffer(f"pi_fisher_{l}", torch.zeros(K, dtype=torch.float64))
            else:
                self.register_parameter(f"phi_logits_{l}", nn.Parameter(phi.log().float()))
                if pi is not None:
                    self.register_parameter(f"pi_logits_{l}", nn.Parameter(pi.log().float()))
        if config.topic_learning == "tlasgr":
            self.register_buffer("tlasgr_step_count", torch.zeros((), dtype=torch.long))
        self._tlasgr_pending = None
        self.gradient_checkpointing = False
        self.post_init()

    # -- topic matrices ----------------------------------------------------------------------------

    def learns_topic_matrices(self) -> bool:
        """Whether training updates Phi and Pi (TLASGR-MCMC): they learn with the topic model, so not when the
        Weibull encoder's own weights are all frozen, as under a PEFT adapter (the base stays as it was loaded, and
        an adapter would not save them: a reloaded adapter would get other topics)."""
        return any(p.requires_grad for name, p in self.encoder.named_parameters() if "lora_" not in name)

    def phi(self, layer: int) -> torch.Tensor:
        """Phi^layer (1-based): (V_c, K_1) or (K_{l-1}, K_l), columns on the simplex."""
        if self.config.topic_learning == "tlasgr":
            return getattr(self, f"phi_{layer}")
        return torch.softmax(getattr(self, f"phi_logits_{layer}"), dim=0)

    def pi(self, layer: int) -> Optional[torch.Tensor]:
        """Pi^layer (K_l, K_l), column k' the transitions out of topic k'; ``None`` for GBN-RNN."""
        if not self.config.recurrent:
            return None
        if self.config.topic_learning == "tlasgr":
            return getattr(self, f"pi_{layer}")
        return torch.softmax(getattr(self, f"pi_logits_{layer}"), dim=0)

    def _matrices(self, dtype):
        L = self.config.num_layers
        phis = [self.phi(l).to(dtype) for l in range(1, L + 1)]
        pis = [self.pi(l).to(dtype) for l in range(1, L + 1)] if self.config.recurrent else None
        return phis, pis

    # -- TLASGR ------------------------------------------------------------------------------------

    def set_training_corpus_size(self, rows: int) -> None:
        """The number of rows (documents) of the training set, which scales the minibatch statistics
        (``TopicLMTrainer`` calls it)."""
        self.config.tlasgr_corpus_size = int(rows)

    @torch.no_grad()
    def accumulate_tlasgr_statistics(self, counts: torch.Tensor, thetas: list, rows: int,
                                     total: Optional[int] = None) -> None:
        """Augment the counts (b, J, V_c) with the raw theta samples (per layer (b, J, K_l)) and add the sufficient
        statistics to the pending ones (applied by :meth:`tlasgr_step`); ``rows``: the minibatch rows they cover;
        ``total``: a bound on the counts' sum known to the host (None: read, one host synchronisation)."""
        phis, pis = self._matrices(torch.float64)
        aug = augment_counts(counts, [t.detach() for t in thetas], phis, pis, self.config.tau0, total=total)
        stats = aug.phi + (aug.pi or [])
        if self._tlasgr_pending is None:
            self._tlasgr_pending = [stats, float(rows)]
        else:
            self._tlasgr_pending = [[a + b for a, b in zip(self._tlasgr_pending[0], stats)],
                                    self._tlasgr_pending[1] + rows]
        _register_for_tlasgr(self)

    @torch.no_grad()
    def tlasgr_step(self) -> bool:
        """Apply one TLASGR-MCMC update of every Phi^l and Pi^l from the pending statistics, then clear them.

        Called automatically after every optimizer step that updates this model's parameters (a global
        ``torch.optim`` step post-hook), so gradient accumulation gives one update per optimizer step from the
        statistics of all its micro-batches. Under ``torch.distributed`` the statistics (and row counts) are
        summed over processes first, and the noise of step t is seeded by (``tlasgr_seed``, t): every process
        computes the same update. Returns False when nothing was pending."""
        if self.config.topic_learning != "tlasgr" or self._tlasgr_pending is None:
            return False
        stats, rows = self._tlasgr_pending
        self._tlasgr_pending = None
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            flat = torch.cat([s.reshape(-1) for s in stats] + [torch.tensor([rows], dtype=torch.float64,
                                                                            device=stats[0].device)])
            torch.distributed.all_reduce(flat)
            rows = float(flat[-1])
            out, start = [], 0
            for s in stats:
                out.append(flat[start:start + s.numel()].view_as(s))
                start += s.numel()
            stats = out
        corpus = self.config.tlasgr_corpus_size
        if corpus is None and not getattr(self, "_warned_corpus_size", False):
            logger.warning("config.tlasgr_corpus_size is not set: TLASGR-MCMC treats each minibatch as the whole corpus "
                           "(the Dirichlet priors then weigh far more). TopicLMTrainer sets it; with another loop, call "
                           "model.set_training_corpus_size(len(train_dataset)).")
            self._warned_corpus_size = True
        scale = (corpus / max(rows, 1.0)) if corpus else 1.0
        step = int(self.tlasgr_step_count)
        device = self.phi_1.device
        generator = torch.Generator(device=device).manual_seed(self.config.tlasgr_seed * 1_000_003 + step)
        L = self.config.num_layers
        names = [(f"phi_{l}", f"phi_fisher_{l}", self.config.eta_phi) for l in range(1, L + 1)]
        if self.config.recurrent:
            names += [(f"pi_{l}", f"pi_fisher_{l}", self.config.eta_pi) for l in range(1, L + 1)]
        for (name, fisher_name, eta), stat in zip(names, stats):
            matrix, fisher = getattr(self, name), getattr(self, fisher_name)
            new, new_fisher = tlasgr_update(matrix, stat * scale, fisher, step, eta, self.config, generator)
            matrix.copy_(new.to(matrix.dtype))
            fisher.copy_(new_fisher.to(fisher.dtype))
        self.tlasgr_step_count += 1
        return True

    # -- topic side --------------------------------------------------------------------------------

    def _theta_from_posterior(self, shapes, scales, sample: bool) -> list:
        if sample:
            return [weibull_sample(k, lam) for k, lam in zip(shapes, scales)]
        return [weibull_mean(k, lam) for k, lam in zip(shapes, scales)]

    def encode_documents(self, context_bow: torch.Tensor, slot_mask: torch.Tensor, sample: bool) -> _TopicPass:
        """The sentence recurrence over documents: context_bow (b, J, V_c) per sentence slot, slot_mask (b, J)
        -> theta per layer (b, J, K_l) (samples when ``sample``, else the posterior mean) with k, lambda."""
        b, J, _ = context_bow.shape
        shapes, scales, hidden = self.encoder(context_bow)
        if sample:  # one draw of the uniforms, in the order sentence by sentence, then layer by layer
            sizes = [b * lam.shape[-1] for lam in scales]
            uniforms = torch.rand(J, sum(sizes), dtype=scales[0].dtype, device=scales[0].device).split(sizes, 1)
            thetas = [weibull_sample(k, lam, u.view(J, b, -1).transpose(0, 1))
                      for k, lam, u in zip(shapes, scales, uniforms)]
        else:
            thetas = self._theta_from_posterior(shapes, scales, sample=False)
        prev = [F.pad(t[:, :-1], (0, 0, 1, 0)) for t in thetas]  # theta_{j-1}, zero at j = 1
        has_prev = torch.ones(b, J, dtype=torch.bool, device=context_bow.device)
        has_prev[:, 0] = False
        return _TopicPass(thetas, shapes, scales, prev, has_prev, context_bow, slot_mask.bool(), hidden)

    def prior_shapes(self, thetas: list, prev: list, has_prev: torch.Tensor) -> list:
        """The gamma prior shape alpha^l of every theta^l (same leading shape as the thetas):
        tau0 (Phi^{l+1} theta^{l+1} + Pi^l theta^l_{j-1}); at the top tau0 Pi^L theta^L_{j-1}, or 1 for a first
        sentence and for GBN-RNN."""
        cfg = self.config
        L = cfg.num_layers
        dtype = thetas[0].dtype
        phis, pis = self._matrices(dtype)
        alphas = []
        for l in range(L):
            alpha = torch.zeros_like(thetas[l])
            if l < L - 1:
                alpha = alpha + thetas[l + 1] @ phis[l + 1].T
            if pis is not None:
                alpha = alpha + prev[l] * has_prev.unsqueeze(-1).to(dtype) @ pis[l].T
            alpha = cfg.tau0 * alpha
            if l == L - 1:
                first = ~has_prev if pis is not None else torch.ones_like(has_prev)
                alpha = torch.where(first.unsqueeze(-1), torch.ones_like(alpha), alpha)
            alphas.append(alpha.clamp_min(ALPHA_MIN))
        return alphas

    def topic_terms(self, tp: _TopicPass):
        """(Poisson NLL summed over counted rows, KL per layer summed over counted rows)."""
        rows = tp.rows.to(tp.thetas[0].dtype)
        alphas = self.prior_shapes(tp.thetas, tp.prev, tp.has_prev)
        kls = [(kl_weibull_gamma(k, lam, alpha, self.config.tau0).sum(-1) * rows).sum()
               for k, lam, alpha in zip(tp.shapes, tp.scales, alphas)]
        return poisson_nll(tp.counts, tp.thetas[0], self.phi(1), rows, tp.total), kls

    # -- language model ----------------------------------------------------------------------------

    def gate_inputs(self, thetas: list) -> list:
        """theta~ per topic layer: theta / max_k theta_k (``theta_normalization="max"``) or theta."""
        if self.config.theta_normalization == "none":
            return thetas
        return [t / t.amax(-1, keepdim=True).clamp_min(1e-20) for t in thetas]

    def lm_features(self, input_ids, attention_mask, inputs_embeds, thetas: list, lstm_state=None,
                    need_state: bool = False, output_hidden_states: bool = False):
        """Run the stacked LSTM with its gates on (n, s) tokens conditioned on raw theta per topic layer (n, K_l), or
        per position (n, s, K_l).

        Returns ([a^1; ...; a^L] (n, s, sum H) zero at padding, new LSTM state [(h, c) per layer] or None,
        hidden states tuple or None)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = embed_checked(self.embed_tokens, input_ids, self.config.vocab_size)
        attention_mask = last_columns(attention_mask, inputs_embeds.shape[1])
        gate_thetas = self.gate_inputs(thetas)
        x = self.dropout(inputs_embeds)
        outputs, states, hidden = [], [], [x]
        checkpoint_fn = self.checkpoint_function()  # gradient checkpointing: every gated layer is a checkpoint
        for i, (lstm, gate) in enumerate(zip(self.lstms, self.gates)):
            state_i = () if lstm_state is None else tuple(lstm_state[i])
            args = (lstm, gate, x, attention_mask, gate_thetas[self.config.topic_layer_of_lstm(i)], need_state,
                    *state_i)
            a, *new = _run_gated_layer(*args) if checkpoint_fn is None else checkpoint_fn(_run_gated_layer, *args)
            hidden.append(a)
            x = self.dropout(a)
            outputs.append(x)
            states.append(new)
        return torch.cat(outputs, -1), (states if need_state else None), (tuple(hidden) if output_hidden_states
                                                                          else None)

    # -- conditioning ------------------------------------------------------------------------------

    def split_theta(self, theta: torch.Tensor) -> list:
        """(..., sum K) -> per layer (..., K_l)."""
        return list(theta.split(self.config.topic_sizes, dim=-1))

    def check_topic_mixture(self, theta, batch_size: Optional[int]) -> torch.Tensor:
        """``topic_mixture`` (b, sum K) checked: every layer's raw topic weights theta^1..theta^L side by side,
        bottom first, finite and non-negative (not normalised: theta^l's scale is the model's)."""
        total = sum(self.config.topic_sizes)
        theta = torch.as_tensor(theta, dtype=torch.float32) if not isinstance(theta, torch.Tensor) else theta
        theta = theta.unsqueeze(0) if theta.dim() == 1 else theta
        if theta.dim() != 2 or theta.shape[-1] != total:
            raise ValueError(f"topic_mixture must have shape (b, {total}) (every layer's topic weights, bottom first, "
                             f"sizes {list(self.config.topic_sizes)}), got {tuple(theta.shape)}")
        if not bool(torch.isfinite(theta).all()) or bool((theta < 0).any()):
            raise ValueError("topic_mixture must be finite and non-negative")
        return broadcast_rows(theta, batch_size, "topic_mixture")

    def resolve_conditioning(self, batch_size: Optional[int], context_bow=None, topic_mixture=None, topic_ids=None,
                             topic_layer=None, topic_mode: str = "propagate", theta=None) -> TopicConditioning:
        """The raw conditioning of a chunk batch (at most one) validated once, as the batch-first tensors of
        ``batch_size`` rows that :meth:`_run` takes and trusts: ``context_bow`` (b, V_c), or ``topic_mixture``
        (b, sum K: theta^1..theta^L, bottom first), given or made from the ``topic_ids`` of layer ``topic_layer``
        (1 = bottom) by :meth:`theta_of_topics`. ``theta=`` is the deprecated name of ``topic_mixture``."""
        if theta is not None:
            warnings.warn("rGBN-RNN's theta= is deprecated: give topic_mixture= (the same (b, sum K) weights)",
                          FutureWarning, stacklevel=3)
            check_at_most_one(topic_mixture=topic_mixture, theta=theta)
            topic_mixture = theta
        check_at_most_one(context_bow=context_bow, topic_mixture=topic_mixture, topic_ids=topic_ids)
        if topic_layer is not None and topic_ids is None:
            raise ValueError("topic_layer goes with topic_ids")
        layer = check_topic_layer(topic_layer, self.config.num_layers)
        given = normalize_topic_kwargs(self.config.topic_sizes[layer - 1], self.config.topic_vocab_size, batch_size,
                                       topic_ids=topic_ids, context_bow=context_bow)
        if topic_mixture is not None:
            return TopicConditioning("topic_mixture", self.check_topic_mixture(topic_mixture, batch_size))
        if topic_ids is not None:
            return TopicConditioning("topic_mixture", self.theta_of_topics(given["topic_ids"], layer, topic_mode))
        return given

    def theta_from_topics(self, topic_ids, topic_layer: int = 1, mode: str = "propagate",
                          batch_size: Optional[int] = None) -> torch.Tensor:
        """theta (b, sum K) for raw ``topic_ids`` of layer ``topic_layer``, validated (:meth:`theta_of_topics`)."""
        return self.resolve_conditioning(batch_size, topic_ids=topic_ids, topic_layer=topic_layer,
                                         topic_mode=mode)["topic_mixture"]

    @torch.no_grad()
    def theta_of_topics(self, ids: torch.Tensor, layer: int, mode: str = "propagate") -> torch.Tensor:
        """theta (b, sum K) for validated topic ids (b, k) of one layer: theta^layer = the one-hot sum of the
        topics; the layers below get ``"propagate"``: theta^{l-1} = Phi^l theta^l (the prior mean), or ``"chain"``
        (the official ``generate_on_topic``): one-hot at each parent's argmax_k' Phi^l[k', k]; the layers above
        are 0."""
        if mode not in ("propagate", "chain"):
            raise ValueError(f"topic_mode must be 'propagate' or 'chain', got {mode!r}")
        K = self.config.topic_sizes
        ids = ids.to(self.device)
        thetas = [torch.zeros(ids.shape[0], k, device=self.device, dtype=torch.float32) for k in K]  # topic side
        onehot = torch.zeros(ids.shape[0], K[layer - 1] + 1, device=self.device, dtype=torch.float32)
        onehot.scatter_(1, ids.clamp(min=-1) % (K[layer - 1] + 1), 1.0)
        thetas[layer - 1] = onehot[:, :-1]
        for l in range(layer - 1, 0, -1):  # 0-based index of the layer below: l - 1
            phi = self.phi(l + 1).float()  # (K_l, K_{l+1})
            if mode == "propagate":
                thetas[l - 1] = thetas[l] @ phi.T
            else:
                best = F.one_hot(phi.argmax(0), phi.shape[0]).float()  # (K_{l+1}, K_l): each parent's top child
                thetas[l - 1] = ((thetas[l] > 0).float() @ best > 0).float()
        return torch.cat(thetas, -1)

    @torch.no_grad()
    def sample_prior_theta(self, batch_size: int = 1, previous: Optional[torch.Tensor] = None,
                           sample: bool = True) -> torch.Tensor:
        """theta (b, sum K) drawn from the generative model, top-down: the first sentence's prior, or with
        ``previous`` (b, sum K) the next sentence's (eq. 2; GBN-RNN ignores it). ``sample=False``: the prior mean
        of each layer given the layer above (shape / tau0), top-down, instead of a draw (deterministic)."""
        cfg = self.config
        L = cfg.num_layers
        phis, pis = self._matrices(torch.float32)
        prev = self.split_theta(previous.float().to(self.device)) if previous is not None else None
        if prev is not None:
            batch_size = prev[0].shape[0]
        thetas = [None] * L
        for l in range(L - 1, -1, -1):
            if l == L - 1:
                shape = (cfg.tau0 * prev[l] @ pis[l].T if (pis is not None and prev is not None)
                         else torch.ones(batch_size, cfg.topic_sizes[l], device=self.device, dtype=torch.float32))
            else:
                shape = thetas[l + 1] @ phis[l + 1].T
                if pis is not None and prev is not None:
                    shape = shape + prev[l] @ pis[l].T
                shape = cfg.tau0 * shape
            shape = shape.clamp_min(ALPHA_MIN)
            thetas[l] = torch.distributions.Gamma(shape, cfg.tau0).sample() if sample else shape / cfg.tau0
        return torch.cat(thetas, -1)

    # -- forward -----------------------------------------------------------------------------------

    @staticmethod
    def is_documents_batch(input_ids, inputs_embeds) -> bool:
        """Whether the tokens are a documents batch: (b, c, s) ids or (b, c, s, E) embeddings."""
        return (input_ids is not None and input_ids.dim() == 3) or \
            (inputs_embeds is not None and inputs_embeds.dim() == 4)

    def conditioning_of_batch(self, input_ids, inputs_embeds, resolved: Optional[TopicConditioning] = None,
                              **raw) -> TopicConditioning:
        """What :meth:`_run` takes: a chunk batch's raw keywords validated once by :meth:`resolve_conditioning`; the
        ``resolved`` conditioning as it is; a documents batch's bags as they are (sentence_slots checks them)."""
        if resolved is not None:
            return check_resolved(resolved, raw)
        if self.is_documents_batch(input_ids, inputs_embeds):
            return TopicConditioning.of(**raw)
        tokens = input_ids if input_ids is not None else inputs_embeds
        return self.resolve_conditioning(None if tokens is None else tokens.shape[0], **raw)

    def _run(self, input_ids, attention_mask, inputs_embeds, state, use_cache, given: dict, chunk_mask=None,
             sentence_index=None, output_hidden_states=None, topic_representation=None, carry_token_state=None):
        """The forward pass shared by the base and the causal LM (see the module docstring), with the conditioning
        ``given`` by :meth:`conditioning_of_batch` (used as is).

        Returns (features, state or None, hidden states, _TopicPass or None, theta out, documents layout info)."""
        cfg = self.config
        output_hidden_states = bool(cfg.output_hidden_states if output_hidden_states is None else output_hidden_states)
        tokens = input_ids if input_ids is not None else inputs_embeds
        if tokens is None:
            raise ValueError("Give exactly one of input_ids and inputs_embeds")
        sample = (cfg.train_theta if self.training else cfg.eval_theta) == "sample"
        if self.is_documents_batch(input_ids, inputs_embeds):
            carry = cfg.carry_token_state if carry_token_state is None else bool(carry_token_state)
            return self._run_documents(input_ids, attention_mask, inputs_embeds, given.get("context_bow"), chunk_mask,
                                       sentence_index, sample, output_hidden_states, carry)
        if chunk_mask is not None or sentence_index is not None:
            raise ValueError("chunk_mask and sentence_index go with documents-shaped input_ids (b, chunks, tokens)")
        b = tokens.shape[0]
        device = self.embed_tokens.weight.device
        L = cfg.num_layers
        lstm_state = enc_hidden = prev = None
        if state is not None:
            if len(state) != 4 * L:
                raise ValueError(f"state must hold {4 * L} tensors (LSTM h, c, encoder hidden, theta per layer), got "
                                 f"{len(state)}")
            lstm_state = [(state[2 * i], state[2 * i + 1]) for i in range(L)]
            enc_hidden = [s.squeeze(1) for s in state[2 * L:3 * L]]
            prev = [s.squeeze(1) for s in state[3 * L:]]
        tp = None
        if topic_representation is not None:  # theta resolved before (generation's cache): used as is
            thetas = self.split_theta(topic_representation.to(device))
        elif "topic_mixture" in given:
            thetas = self.split_theta(given["topic_mixture"].to(device))
        else:
            bow = given["context_bow"].to(device) if "context_bow" in given else \
                torch.zeros(b, cfg.topic_vocab_size, device=device, dtype=torch.float32)  # counts, as the collator's
            # a chunk that starts with <bos> starts a new sentence; without a state every chunk does
            if state is None or input_ids is None:
                new_sentence = torch.ones(b, dtype=torch.bool, device=device)
            else:
                first = (attention_mask[:, -input_ids.shape[1]:].long().argmax(1) if attention_mask is not None
                         else torch.zeros(b, dtype=torch.long, device=device))
                new_sentence = input_ids.gather(1, first.unsqueeze(1)).squeeze(1) == cfg.bos_token_id
            shapes, scales, hidden = self.encoder.step(bow, enc_hidden)
            fresh = self._theta_from_posterior(shapes, scales, sample)
            keep = new_sentence.unsqueeze(-1)
            thetas = [torch.where(keep, t, p.to(t.dtype)) if prev is not None else t for t, p in
                      zip(fresh, prev or fresh)]
            hidden = [torch.where(keep, h, e.to(h.dtype)) if enc_hidden is not None else h
                      for h, e in zip(hidden, enc_hidden or hidden)]
            has_prev = torch.full((b,), prev is not None, dtype=torch.bool, device=device)
            zeros = [torch.zeros_like(t) for t in fresh]
            tp = _TopicPass(fresh, shapes, scales, prev if prev is not None else zeros, has_prev, bow,
                            new_sentence, hidden)
        need_state = bool(use_cache) or state is not None
        features, new_lstm, hidden_states = self.lm_features(input_ids, attention_mask, inputs_embeds, thetas,
                                                             lstm_state, need_state, output_hidden_states)
        new_state = None
        if need_state:
            enc = tp.hidden if tp is not None else (enc_hidden or [torch.zeros_like(t) for t in thetas])
            new_state = tuple(x for h, c in new_lstm for x in (h, c)) + tuple(e.unsqueeze(1) for e in enc) + \
                tuple(t.unsqueeze(1).to(features.dtype) for t in thetas)
        return features, new_state, hidden_states, tp, torch.cat(thetas, -1), None

    def sentence_slots(self, input_ids, chunk_mask, sentence_index, context_bow, b: int, c: int,
                       sequence_lengths: Optional[torch.Tensor] = None) -> "_Slots":
        """The sentence slot of every chunk of a documents batch, (b, c): a new slot where ``sentence_index``
        changes (or, without it, at a chunk that starts with <bos>); the slot mask (b, J); the bags of words per
        slot (b, J, V_c), each the ``context_bow`` (b, c, V_c) of its sentence's first chunk (zero without); the real
        chunks (rows, cols) in order; a bound on the counts (the augmentation's buffers); and the longest of
        ``sequence_lengths`` (b,) when given (the carried token sequences).

        The batch is checked (every document has chunks, first; the bags hold finite, non-negative counts) and J,
        the number of real chunks and the counts' total are read by the host in one synchronisation."""
        cfg = self.config
        device = chunk_mask.device
        if sentence_index is not None:
            sentence_index = sentence_index.to(device)
            starts = torch.ones(b, c, dtype=torch.bool, device=device)
            starts[:, 1:] = sentence_index[:, 1:] != sentence_index[:, :-1]
        elif input_ids is not None:
            starts = input_ids[:, :, 0].to(device) == cfg.bos_token_id
            starts[:, 0] = True
        else:
            raise ValueError("Documents given as inputs_embeds need sentence_index")
        starts = starts & chunk_mask
        slot = starts.long().cumsum(1) - 1  # (b, c)
        checks = [chunk_mask[:, 0].all(), ~(chunk_mask[:, 1:] & ~chunk_mask[:, :-1]).any()]
        weights = starts.unsqueeze(-1)
        if context_bow is not None:
            if context_bow.dim() != 3 or tuple(context_bow.shape) != (b, c, cfg.topic_vocab_size):
                raise ValueError(f"context_bow of a documents batch must have shape ({b}, {c}, "
                                 f"{cfg.topic_vocab_size}), got {tuple(context_bow.shape)}")
            context_bow = context_bow.to(device).float()
            checks.append(torch.isfinite(context_bow).all() & (context_bow >= 0).all())
            total = (context_bow.round() * weights).sum()
        else:
            total = torch.zeros((), device=device)
        longest = sequence_lengths.max() if sequence_lengths is not None else torch.zeros((), device=device)
        flags = read_on_host(torch.stack([torch.stack(checks).all().double(), (slot.max() + 1).double(),
                                          chunk_mask.sum().double(), total.double(), longest.double()]))
        if not flags[0]:
            if not bool(chunk_mask[:, 0].all()):
                raise ValueError("Every document of a documents batch needs at least one chunk (an empty document?)")
            if bool((chunk_mask[:, 1:] & ~chunk_mask[:, :-1]).any()):
                raise ValueError("chunk_mask must mark each document's chunks first, padding chunks after them")
            raise ValueError("context_bow must hold finite, non-negative counts")
        J, real, total, longest = (int(v) for v in flags[1:])
        slot_mask = torch.zeros(b, J, dtype=torch.bool, device=device)
        slot_mask.scatter_(1, torch.where(chunk_mask, slot, torch.zeros_like(slot)), chunk_mask)
        bows = torch.zeros(b, J, cfg.topic_vocab_size, device=device, dtype=torch.float32)
        if context_bow is not None:  # each sentence's first chunk's bag (the others add zeros)
            index = slot.clamp_min(0).unsqueeze(-1).expand(b, c, cfg.topic_vocab_size)
            bows.scatter_add_(1, index, context_bow * weights)
        flat = torch.nonzero_static(chunk_mask.flatten(), size=real).squeeze(1)
        return _Slots(slot, slot_mask, bows, flat // c, flat % c, total, longest)

    def _run_documents(self, input_ids, attention_mask, inputs_embeds, context_bow, chunk_mask, sentence_index,
                       sample, output_hidden_states=False, carry=False):
        tokens = input_ids if input_ids is not None else inputs_embeds
        b, c, s = tokens.shape[:3]
        device = self.embed_tokens.weight.device
        if attention_mask is None:
            attention_mask = torch.ones(b, c, s, dtype=torch.long, device=device)
        if chunk_mask is None:
            chunk_mask = attention_mask.any(-1)
        chunk_mask = chunk_mask.bool().to(device)
        lengths = carried_sequence_lengths(attention_mask, chunk_mask) if carry else None
        slots = self.sentence_slots(input_ids, chunk_mask, sentence_index, context_bow, b, c, lengths)
        slot, rows, cols = slots.slot, slots.rows, slots.cols
        tp = self.encode_documents(slots.bows, slots.slot_mask, sample)
        tp.total = slots.total
        chunk_slot = slot[rows, cols]
        thetas = [t[rows, chunk_slot] for t in tp.thetas]
        if carry:  # the LM over each document's token sequence, its state carried across the chunks
            features, hidden = self._carried_lm_features(input_ids, attention_mask, inputs_embeds, chunk_mask, slots,
                                                         tp.thetas, output_hidden_states)
        else:  # the LM over the real chunks, each from a zero state, with its sentence's theta
            ids = input_ids[rows, cols] if input_ids is not None else None
            embeds = inputs_embeds[rows, cols] if inputs_embeds is not None else None
            features, _, hidden = self.lm_features(ids, attention_mask[rows, cols], embeds, thetas,
                                                   output_hidden_states=output_hidden_states)
        if hidden is not None:  # per document, as the features: (b, c, s, .) with zeros at padding chunks
            hidden = tuple(h.new_zeros(b, c, *h.shape[1:]).index_put((rows, cols), h) for h in hidden)
        row_theta = torch.cat(thetas, -1)  # each chunk's sentence theta, as the rows of the features
        return features, None, hidden, tp, torch.cat(tp.thetas, -1), (rows, cols, b, c, row_theta)

    def _carried_lm_features(self, input_ids, attention_mask, inputs_embeds, chunk_mask, slots: _Slots, thetas,
                             output_hidden_states):
        """The gated LSTM with its state carried across each document's chunks, as ``causal-carry`` feeds them one
        after another: every layer in one call over the document's token sequence (:func:`document_layout`), each
        position gated by its chunk's sentence theta (the gate is position-wise, so layer l + 1 reads what the loop
        gives it). Returns (features, hidden states or None) of the real chunks (R, s, .), zero at a chunk's tokens
        the sequence does not hold (its last, which the next chunk repeats or which ends the document's sentence)."""
        b, c, s = attention_mask.shape
        order, mask, held, index = document_layout(attention_mask, chunk_mask, slots.longest)
        docs = torch.arange(b, device=order.device).unsqueeze(1)
        sentence = slots.slot.gather(1, order // s)  # (b, n): the sentence slot of every token of the sequences
        ids = input_ids.flatten(1).gather(1, order) if input_ids is not None else None
        embeds = inputs_embeds.flatten(1, 2)[docs, order] if inputs_embeds is not None else None
        features, _, hidden = self.lm_features(ids, mask.long(), embeds, [t[docs, sentence] for t in thetas],
                                               output_hidden_states=output_hidden_states)
        keep = slots.rows * c + slots.cols  # the real chunks
        positions, held = index.view(b * c, s)[keep], held.view(b * c, s)[keep].unsqueeze(-1)
        pick = lambda x: x.flatten(0, 1)[positions] * held.to(x.dtype)  # noqa: E731
        return pick(features), (tuple(pick(h) for h in hidden) if hidden is not None else None)

    # -- downstream: the document as one sequence, its bag of words as one sentence ---------------------

    @property
    def document_representation_sizes(self) -> tuple[int, int]:
        return sum(self.config.hidden_sizes), self.document_topic_size

    @property
    def document_topic_size(self) -> int:
        return sum(self.config.topic_sizes)

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """c (b, sum K) = [theta^1; ...; theta^L], the encoder's posterior mean (lambda Gamma(1 + 1/k)) for the
        bag of words read as a document's first sentence (raw weights, not normalised)."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.embed_tokens.weight.device)
        shapes, scales, _ = self.encoder.step(bow, None)
        return torch.cat([weibull_mean(k, lam) for k, lam in zip(shapes, scales)], dim=-1)

    def _document_token_states(self, input_ids, attention_mask, context_bow):
        # o_m = [a^1_m; ...; a^L_m], the gated outputs the softmax reads, with the document's own theta
        out = self(input_ids=input_ids, attention_mask=attention_mask, context_bow=context_bow, use_cache=False,
                   return_dict=True)
        states = out.last_hidden_state
        last = last_token_positions(attention_mask, states.shape[1], states.shape[0], states.device)
        return states, states[torch.arange(states.shape[0], device=states.device), last]

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, state=None, use_cache=None,
                context_bow=None, topic_mixture=None, topic_ids=None, topic_layer=None, chunk_mask=None,
                sentence_index=None, output_hidden_states=None, return_dict=None, carry_token_state=None, theta=None,
                **kwargs) -> RecurrentModelOutput:
        """[a^1; ...; a^L] (b, s, sum H) for a chunk batch (the conditioning and the keywords of a documents batch as in
        :class:`RGBNRNNForCausalLM`)."""
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        given = self.conditioning_of_batch(input_ids, inputs_embeds, context_bow=context_bow,
                                           topic_mixture=topic_mixture, topic_ids=topic_ids, topic_layer=topic_layer,
                                           theta=theta)
        features, new_state, hidden, _, _, doc = self._run(input_ids, attention_mask, inputs_embeds, state, use_cache,
                                                           given, chunk_mask, sentence_index, output_hidden_states,
                                                           carry_token_state=carry_token_state)
        if doc is not None:  # per document (b, c, s, .), zero at padding chunks
            features = features.new_zeros(*doc[2:4], *features.shape[1:]).index_put(doc[:2], features)
        out = RecurrentModelOutput(last_hidden_state=features, state=new_state if use_cache else None,
                                   hidden_states=hidden)
        return out if return_dict is not False else out.to_tuple()


class RGBNRNNForCausalLM(TopicFamilyForCausalLM, RGBNRNNPreTrainedModel, TopicGenerationMixin, GenerationMixin):
    """GBN-RNN / rGBN-RNN with the output softmax over [a^1; ...; a^L], the joint loss, TLASGR-MCMC and generation.

    Conditioning of a chunk batch (at most one): ``context_bow`` (b, V_c), encoded as the next sentence of the
    ``state``'s document (as a first sentence without state); ``topic_mixture`` (b, sum K): theta, the raw topic
    weights of every layer side by side, bottom first (``theta=`` is its deprecated name); ``topic_ids`` with ``topic_layer`` (1 = bottom): :meth:`RGBNRNNModel.theta_from_topics`;
    nothing: an empty context. ``generate()`` without conditioning takes theta from the prior (drawn with
    ``do_sample``, else its mean).
    """

    # which layer topic_ids name, how theta is completed; theta: the deprecated name of topic_mixture
    conditioning_options = ("topic_layer", "topic_mode", "theta")
    forward_inputs = {
        "context_bow": "(b, V_c) per chunk, or (b, c, V_c) per chunk of each document.",
        "topic_mixture": "(b, sum K): theta, every layer's raw topic weights side by side, bottom first (chunk "
                         "batches; see the class doc).",
        "topic_ids": "topics of layer ``topic_layer`` to steer towards (chunk batches; see the class doc).",
        "topic_layer": "the layer ``topic_ids`` name (1 = bottom, the default).",
        "topic_mode": "how theta is completed below the layer of ``topic_ids``: \"propagate\" or \"chain\".",
        "theta": "the deprecated name of ``topic_mixture``.",
        "chunk_mask": "(b, c) of a documents batch (the collator gives it).",
        "sentence_index": "(b, c) of a documents batch (the collator gives it).",
        "carry_token_state": "a documents batch's LSTM state carried across each document's chunks (the collator's "
                             "chunks, consecutive ones sharing a token), or every chunk from a zero state; None: the "
                             "configuration's.",
    }
    forward_returns = ":class:`RGBNRNNOutput`; for documents ``logits`` are (b, c, s, V) (zero for padding chunks)."
    output_class = RGBNRNNOutput
    topic_pretraining_batches = "document"  # whole documents' bags: the causal context's first ones are near empty

    def __init__(self, config: RGBNRNNConfig):
        super().__init__(config)
        self.model = RGBNRNNModel(config)
        self.lm_head = nn.Linear(sum(config.hidden_sizes), config.vocab_size)
        # config.topic_output_bias: "beta" the shared topic output prior, "learned" B theta^1 (normalised)
        self._init_topic_word_prior(learned_topics=config.topic_sizes[0])
        self.post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if module is getattr(self, "lm_head", None):
            nn.init.xavier_uniform_(module.weight)  # the code: Glorot-uniform softmax weights, zero bias
            nn.init.zeros_(module.bias)

    language_model_weights = lstm_language_model_weights("model.lstms.{i}.{name}_l0")

    @classmethod
    def from_language_model(cls, language_model, config):
        """See :meth:`TopicFamilyForCausalLM.from_language_model`; one topic layer only (with more, the output layer
        reads every layer's output side by side, which an LSTM LM's output layer cannot give)."""
        if config.num_layers != 1:
            raise ValueError(f"An rGBN-RNN with {config.num_layers} layers reads every layer's output in its output "
                             "layer, which an LSTM LM's cannot give: start a one-layer rGBN-RNN (one topic_sizes "
                             "entry) from it")
        return super().from_language_model(language_model, config)

    def start_from_language_model(self) -> None:
        """Every gate's update z starts at sigmoid(-4) = 1.8 % whatever theta and h are (W_z and U_z zero, b_z -4,
        the sign flipped for the official form), so that each layer passes on its LSTM's output h nearly as it is
        and the topics come in as far as training opens the gate (it learns W_z, U_z and b_z from there); the
        shared topic output prior's weight starts at 0."""
        super().start_from_language_model()
        with torch.no_grad():
            for gate in self.model.gates:
                H = gate.candidate_proj.weight.shape[0]
                gate.theta_proj.weight[:H].zero_()
                gate.hidden_proj.weight[:H].zero_()
                gate.bias[:H].fill_(-LANGUAGE_MODEL_GATE_BIAS if gate.kind == "paper" else LANGUAGE_MODEL_GATE_BIAS)

    def tlasgr_step(self) -> bool:
        """See :meth:`RGBNRNNModel.tlasgr_step` (called automatically after optimizer steps)."""
        return self.model.tlasgr_step()

    def set_training_corpus_size(self, rows: int) -> None:
        self.model.set_training_corpus_size(rows)

    @property
    def num_topic_layers(self) -> int:
        return self.config.num_layers

    def topic_word_log_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """log p(w | theta^1) (b, V_c) = log of Phi^1 theta^1 normalised; theta (b, sum K) or (b, K_1)."""
        theta1 = theta[..., :self.config.topic_sizes[0]].float()
        rate = theta1 @ self.model.phi(1).float().T  # (b, V_c)
        return (rate / rate.sum(-1, keepdim=True).clamp_min(1e-30)).clamp_min(1e-10).log()

    # the batch entries topic_model_loss reads (pretrain_topic_model passes them): a documents batch's sentences
    topic_model_inputs = ("context_bow", "input_ids", "chunk_mask", "sentence_index")

    def topic_model_parameters(self) -> list[nn.Parameter]:
        """The Weibull encoder's parameters (and Phi, Pi with ``topic_learning="gradient"``)."""
        params = list(self.model.encoder.parameters())
        if self.config.topic_learning == "gradient":
            params += [p for name, p in self.model.named_parameters() if name.startswith(("phi_", "pi_"))]
        return params

    def topic_model_loss(self, context_bow: torch.Tensor, input_ids=None, chunk_mask=None,
                         sentence_index=None, **inputs) -> torch.Tensor:
        """The (r)GBN alone on bags of words: (Poisson NLL + every layer's KL) per context word, unweighted.
        ``context_bow``: (b, V_c) one-sentence documents, or a documents batch's (b, c, V_c) with ``chunk_mask`` and
        ``sentence_index`` (or ``input_ids``): sentences in order. Training mode gathers TLASGR-MCMC statistics."""
        device = self.lm_head.weight.device
        if context_bow.dim() == 2:
            bows = bags_of_words(context_bow, self.config.topic_vocab_size).to(device).float().unsqueeze(1)
            slot_mask = torch.ones(bows.shape[:2], dtype=torch.bool, device=device)
        else:
            b, c = context_bow.shape[:2]
            chunk_mask = (context_bow.sum(-1) > 0) if chunk_mask is None else chunk_mask
            slots = self.model.sentence_slots(input_ids, chunk_mask.bool().to(device), sentence_index, context_bow,
                                              b, c)
            slot_mask, bows = slots.slot_mask, slots.bows
        sample = self.training
        tp = self.model.encode_documents(bows, slot_mask, sample)
        poisson, kls = self.model.topic_terms(tp)
        if self.training and torch.is_grad_enabled() and self.config.topic_learning == "tlasgr" \
                and self.model.learns_topic_matrices():
            counts = bows * slot_mask.unsqueeze(-1).to(bows.dtype)
            self.model.accumulate_tlasgr_statistics(counts, tp.thetas, rows=counts.shape[0],
                                                    total=slots.total if context_bow.dim() == 3 else None)
        words = (bows * slot_mask.unsqueeze(-1).to(bows.dtype))[..., 1:].sum().clamp_min(1)
        return (poisson + sum(kls)) / words

    def conditioning(self, input_ids, inputs_embeds, resolved: Optional[TopicConditioning],
                     **raw) -> TopicConditioning:
        """The keywords as :meth:`RGBNRNNModel.conditioning_of_batch` takes them (a documents batch's as they are)."""
        return self.model.conditioning_of_batch(input_ids, inputs_embeds, resolved, **raw)

    def language_model_features(self, topics: dict, topic_representation: Optional[torch.Tensor], *, input_ids,
                                attention_mask, inputs_embeds, state, labels, use_cache, output_hidden_states,
                                logits_to_keep, chunk_mask=None, sentence_index=None, carry_token_state=None,
                                **inputs) -> LanguageModelPass:
        """[a^1; ...; a^L] under theta (:meth:`RGBNRNNModel._run`) per chunk, with the topic pass in ``details``."""
        features, new_state, hidden, tp, theta_out, doc = self.model._run(
            input_ids, attention_mask, inputs_embeds, state, use_cache, topics, chunk_mask, sentence_index,
            output_hidden_states, topic_representation, carry_token_state)
        if logits_to_keep and labels is None and doc is None:
            features = features[:, -logits_to_keep:]
        mixture = self.bottom_mixture(theta_out)
        return LanguageModelPass(features, new_state if use_cache or state is not None else None, hidden, mixture,
                                 theta_out, outputs=dict(theta=theta_out), details=dict(tp=tp, doc=doc))

    def bottom_mixture(self, theta: torch.Tensor) -> torch.Tensor:
        """theta^1 normalised to sum to 1 (the topic mixture the model reports, and B's input): (..., sum K) ->
        (..., K_1)."""
        theta1 = self.model.split_theta(theta)[0].float()
        return theta1 / theta1.sum(-1, keepdim=True).clamp_min(1e-20)

    def output_logits(self, run: LanguageModelPass, labels: Optional[torch.Tensor]):
        """The shared output layer; a documents batch's on its real chunks (rows), each with its sentence's theta."""
        doc = run.details["doc"]  # (rows, cols, b, c, each row's theta) of a documents batch's real chunks
        if doc is None:
            return super().output_logits(run, labels)
        labels = labels.to(run.features.device)[doc[:2]] if labels is not None else None  # the chunks as rows
        mixture = self.bottom_mixture(doc[4]) if self.topic_bias is not None else None  # B's input, where B is
        row_bias = self.topic_output_terms(mixture, doc[4])
        logits, lm_loss = self.output_layer(run.features, labels, row_bias)
        if logits is not None:  # (b, c, s, V), zero at padding chunks
            logits = logits.new_zeros(*doc[2:4], *logits.shape[1:]).index_put(doc[:2], logits)
        return logits, lm_loss

    def loss_terms(self, run: LanguageModelPass, labels: torch.Tensor) -> list[LossTerm]:
        """The weighted Poisson NLL and KL of every layer per predicted token (TLASGR training: and the statistics)."""
        tp, doc = run.details["tp"], run.details["doc"]
        if tp is None:
            return []
        labels = labels if doc is None else labels.to(run.features.device)[doc[:2]]
        n = self.predicted_tokens(labels).clamp_min(1).to(run.features.device).float()
        (poisson, kls), (w_poisson, w_kl) = self.model.topic_terms(tp), self.config.loss_weights
        if self.training and torch.is_grad_enabled() and self.config.topic_learning == "tlasgr" \
                and self.model.learns_topic_matrices():
            counts, thetas = tp.counts * tp.rows.unsqueeze(-1).to(tp.counts.dtype), tp.thetas
            if counts.dim() == 2:  # chunk rows: each a one-sentence document; only sentence starts count
                counts, thetas = counts.unsqueeze(1), [t.unsqueeze(1) for t in thetas]
            self.model.accumulate_tlasgr_statistics(counts, thetas, rows=counts.shape[0], total=tp.total)
        return [LossTerm((w_poisson * poisson + sum(w * kl for w, kl in zip(w_kl, kls))) / n,
                         reported=dict(bow_loss=poisson / n, kl_loss=sum(kls) / n))]

    # -- generation --------------------------------------------------------------------------------

    def resolve_conditioning(self, batch_size: Optional[int], **given) -> TopicConditioning:
        """A chunk batch's conditioning validated once: :meth:`RGBNRNNModel.resolve_conditioning`."""
        return self.model.resolve_conditioning(batch_size, **given)

    def prepare_generation_conditioning(self, batch_size: Optional[int], do_sample: bool = False,
                                        **given) -> TopicConditioning:
        """rGBN conditioning of ``generate()`` (at most one), resolved once per row before transformers expands
        the batch for beams / return sequences:

        * ``topic_ids`` (an int, a list, a list of lists or a (b, k) tensor) of layer ``topic_layer`` (1 = bottom,
          default 1): theta by :meth:`RGBNRNNModel.theta_from_topics` (``topic_mode`` "propagate" or "chain");
        * ``context_bow`` (b, V_c): encoded as a first sentence (posterior mean in eval mode);
        * ``topic_mixture`` (b, sum K): theta given directly (``theta=``, its deprecated name, too);
        * nothing: theta from the prior, top-down (theta^L ~ Gam(1, tau0), then each layer below from the one
          above): drawn with ``do_sample``, else the prior mean (greedy and beam decoding are deterministic)."""
        resolved = self.resolve_conditioning(batch_size, **given)
        return resolved or TopicConditioning("topic_mixture",
                                             self.model.sample_prior_theta(batch_size or 1, sample=do_sample))

    @torch.no_grad()
    def generate_paragraph(self, num_sentences: int, topic_ids=None, topic_layer: Optional[int] = None,
                           topic_mixture=None, context_bow=None, num_paragraphs: int = 1, tokenizer=None,
                           topic_mode: str = "propagate", **generate_kwargs):
        """Sentences linked by the recurrence over sentences (the paper's paragraphs): theta_1 from the topics of
        ``topic_ids`` / ``topic_mixture`` / the prior, then theta_{j+1} ~ p(theta_{j+1} | theta_j) (eq. 2; GBN-RNN draws
        each sentence's theta from the prior); every sentence is decoded from ``<bos>`` and a zero LSTM state.
        ``context_bow`` (J, V_c) or (b, J, V_c), the bags of words of a given paragraph's sentences (the paper's
        conditioned paragraphs): theta_1..theta_J from the recurrent encoder (posterior mean), one sentence each;
        sentences after the J-th continue with the recurrence.

        Returns a list of ``num_sentences`` (b, len) id tensors (b = rows of the conditioning, else
        ``num_paragraphs``), or with ``tokenizer`` a list of b paragraphs, each a list of sentences (strings)."""
        if isinstance(num_sentences, bool) or not isinstance(num_sentences, int) or num_sentences < 1:
            raise ValueError(f"num_sentences must be a positive integer, got {num_sentences!r}")
        check_at_most_one(topic_ids=topic_ids, topic_mixture=topic_mixture, context_bow=context_bow)
        encoded = None
        if context_bow is not None:
            bows = torch.as_tensor(context_bow, dtype=torch.float32).to(self.device)
            bows = bows.unsqueeze(0) if bows.dim() == 2 else bows
            if bows.dim() != 3 or bows.shape[-1] != self.config.topic_vocab_size or bows.shape[1] == 0:
                raise ValueError(f"context_bow must have shape (J, {self.config.topic_vocab_size}) or (b, J, "
                                 f"{self.config.topic_vocab_size}) with J >= 1, got {tuple(bows.shape)}")
            check_counts(bows)
            mask = torch.ones(bows.shape[:2], dtype=torch.bool, device=self.device)
            encoded = torch.cat(self.model.encode_documents(bows, mask, sample=False).thetas, -1)  # (b, J, sum K)
            current = encoded[:, 0]
        else:  # as generate() resolves it; the prior's theta has num_paragraphs rows
            rows = num_paragraphs if topic_ids is None and topic_mixture is None else None
            current = self.prepare_generation_conditioning(rows, do_sample=True, topic_ids=topic_ids,
                                                           topic_layer=topic_layer, topic_mixture=topic_mixture,
                                                           topic_mode=topic_mode)["topic_mixture"].to(self.device)
        sentences = []
        for j in range(num_sentences):
            if j > 0 and encoded is not None and j < encoded.shape[1]:
                current = encoded[:, j]
            elif j > 0:
                current = self.model.sample_prior_theta(previous=current) if self.config.recurrent else \
                    self.model.sample_prior_theta(current.shape[0])
            sentences.append(self.generate(topic_mixture=current, **generate_kwargs))
        if tokenizer is None:
            return sentences
        return [[tokenizer.decode(s[i], skip_special_tokens=True).strip() for s in sentences]
                for i in range(current.shape[0])]

    # -- topics ------------------------------------------------------------------------------------

    @torch.no_grad()
    def infer_topics(self, context_bow, *, layer=None) -> torch.Tensor:
        """Topic proportions (b, K_layer) of bags of words (b, V_c), each read as a document's first sentence:
        the encoder's posterior mean of theta^layer (1 = bottom, the default), normalised to sum 1."""
        layer = self.check_layer(layer)
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.device)
        shapes, scales, _ = self.model.encoder.step(bow, None)
        theta = weibull_mean(shapes[layer - 1], scales[layer - 1]).float()
        return theta / theta.sum(-1, keepdim=True)

    @torch.no_grad()
    def topic_word_distributions(self, *, layer=None) -> torch.Tensor:
        """(K_layer, V_c): each topic of ``layer`` (1 = bottom, the default) projected down to words,
        Phi^1 Phi^2 ... Phi^layer (columns)."""
        layer = self.check_layer(layer)
        matrix = self.model.phi(1).double()
        for l in range(2, layer + 1):
            matrix = matrix @ self.model.phi(l).double()
        return matrix.T.float()

    def topic_word_scores(self, layer: int) -> torch.Tensor:
        """The topics of ``layer`` projected down to words: a topic's words are its most probable ones."""
        return self.topic_word_distributions(layer=layer)

    @torch.no_grad()
    def topic_tree(self, top_n: int = 5, num_children: int = 3, topic_tokenizer=None) -> list[dict]:
        """The hierarchy from the top layer down: every top topic with its words and the ``num_children``
        lower-layer topics it puts most weight on (the largest entries of its column of Phi^l), recursively.

        Returns a list of ``{"layer", "topic", "weight", "words", "children"}`` dicts (``weight``: the parent's
        Phi entry, None at the top)."""
        if isinstance(num_children, bool) or not isinstance(num_children, int) or num_children < 1:
            raise ValueError(f"num_children must be a positive integer, got {num_children!r}")
        L = self.config.num_layers
        topics = {l: self.get_topics(top_n, layer=l, topic_tokenizer=topic_tokenizer) for l in range(1, L + 1)}

        def node(layer, k, weight):
            children = []
            if layer > 1:
                column = self.model.phi(layer)[:, k].float()
                values, idx = column.topk(min(num_children, column.numel()))
                children = [node(layer - 1, int(i), float(v)) for v, i in zip(values, idx)]
            return {"layer": layer, "topic": k, "weight": weight, "words": topics[layer][k], "children": children}

        return [node(L, k, None) for k in range(self.config.topic_sizes[-1])]


class RGBNRNNForSequenceClassification(DocumentClassifierMixin, RGBNRNNPreTrainedModel):
    """Document classifier on rGBN-RNN / GBN-RNN features [o_N; theta^1; ...; theta^L], o_N the gated outputs of
    every layer after the document's last token. Loads the body of a saved :class:`RGBNRNNForCausalLM` folder (see
    :class:`~.modeling_document.DocumentClassifierMixin`)."""

    def __init__(self, config: RGBNRNNConfig):
        super().__init__(config)
        self._init_classifier(RGBNRNNModel(config))


def format_topic_tree(tree: list[dict], indent: str = "  ") -> str:
    """The tree of :meth:`RGBNRNNForCausalLM.topic_tree` as indented text."""
    lines = []

    def walk(n, depth):
        weight = "" if n["weight"] is None else f" ({n['weight']:.2f})"
        lines.append(f"{indent * depth}L{n['layer']}-{n['topic']}{weight}: {' '.join(n['words'])}")
        for child in n["children"]:
            walk(child, depth + 1)

    for root in tree:
        walk(root, 0)
    return "\n".join(lines)


__all__ = ["RGBNRNNForCausalLM", "RGBNRNNForSequenceClassification", "RGBNRNNModel", "RGBNRNNOutput",
           "RGBNRNNPreTrainedModel", "format_topic_tree"]
