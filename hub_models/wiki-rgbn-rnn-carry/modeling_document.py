"""Downstream: one document representation and one sequence classifier for every family.

Copied next to the weights with a family's own files when a model is shared with remote code.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from .modeling_conditioning import broadcast_rows


class DocumentRepresentationMixin:
    """What a document is to the downstream tasks, the same for every family (mixed into the base models).

    * :meth:`document_topic_representation` ``c`` (b, |c|): the document's topic vector from its bag of
      words, deterministic (no sampling). Each family says which (NCLM: h, z or [z; h]; TCNLM: the topic
      proportions t; TopicRNN: the posterior mean of theta [and log sigma]; the LSTM LM: none, |c| = 0).
    * :meth:`document_representation`: [o_N; c] (b, H + |c|), o_N the top recurrent layer's output after the
      document's last token (the NCLM paper's retrieval vector), or with ``per_token=True`` [o_m; c] at every
      position (b, n, H + |c|), the input of NCLM's CNN classifier (zero at padding).

    A family implements ``document_topic_representation`` and ``document_topic_size``; a family whose
    recurrent outputs depend on the topics (TCNLM) overrides :meth:`_document_token_states`."""

    @property
    def document_topic_size(self) -> int:
        return 0

    @property
    def document_representation_sizes(self) -> tuple[int, int]:
        """(H, |c|): the widths of the two blocks of :meth:`document_representation`."""
        return self.config.hidden_size, self.document_topic_size

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """c (b, |c|) of documents given as bags of words (b, V_c)."""
        context_bow = torch.as_tensor(context_bow)
        return torch.zeros(context_bow.shape[0] if context_bow.dim() > 1 else 1, 0, device=self.device)

    def _document_token_states(self, input_ids, attention_mask, context_bow):
        """(o (b, n, H) zero at padding, o_N (b, H)) of one sequence per document."""
        out = self(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, return_dict=True)
        return out.last_hidden_state, out.state[0][:, -1]

    def document_representation(self, batch: Optional[dict] = None, *, input_ids=None, attention_mask=None,
                                context_bow=None, per_token: bool = False) -> torch.Tensor:
        """[o_N; c] (b, H + |c|), or [o_m; c] at every position (b, n, H + |c|) with ``per_token``.

        ``batch``: one sequence per document with its bag of words, as ``TopicContextCollator(...,
        context="document", layout="sequence")`` makes them (extra keys such as ``labels`` are ignored), or the
        tensors by name. A missing ``context_bow`` is an empty bag of words. Call it in eval mode for
        deterministic features (the classifiers do)."""
        if batch is not None:
            input_ids = batch.get("input_ids", input_ids)
            attention_mask = batch.get("attention_mask", attention_mask)
            context_bow = batch.get("context_bow", context_bow)
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError("document_representation takes one sequence per document, input_ids of shape (b, n) "
                             "(TopicContextCollator(..., context='document', layout='sequence') makes them)")
        device = self.device
        b = input_ids.shape[0]
        input_ids = input_ids.to(device)
        attention_mask = None if attention_mask is None else attention_mask.to(device)
        topic_vocab_size = getattr(self.config, "topic_vocab_size", None)
        if context_bow is None and topic_vocab_size:
            context_bow = torch.zeros(b, topic_vocab_size, device=device)
        if context_bow is not None and topic_vocab_size:
            context_bow = broadcast_rows(torch.as_tensor(context_bow, device=device), b, "context_bow")
        states, last = self._document_token_states(input_ids, attention_mask, context_bow)
        c = (self.document_topic_representation(context_bow) if self.document_topic_size
             else last.new_zeros(b, 0)).to(device, last.dtype)
        if not per_token:
            return torch.cat([last, c], dim=-1)
        if attention_mask is not None:
            states = states * attention_mask.unsqueeze(-1).to(states.dtype)
        return torch.cat([states, c.unsqueeze(1).expand(-1, states.shape[1], -1)], dim=-1)


class DocumentRepresentationDelegate:
    """The document methods of a causal LM or classifier, read from its base model ``self.model``."""

    @property
    def document_topic_size(self) -> int:
        return self.model.document_topic_size

    @property
    def document_representation_sizes(self) -> tuple[int, int]:
        return self.model.document_representation_sizes

    def document_topic_representation(self, context_bow) -> torch.Tensor:
        """See :meth:`DocumentRepresentationMixin.document_topic_representation`."""
        return self.model.document_topic_representation(context_bow)

    def document_representation(self, batch: Optional[dict] = None, **kwargs) -> torch.Tensor:
        """See :meth:`DocumentRepresentationMixin.document_representation`."""
        return self.model.document_representation(batch, **kwargs)


class DocumentClassificationHead(nn.Module):
    """The head of every ``*ForSequenceClassification`` (see :class:`ClassifierConfigMixin`).

    ``"mlp"``: features (b, F) -> dropout -> Linear(F, hidden) -> activation -> dropout -> Linear(hidden, labels).
    ``"cnn"``: features (b, n, F) and their mask -> Conv1d of each width -> ReLU -> max over the windows that lie
    inside the document (a document shorter than a filter is zero-padded to its width) -> concat -> dropout ->
    Linear(maps * widths, labels) with rows renormalised to L2 norm <= ``classifier_max_norm``."""

    def __init__(self, config, in_features: int):
        super().__init__()
        self.kind = config.classifier_head
        dropout = config.classifier_dropout
        if dropout is None:
            dropout = 0.5 if self.kind == "cnn" else 0.0
        self.dropout = nn.Dropout(dropout)
        self.max_norm = config.classifier_max_norm if self.kind == "cnn" else None
        if self.kind == "mlp":
            self.dense = nn.Linear(in_features, config.classifier_hidden_size)
            self.activation = {"sigmoid": nn.Sigmoid(), "tanh": nn.Tanh(), "relu": nn.ReLU()}[
                config.classifier_activation]
            self.out_proj = nn.Linear(config.classifier_hidden_size, config.num_labels)
        else:
            self.kernel_sizes = list(config.classifier_kernel_sizes)
            self.convs = nn.ModuleList(nn.Conv1d(in_features, config.classifier_num_filters, k)
                                       for k in self.kernel_sizes)
            self.out_proj = nn.Linear(config.classifier_num_filters * len(self.kernel_sizes), config.num_labels)

    @property
    def per_token(self) -> bool:
        return self.kind == "cnn"

    def forward(self, features: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.kind == "mlp":
            if features.dim() != 2:
                raise ValueError(f"The MLP head takes one vector per document (b, F), got shape {tuple(features.shape)}")
            return self.out_proj(self.dropout(self.activation(self.dense(self.dropout(features)))))
        if features.dim() != 3:
            raise ValueError(f"The CNN head takes one vector per token (b, n, F), got shape {tuple(features.shape)}")
        b, n, _ = features.shape
        lengths = (attention_mask.long().sum(-1) if attention_mask is not None
                   else torch.full((b,), n, device=features.device))
        x = self.dropout(features).transpose(1, 2)  # (b, F, n)
        width = max(self.kernel_sizes)
        if n < width:
            x = F.pad(x, (0, width - n))
        pooled = []
        for k, conv in zip(self.kernel_sizes, self.convs):
            y = torch.relu(conv(x))  # (b, maps, n' - k + 1)
            starts = torch.arange(y.shape[-1], device=y.device)
            # windows lying inside the document; a document shorter than k keeps its first (zero-padded) window
            valid = (starts.unsqueeze(0) + k <= lengths.clamp_min(k).unsqueeze(1))  # (b, windows)
            pooled.append(y.masked_fill(~valid.unsqueeze(1), float("-inf")).amax(-1))
        if self.max_norm is not None:
            with torch.no_grad():  # Kim (2014): the output rows are rescaled to norm <= s after every update
                self.out_proj.weight.copy_(torch.renorm(self.out_proj.weight, 2, 0, self.max_norm))
        return self.out_proj(self.dropout(torch.cat(pooled, dim=-1)))


class DocumentClassifierMixin(DocumentRepresentationDelegate):
    """``*ForSequenceClassification`` of every family: the family's base model (``model.*``, loaded from a
    saved ``*ForCausalLM`` folder) and a :class:`DocumentClassificationHead` on
    :meth:`~DocumentRepresentationMixin.document_representation`.

    With ``config.freeze_backbone`` (the default, the papers' recipe) only the head is trained: the body stays
    in eval mode and receives no gradient, and precomputed ``document_features`` can be passed instead of
    tokens (the MLP head: (b, H + |c|); the CNN head: (b, n, H + |c|) with ``attention_mask``).
    ``freeze_backbone=False`` fine-tunes everything. Put it first in the bases; ``__init__`` calls
    :meth:`_init_classifier` with the family's base model."""

    # Declared reads (see RecurrentPreTrainedModel): one sequence per document with the bag of words of the whole
    # document; a family without topics (the LSTM LM) overrides conditioning_inputs = () and training_context = "none".
    conditioning_inputs = ("context_bow",)
    training_context = "document"
    reads_sentence_prefix = False
    reads_documents = False
    _is_stateful = False  # no recurrent state in or out: the document is read whole

    def _init_classifier(self, base_model) -> None:
        self.num_labels = self.config.num_labels
        self.model = base_model
        self.classifier = DocumentClassificationHead(self.config, sum(base_model.document_representation_sizes))
        self.post_init()
        self.hold_configured_weights()

    def hold_configured_weights(self) -> None:
        """The body frozen or not as ``config.freeze_backbone`` says."""
        super().hold_configured_weights()
        self.set_backbone_frozen(self.config.freeze_backbone)

    def set_backbone_frozen(self, frozen: bool = True) -> None:
        """Train only the head on frozen features (``True``) or fine-tune everything (``False``)."""
        self.config.freeze_backbone = bool(frozen)
        self.model.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.config.freeze_backbone:
            self.model.eval()  # frozen features: no dropout, no sampling in the body
        return self

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                context_bow: Optional[torch.Tensor] = None, document_features: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: Optional[bool] = None, **kwargs):
        r"""
        Args:
            input_ids: (b, n) one sequence per document (right-padded), with ``attention_mask``.
            context_bow: (b, V_c) the document's bag of topic words.
            document_features: precomputed :meth:`document_representation` (frozen-feature training) instead of
                ``input_ids``/``context_bow``: (b, F) for the MLP head, (b, n, F) with ``attention_mask`` for
                the CNN.
            labels: (b,) class ids, or floats for regression / multi-label (``config.problem_type``).
        """
        from transformers.modeling_outputs import SequenceClassifierOutput

        if document_features is None:
            if input_ids is None:
                raise ValueError("Give input_ids (with context_bow) or precomputed document_features")
            frozen = self.config.freeze_backbone
            with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
                document_features = self.model.document_representation(
                    input_ids=input_ids, attention_mask=attention_mask, context_bow=context_bow,
                    per_token=self.classifier.per_token)
        weight = self.classifier.out_proj.weight
        features = document_features.to(weight.device, weight.dtype)
        mask = attention_mask.to(weight.device) if (attention_mask is not None and self.classifier.per_token) else None
        logits = self.classifier(features, mask)
        loss = None
        if labels is not None:
            if self.num_labels > 1 and not labels.is_floating_point():
                outside = labels[(labels != -100) & ((labels < 0) | (labels >= self.num_labels))]
                if outside.numel():
                    raise ValueError(f"label {int(outside[0])} is not a class of this classifier (num_labels="
                                     f"{self.num_labels}): load it with num_labels=<the number of classes>")
            loss = self.loss_function(labels=labels.to(logits.device), pooled_logits=logits, config=self.config)
        out = SequenceClassifierOutput(loss=loss, logits=logits,
                                       hidden_states=(features,) if output_hidden_states else None)
        return out if return_dict is not False else out.to_tuple()


__all__ = ["DocumentClassificationHead", "DocumentClassifierMixin", "DocumentRepresentationDelegate",
           "DocumentRepresentationMixin"]
