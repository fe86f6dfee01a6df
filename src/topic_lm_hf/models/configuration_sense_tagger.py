"""Configuration of the BiLSTM sense tagger for word sense disambiguation (NCLM paper §4.5)."""

from transformers import PretrainedConfig

from .configuration_common import CompactReprMixin, check_integers

OUTPUT_MODES = ("all_senses", "candidates")
TRAINING_OBJECTIVES = ("all_senses", "candidates")
INPUT_FEATURES = ("lemma", "form")


class SenseTaggerConfig(CompactReprMixin, PretrainedConfig):
    r"""Configuration of :class:`SenseTaggerForTokenClassification`.

    The defaults follow the NCLM paper's WSD setup (Chaudhary et al., ICML 2020, §4.5): one BiLSTM layer of
    100 units per direction over the whole sentence (the word itself included), the document topic
    representation c composed at its output as in NCLM's eq. 6, ô = sigmoid([o; c] W_p + b_p), and a
    softmax over every sense key seen in training.

    Args:
        word_vocabulary: the input words by id; id 0 is ``<pad>`` and id 1 ``<unk>``. Built from the
            training corpus (:func:`topic_lm_hf.tasks.wsd_tagger.build_word_vocabulary`).
        input_feature: what a token is looked up by: ``"lemma"`` (default: the corpus lemma,
            lower-cased; fewer types than forms, which matters without pretrained embeddings) or
            ``"form"`` (the surface form, lower-cased).
        id2label / label2id: the sense keys (classes), every distinct gold key of the training corpus,
            sorted. ``num_labels`` follows from them.
        embedding_size: E, the word embeddings.
        hidden_size: H, the LSTM units per direction (100); o is 2H wide.
        dropout: on the embeddings and on the BiLSTM output (0 turns it off).
        topic_representation_size: |c|, the width of the document topic representation (0: the
            same tagger without topics, the paper's BiLSTM baseline).
        topic_model_name_or_path: the frozen topic model that makes c (any topic family of the
            package, through ``document_topic_representation``); ``None`` without topics.
        topic_model_type: its ``model_type`` (and variant), for the record.
        topic_model_sha256: the fingerprint of its weights (sha256 of its weight files), so that the tagger
            refuses another topic model found under the same path.
        max_context_tokens: topic tokens of the document's bag of words (``None``: the whole
            document, as in the paper: NTM on the full document, the sentence not removed).
        output_mode: how senses are predicted by :func:`~topic_lm_hf.tasks.wsd_tagger.disambiguate`:
            ``"candidates"`` (argmax among the candidates of the instance's (lemma, POS) that are
            training senses; WordNet first sense when there is none: lemma unseen in training) or
            ``"all_senses"`` (the paper, literally: argmax over every training sense, no back-off).
        training_objective: the training loss: ``"all_senses"`` (the paper: cross-entropy of a softmax over
            every training sense) or ``"candidates"`` (cross-entropy of a softmax over the instance's own
            candidates, the training senses of its (lemma, POS) in the sense inventory: the output layer
            is evaluated for those rows only, and nothing pushes down the senses of other lemmas, which
            candidate restriction never predicts). Same network and parameters either way.
        sense_inventory: the ``senses.tsv[.gz]`` used for candidates and the first-sense back-off.
        training_corpus: the training set (SemCor) the label vocabulary and the inventory's
            counts come from.
        initializer_range: scale r of the uniform initialisation U(-r, r).

    Example:
        >>> from topic_lm_hf.models import SenseTaggerConfig, SenseTaggerForTokenClassification
        >>> config = SenseTaggerConfig(word_vocabulary=["<pad>", "<unk>", "bank", "river"],
        ...                            id2label={0: "bank%1:14:00::", 1: "bank%1:17:01::"}, embedding_size=8,
        ...                            hidden_size=8, topic_representation_size=5)
        >>> model = SenseTaggerForTokenClassification(config)
    """

    model_type = "sense_tagger"
    keys_to_ignore_at_inference = ["hidden_states"]

    def __init__(self, word_vocabulary=None, input_feature="lemma", embedding_size=100, hidden_size=100, dropout=0.2,
                 topic_representation_size=0, topic_model_name_or_path=None, topic_model_type=None,
                 topic_model_sha256=None,
                 max_context_tokens=None, output_mode="candidates", training_objective="all_senses",
                 sense_inventory=None, training_corpus=None,
                 initializer_range=0.1, pad_token_id=0, unk_token_id=1, **kwargs):
        if word_vocabulary is None:
            word_vocabulary = ["<pad>", "<unk>"]
        word_vocabulary = [str(w) for w in word_vocabulary]
        if len(word_vocabulary) < 2 or word_vocabulary[:2] != ["<pad>", "<unk>"]:
            raise ValueError(f"word_vocabulary must start with '<pad>', '<unk>' (ids 0 and 1), got "
                             f"{word_vocabulary[:2]}")
        if len(set(word_vocabulary)) != len(word_vocabulary):
            raise ValueError("word_vocabulary has repeated words: ids would be ambiguous")
        check_integers(1, embedding_size=embedding_size, hidden_size=hidden_size)
        check_integers(0, topic_representation_size=topic_representation_size)
        if max_context_tokens is not None:
            check_integers(1, max_context_tokens=max_context_tokens)
        if input_feature not in INPUT_FEATURES:
            raise ValueError(f"input_feature must be one of {INPUT_FEATURES}, got {input_feature!r}")
        if output_mode not in OUTPUT_MODES:
            raise ValueError(f"output_mode must be one of {OUTPUT_MODES}, got {output_mode!r}")
        if training_objective not in TRAINING_OBJECTIVES:
            raise ValueError(f"training_objective must be one of {TRAINING_OBJECTIVES}, got {training_objective!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if not initializer_range > 0:
            raise ValueError(f"initializer_range must be positive, got {initializer_range!r}")
        if topic_representation_size > 0 and not topic_model_name_or_path:
            raise ValueError(f"topic_representation_size={topic_representation_size} needs topic_model_name_or_path "
                             "(the frozen topic model that makes c); use 0 for the tagger without topics")
        self.word_vocabulary = word_vocabulary
        self.vocab_size = len(word_vocabulary)
        self.input_feature = input_feature
        self.embedding_size = embedding_size
        self.hidden_size = hidden_size
        self.dropout = dropout
        self.topic_representation_size = topic_representation_size
        self.topic_model_name_or_path = None if topic_model_name_or_path is None else str(topic_model_name_or_path)
        self.topic_model_type = topic_model_type
        self.topic_model_sha256 = topic_model_sha256
        self.max_context_tokens = max_context_tokens
        self.output_mode = output_mode
        self.training_objective = training_objective
        self.sense_inventory = None if sense_inventory is None else str(sense_inventory)
        self.training_corpus = None if training_corpus is None else str(training_corpus)
        self.initializer_range = initializer_range
        super().__init__(pad_token_id=pad_token_id, unk_token_id=unk_token_id, **kwargs)

    @property
    def uses_topics(self) -> bool:
        return self.topic_representation_size > 0


__all__ = ["INPUT_FEATURES", "OUTPUT_MODES", "SenseTaggerConfig", "TRAINING_OBJECTIVES"]
