"""TCNLM: Topic Compositional Neural Language Model (Wang et al., AISTATS 2018).

Notation: b batch, s tokens, E embedding size, H hidden size, L layers, n_f factors, T topics,
V vocabulary, V_c topic vocabulary, g = 4 LSTM gates in PyTorch's order (i, f, g, o), where g is
the candidate cell c~ of the paper.

The model (paper section 3), with the equations it cites:

* Neural topic model (NTM). A context bag of words d (b, V_c) goes through a 2-layer ReLU MLP to
  the posterior q(theta | d) = N(mu, sigma^2) (b, T); theta ~ N(mu_0, sigma_0^2 I) a priori, and
  the topic proportions are t = softmax(W^ theta + b^) (b, T). Words are drawn from
  p(w | t) = beta^T t (eq. 6), where beta (T, V_c) holds one distribution over words per topic.
* Topic-compositional LSTM (eq. 12-15). Every gate * of every layer has
  x~_* = (W_*b t) ⊙ (W_*c x),  h~_* = (U_*b t) ⊙ (U_*c h),  gate_* = act(W_*a x~_* + U_*a h~_* + b_*),
  i.e. the input weight is W_*(t) = W_*a diag(W_*b t) W_*c: an ensemble of T LSTMs whose weights
  are mixed by t and share the factors W_*a, W_*c.
* Naive mixture of experts (eq. 7-8, ``lm_type="naive_moe"``): T separate LSTMs mixed at the
  output, p(y_m) = sum_k t_k softmax(V h_m^(k)). The paper's Table 6 baseline.

Decisions the paper leaves open (each is a choice, stated here once):

* c~ uses tanh, as in a standard LSTM; eq. 13 writes sigma, which we read as a typo (with sigma
  every candidate would be positive, so the cell could only be written positive values). The
  gates have biases ("omitted for simplicity" in the paper).
* theta has T dimensions; d is fed to the encoder as raw counts.
* beta_k = softmax(V_w u_k) over the topic vocabulary, with topic vectors u (T, D) and word vectors
  V_w (V_c, D), D = ``topic_embedding_size``: the parameterisation of Miao et al. 2017's Gaussian
  softmax model, whose diversity regulariser the paper adopts. Free (T, V_c) logits learned far
  too slowly under Adam at LM learning rates (on APNEWS, 600 steps left every topic a list of
  frequent words). ``<unk>`` (topic id 0, never in a bag of words) gets probability 0.
* The diversity regulariser R = mean - variance of the angles a(beta_i, beta_j) uses the
  T (T - 1) pairs i != j: the paper's 1/T^2 sum includes i = j, whose angle is identically 0 and
  whose arccos has an infinite derivative.
* Evaluation and generation use the posterior mean t = softmax(W^ mu + b^); training samples
  theta with the reparameterisation trick.

The training loss and its scale (the paper's J = ELBO + lambda R, eq. 17-18, negated). One row of
a batch is one sentence chunk y with its context d (the document minus the sentence in the papers'
protocol). With N = the number of predicted tokens and D = the number of context words in the batch:

    loss = lm_loss + bow_loss + kl_weight * kl_loss + aux_loss
    lm_loss  = - sum_{rows, m} log p(y_m | y_<m, t) / N            (mean NLL per predicted token, nats)
    bow_loss = - sum_{rows} sum_w d_w log (beta^T t)_w / D         (mean NLL per context word)
    kl_loss  =   sum_{rows} KL(q(theta | d) || N(mu_0, sigma_0^2 I)) / D
    aux_loss = - lambda * R                                       (once per batch)

``bow_loss + kl_loss`` is the topic model's negative ELBO per context word and ``lm_loss`` the LM's
per predicted token. With ``config.topic_loss_normalization = "lm_tokens"`` both topic terms are
divided by N instead, and ``lm_loss + bow_loss + kl_loss`` is exactly eq. 17 summed over the rows
and divided by N (a per-token ELBO). That is not the default because a context (up to 300 words)
is ~10x longer than a chunk (<= 30 tokens): the topic terms then dominate the gradient and global
gradient-norm clipping shrinks the LM's updates accordingly.
``kl_weight`` goes linearly from 0 to 1 over ``config.kl_annealing_steps`` training forward passes
(1 when 0); ``kl_loss`` is reported without it. Topic-model terms exist only when the batch has
``context_bow`` and ``labels``; with ``topic_ids`` / ``topic_mixture`` / the prior the loss is
``lm_loss``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint
from transformers import GenerationMixin
from transformers.utils import ModelOutput

from .configuration_tcnlm import TCNLMConfig
from .modeling_conditioning import (TOPIC_LOGIT_INIT_STD, TopicConditioning, angular_diversity, bags_of_words,
                                    check_resolved, normalize_topic_kwargs, topic_ids_to_mixture, topic_vocabulary)
from .modeling_generation import TopicGenerationMixin
from .modeling_document import DocumentClassifierMixin, DocumentRepresentationMixin
from .modeling_recurrent import (RecurrentPreTrainedModel, TopicLMOutput, causal_lm_loss, embed_checked,
                                 last_columns, read_padding, run_rnn, run_rnn_layers, state_from_aliases)
from .modeling_topic_family import LanguageModelPass, LossTerm, TopicFamilyForCausalLM

NUM_GATES = 4  # i, f, g (= c~), o


# ----------------------------------------------------------------------------------------------
# neural topic model
# ----------------------------------------------------------------------------------------------


class TCNLMTopicModel(nn.Module):
    """The NTM of section 3.1: Gaussian softmax topic proportions and topic-word distributions beta."""

    def __init__(self, config: TCNLMConfig):
        super().__init__()
        self.prior_mean = config.prior_mean
        self.prior_std = config.prior_std
        self.encoder = nn.Sequential(nn.Linear(config.topic_vocab_size, config.encoder_hidden_size), nn.ReLU(),
                                     nn.Linear(config.encoder_hidden_size, config.encoder_hidden_size), nn.ReLU())
        self.posterior_mean = nn.Linear(config.encoder_hidden_size, config.num_topics)
        self.posterior_logvar = nn.Linear(config.encoder_hidden_size, config.num_topics)
        self.topic_proj = nn.Linear(config.num_topics, config.num_topics)  # g(theta) = softmax(W^ theta + b^)
        # beta_k = softmax(word_vectors . topic_vectors_k), as in the Gaussian softmax model of Miao et al. 2017
        self.topic_vectors = nn.Parameter(torch.empty(config.num_topics, config.topic_embedding_size))
        self.word_vectors = nn.Parameter(torch.empty(config.topic_vocab_size, config.topic_embedding_size))

    def posterior(self, bow: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(theta | d): mean and log-variance, each (b, T), from counts (b, V_c)."""
        hidden = self.encoder(bow)
        return self.posterior_mean(hidden), self.posterior_logvar(hidden)

    def proportions(self, theta: torch.Tensor) -> torch.Tensor:
        """t = softmax(W^ theta + b^): (b, T) -> (b, T) on the simplex."""
        return torch.softmax(self.topic_proj(theta), dim=-1)

    def prior_proportions(self, batch_size: int) -> torch.Tensor:
        """t at the prior mean theta = mu_0, for every row: (b, T)."""
        theta = self.topic_vectors.new_full((1, self.topic_proj.in_features), self.prior_mean)
        return self.proportions(theta).expand(batch_size, -1)

    def beta(self) -> torch.Tensor:
        """Topic-word distributions (T, V_c); each row sums to 1 and ``<unk>`` (id 0) has probability 0."""
        logits = self.topic_vectors @ self.word_vectors.T  # (T, V_c)
        logits = torch.cat([torch.full_like(logits[:, :1], float("-inf")), logits[:, 1:]], dim=1)
        return torch.softmax(logits, dim=-1)

    def bow_nll(self, bow: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """-log p(d | t) = -sum_w d_w log (beta^T t)_w per document: (b,)."""
        word_probs = t @ self.beta()  # (b, V_c)
        # Column 0 (<unk>) has probability 0 and count 0: clamp so that 0 * log 0 is 0, not NaN.
        return -(bow * word_probs.clamp_min(1e-30).log()).sum(-1)

    def kl(self, mean: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        """KL(N(mean, exp(logvar)) || N(mu_0, sigma_0^2)) summed over the T dimensions: (b,)."""
        var0 = self.prior_std ** 2
        return 0.5 * (math.log(var0) - logvar + (logvar.exp() + (mean - self.prior_mean) ** 2) / var0 - 1.0).sum(-1)

    def diversity(self) -> torch.Tensor:
        """R = mean - variance of the pairwise angles arccos(|beta_i . beta_j| / |beta_i| |beta_j|), i != j."""
        return angular_diversity(self.beta())

    def forward(self, bow: torch.Tensor, sample: bool):
        """(t, mean, logvar) for counts (b, V_c); theta is sampled (reparameterised) when ``sample``."""
        mean, logvar = self.posterior(bow)
        theta = mean + torch.randn_like(mean) * (0.5 * logvar).exp() if sample else mean
        return self.proportions(theta), mean, logvar


# ----------------------------------------------------------------------------------------------
# topic-compositional LSTM
# ----------------------------------------------------------------------------------------------


class TCNLMRecurrence(torch.autograd.Function):
    """The recurrent side of :class:`TCNLMLSTMLayer` over a whole sequence, with a hand-written backward through
    time: autograd records one node for the sequence instead of about 68 operations per time step.

    ``forward(gates_x (s, 4, b, H), q (4, b, n_f) or (s, 4, b, n_f), U_c (4 n_f, H), U_a (4, H, n_f), h0, c0 (b, H),
    keep (s, b, 1) or None) -> (outputs (s, b, H), h, c)``, where ``gates_x`` is the input side of every step plus the
    bias and ``q = U_b t`` (one per row, or one per step and row where t changes along the sequence: a carried
    document's chunks each have their own); step m computes u = (U_c h) per gate, a = gates_x[m] + U_a (q_m * u) per
    gate, the LSTM cell on a,
    and, where ``keep`` is False (padding), carries h and c over and outputs 0. The products run in ``gates_x``'s
    dtype (bfloat16 under autocast, as the per-step layer ran them), the cell state in float32.

    The backward runs the steps in reverse with the few products and pointwise operations that depend on the
    state; the gradients of U_a, U_c and q are summed over the sequence in batched products after the loop."""

    @staticmethod
    def forward(ctx, gates_x, q, U_c, U_a, h0, c0, keep):
        outputs, h, c, saved = TCNLMRecurrence.run(gates_x, q, U_c, U_a, h0, c0, keep, save=True)
        ctx.save_for_backward(q, U_c, U_a, keep, *saved)
        ctx.dtypes = gates_x.dtype, h0.dtype, c0.dtype
        return outputs, h, c

    @staticmethod
    def run(gates_x, q, U_c, U_a, h0, c0, keep, save: bool = False):
        """The forward steps: ``(outputs, h, c, what backward reads)``; without ``save`` (no gradient wanted, e.g.
        generation) nothing is kept beyond the outputs."""
        s, gates, b, H = gates_x.shape
        f = q.shape[-1]
        dt = gates_x.dtype
        with torch.autocast(gates_x.device.type, enabled=False):
            U_c_t, U_a_t, qd = U_c.to(dt).t(), U_a.to(dt).transpose(1, 2), q.to(dt)
            q_steps = qd.unbind(0) if qd.dim() == 4 else [qd] * s
            steps = gates_x.unbind(0)
            kept = keep.unbind(0) if keep is not None else None
            h, c = h0, c0
            previous_h, previous_c, us, acts, gs, tcs, outputs = [], [], [], [], [], [], []
            for m in range(s):
                u = torch.mm(h.to(dt), U_c_t).view(b, gates, f).transpose(0, 1)  # (4, b, n_f)
                a = torch.baddbmm(steps[m], u * q_steps[m], U_a_t)  # (4, b, H)
                act = torch.sigmoid(a)  # i, f and o (the g row's sigmoid goes unused: one kernel for the three)
                i_gate, f_gate, _, o_gate = act.unbind(0)
                g = torch.tanh(a[2])
                c_new = torch.addcmul(f_gate * c, i_gate, g)
                tc = torch.tanh(c_new)
                h_new = o_gate * tc
                if save:
                    previous_h.append(h)
                    previous_c.append(c)
                    us.append(u)
                    acts.append(act)
                    gs.append(g)
                    tcs.append(tc)
                if kept is None:
                    h, c = h_new, c_new
                    outputs.append(h_new)
                else:
                    h, c = torch.where(kept[m], h_new, h), torch.where(kept[m], c_new, c)
                    outputs.append(h_new * kept[m])
            saved = [torch.stack(x) for x in (previous_h, previous_c, us, acts, gs, tcs)] if save else []
        return torch.stack(outputs), h, c, saved

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_outputs, d_h, d_c):
        q, U_c, U_a, keep, previous_h, previous_c, us, acts, gs, tcs = ctx.saved_tensors
        s, gates, b, H = acts.shape
        f = q.shape[-1]
        dt, h0_dtype, c0_dtype = ctx.dtypes
        with torch.autocast(acts.device.type, enabled=False):
            qd, U_a_d, U_c_g = q.to(dt), U_a.to(dt), U_c.to(dt).view(gates, f, H)
            q_steps = qd.unbind(0) if qd.dim() == 4 else [qd] * s
            # What the reverse steps read, for all steps at once: the gates' derivatives at their pre-activations
            # (sigmoid' for i, f and o; tanh' for g) times what each gate multiplies (g, c_{m-1}, i, tanh(c)), so
            # that a step's gradient at the pre-activations is one product with (dc, dc, dc, dh); and o tanh'(c).
            deriv = acts * (1 - acts)
            deriv[:, 2] = 1 - gs * gs
            scaled = deriv * torch.stack([gs, previous_c.to(dt), acts[:, 0], tcs.to(dt)], dim=1)  # (s, 4, b, H)
            o_dtanh = acts[:, 3] * (1 - tcs * tcs)
            scaled_steps, o_dtanhs, f_steps = scaled.unbind(0), o_dtanh.unbind(0), acts[:, 1].unbind(0)
            d_out = d_outputs.unbind(0) if d_outputs is not None else None
            kept = keep.unbind(0) if keep is not None else None
            dh = d_h if d_h is not None else previous_h.new_zeros(b, H)
            dc = d_c if d_c is not None else previous_c.new_zeros(b, H)
            das, dus, dqs = [None] * s, [None] * s, [None] * s
            for m in range(s - 1, -1, -1):
                dh_new = dh if d_out is None else dh + d_out[m]
                dc_new = dc
                if kept is not None:  # a padded step passed h and c on unchanged and output 0
                    carried_h, carried_c = dh * ~kept[m], dc * ~kept[m]
                    dh_new, dc_new = dh_new * kept[m], dc * kept[m]
                dc_new = torch.addcmul(dc_new, dh_new, o_dtanhs[m])
                # (4, b, H): the gradient at the pre-activations of i, f, g and o
                da = (scaled_steps[m] * torch.stack([dc_new, dc_new, dc_new, dh_new])).to(dt)
                d_hq = torch.bmm(da, U_a_d)  # (4, b, n_f): at q * u
                du = d_hq * q_steps[m]
                dh = torch.bmm(du, U_c_g).sum(0).to(previous_h.dtype)
                dc = dc_new * f_steps[m]
                if kept is not None:
                    dh, dc = dh + carried_h, dc + carried_c
                das[m], dus[m], dqs[m] = da, du, d_hq
            da_all, du_all, dq_all = torch.stack(das), torch.stack(dus), torch.stack(dqs)  # (s, 4, b, .)
            # the weights' gradients, summed over the sequence in batched products
            hq = us * qd  # (s, 4, b, n_f): q * u of every step
            d_U_a = torch.bmm(da_all.permute(1, 3, 0, 2).reshape(gates, H, s * b),
                              hq.permute(1, 0, 2, 3).reshape(gates, s * b, f))  # (4, H, n_f)
            d_U_c = torch.mm(du_all.permute(1, 3, 0, 2).reshape(gates * f, s * b),
                             previous_h.to(dt).reshape(s * b, H))  # (4 n_f, H)
            d_q = dq_all * us  # (s, 4, b, n_f)
            d_q = d_q.sum(0) if q.dim() == 3 else d_q  # a q shared by the steps gets their sum
        return (da_all, d_q.to(q.dtype), d_U_c.to(U_c.dtype), d_U_a.to(U_a.dtype), dh.to(h0_dtype),
                dc.to(c0_dtype), None)

class TCNLMLSTMLayer(nn.Module):
    """One topic-compositional LSTM layer (eq. 13-15) with the gates stacked.

    Parameters (gates stacked in the order i, f, g, o; blocks of n_f rows per gate):
        W_c (4 n_f, n_x), W_b (4 n_f, T), W_a (4, H, n_f): the input side, W_*(t) = W_*a diag(W_*b t) W_*c;
        U_c (4 n_f, H),   U_b (4 n_f, T), U_a (4, H, n_f): the recurrent side;
        bias (4 H).

    The input side does not depend on the recurrence, so x~ and W_a x~ are computed for all time
    steps in two batched products; only U_a ((U_b t) ⊙ (U_c h)) runs inside the loop over time.
    """

    def __init__(self, input_size: int, hidden_size: int, num_factors: int, num_topics: int):
        super().__init__()
        self.input_size, self.hidden_size, self.num_factors = input_size, hidden_size, num_factors
        g, f = NUM_GATES, num_factors
        self.W_c = nn.Parameter(torch.empty(g * f, input_size))
        self.W_b = nn.Parameter(torch.empty(g * f, num_topics))
        self.W_a = nn.Parameter(torch.empty(g, hidden_size, f))
        self.U_c = nn.Parameter(torch.empty(g * f, hidden_size))
        self.U_b = nn.Parameter(torch.empty(g * f, num_topics))
        self.U_a = nn.Parameter(torch.empty(g, hidden_size, f))
        self.bias = nn.Parameter(torch.empty(g * hidden_size))

    def forward(self, x: torch.Tensor, t: torch.Tensor, mask: Optional[torch.Tensor] = None,
                state: Optional[tuple[torch.Tensor, torch.Tensor]] = None):
        """Run the layer over a sequence.

        Args:
            x: (b, s, n_x) inputs.
            t: (b, T) topic proportions, or (b, s, T): one t per step (a carried document whose chunks each have
                their own).
            mask: (b, s) bool, True at real tokens (left or right padding) or None; at padded steps
                the state is carried over unchanged and the output is 0.
            state: ``(h, c)``, each (b, H), or None for zeros.

        Returns:
            ``(outputs (b, s, H), (h, c))`` with the state after each row's last real token.
        """
        b, s, _ = x.shape
        g, f, H = NUM_GATES, self.num_factors, self.hidden_size
        # Input side for all steps at once (eq. 14): x~ = (W_b t) ⊙ (W_c x), then W_a x~ per gate, plus the bias.
        t = t.to(self.W_b.dtype)  # t is float32 (see _float_simplex); the weights may be bfloat16
        per_step = t.dim() == 3
        topic_x = F.linear(t, self.W_b)
        x_tilde = F.linear(x, self.W_c) * (topic_x if per_step else topic_x.unsqueeze(1))  # (b, s, 4 n_f)
        gates_x = torch.einsum("bsgf,ghf->sgbh", x_tilde.view(b, s, g, f), self.W_a)  # (s, 4, b, H)
        gates_x = gates_x + self.bias.view(1, g, 1, H)
        if per_step:  # U_b t of every step: (s, 4, b, n_f)
            hidden_topic = F.linear(t, self.U_b).view(b, s, g, f).permute(1, 2, 0, 3)
        else:  # U_b t: (4, b, n_f), fixed over time
            hidden_topic = F.linear(t, self.U_b).view(b, g, f).transpose(0, 1)
        if state is None:
            h = x.new_zeros(b, H)
            c = x.new_zeros(b, H)
        else:
            h, c = state
        if s == 0:
            return x.new_zeros(b, 0, H), (h, c)
        # The recurrent side (eq. 15) over every step, with its backward through time written out.
        keep = None if mask is None else mask.transpose(0, 1).unsqueeze(-1)  # (s, b, 1)
        inputs = (gates_x, hidden_topic, self.U_c, self.U_a, h, c, keep)
        if torch.is_grad_enabled() and any(x.requires_grad for x in inputs if x is not None):
            outputs, h, c = TCNLMRecurrence.apply(*inputs)
        else:  # no gradient: the steps alone (generation, evaluation)
            outputs, h, c, _ = TCNLMRecurrence.run(*inputs)
        return outputs.transpose(0, 1), (h, c)


class TCNLMExperts(nn.Module):
    """The naive mixture of experts of eq. 7-8: T independent (multi-layer) LSTMs on the same input.

    State: ``(h, c)``, each (b, T * L, H), expert k's layers at rows k * L ... k * L + L - 1.
    """

    def __init__(self, config: TCNLMConfig):
        super().__init__()
        self.num_layers = config.num_hidden_layers
        self.experts = nn.ModuleList(
            nn.LSTM(config.embedding_size, config.hidden_size, num_layers=config.num_hidden_layers, batch_first=True,
                    dropout=config.dropout if config.num_hidden_layers > 1 else 0.0)
            for _ in range(config.num_topics))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], state, need_state: bool,
                output_hidden_states: bool = False, checkpoint_fn=None):
        """(b, s, E) -> outputs (b, s, T, H), the state (or None) and, with ``output_hidden_states``,
        each layer's outputs (b, s, T, H) (see :func:`run_rnn_layers`; ``checkpoint_fn``: gradient checkpointing)."""
        L = self.num_layers
        outputs, h_all, c_all, layer_outputs = [], [], [], []
        for k, lstm in enumerate(self.experts):
            expert_state = None if state is None else tuple(s[:, k * L:(k + 1) * L] for s in state)
            if output_hidden_states or checkpoint_fn is not None:
                out, (h, c), layers = run_rnn_layers(lstm, x, mask, expert_state, need_state, checkpoint_fn)
                layer_outputs.append(layers)
            else:
                lstm.flatten_parameters()
                out, (h, c) = run_rnn(lstm, x, mask, expert_state, need_state=need_state)
            outputs.append(out)
            h_all.append(h)
            c_all.append(c)
        new_state = (torch.cat(h_all, 1), torch.cat(c_all, 1)) if need_state else None
        layers = tuple(torch.stack(per_expert, dim=2) for per_expert in zip(*layer_outputs)) if output_hidden_states \
            else None
        return torch.stack(outputs, dim=2), new_state, layers


