"""A BiLSTM sense tagger with a document topic representation (NCLM paper §4.5:
Chaudhary, Schütze & Gupta, ICML 2020).

Notation: b sentences, s tokens, E embedding size, H LSTM units per direction, |c| topic
representation size, S senses (every distinct sense key of the training corpus), n instances.

    x_t = embed(w_t)                               (b, s, E)    every word of the sentence, the target too
    o_t = [fwd_t ; bwd_t]                          (b, s, 2H)   one BiLSTM layer
    ô_t = sigmoid([o_t ; c] W_p + b_p)             (b, s, 2H)   NCLM's eq. 6, c tiled over positions
    p(sense | t) = softmax(ô_t U + a)              (b, s, S)

c is the document's topic representation from a *frozen* topic model of the package (NCLM's h, z or
[z; h]; TCNLM's t; TopicRNN's theta), computed once per document and passed in as
``topic_representation`` (b, |c|). With |c| = 0 the same network is the paper's BiLSTM baseline (the
projection is kept, so the two differ by c only).

The input is the whole sentence *including* the target word, as a standard tagger: the NCLM code's
``use_bilm`` path represents position t by [fwd_{t-1}; bwd_{t+1}] and leaves the word out
(that excludes the target's identity from its features and may explain the paper's tagger scoring below the
most-frequent-sense baseline, so it is not replicated).

Loss: cross-entropy at the instance positions only (labels -100 elsewhere). In training mode with
labels, logits are computed at those positions only and ``logits`` is ``None``: the S-way output
layer (35,399 senses on SemCor) at every token would cost about three times as much, for no loss term.
With ``training_objective="candidates"`` the softmax of each instance is over its own candidate senses
``sense_candidates`` (n, C) only (rows of U gathered; -1 pads), so only those rows are evaluated.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import TokenClassifierOutput

from .configuration_sense_tagger import SenseTaggerConfig
from .modeling_recurrent import RecurrentPreTrainedModel, run_rnn


class SenseTaggerPreTrainedModel(RecurrentPreTrainedModel):
    config_class = SenseTaggerConfig
    base_model_prefix = "tagger"
    _is_stateful = False
    _no_split_modules = []

    @classmethod
    def _may_be_missing(cls, key: str) -> bool:
        return False  # a tagger checkpoint is whole: a missing head is an error, not a random init


class SenseTaggerForTokenClassification(SenseTaggerPreTrainedModel):
    """BiLSTM (the word included) + NCLM's eq. 6 composition with c + a softmax over training senses.

    Use :func:`topic_lm_hf.tasks.wsd_tagger.disambiguate` to tag a corpus (candidate restriction and
    back-off live there, with the sense inventory), and
    :func:`~topic_lm_hf.tasks.wsd_tagger.train_sense_tagger` to train one with ``Trainer``.
    """

    def __init__(self, config: SenseTaggerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(config.embedding_size, config.hidden_size, num_layers=1, batch_first=True,
                            bidirectional=True)
        width = 2 * config.hidden_size
        self.topic_projection = nn.Linear(width + config.topic_representation_size, width)  # W_p, b_p
        self.classifier = nn.Linear(width, config.num_labels)  # U, a
        self.post_init()

    def word_tokenizer(self):
        """A fast tokenizer of the tagger's word vocabulary (``config.word_vocabulary``): lower-cased words split
        on whitespace and punctuation, unknown words to ``<unk>``. It is saved with the model, so that
        ``pipeline("token-classification", model=<folder>)`` runs a tagger without topics on raw text: each
        word then gets the most probable of all training senses, without the candidate restriction and
        back-off of :func:`topic_lm_hf.tasks.disambiguate` (the scorer's path), and a tagger trained on lemmas
        (``input_feature="lemma"``) sees word forms."""
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        words = self.config.word_vocabulary
        backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[1]))
        backend.normalizer = normalizers.Lowercase()
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # whitespace, then punctuation as its own token
        return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=words[0], unk_token=words[1],
                                       model_input_names=["input_ids", "attention_mask"])

    def save_pretrained(self, save_directory, *args, **kwargs):
        """The model and its :meth:`word_tokenizer` (what ``AutoTokenizer`` and pipelines load)."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            self.word_tokenizer().save_pretrained(save_directory)
        return result

    def _init_weights(self, module):
        super()._init_weights(module)
        if module is getattr(self, "topic_projection", None):  # eq. 6: Glorot W_p, b_p = 0 (as NCLM's official code)
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)

    def _check_inputs(self, input_ids, attention_mask, topic_representation):
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be (b, s) word ids with s >= 1, got shape {tuple(input_ids.shape)}: "
                             "an empty sentence has nothing to tag")
        if bool((input_ids < 0).any()) or bool((input_ids >= self.config.vocab_size).any()):
            raise ValueError(f"input_ids must be in [0, {self.config.vocab_size}) (the tagger's word vocabulary), "
                             f"got ids in [{int(input_ids.min())}, {int(input_ids.max())}]: mismatched vocabulary?")
        if attention_mask is not None and bool((attention_mask.sum(1) == 0).any()):
            raise ValueError("a row of attention_mask has no token: an empty sentence has nothing to tag")
        size = self.config.topic_representation_size
        if size == 0:
            if topic_representation is not None and topic_representation.numel() > 0:
                raise ValueError("this tagger has no topics (topic_representation_size=0) but got a "
                                 f"topic_representation of shape {tuple(topic_representation.shape)}")
        elif topic_representation is None:
            raise ValueError(f"this tagger needs the document topic representation (b, {size}) from its topic model "
                             f"{self.config.topic_model_name_or_path}: pass topic_representation (a text pipeline "
                             f"cannot; tag with topic_lm_hf.tasks.disambiguate)")
        elif topic_representation.shape != (input_ids.shape[0], size):
            raise ValueError(f"topic_representation must have shape ({input_ids.shape[0]}, {size}), got "
                             f"{tuple(topic_representation.shape)}: a c from another topic model?")

    def composed_states(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None,
                        topic_representation: Optional[torch.Tensor] = None) -> torch.Tensor:
        """ô (b, s, 2H): the BiLSTM outputs composed with c (eq. 6), zero at padding."""
        self._check_inputs(input_ids, attention_mask, topic_representation)
        x = self.dropout(self.embed_tokens(input_ids))  # (b, s, E)
        self.lstm.flatten_parameters()
        o, _ = run_rnn(self.lstm, x, attention_mask, need_state=False)  # (b, s, 2H), zero at padding
        o = self.dropout(o)
        if self.config.topic_representation_size > 0:
            c = topic_representation.to(o.dtype).unsqueeze(1).expand(-1, o.shape[1], -1)  # (b, s, |c|), tiled
            o = torch.cat([o, c], dim=-1)  # (b, s, 2H + |c|)
        return torch.sigmoid(self.topic_projection(o))  # (b, s, 2H)

    def candidate_loss(self, hidden: torch.Tensor, labels: torch.LongTensor,
                       sense_candidates: torch.LongTensor) -> torch.Tensor:
        """Mean cross-entropy of a softmax over each instance's candidates: ``hidden`` (n, 2H) at the
        instances, ``labels`` (n,), ``sense_candidates`` (n, C) sense ids padded with -1; each row holds its
        label. Only the C gathered rows of the output layer are evaluated."""
        if sense_candidates.dim() != 2 or sense_candidates.shape[0] != labels.shape[0]:
            raise ValueError(f"sense_candidates must be (n, C) with one row per labelled position (n = "
                             f"{labels.shape[0]}), got shape {tuple(sense_candidates.shape)}")
        if labels.numel() == 0:
            return hidden.sum() * 0.0  # no instance in the batch: a zero loss that still has a graph
        real = sense_candidates >= 0
        if bool((sense_candidates >= self.num_labels).any()):
            raise ValueError(f"sense_candidates must be sense ids in [0, {self.num_labels}) or -1 (padding)")
        hits = (sense_candidates == labels.unsqueeze(1)) & real  # (n, C)
        if not bool(hits.any(1).all()):
            raise ValueError("a label is not among its instance's sense_candidates: the candidates must hold the gold "
                             "sense (built from another sense inventory?)")
        ids = sense_candidates.clamp(min=0)
        weight, bias = self.classifier.weight[ids], self.classifier.bias[ids]  # (n, C, 2H), (n, C)
        scores = torch.einsum("nh,nch->nc", hidden, weight) + bias  # (n, C)
        scores = scores.float().masked_fill(~real, float("-inf"))
        return F.cross_entropy(scores, hits.float().argmax(1))

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                topic_representation: Optional[torch.Tensor] = None, labels: Optional[torch.LongTensor] = None,
                sense_candidates: Optional[torch.LongTensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: Optional[bool] = None, **kwargs) -> TokenClassifierOutput:
        r"""
        Args:
            input_ids: (b, s) word ids of the tagger's own vocabulary (right- or left-padded).
            attention_mask: (b, s), 1 for real tokens.
            topic_representation: (b, |c|) the document topic representation of each sentence's document
                (from the frozen topic model named in the config); omit it for a tagger without topics.
            labels: (b, s) sense ids at instance positions, -100 elsewhere.
            sense_candidates: (n, C) the candidate sense ids of each labelled position (row-major order of
                ``labels != -100``), -1 padded: the loss is then over the candidates
                (``training_objective="candidates"``; the collator adds them for such a tagger).

        Returns:
            :class:`~transformers.modeling_outputs.TokenClassifierOutput`: ``loss`` (mean cross-entropy over
            the labelled positions), ``logits`` (b, s, S) (``None`` in training mode with labels, see the
            module docstring), ``hidden_states`` = (ô,) with ``output_hidden_states``.
        """
        if kwargs:
            raise TypeError(f"SenseTaggerForTokenClassification.forward() got unexpected arguments {sorted(kwargs)}")
        if input_ids is None:
            raise ValueError("input_ids is required")
        hidden = self.composed_states(input_ids, attention_mask, topic_representation)  # (b, s, 2H)
        logits = loss = None
        if labels is not None:
            labels = labels.to(hidden.device)
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}, got "
                                 f"{tuple(labels.shape)}")
            labelled = labels != -100
            if bool((labels[labelled] < 0).any()) or bool((labels[labelled] >= self.num_labels).any()):
                raise ValueError(f"labels must be sense ids in [0, {self.num_labels}) or -100")
            if sense_candidates is not None:
                loss = self.candidate_loss(hidden[labelled], labels[labelled], sense_candidates.to(hidden.device))
                if not self.training:
                    logits = self.classifier(hidden)  # (b, s, S)
            elif self.training:
                instance_logits = self.classifier(hidden[labelled])  # (n, S): instances only
                loss = F.cross_entropy(instance_logits.float(), labels[labelled], reduction="sum") \
                    / labelled.sum().clamp(min=1)
            else:
                logits = self.classifier(hidden)  # (b, s, S)
                loss = F.cross_entropy(logits[labelled].float(), labels[labelled], reduction="sum") \
                    / labelled.sum().clamp(min=1)
        else:
            logits = self.classifier(hidden)  # (b, s, S)
        out = TokenClassifierOutput(loss=loss, logits=logits, hidden_states=(hidden,) if output_hidden_states else None)
        return out if return_dict is not False else out.to_tuple()

    @torch.no_grad()
    def instance_logits(self, input_ids: torch.LongTensor, positions: torch.LongTensor,
                        attention_mask: Optional[torch.Tensor] = None,
                        topic_representation: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sense scores (n, S) at ``positions`` (n, 2) = (row, token) pairs; for tagging a corpus."""
        hidden = self.composed_states(input_ids, attention_mask, topic_representation)  # (b, s, 2H)
        return self.classifier(hidden[positions[:, 0], positions[:, 1]])  # (n, S)


__all__ = ["SenseTaggerForTokenClassification", "SenseTaggerPreTrainedModel"]
