"""TopicContextCollator: sentence batches for the LM plus each sentence's context bag of words.

Shapes: b batch rows, c chunks of a document, l tokens of a chunk, V_c topic vocabulary.

Every paper models a document one sentence at a time and conditions the topic model on a
*context* bag of words. Which words form that context decides whether perplexity is honest:

=============  =====================================================  ======================
``context``    bag of words of sentence j                              use
=============  =====================================================  ======================
``"others"``   the document minus sentence j                           the papers' protocol
``"preceding"``sentences 0..j-1 only                                   causal (no leakage)
``"document"`` the whole document                                      downstream tasks
``"none"``     no ``context_bow`` at all                               plain LSTM LM
=============  =====================================================  ======================

The context keeps the *first* ``max_context_tokens`` topic tokens (300 by default, as in the
papers) of those sentences, in document order, for every mode. A document without topic words,
or a first sentence under ``"preceding"``, gets an all-zero bag of words; an empty document is
an error.

A sentence ``w_1..w_n`` becomes the sequence ``<bos> w_1 .. w_n <eos>`` and is cut into chunks
that each predict at most ``max_sentence_length`` tokens; consecutive chunks share one token
(the last input of a chunk is the first of the next), so every token after ``<bos>`` is
predicted exactly once. ``labels`` equal ``input_ids`` (the model shifts them) with padding set
to -100.

Work is done per document in :meth:`TopicContextCollator.prepare` (a ``Dataset.map``): the
context of a sentence costs O(max_context_tokens), so preparing a document is linear in its
length. ``__call__`` only pads and scatters the stored context ids into dense rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import datasets
import numpy as np
import torch

from .data import BOS, EOS, PAD, STREAM_BATCH_SIZE, UNK, check_sentences, check_vocabularies, dataset_columns
from .models.modeling_recurrent import RecurrentPreTrainedModel
from .models.modeling_topic_family import TopicFamilyForCausalLM
from .protocols import ALL_PROTOCOLS

CONTEXT_MODES = ("others", "preceding", "document", "none")
LAYOUTS = ("sentences", "documents", "sequence")


@dataclass
class TopicContextCollator:
    """Builds LM batches with context bags of words for every model of the package.

    Args:
        tokenizer: the LM tokenizer (``<pad> <unk> <bos> <eos>`` in its vocabulary).
        topic_tokenizer: the topic tokenizer; required unless ``context="none"``.
        context: ``"others"``, ``"preceding"``, ``"document"`` or ``"none"`` (see module doc).
        max_sentence_length: predicted tokens per chunk (30 in the papers).
        max_context_tokens: topic tokens kept in a context (300 in the papers); ``None`` keeps all.
        layout: ``"sentences"`` gives one row per chunk; ``"documents"`` gives one row per
            document with all its chunks (``input_ids`` of shape (b, c, l), ``context_bow`` of
            shape (b, c, V_c), ``chunk_mask`` (b, c)), for models with a recurrence over sentences;
            ``"sequence"`` gives one row per document as ONE sequence, its sentences as ``<bos> w_1 .. w_n <eos>``
            one after the other, cut at ``max_document_length`` tokens, with the bag of words of the whole
            document (``context="document"`` or ``"none"`` only): the input of the downstream tasks
            (``document_representation``, the ``*ForSequenceClassification`` models, retrieval).
        max_document_length: tokens kept per document in the ``"sequence"`` layout.
        label_column: in the ``"sequence"`` layout, the documents' column returned as ``labels`` (class ids for
            a sequence classifier); without it ``labels`` are the LM labels. Documents without the column (a
            corpus to featurise) give batches without ``labels``.
        keep_columns: columns of the documents dataset copied to every prepared row (e.g. ``label``).
        sentence_prefix: also give each chunk ``sentence_prefix_bow``, the topic words of its sentence
            *before* the chunk (all-zero for a sentence's first chunk), for models with sentence-level
            topics (NCLM's SDT): with it, a chunk that continues a long sentence still sees the
            sentence's earlier words, causally. Needs a topic tokenizer.
    """

    tokenizer: Any
    topic_tokenizer: Any = None
    context: str = "others"
    max_sentence_length: int = 30
    max_context_tokens: int | None = 300
    layout: str = "sentences"
    keep_columns: Sequence[str] = field(default_factory=tuple)
    sentence_prefix: bool = False
    max_document_length: int = 400
    label_column: str | None = None

    def __post_init__(self):
        if self.context not in CONTEXT_MODES:
            raise ValueError(f"context must be one of {CONTEXT_MODES}, got {self.context!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.layout == "sequence" and self.context not in ("document", "none"):
            raise ValueError(f"layout='sequence' (one sequence per document) takes context='document' or 'none', got "
                             f"context={self.context!r}: the other modes are per sentence")
        if self.layout == "sequence" and self.sentence_prefix:
            raise ValueError("sentence_prefix is a per-chunk option; layout='sequence' has no chunks")
        if self.label_column is not None and self.layout != "sequence":
            raise ValueError("label_column is an option of layout='sequence' (document classification); with "
                             "the other layouts copy the column with keep_columns")
        if self.max_document_length < 2:
            raise ValueError(f"max_document_length must be >= 2, got {self.max_document_length}")
        if self.max_sentence_length < 1:
            raise ValueError(f"max_sentence_length must be >= 1, got {self.max_sentence_length}")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1 or None, got {self.max_context_tokens}")
        if self.context != "none" and self.topic_tokenizer is None:
            raise ValueError(f"context={self.context!r} needs a topic_tokenizer (or use context='none')")
        if self.sentence_prefix and self.topic_tokenizer is None:
            raise ValueError("sentence_prefix=True needs a topic_tokenizer (the prefix is a bag of topic words)")
        check_vocabularies(self.tokenizer, self.topic_tokenizer if (self.context != "none" or self.sentence_prefix)
                           else None)
        self._vocab = self.tokenizer.get_vocab()
        self.pad_id, self.unk_id = self._vocab[PAD], self._vocab[UNK]
        self.bos_id, self.eos_id = self._vocab[BOS], self._vocab[EOS]
        # A word of the text is never a control token: a literal "<pad>", "<bos>" or "<eos>" in a sentence is <unk>.
        self._words = {w: i for w, i in self._vocab.items() if i not in (self.pad_id, self.bos_id, self.eos_id)}
        self.topic_vocab_size = len(self.topic_tokenizer) if self.topic_tokenizer is not None else 0
        # LM id -> topic id (-1 for words outside the topic vocabulary): one lookup per token.
        self.lm_to_topic = np.full(len(self.tokenizer), -1, dtype=np.int64)
        if self.topic_tokenizer is not None:
            for word, topic_id in self.topic_tokenizer.get_vocab().items():
                if word != UNK and word in self._vocab:
                    self.lm_to_topic[self._vocab[word]] = topic_id

    @classmethod
    def for_model(cls, model, tokenizer, topic_tokenizer=None, protocol: str = "train", context: str | None = None,
                  layout: str | None = None, **kwargs) -> "TopicContextCollator":
        """The collator that builds ``model``'s batches, from what the model declares it reads
        (``conditioning_inputs``, ``training_context``, ``reads_sentence_prefix``, ``reads_documents``).

        Args:
            model: a model of the package (or its class).
            tokenizer, topic_tokenizer: the model's vocabularies (the topic tokenizer is used only when
                the model reads a bag of words).
            protocol: what the batches are for:

                * ``"train"``: the model's documented training batches (its ``training_context``);
                * ``"pretraining"``: the batches its topic model is pre-trained on
                  (:func:`~topic_lm_hf.pretrain_topic_model`): the training batches, or one row per document with
                  its whole bag of words (``"document"``) for a model that declares
                  ``topic_pretraining_batches = "document"`` (rGBN-RNN: under its causal training context the
                  first sentences of a document see nearly empty bags);
                * a protocol of :data:`~topic_lm_hf.protocols.ALL_PROTOCOLS`: its context mode, and whole documents
                  where it carries the state: ``"train-carry"`` for ``TopicLMTrainer(carry_state=True)``;
                  ``"paper"``, ``"causal"``, ``"causal-carry"``, the evaluation protocols of
                  :func:`~topic_lm_hf.evaluate_perplexity`; ``"sliding-window"`` (whole documents without a context:
                  :func:`~topic_lm_hf.evaluation.evaluate_perplexity_sliding_window` builds it from the window);
                  ``"document"``, one sequence per document with its whole bag of words (the downstream tasks:
                  classification, retrieval, ``document_representation``).
            context: another context mode for ``"train"`` and ``"pretraining"`` (``--context`` of ``topic-lm
                train``); a model without a bag-of-words input always gets ``"none"``.
            layout: ``"documents"`` for ``"train"`` (and ``"pretraining"``) gives whole documents also to a model that reads sentence
                chunks (a benchmark that streams the same documents to every model cuts them into chunks).
            kwargs: the other fields (``max_sentence_length``, ``max_context_tokens``, ``label_column``, ...).

        A model reading whole documents (rGBN-RNN) gets documents batches under every protocol but
        ``"document"``; a model reading the sentence prefix (NCLM) gets ``sentence_prefix_bow``.
        """
        if protocol not in ("train", "pretraining") and protocol not in ALL_PROTOCOLS:
            raise ValueError(f"protocol must be one of {['train', 'pretraining', *ALL_PROTOCOLS]}, got {protocol!r}")
        family = model if isinstance(model, type) else type(model)
        if not issubclass(family, RecurrentPreTrainedModel):
            raise ValueError(f"TopicContextCollator.for_model takes a model of the package (or its class), got "
                             f"{family.__name__}: build the collator with TopicContextCollator(...) instead")
        if protocol == "pretraining":
            if not issubclass(family, TopicFamilyForCausalLM):
                raise ValueError(f"{family.__name__} has no topic model to pre-train")
            whole_bags = family.topic_pretraining_batches == "document"
            protocol, context, layout = ("document", None, None) if whole_bags else ("train", context, layout)
        if (context is not None or layout is not None) and protocol != "train":
            raise ValueError(f"context= and layout= choose the training batches (protocol='train'); "
                             f"protocol={protocol!r} fixes its own")
        if layout not in (None, "sentences", "documents"):
            raise ValueError(f"layout must be 'sentences' or 'documents' for the training batches, got {layout!r}")
        reads_context = "context_bow" in family.conditioning_inputs
        reads_documents = family.reads_documents
        if protocol == "train":
            mode, whole_documents = context or family.training_context, reads_documents
        else:
            record = ALL_PROTOCOLS[protocol]
            mode, whole_documents = record.context, record.carry_state or reads_documents
        if not reads_context:
            mode = "none"
        if protocol == "document":
            layout, prefix = "sequence", False
        else:
            layout = layout or ("documents" if whole_documents else "sentences")
            prefix = family.reads_sentence_prefix
        # A topic model keeps its topic vocabulary also without a context (the sliding window maps words to it).
        return cls(tokenizer, topic_tokenizer if (reads_context or prefix) else None, context=mode, layout=layout,
                   sentence_prefix=prefix, **kwargs)

    # ------------------------------------------------------------------------------------------
    # per document
    # ------------------------------------------------------------------------------------------

    def encode_sentence(self, tokens: Sequence[str]) -> list[int]:
        """LM ids of a tokenized sentence (out-of-vocabulary words, and the special tokens' names written as words,
        become ``<unk>``)."""
        return [self._words.get(w.lower(), self.unk_id) for w in tokens]

    def chunks(self, ids: Sequence[int]) -> list[list[int]]:
        """``<bos> ids <eos>`` cut into chunks predicting at most ``max_sentence_length`` tokens."""
        seq = [self.bos_id, *ids, self.eos_id]
        step = self.max_sentence_length
        return [seq[start:start + step + 1] for start in range(0, len(seq) - 1, step)]

    def contexts(self, sentence_ids: Sequence[Sequence[int]], mode: str | None = None) -> list[np.ndarray]:
        """The context topic ids of each sentence of one document (already capped)."""
        mode = mode or self.context
        lm_to_topic = self.lm_to_topic
        topic = [lm_to_topic[np.asarray(s, dtype=np.int64)] for s in sentence_ids]
        topic = [t[t >= 0] for t in topic]
        flat = np.concatenate(topic) if topic else np.zeros(0, dtype=np.int64)
        offsets = np.cumsum([0] + [len(t) for t in topic])
        cap = self.max_context_tokens if self.max_context_tokens is not None else len(flat)
        out = []
        for j in range(len(sentence_ids)):
            if mode == "document":
                ctx = flat[:cap]
            elif mode == "preceding":
                ctx = flat[:min(offsets[j], cap)]
            elif mode == "others":
                before = flat[:min(offsets[j], cap)]
                after = flat[offsets[j + 1]:offsets[j + 1] + cap - len(before)]
                ctx = np.concatenate([before, after])
            else:
                ctx = flat[:0]
            out.append(ctx)
        return out

    def encode_document(self, sentences: Sequence[Sequence[str]], doc_index: int = -1) -> dict[str, list]:
        """All chunks of one document with their context ids (lists, one entry per chunk)."""
        sentences = [s for s in sentences if len(s) > 0]
        if not sentences:
            raise ValueError(f"Document {doc_index} is empty (no tokens): remove it, or load documents "
                             "with load_documents(..., on_empty='skip')")
        sentence_ids = [self.encode_sentence(s) for s in sentences]
        contexts = self.contexts(sentence_ids) if self.context != "none" else None
        rows: dict[str, list] = {"input_ids": [], "context_ids": [], "sentence_index": [], "chunk_index": []}
        if self.sentence_prefix:
            rows["prefix_ids"] = []
        for j, ids in enumerate(sentence_ids):
            for k, chunk in enumerate(self.chunks(ids)):
                rows["input_ids"].append(chunk)
                rows["context_ids"].append(contexts[j].tolist() if contexts is not None else [])
                rows["sentence_index"].append(j)
                rows["chunk_index"].append(k)
                if self.sentence_prefix:
                    # <bos> w_1 .. : the tokens before this chunk's first one are w_1 .. w_{k * step - 1}
                    before = self.lm_to_topic[np.asarray(ids[:max(k * self.max_sentence_length - 1, 0)],
                                                          dtype=np.int64)]
                    rows["prefix_ids"].append(before[before >= 0].tolist())
        return rows

    def encode_sequence(self, sentences: Sequence[Sequence[str]], doc_index: int = -1) -> dict[str, list]:
        """One document as one sequence (``input_ids``, cut at ``max_document_length``) and the topic ids of its
        bag of words (``context_ids``: the first ``max_context_tokens`` of the whole document)."""
        sentences = [s for s in sentences if len(s) > 0]
        if not sentences:
            raise ValueError(f"Document {doc_index} is empty (no tokens): remove it, or load documents "
                             "with load_documents(..., on_empty='skip')")
        ids = [self.encode_sentence(s) for s in sentences]
        tokens = [t for s in ids for t in (self.bos_id, *s, self.eos_id)][:self.max_document_length]
        context = self.contexts(ids, mode="document")[0].tolist() if self.context != "none" else []
        return {"input_ids": tokens, "context_ids": context}

    def prepare(self, documents, num_proc: int | None = None):
        """Turn a documents dataset (column ``sentences``) into rows for this collator.

        ``layout="sentences"``: one row per chunk with ``input_ids``, ``context_ids``,
        ``doc_index``, ``sentence_index``, ``chunk_index`` (+ ``keep_columns``).
        ``layout="documents"``: one row per document whose columns are lists over its chunks.
        ``layout="sequence"``: one row per document with ``input_ids``, ``context_ids``, ``doc_index``
        (+ ``keep_columns``, + ``labels`` from ``label_column``).

        ``documents`` may be a ``datasets.IterableDataset`` (e.g. ``load_documents(...,
        streaming=True)``): the rows are then an ``IterableDataset`` too, made as the stream is read,
        for ``Trainer`` with ``max_steps``.
        """
        if not isinstance(documents, (datasets.Dataset, datasets.IterableDataset)):
            raise ValueError(f"prepare takes a documents dataset (a 'sentences' column of token lists), got "
                             f"{type(documents).__name__}: make one with documents_from_lists(documents) or "
                             "load_documents(path)")
        columns = dataset_columns(documents)
        if "sentences" in columns:
            check_sentences(documents)
        if self.layout == "sequence":
            return self._prepare_sequences(documents, columns, num_proc)
        missing = [c for c in ["sentences", *self.keep_columns] if c not in columns]
        if missing:
            raise ValueError(f"The documents dataset lacks column(s) {missing} (has {columns})")
        stream = isinstance(documents, datasets.IterableDataset)

        per_chunk = ("input_ids", "context_ids", "sentence_index", "chunk_index") + (
            ("prefix_ids",) if self.sentence_prefix else ())

        def encode(batch, indices):
            out: dict[str, list] = {k: [] for k in (*per_chunk, "doc_index", *self.keep_columns)}
            for row, (doc, index) in enumerate(zip(batch["sentences"], indices)):
                rows = self.encode_document(doc, index)
                n = len(rows["input_ids"])
                extra = {c: batch[c][row] for c in self.keep_columns}
                if self.layout == "sentences":
                    for key in per_chunk:
                        out[key].extend(rows[key])
                    out["doc_index"].extend([index] * n)
                    for c in self.keep_columns:
                        out[c].extend([extra[c]] * n)
                else:
                    for key in per_chunk:
                        out[key].append(rows[key])
                    out["doc_index"].append(index)
                    for c in self.keep_columns:
                        out[c].append(extra[c])
            return out

        if stream:
            return documents.map(encode, batched=True, with_indices=True, remove_columns=columns,
                                 batch_size=STREAM_BATCH_SIZE)
        return documents.map(encode, batched=True, with_indices=True, remove_columns=columns,
                             num_proc=num_proc, desc=f"preparing {self.layout} ({self.context} context)")

    def _prepare_sequences(self, documents, columns, num_proc):
        missing = [c for c in ["sentences", *self.keep_columns] if c not in columns]
        if missing:
            raise ValueError(f"The documents dataset lacks column(s) {missing} (has {columns})")
        labelled = self.label_column is not None and self.label_column in columns

        def encode(batch, indices):
            rows = [self.encode_sequence(doc, index) for doc, index in zip(batch["sentences"], indices)]
            out = {"input_ids": [r["input_ids"] for r in rows], "context_ids": [r["context_ids"] for r in rows],
                   "doc_index": list(indices), **{c: batch[c] for c in self.keep_columns}}
            if labelled:
                out["labels"] = batch[self.label_column]
            return out

        kwargs = ({"batch_size": STREAM_BATCH_SIZE} if isinstance(documents, datasets.IterableDataset)
                  else {"num_proc": num_proc, "desc": f"preparing sequences ({self.context} context)"})
        return documents.map(encode, batched=True, with_indices=True, remove_columns=columns, **kwargs)

    # ------------------------------------------------------------------------------------------
    # batching
    # ------------------------------------------------------------------------------------------

    def bag_of_words(self, context_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Dense float counts (b, V_c) from lists of topic ids."""
        bow = torch.zeros(len(context_ids), self.topic_vocab_size)
        for i, ids in enumerate(context_ids):
            if len(ids):
                bow[i].index_add_(0, torch.as_tensor(ids, dtype=torch.long), torch.ones(len(ids)))
        return bow

    def _pad(self, sequences: Sequence[Sequence[int]], length: int | None = None) -> torch.Tensor:
        length = length or max(len(s) for s in sequences)
        out = torch.full((len(sequences), length), self.pad_id, dtype=torch.long)
        for i, s in enumerate(sequences):
            out[i, :len(s)] = torch.as_tensor(s, dtype=torch.long)
        return out

    def _lm_batch(self, input_ids: Sequence[Sequence[int]], length: int | None = None) -> dict[str, torch.Tensor]:
        ids = self._pad(input_ids, length)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(input_ids):
            mask[i, :len(s)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def _extra(self, features) -> dict[str, Any]:
        out = {}
        for c in self.keep_columns:
            values = [f[c] for f in features]
            out[c] = torch.as_tensor(values) if isinstance(values[0], (int, float, bool)) else values
        return out

    def _sequence_batch(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """layout="sequence": raw documents (``sentences``) or prepared rows -> (b, n) batches."""
        if "input_ids" not in features[0]:
            label = self.label_column
            features = [{**self.encode_sequence(f["sentences"], f.get("doc_index", i)),
                         **{c: f[c] for c in self.keep_columns},
                         **({"labels": f[label]} if label is not None and label in f else {})}
                        for i, f in enumerate(features)]
        batch = self._lm_batch([f["input_ids"] for f in features])
        if self.context != "none":
            batch["context_bow"] = self.bag_of_words([f["context_ids"] for f in features])
        if self.label_column is not None:
            del batch["labels"]  # the LM labels: this batch is for a classifier / feature extraction
            if "labels" in features[0]:
                batch["labels"] = torch.as_tensor([f["labels"] for f in features])
        batch.update(self._extra(features))
        return batch

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if not features:
            raise ValueError("Empty batch")
        if self.layout == "sequence":
            return self._sequence_batch(features)
        if "sentences" in features[0] and "input_ids" not in features[0]:
            # Raw documents: encode them here (convenient for small data; prepare() is faster).
            encoded = []
            for i, f in enumerate(features):
                rows = self.encode_document(f["sentences"], f.get("doc_index", i))
                extra = {c: f[c] for c in self.keep_columns}
                if self.layout == "sentences":
                    encoded.extend({**{k: rows[k][n] for k in rows}, **extra} for n in range(len(rows["input_ids"])))
                else:
                    encoded.append({**rows, **extra})
            features = encoded
        needed = ["input_ids"] + (["context_ids"] if self.layout == "sentences" and self.context != "none" else []) \
            + (["prefix_ids"] if self.layout == "sentences" and self.sentence_prefix else [])
        missing = [c for c in needed if c not in features[0]]
        if missing:
            raise ValueError(f"The batch's rows lack {', '.join(missing)} (they have {', '.join(sorted(features[0]))}): "
                             "a plain transformers.Trainer drops the columns its model's forward() does not name; "
                             "pass TrainingArguments(remove_unused_columns=False), or use TopicLMTrainer, which sets it")
        if self.layout == "sentences":
            batch = self._lm_batch([f["input_ids"] for f in features])
            if self.context != "none":
                batch["context_bow"] = self.bag_of_words([f["context_ids"] for f in features])
            if self.sentence_prefix:
                batch["sentence_prefix_bow"] = self.bag_of_words([f["prefix_ids"] for f in features])
            batch.update(self._extra(features))
            return batch

        # documents layout: (b, c, l)
        n_chunks = [len(f["input_ids"]) for f in features]
        c_max = max(n_chunks)
        l_max = max(len(chunk) for f in features for chunk in f["input_ids"])
        flat = [chunk for f in features for chunk in f["input_ids"]]
        lm = self._lm_batch(flat, l_max)
        b = len(features)
        batch = {k: torch.full((b, c_max, l_max), -100 if k == "labels" else 0, dtype=torch.long)
                 for k in ("input_ids", "attention_mask", "labels")}
        batch["input_ids"].fill_(self.pad_id)
        chunk_mask = torch.zeros(b, c_max, dtype=torch.long)
        sentence_index = torch.full((b, c_max), -1, dtype=torch.long)
        start = 0
        for i, n in enumerate(n_chunks):
            for k in ("input_ids", "attention_mask", "labels"):
                batch[k][i, :n] = lm[k][start:start + n]
            chunk_mask[i, :n] = 1
            sentence_index[i, :n] = torch.as_tensor(features[i]["sentence_index"])
            start += n
        batch["chunk_mask"] = chunk_mask
        batch["sentence_index"] = sentence_index
        for key, column, wanted in (("context_bow", "context_ids", self.context != "none"),
                                    ("sentence_prefix_bow", "prefix_ids", self.sentence_prefix)):
            if not wanted:
                continue
            bow = self.bag_of_words([ids for f in features for ids in f[column]])
            dense = torch.zeros(b, c_max, self.topic_vocab_size)
            start = 0
            for i, n in enumerate(n_chunks):
                dense[i, :n] = bow[start:start + n]
                start += n
            batch[key] = dense
        batch.update(self._extra(features))
        return batch


def make_bow(texts: Sequence[str | Sequence[str]], topic_tokenizer) -> torch.Tensor:
    """Bag of words (b, V_c) over the topic vocabulary for raw or tokenized texts.

    ``<unk>`` (id 0) is never counted. Raw strings are tokenized like the corpora
    (:func:`topic_lm_hf.data.tokenize_text`).
    """
    from .data import tokenize_text

    if isinstance(texts, str):  # would be one bag per character
        raise ValueError("make_bow takes a list of texts (one bag of words each), got one string: wrap it, "
                         "make_bow([text], topic_tokenizer)")
    vocab = topic_tokenizer.get_vocab()
    bow = torch.zeros(len(texts), len(topic_tokenizer))
    for i, text in enumerate(texts):
        tokens = [w for s in tokenize_text(text) for w in s] if isinstance(text, str) else list(text)
        ids = [vocab[w.lower()] for w in tokens if w.lower() in vocab and w.lower() != UNK]
        if ids:
            bow[i].index_add_(0, torch.as_tensor(ids), torch.ones(len(ids)))
    return bow