# ----------------------------------------------------------------------------------------------
# pretrained-model classes
# ----------------------------------------------------------------------------------------------


@dataclass
class TCNLMModelOutput(ModelOutput):
    """Output of :class:`TCNLMModel`.

    Args:
        last_hidden_state: (b, s, H) top-layer outputs; (b, s, T, H) for ``lm_type="naive_moe"``.
        state: ``(h, c)``, the recurrent state after the last real token (see the layer classes).
        hidden_states: with ``output_hidden_states=True``, the embeddings fed to the first layer and every
            layer's outputs (see :class:`TopicLMOutput`).
        topic_mixture: (b, T) topic proportions t that conditioned the LM.
        bow_nll: (b,) -log p(d | t) per document (only with ``context_bow`` and ``return_topic_losses``).
        kl: (b,) KL(q(theta | d) || p(theta)) per document (same condition).
        context_tokens: (b,) number of words in each context bag of words (same condition).
    """

    last_hidden_state: Optional[torch.Tensor] = None
    state: Optional[tuple[torch.Tensor, ...]] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None
    topic_mixture: Optional[torch.Tensor] = None
    bow_nll: Optional[torch.Tensor] = None
    kl: Optional[torch.Tensor] = None
    context_tokens: Optional[torch.Tensor] = None


