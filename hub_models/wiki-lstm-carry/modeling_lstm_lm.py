"""The plain LSTM language model: the same-size baseline of every topic-guided LM.

Notation: b batch, s tokens, E embedding size, H hidden size, L layers, V vocabulary.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import GenerationMixin

from .configuration_lstm_lm import LSTMLMConfig
from .modeling_document import DocumentClassifierMixin, DocumentRepresentationDelegate, DocumentRepresentationMixin
from .modeling_recurrent import (RecurrentBodyMixin, RecurrentPreTrainedModel, TopicLMOutput, check_call,
                                 check_prompt, state_from_aliases)


class LSTMLMPreTrainedModel(RecurrentPreTrainedModel):
    config_class = LSTMLMConfig
    _no_split_modules = ["LSTMLMModel"]


class LSTMLMModel(DocumentRepresentationMixin, RecurrentBodyMixin, LSTMLMPreTrainedModel):
    """Embeddings and a stack of LSTM layers; returns a :class:`RecurrentModelOutput` whose
    ``last_hidden_state`` holds the top layer's outputs (b, s, H). Its document representation is o_N alone
    (no topic part: the papers' "same-size LSTM features" baseline)."""

    _keys_to_ignore_on_load_unexpected = [r"^(lm_head|proj)\."]  # a causal LM's output layer: not in the body

    def __init__(self, config: LSTMLMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(config.embedding_size, config.hidden_size, num_layers=config.num_hidden_layers,
                            dropout=config.dropout if config.num_hidden_layers > 1 else 0.0, batch_first=True)
        self.gradient_checkpointing = False
        self.post_init()


class LSTMLMForCausalLM(DocumentRepresentationDelegate, LSTMLMPreTrainedModel, GenerationMixin):
    """LSTM LM with a softmax output layer, cached-state generation and Trainer support."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # Its training step reads nothing on the host under host_reads_deferred, but cuDNN's LSTM does not train under
    # a captured graph: measured on an H200 (torch 2.11), the captured model learnt nothing (perplexity 4,202
    # against eager training's 201 after 300 steps) or the replay hit an illegal memory access.
    supports_cuda_graphs = False

    def __init__(self, config: LSTMLMConfig):
        super().__init__(config)
        self.model = LSTMLMModel(config)
        self.dropout = nn.Dropout(config.dropout)
        out_size = config.hidden_size
        self.proj = None
        if config.tie_word_embeddings and config.embedding_size != config.hidden_size:
            self.proj = nn.Linear(config.hidden_size, config.embedding_size)
            out_size = config.embedding_size
        self.lm_head = nn.Linear(out_size, config.vocab_size)
        self.post_init()

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """``GenerationMixin.generate``, an empty prompt refused first (:func:`check_prompt`); ``past_key_values=``
        (a returned ``past_key_values``) continues a generation as ``state=`` does."""
        check_prompt(inputs if inputs is not None else kwargs.get("input_ids"))
        state = state_from_aliases(kwargs.pop("state", None), kwargs)
        if state is not None:
            kwargs["state"] = state
        return super().generate(inputs, generation_config, **kwargs)

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None, state: Optional[tuple] = None,
                labels: Optional[torch.LongTensor] = None, use_cache: Optional[bool] = None,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None,
                logits_to_keep: int = 0, **kwargs) -> TopicLMOutput:
        r"""
        Args:
            input_ids: (b, s) token ids, left- or right-padded.
            attention_mask: (b, s), 1 for real tokens.
            state: batch-first ``(h, c)``, each (b, L, H), to continue from (``past_key_values=`` is the same).
            labels: (b, s) = ``input_ids`` with -100 at ignored positions; shifted inside.
            logits_to_keep: compute logits for the last N positions only (0 = all).
        """
        state = state_from_aliases(state, kwargs)
        check_call(input_ids, inputs_embeds, attention_mask, state)
        base = self.model(input_ids, attention_mask, inputs_embeds, state, use_cache,
                          output_hidden_states=output_hidden_states)
        hidden, state = base.last_hidden_state, base.state
        if logits_to_keep and labels is None:
            hidden = hidden[:, -logits_to_keep:]
        h = self.dropout(hidden)
        if self.proj is not None:
            h = self.proj(h)
        logits, loss = self.output_layer(h, labels)  # (b, s, V); None in training with labels
        out = TopicLMOutput(loss=loss, logits=logits, state=state, lm_loss=loss.detach() if loss is not None else None,
                            hidden_states=base.hidden_states)
        return out if return_dict is not False else out.to_tuple()


class LSTMLMForSequenceClassification(DocumentClassifierMixin, LSTMLMPreTrainedModel):
    """Document classifier on the LSTM LM's features o_N (or o_m with the CNN head): the papers' CNN-LSTM /
    "LSTM features" baseline. Loads the body of a saved :class:`LSTMLMForCausalLM` folder (see
    :class:`~.modeling_document.DocumentClassifierMixin`)."""

    conditioning_inputs = ()  # no topics: the document is its token sequence alone
    training_context = "none"

    def __init__(self, config: LSTMLMConfig):
        super().__init__(config)
        self._init_classifier(LSTMLMModel(config))


__all__ = ["LSTMLMForCausalLM", "LSTMLMForSequenceClassification", "LSTMLMModel", "LSTMLMPreTrainedModel"]
