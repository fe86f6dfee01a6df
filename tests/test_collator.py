"""TopicContextCollator: chunks, labels and context bags of words against a naive recount."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from topic_lm_hf import TopicContextCollator, build_vocabularies, documents_from_lists, make_bow

WORDS = ["apple", "bank", "court", "delta", "echo", "the", "of", ",", "42"]


@pytest.fixture(scope="module")
def vocabs():
    docs = documents_from_lists([[WORDS]])
    return build_vocabularies(docs, min_freq=1, top_fraction=0, stopwords=["the", "of"])


def naive_context(doc, j, mode, topic_vocab, cap):
    """Straight from the definition: the topic tokens of the chosen sentences, in order, first `cap`."""
    if mode == "others":
        sentences = [s for i, s in enumerate(doc) if i != j]
    elif mode == "preceding":
        sentences = doc[:j]
    else:
        sentences = doc
    tokens = [w for s in sentences for w in s if w in topic_vocab and w != "<unk>"]
    if cap is not None:
        tokens = tokens[:cap]
    bow = torch.zeros(len(topic_vocab))
    for w in tokens:
        bow[topic_vocab[w]] += 1
    return bow


documents = st.lists(st.lists(st.sampled_from(WORDS + ["unseen"]), min_size=1, max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(doc=documents, mode=st.sampled_from(["others", "preceding", "document"]),
       cap=st.one_of(st.none(), st.integers(1, 10)), length=st.integers(1, 5))
def test_context_counts_equal_a_naive_recount(vocabs, doc, mode, cap, length):
    tok, topic_tok = vocabs
    collator = TopicContextCollator(tok, topic_tok, context=mode, max_context_tokens=cap, max_sentence_length=length)
    rows = collator.encode_document(doc)
    batch = collator([{k: rows[k][i] for k in rows} for i in range(len(rows["input_ids"]))])
    vocab = topic_tok.get_vocab()
    for i, j in enumerate(rows["sentence_index"]):
        assert torch.equal(batch["context_bow"][i], naive_context(doc, j, mode, vocab, cap))
    # every token after <bos> is predicted exactly once: labels (minus the first of each chunk) rebuild the document
    predicted = []
    for i in range(len(rows["input_ids"])):
        n = int(batch["attention_mask"][i].sum())
        predicted += batch["labels"][i, 1:n].tolist()
    expected = []
    for s in doc:
        expected += [tok.get_vocab().get(w, 1) for w in s] + [3]
    assert predicted == expected
    assert all(len(c) <= length + 1 for c in rows["input_ids"])


@settings(max_examples=40, deadline=None)
@given(doc=documents)
def test_preceding_context_never_sees_the_current_or_a_later_sentence(vocabs, doc):
    tok, topic_tok = vocabs
    collator = TopicContextCollator(tok, topic_tok, context="preceding", max_context_tokens=None)
    rows = collator.encode_document(doc)
    vocab = topic_tok.get_vocab()
    for ctx, j in zip(rows["context_ids"], rows["sentence_index"]):
        allowed = torch.zeros(len(vocab))
        for s in doc[:j]:
            for w in s:
                if w in vocab:
                    allowed[vocab[w]] += 1
        got = torch.bincount(torch.tensor(ctx, dtype=torch.long), minlength=len(vocab)).float()
        assert torch.all(got <= allowed)  # nothing outside sentences 0..j-1
        assert torch.equal(got, allowed)


def test_batch_layout_capping_and_padding(vocabs):
    tok, topic_tok = vocabs
    doc = [["apple"] * 5 + ["bank"], ["court", "the", "court"], ["delta"] * 4]
    collator = TopicContextCollator(tok, topic_tok, context="others", max_context_tokens=3)
    batch = collator([{"sentences": doc}])
    v = topic_tok.get_vocab()
    assert batch["context_bow"].sum(1).tolist() == [3, 3, 3]  # capped
    assert batch["context_bow"][0, v["court"]] == 2 and batch["context_bow"][0, v["delta"]] == 1
    assert batch["context_bow"][1, v["apple"]] == 3  # first three topic tokens of the other sentences
    assert batch["input_ids"][1].tolist()[:6] == [2, tok.get_vocab()["court"], tok.get_vocab()["the"],
                                                  tok.get_vocab()["court"], 3, 0]
    assert batch["labels"][1, 5].item() == -100 and batch["attention_mask"][1].sum().item() == 5
    assert batch["context_bow"].dtype == torch.float32


def test_documents_without_topic_words_get_a_zero_context_and_empty_ones_an_error(vocabs):
    tok, topic_tok = vocabs
    collator = TopicContextCollator(tok, topic_tok, context="others")
    batch = collator([{"sentences": [["the", "of", ","], ["the"]]}])
    assert batch["context_bow"].abs().sum() == 0 and batch["input_ids"].shape[0] == 2
    with pytest.raises(ValueError, match="Document 0 is empty"):
        collator([{"sentences": []}])
    with pytest.raises(ValueError, match="Document 0 is empty"):
        collator([{"sentences": [[]]}])
    with pytest.raises(ValueError, match="needs a topic_tokenizer"):
        TopicContextCollator(tok, None, context="others")
    with pytest.raises(ValueError, match="context must be"):
        TopicContextCollator(tok, topic_tok, context="future")


def test_prepare_is_a_dataset_and_documents_layout_matches_sentences(vocabs):
    tok, topic_tok = vocabs
    docs = documents_from_lists([[["apple", "bank"], ["court", "delta", "echo", "apple"]], [["echo", "the"]]],
                                label=[1, 0])
    flat = TopicContextCollator(tok, topic_tok, context="preceding", max_sentence_length=2, keep_columns=("label",))
    rows = flat.prepare(docs)
    assert set(rows.column_names) == {"input_ids", "context_ids", "doc_index", "sentence_index", "chunk_index", "label"}
    # doc 0: "<bos> apple bank <eos>" -> 2 chunks of <= 2 predictions, the 6-token sentence -> 3; doc 1 -> 2
    assert list(rows["doc_index"]) == [0] * 5 + [1] * 2 and list(rows["label"]) == [1] * 5 + [0] * 2
    nested = TopicContextCollator(tok, topic_tok, context="preceding", max_sentence_length=2, layout="documents")
    doc_rows = nested.prepare(docs)
    assert len(doc_rows) == 2
    batch = nested([doc_rows[0], doc_rows[1]])
    flat_batch = flat([rows[i] for i in range(7)])
    assert batch["input_ids"].shape[:2] == (2, 5)
    assert batch["chunk_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    width = flat_batch["input_ids"].shape[1]
    assert torch.equal(batch["input_ids"][0, :, :width], flat_batch["input_ids"][:5])
    assert torch.equal(batch["context_bow"][1, :2], flat_batch["context_bow"][5:])
    assert batch["sentence_index"][0].tolist() == [0, 0, 1, 1, 1]


def test_make_bow_counts_raw_text(vocabs):
    _, topic_tok = vocabs
    bow = make_bow(["The apple, the Bank and another apple.", ["court", "zzz"]], topic_tok)
    v = topic_tok.get_vocab()
    assert bow[0, v["apple"]] == 2 and bow[0, v["bank"]] == 1 and bow[0].sum() == 3
    assert bow[1].sum() == 1 and bow[:, 0].sum() == 0


def test_training_from_a_stream_that_is_never_fully_loaded(wiki, tmp_path):
    """TopicLMTrainer trains (max_steps) on rows made from a corpus read line by line as training goes."""
    import datasets
    from transformers import TrainingArguments

    import gzip

    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, TopicLMTrainer, load_documents
    from topic_lm_hf.data import EMBEDDED_CORPORA

    read = []

    def lines():
        with gzip.open(EMBEDDED_CORPORA["wikipedia-sample"], "rt", encoding="utf-8") as f:
            for line in f:
                read.append(1)
                yield {"text": line}

    documents = load_documents(datasets.IterableDataset.from_generator(lines), format="lau")
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    collator = TopicContextCollator(tok, topic_tok, context="others")
    rows = collator.prepare(documents)
    assert isinstance(rows, datasets.IterableDataset)
    torch.manual_seed(0)
    model = TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=4,
                                         embedding_size=16, hidden_size=16, encoder_hidden_size=16,
                                         topic_embedding_size=8))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, learning_rate=3e-3,
                             logging_steps=1, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no")
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    assert trainer.state.global_step == 4
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert all(h["bow_loss"] > 1 for h in trainer.state.log_history if "loss" in h)  # the contexts were used
    assert 0 < len(read) < 400  # of 900 documents: the corpus was read only as far as training needed


def test_a_plain_trainer_that_dropped_the_collators_columns_gets_told_what_to_do(tmp_path):
    """transformers.Trainer's default remove_unused_columns=True drops context_ids (forward() does not name it)."""
    from transformers import Trainer, TrainingArguments

    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, build_vocabularies, synthetic_documents

    docs = synthetic_documents(20)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, embedding_size=4,
                                                         hidden_size=4))
    collator = TopicContextCollator.for_model(model, tok, topic_tok)
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path), max_steps=1, report_to=[], use_cpu=True),
                      train_dataset=collator.prepare(docs), data_collator=collator)
    with pytest.raises(ValueError, match=r"lack context_ids .*remove_unused_columns=False\), or use TopicLMTrainer"):
        trainer.train()