class TCNLMPreTrainedModel(RecurrentPreTrainedModel):
    config_class = TCNLMConfig
    _no_split_modules = ["TCNLMModel"]
    conditioning_inputs = ("context_bow", "topic_ids", "topic_mixture")
    training_context = "others"

    def _init_weights(self, module):
        super()._init_weights(module)  # embeddings, linear layers, nn.LSTM experts: U(-r, r)
        r = self.config.initializer_range
        if isinstance(module, TCNLMLSTMLayer):
            # W_b t starts near 1 (t is on the simplex; config.topic_factor_spread says how near), and W_a,
            # W_c are scaled so that the entries of W_a diag(W_b t) W_c have the spread of U(-r, r):
            # n_f * (a^2 / 3)^2 = r^2 / 3.
            a = math.sqrt(math.sqrt(3.0) * r / math.sqrt(module.num_factors))
            for name in ("W_a", "W_c", "U_a", "U_c"):
                nn.init.uniform_(getattr(module, name), -a, a)
            spread = r if self.config.topic_factor_spread is None else self.config.topic_factor_spread
            for name in ("W_b", "U_b"):
                nn.init.uniform_(getattr(module, name), 1.0 - spread, 1.0 + spread)
            nn.init.zeros_(module.bias)
        elif isinstance(module, TCNLMTopicModel):
            # Topics start as distinct random distributions (logits of std ~1.5), so that log p(d | t) depends
            # on t from the first step: with near-uniform beta nothing rewards a posterior away from the prior,
            # and on APNEWS the KL term then collapsed it (t constant, most encoder units dead) in 50 steps.
            std = (TOPIC_LOGIT_INIT_STD / math.sqrt(module.topic_vectors.shape[1])) ** 0.5
            nn.init.normal_(module.topic_vectors, 0.0, std)
            nn.init.normal_(module.word_vectors, 0.0, std)