def test_the_special_tokens_names_written_in_a_sentence_are_unknown_words_not_control_tokens(vocabs):
    """A corpus that holds the literal words "<pad>", "<bos>" or "<eos>" gets <unk> for them: a <pad> in the middle of
    a sentence used to become the padding id (its label then ignored), an <eos> an end of sentence."""
    tok, topic_tok = vocabs
    collator = TopicContextCollator(tok, topic_tok, context="others")
    ids = collator.encode_sentence(["apple", "<pad>", "<BOS>", "<eos>", "<unk>", "bank"])
    assert ids == [tok.convert_tokens_to_ids("apple"), *[collator.unk_id] * 4, tok.convert_tokens_to_ids("bank")]
    row = collator.prepare(documents_from_lists([[["apple", "<pad>", "bank"], ["court", "<eos>"]]]))[0]
    assert row["input_ids"][1:4] == [tok.convert_tokens_to_ids("apple"), collator.unk_id,
                                     tok.convert_tokens_to_ids("bank")]
    assert row["input_ids"].count(collator.eos_id) == 1 and row["input_ids"].count(collator.pad_id) == 0


def test_prepare_refuses_a_plain_list_and_tokens_that_are_not_strings(vocabs):
    """A plain list of documents was an AttributeError ('list' object has no attribute 'column_names'), and ids given
    as tokens an AttributeError on int.lower; each is now one ValueError that says what to give."""
    tok, topic_tok = vocabs
    collator = TopicContextCollator(tok, topic_tok, context="others")
    with pytest.raises(ValueError, match="got list: make one with documents_from_lists"):
        collator.prepare([[["apple", "bank"]]])
    with pytest.raises(ValueError, match=r"row 0, sentence 0 holds 7 \(int\), where tokens are strings"):
        collator.prepare(documents_from_lists([[[7, 8]]]))