def _float_simplex(t: torch.Tensor) -> torch.Tensor:
    """t in float32, on the simplex: a bfloat16 softmax sums to 1 only within ~T * 2^-8, while t is
    checked (and reused as ``topic_mixture`` by generation) with a tolerance of 1e-3."""
    if t.dtype == torch.float32:
        return t
    t = t.float()
    return t / t.sum(-1, keepdim=True)


def _run_layer(layer: TCNLMLSTMLayer, x, t, mask, *state):
    out, (h, c) = layer(x, t, mask, state or None)
    return out, h, c  # flat: a reentrant checkpoint only sees top-level tensors


class TCNLMModel(DocumentRepresentationMixin, TCNLMPreTrainedModel):
    """Embeddings, the neural topic model and the topic-conditioned recurrent LM (no output layer)."""

    _keys_to_ignore_on_load_unexpected = [*RecurrentPreTrainedModel._keys_to_ignore_on_load_unexpected,
                                          r"^(lm_head|proj)\.", r"^kl_annealing_step$"]  # causal LM only

    def __init__(self, config: TCNLMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.topic_model = TCNLMTopicModel(config)
        if config.lm_type == "tcnlm":
            sizes = [config.embedding_size] + [config.hidden_size] * config.num_hidden_layers
            self.layers = nn.ModuleList(TCNLMLSTMLayer(sizes[i], config.hidden_size, config.num_factors,
                                                       config.num_topics) for i in range(config.num_hidden_layers))
            self.experts = None
        else:
            self.layers = None
            self.experts = TCNLMExperts(config)
        self.gradient_checkpointing = False
        self.post_init()

    # -- topics ---------------------------------------------------------------------------------

    def topic_proportions(self, batch_size: int, device, given: dict, return_topic_losses: bool = False):
        """Resolve the conditioning into t (b, T), plus per-document (bow_nll, kl, context_tokens) when asked.

        ``given`` is the validated conditioning (``normalize_topic_kwargs``' batch-first tensors, used as they
        are), at most one of: ``topic_mixture`` as is; ``topic_ids`` -> equal mixture of the listed topics (one
        id = one-hot t); ``context_bow`` -> the NTM posterior (a sample in training, the mean otherwise); nothing
        -> the prior mean softmax(W^ mu_0 + b^).
        """
        cfg = self.config
        if "topic_mixture" in given:
            return given["topic_mixture"].to(device), None
        if "topic_ids" in given:
            return topic_ids_to_mixture(given["topic_ids"].to(device), cfg.num_topics), None
        if "context_bow" in given:
            bow = given["context_bow"].to(device)
            t, mean, logvar = self.topic_model(bow.to(self.dtype), sample=self.training)
            losses = None
            if return_topic_losses:
                losses = {"bow_nll": self.topic_model.bow_nll(bow, t), "kl": self.topic_model.kl(mean, logvar),
                          "context_tokens": bow.sum(-1)}
            t = _float_simplex(t)
            if self.training and cfg.lm_topic_input == "gumbel":
                # The LM sees a one-hot topic drawn from t (straight-through), as generation from a topic does.
                t = F.gumbel_softmax(t.clamp_min(1e-10).log(), tau=1.0, hard=True)
            return t, losses
        return _float_simplex(self.topic_model.prior_proportions(batch_size).to(device)), None

    def infer_topics(self, context_bow) -> torch.Tensor:
        """Topic proportions t (b, T) of documents given as bags of words (b, V_c): the posterior mean."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size)
        mean, _ = self.topic_model.posterior(bow.to(self.device, self.dtype))
        return _float_simplex(self.topic_model.proportions(mean))

    @property
    def document_topic_size(self) -> int:
        return self.config.num_topics

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """c (b, T) = the topic proportions t of the posterior mean (:meth:`infer_topics`)."""
        return self.infer_topics(context_bow)

    def _document_token_states(self, input_ids, attention_mask, context_bow):
        # The LSTM's weights depend on t: the document's own topics (the posterior mean in eval mode). The naive
        # mixture of experts has one LSTM per topic: o_m is their outputs weighted by t, sum_k t_k h_m^(k).
        out = self(input_ids=input_ids, attention_mask=attention_mask, context_bow=context_bow, use_cache=True,
                   return_dict=True)
        if self.config.lm_type != "naive_moe":
            return out.last_hidden_state, out.state[0][:, -1]
        t = out.topic_mixture.to(out.last_hidden_state.dtype)  # (b, T)
        states = (out.last_hidden_state * t[:, None, :, None]).sum(2)  # (b, s, H)
        b, _, hidden = out.state[0].shape
        top = out.state[0].view(b, self.config.num_topics, self.config.num_hidden_layers, hidden)[:, :, -1]
        return states, (top * t.unsqueeze(-1)).sum(1)

    @torch.no_grad()
    def get_topics(self, top_n: int = 10, topic_tokenizer=None) -> list[list[str]]:
        """The ``top_n`` most probable words of every topic (T lists), from beta; ``<unk>`` is never one."""
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        words = topic_vocabulary(self, topic_tokenizer)
        beta = self.topic_model.beta()
        top = beta.topk(min(top_n, beta.shape[1] - 1), dim=-1).indices  # (T, top_n)
        return [[words[i] for i in row] for row in top.tolist()]

    # -- forward --------------------------------------------------------------------------------

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, state=None, use_cache=None,
                context_bow=None, topic_ids=None, topic_mixture=None, topic_representation=None,
                return_topic_losses: bool = False, output_hidden_states=None, return_dict=None,
                topic_conditioning: Optional[TopicConditioning] = None, **kwargs) -> TCNLMModelOutput:
        """The LSTM's outputs under t (see :class:`TCNLMModelOutput`). The topic keywords are validated here
        unless ``topic_conditioning`` gives them already validated (the causal LM validates them once, in its
        ``resolve_conditioning``); ``topic_representation`` is t itself, used as is."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = embed_checked(self.embed_tokens, input_ids, self.config.vocab_size)  # (b, s, E)
        b, s, _ = inputs_embeds.shape
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        need_state = use_cache or state is not None
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        checkpoint_fn = self.checkpoint_function()
        attention_mask = last_columns(attention_mask, s)
        full, right_padded, _ = (True, False, None) if attention_mask is None else read_padding(attention_mask)
        mask = None if full else attention_mask.bool()
        if topic_representation is not None:  # resolved before (generation's cache): t as is, not re-validated
            t, topic_losses = topic_representation.to(inputs_embeds.device), None
        else:
            given = dict(context_bow=context_bow, topic_ids=topic_ids, topic_mixture=topic_mixture)
            given = check_resolved(topic_conditioning, given) if topic_conditioning is not None else \
                normalize_topic_kwargs(self.config.num_topics, self.config.topic_vocab_size, b, **given)
            t, topic_losses = self.topic_proportions(b, inputs_embeds.device, given, return_topic_losses)
        x = self.dropout(inputs_embeds)
        if self.experts is not None:
            hidden, new_state, layers = self.experts(x, mask, state, need_state, output_hidden_states, checkpoint_fn)
        else:
            # Right padding without a state to return: outputs at real tokens do not depend on what
            # follows, so the per-step masking can be skipped (the outputs are zeroed below).
            step_mask = None if (mask is None or (right_padded and not need_state)) else mask
            hs, cs, layers = [], [], []
            hidden = x
            for layer_index, layer in enumerate(self.layers):
                if layer_index > 0:
                    hidden = self.dropout(hidden)  # between layers, as nn.LSTM(dropout=...)
                layer_state = () if state is None else (state[0][:, layer_index], state[1][:, layer_index])
                if checkpoint_fn is None:
                    hidden, h, c = _run_layer(layer, hidden, t, step_mask, *layer_state)
                else:  # gradient checkpointing: only the layer's inputs are kept, it is rerun in backward
                    hidden, h, c = checkpoint_fn(_run_layer, layer, hidden, t, step_mask, *layer_state)
                hs.append(h)
                cs.append(c)
                if output_hidden_states:
                    zero_padding = mask is not None and step_mask is None
                    layers.append(hidden * mask.unsqueeze(-1).to(hidden.dtype) if zero_padding else hidden)
            if mask is not None and step_mask is None:
                hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
            new_state = (torch.stack(hs, 1), torch.stack(cs, 1)) if need_state else None
        out = TCNLMModelOutput(last_hidden_state=hidden, state=new_state if use_cache else None,
                               hidden_states=(x, *layers) if output_hidden_states else None, topic_mixture=t,
                               **(topic_losses or {}))
        return out if return_dict is not False else out.to_tuple()


class TCNLMForCausalLM(TopicFamilyForCausalLM, TCNLMPreTrainedModel, TopicGenerationMixin, GenerationMixin):
    """TCNLM with its output softmax, the ELBO training loss, and topic-steered generation.

    Conditioning (``forward`` and ``generate``; give at most one):
        ``topic_ids``: an int, a list (shared by the batch), a list of lists or a (b, k) tensor
        padded with -1; each row is an equal mixture of its topics. ``topic_mixture``: (b, T) or
        (T,) proportions on the simplex. ``context_bow``: (b, V_c) or (V_c,) counts, inferred once
        per generation and reused at every step. Nothing: the prior mean.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    supports_cuda_graphs = True

    forward_inputs = {
        "context_bow": "(b, V_c) counts over the topic vocabulary (the collator's ``context_bow``).",
        "topic_ids": "topics to steer towards instead of a bag of words (see the class doc).",
        "topic_mixture": "(b, T) proportions t on the simplex instead of a bag of words.",
        "document_tokens": "the rows are the chunks of documents whose state is carried from chunk to chunk (one row "
                           "per real chunk, each with its own context): the LSTM runs over the documents' sequences "
                           "(``input_ids``, ``attention_mask`` (d, n)) in one call, each token under the t of the "
                           "row that feeds it (``rows`` (d, n)), and each row's outputs are read at ``positions`` "
                           "(b, s), indices into the flattened (d * n) sequences (``state`` must be None); the topic model and the output layer read each "
                           "row as it is.",
    }
    forward_returns = (":class:`TopicLMOutput`; ``loss`` = lm_loss + bow_loss + kl_weight * kl_loss - lambda R (the "
                       "scale of each term is in the module doc). With ``lm_type=\"naive_moe\"`` the logits are the "
                       "mixture's log-probabilities, not materialised (``logits=None``) when a loss is computed with "
                       "gradients.")

    def __init__(self, config: TCNLMConfig):
        super().__init__(config)
        self.model = TCNLMModel(config)
        self.dropout = nn.Dropout(config.dropout)
        out_size = config.hidden_size
        self.proj = None
        if config.tie_word_embeddings and config.embedding_size != config.hidden_size:
            self.proj = nn.Linear(config.hidden_size, config.embedding_size)
            out_size = config.embedding_size
        self.lm_head = nn.Linear(out_size, config.vocab_size)
        # Optional, not in the paper (config.topic_output_bias): logits += B t with B zero at initialisation,
        # or lambda * log(V_c beta^T t) on the topic words with lambda starting at 0.
        self._init_topic_word_prior(learned_topics=config.num_topics)  # topic_output_bias: "learned" or "beta"
        # Training forward passes seen so far, for KL annealing (saved, so that resuming goes on).
        self._register_kl_annealing()
        self.post_init()

    def carries_documents_in_one_call(self) -> bool:
        """Carried-state training runs a documents batch in one call (``document_tokens``): the LSTM over each
        document's sequence, every token under its own chunk's t, the topic model and the output layer on the batch
        of the chunks. The LM loss is the loop's exactly, and so are the topic terms with
        ``topic_loss_normalization="lm_tokens"``; per context word (the default) they are taken over the batch of
        all the documents' chunks, as chunk training takes them over its batch, where the loop took them over the
        batch of the documents' k-th chunks."""
        return getattr(self, "training_phase", None) != "topic_model"

    def infer_topics(self, context_bow, *, layer=None) -> torch.Tensor:
        """Topic proportions t (b, T) of documents given as bags of words (b, V_c): the posterior mean."""
        self.check_layer(layer)
        return self.model.infer_topics(context_bow)

    def topic_word_scores(self, layer: int) -> torch.Tensor:
        """beta (T, V_c): a topic's words are its most probable ones."""
        return self.model.topic_model.beta()

    def topic_word_log_probs(self, t: torch.Tensor) -> torch.Tensor:
        """log (beta^T t)_w over the topic vocabulary (b, V_c): the topic model's word distribution at t (the
        shared topic output prior's expert, ``topic_output_bias="beta"``)."""
        return (t.float() @ self.model.topic_model.beta().float()).clamp_min(1e-10).log()

    @torch.no_grad()
    def topic_word_distributions(self, *, layer=None) -> torch.Tensor:
        """beta (T, V_c): each topic's distribution over the topic vocabulary."""
        self.check_layer(layer)
        return self.model.topic_model.beta()

    def topic_model_parameters(self) -> list[nn.Parameter]:
        """The neural topic model's parameters (encoder, g(theta), beta), for :func:`pretrain_topic_model`."""
        return list(self.model.topic_model.parameters())

    def topic_model_loss(self, context_bow: torch.Tensor, **inputs) -> torch.Tensor:
        """The topic model's own objective on bags of words (b, V_c), on the scale of ``forward``'s topic
        terms: (-log p(d | t) + KL) per context word (``"context_tokens"`` normalisation) - lambda R."""
        bow = bags_of_words(context_bow, self.config.topic_vocab_size).to(self.device)
        topic_model = self.model.topic_model
        t, mean, logvar = topic_model(bow, sample=self.training)
        count = bow.sum().clamp_min(1)
        return ((topic_model.bow_nll(bow, t).sum() + topic_model.kl(mean, logvar).sum()) / count
                - self.config.diversity_weight * topic_model.diversity())

    # -- output layer ---------------------------------------------------------------------------

    def _features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer's input: dropout, then the projection to E when the embeddings are tied."""
        h = self.dropout(hidden)
        return self.proj(h) if self.proj is not None else h

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self._features(hidden))

    def _expert_target_log_probs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log softmax(V h^(k))[y] for one expert: (b, s, H), (b, s) -> (b, s)."""
        return torch.log_softmax(self._head(hidden).float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    def _mixture_log_probs(self, hidden: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Eq. 7: log sum_k t_k softmax(V h^(k)) for (b, s, T, H) -> (b, s, V); experts with t_k = 0 are skipped."""
        log_t = t.float().clamp_min(0).log()  # (b, T); -inf where a topic is off
        out = None
        active = torch.isfinite(log_t).any(0).tolist()  # one device sync, not one per expert
        for k in range(hidden.shape[2]):
            if not active[k]:
                continue
            log_probs = torch.log_softmax(self._head(hidden[:, :, k]).float(), dim=-1) + log_t[:, k, None, None]
            out = log_probs if out is None else torch.logaddexp(out, log_probs)
        return out

    def _mixture_lm_loss(self, hidden: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean NLL per token of the eq. 7 mixture without materialising T (b, s, V) tensors for backward.

        Each expert's target log-probability is computed under activation checkpointing: only its
        (b, s, H) input is kept, and its (b, s, V) logits are recomputed in the backward pass.
        """
        targets = labels[:, 1:].to(hidden.device)
        valid = targets != -100
        safe_targets = targets.clamp_min(0)
        per_expert = [checkpoint(self._expert_target_log_probs, hidden[:, :-1, k], safe_targets, use_reentrant=False)
                      for k in range(hidden.shape[2])]
        log_probs = torch.logsumexp(torch.stack(per_expert, -1) + t.float().log()[:, None, :], dim=-1)  # (b, s-1)
        return -(log_probs * valid).sum() / valid.sum()

    # -- forward --------------------------------------------------------------------------------

    def language_model_features(self, topics: dict, topic_representation: Optional[torch.Tensor], *, input_ids,
                                attention_mask, inputs_embeds, state, labels, use_cache, output_hidden_states,
                                logits_to_keep, document_tokens=None, **inputs) -> LanguageModelPass:
        """The LSTM's outputs under t (:class:`TCNLMModel`; every expert's with the naive MoE), t itself and, with
        labels and a context, the topic model's terms per document (the base model's output, in ``details``); with
        ``document_tokens``, the outputs of the LSTM's run over the documents' sequences, read at the rows'
        positions."""
        return_topic_losses = labels is not None and "context_bow" in topics
        if document_tokens is not None:
            base = self._document_run(topics, topic_representation, input_ids, inputs_embeds, state,
                                      output_hidden_states, return_topic_losses, document_tokens)
        else:
            base = self.model(input_ids, attention_mask, inputs_embeds, state, use_cache, topic_conditioning=topics,
                              topic_representation=topic_representation, return_topic_losses=return_topic_losses,
                              output_hidden_states=output_hidden_states)
        hidden, t = base.last_hidden_state, base.topic_mixture
        if logits_to_keep and labels is None:
            hidden = hidden[:, -logits_to_keep:]
        return LanguageModelPass(hidden, base.state, base.hidden_states, t, t, details=dict(base=base))

    def _document_run(self, topics, topic_representation, input_ids, inputs_embeds, state, output_hidden_states,
                      return_topic_losses, document_tokens) -> TCNLMModelOutput:
        """:meth:`language_model_features`' base output with ``document_tokens``: t of each row (R, T), the LSTM
        over the documents' sequences with each token under its row's t, its outputs read at the rows' positions
        (R, s, H), and the topic model's terms of the rows."""
        if state is not None or output_hidden_states or input_ids is None:
            raise ValueError("document_tokens reads the LSTM's run over whole documents: it takes input_ids, no "
                             "state, and gives no per-layer hidden states")
        rows = input_ids.shape[0]
        if topic_representation is not None:
            t, losses = topic_representation.to(input_ids.device), None
        else:
            t, losses = self.model.topic_proportions(rows, input_ids.device, topics, return_topic_losses)
        t = t.expand(rows, -1) if t.shape[0] == 1 else t
        sequences = self.model(document_tokens["input_ids"], document_tokens["attention_mask"], use_cache=False,
                               topic_representation=t[document_tokens["rows"]])  # (d, n, T): each token's t
        hidden = sequences.last_hidden_state.flatten(0, 1)[document_tokens["positions"]]
        return TCNLMModelOutput(last_hidden_state=hidden, topic_mixture=t, **(losses or {}))

    def output_logits(self, run: LanguageModelPass, labels: Optional[torch.Tensor]):
        """The shared output layer on the projected outputs, or for the naive MoE the eq. 7 mixture's
        log-probabilities (not materialised when a loss is computed with gradients: ``logits`` None)."""
        hidden, t = run.features, run.topic_mixture
        if self.config.lm_type != "naive_moe":
            return self.output_layer(self._features(hidden), labels, self.output_bias(run))
        if labels is not None and torch.is_grad_enabled():
            return None, self._mixture_lm_loss(hidden, t, labels)
        logits = self._mixture_log_probs(hidden, t)
        return logits, (causal_lm_loss(logits, labels) if labels is not None else None)

    def loss_terms(self, run: LanguageModelPass, labels: torch.Tensor) -> list[LossTerm]:
        """With a context: bow_loss, kl_loss (annealed), each per context word (or per predicted token with
        ``topic_loss_normalization="lm_tokens"``), and aux_loss = -lambda R (the topics' diversity)."""
        base = run.details["base"]
        if base.bow_nll is None:  # no context, or no labels
            return []
        if self.config.topic_loss_normalization == "lm_tokens":
            count = self.predicted_tokens(labels)
        else:
            count = base.context_tokens.sum()
        count = count.clamp_min(1).to(run.features.device)
        bow_loss, kl_loss = base.bow_nll.sum() / count, base.kl.sum() / count
        aux_loss = -self.config.diversity_weight * self.model.topic_model.diversity()
        return [LossTerm(bow_loss, reported={"bow_loss": bow_loss}),
                LossTerm(kl_loss, annealed=True, reported={"kl_loss": kl_loss}),
                LossTerm(aux_loss, reported={"aux_loss": aux_loss})]


class TCNLMForSequenceClassification(DocumentClassifierMixin, TCNLMPreTrainedModel):
    """Document classifier on TCNLM features [o_N; t] (o_m with the CNN head): the LSTM runs with the document's
    own topic proportions t. Loads the body of a saved :class:`TCNLMForCausalLM` folder (see
    :class:`~.modeling_document.DocumentClassifierMixin`)."""

    def __init__(self, config: TCNLMConfig):
        super().__init__(config)
        self._init_classifier(TCNLMModel(config))


__all__ = ["TCNLMForCausalLM", "TCNLMForSequenceClassification", "TCNLMLSTMLayer", "TCNLMModel", "TCNLMModelOutput",
           "TCNLMPreTrainedModel"]
