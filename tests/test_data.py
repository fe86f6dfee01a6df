"""Loading documents in both formats and building the two vocabularies."""

import gzip
import json

import datasets
import pytest

from conftest import DATA, MALLET, requires_data
from topic_lm_hf import build_vocabularies, check_vocabularies, documents_from_lists, load_documents
from topic_lm_hf.data import (EMBEDDED_CORPORA, SPECIAL_TOKENS, load_vocabularies, read_stopwords, save_vocabularies,
                              tokenize_text)

VALIDATION = EMBEDDED_CORPORA["wikipedia-sample/validation"]  # a Lau-format .txt.gz that ships with the package


def raw_lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.mark.parametrize("source", ["wikipedia-sample/validation", VALIDATION], ids=["name", "path"])
def test_lau_format_matches_the_raw_file(source):
    docs = load_documents(source)
    lines = raw_lines(VALIDATION)
    assert isinstance(docs, datasets.Dataset) and len(docs) == len([l for l in lines if l.strip()]) == 100
    first = lines[0].split("\t")
    assert docs[0]["sentences"][0] == first[0].split()
    assert len(docs[0]["sentences"]) == len([s for s in first if s.strip()])


@pytest.mark.parametrize("streaming", [False, True])
def test_a_byte_order_mark_is_not_part_of_the_first_word(tmp_path, streaming):
    """A Lau-format file saved by a Windows editor starts with a UTF-8 byte-order mark."""
    lines = raw_lines(VALIDATION)[:20]
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8") + b"\n")
    docs = list(load_documents(tmp_path / "bom.txt", streaming=streaming))
    assert docs[0]["sentences"][0] == lines[0].split("\t")[0].split()
    tok, _ = build_vocabularies([doc["sentences"] for doc in docs], min_freq=1)  # rows: their sentences
    assert not any(w.startswith("\ufeff") for w in tok.get_vocab())


@requires_data("imdb", "train.jsonl.gz")
def test_raw_text_jsonl_is_split_tokenized_lowercased_and_keeps_labels():
    docs = load_documents(DATA / "imdb" / "train.jsonl.gz", text_column="text", max_documents=50)
    assert len(docs) == 50 and "label" in docs.column_names
    with gzip.open(DATA / "imdb" / "train.jsonl.gz", "rt") as f:
        raw = [json.loads(next(f)) for _ in range(50)]
    assert any("<br" in r["text"] for r in raw)
    for doc, r in zip(docs, raw):
        tokens = [w for s in doc["sentences"] for w in s]
        assert tokens and all(w == w.lower() for w in tokens)
        assert "<br" not in " ".join(tokens) and "br" not in tokens  # HTML breaks removed
        assert doc["label"] == r["label"]
    assert max(len(d["sentences"]) for d in docs) > 1  # really sentence-split


def test_tokenize_text_sentences_and_abbreviations():
    sents = tokenize_text("Mr. Smith went to Washington.<br /><br />He said it's $7.5 million!")
    assert sents == [["mr.", "smith", "went", "to", "washington", "."],
                     ["he", "said", "it", "'s", "$", "7.5", "million", "!"]]
    # the Lau et al. conventions: n't split off, hyphenated words and initialisms whole
    assert tokenize_text("The 40-year-old U.S. senator didn't go.") == [
        ["the", "40-year-old", "u.s.", "senator", "did", "n't", "go", "."]]


def test_parquet_and_dataset_inputs(tmp_path):
    ds = datasets.Dataset.from_dict({"text": ["One sentence. Two sentences here.", "Another doc!"], "label": [0, 1]})
    ds.to_parquet(tmp_path / "c.parquet")
    for source in (tmp_path / "c.parquet", ds):
        docs = load_documents(source, text_column="text")
        assert docs[0]["sentences"] == [["one", "sentence", "."], ["two", "sentences", "here", "."]]
        assert docs["label"] == [0, 1]


def test_empty_documents_are_skipped_or_rejected(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a b c .\tmore words .\n\nonly one .\n", encoding="utf-8")
    assert len(load_documents(path)) == 2
    with pytest.raises(ValueError, match="empty document"):
        load_documents(path, on_empty="error")
    with pytest.raises(ValueError, match="text_column"):
        load_documents(datasets.Dataset.from_dict({"body": ["x"]}))
    with pytest.raises(FileNotFoundError):
        load_documents(tmp_path / "missing.txt")


def test_vocabulary_statistics_on_the_wikipedia_sample():
    docs = load_documents("wikipedia-sample")
    tok, topic_tok = build_vocabularies(docs, min_freq=10)  # MALLET's stop list by default
    vocab, topic_vocab = tok.get_vocab(), topic_tok.get_vocab()
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    counts = {}
    for doc in docs["sentences"]:
        for s in doc:
            for w in s:
                counts[w] = counts.get(w, 0) + 1
    expected_lm = {w for w, c in counts.items() if c >= 10}
    assert set(vocab) - set(SPECIAL_TOKENS) == expected_lm
    stop = read_stopwords(MALLET)
    topic_words = set(topic_vocab) - {"<unk>"}
    assert topic_vocab["<unk>"] == 0
    assert not topic_words & stop, "a stop word is in the topic vocabulary"
    assert all(w.isalpha() for w in topic_words), "a non-alphabetic token is in the topic vocabulary"
    top = sorted(expected_lm, key=lambda w: (-counts[w], w))[: -(-len(expected_lm) // 1000)]
    assert not topic_words & set(top)
    expected_topic = {w for w in expected_lm if w.isalpha() and w not in stop and w not in top}
    assert topic_words == expected_topic
    # 1,800 documents of the full corpus's 34k-word vocabulary: a few thousand words survive min_freq=10.
    assert 3000 < len(tok) < 8000 and 0.6 < len(topic_words) / len(tok) < 0.95


def test_default_stop_list_and_min_doc_freq():
    docs = documents_from_lists([[["the", "cat", "sat", "on", "mat"]], [["the", "cat", "ran", "42"]]])
    tok, topic_tok = build_vocabularies(docs, min_freq=1, top_fraction=0)
    assert "the" in tok.get_vocab() and "the" not in topic_tok.get_vocab()  # MALLET's English list, the default
    mallet = read_stopwords()
    # 524 lines, "would" twice
    assert len(mallet) == 523 and {"the", "would", "whereupon"} <= mallet and "cat" not in mallet
    assert read_stopwords("mallet") == read_stopwords(MALLET) == mallet  # by name or by the package's file
    assert read_stopwords("none") == read_stopwords(None) == frozenset()
    assert "42" in tok.get_vocab() and "42" not in topic_tok.get_vocab()
    _, topic_tok2 = build_vocabularies(docs, min_freq=1, top_fraction=0, min_doc_freq=2, stopwords=None)
    assert set(topic_tok2.get_vocab()) == {"<unk>", "cat", "the"}


def test_vocabularies_round_trip_and_mismatch_errors(tmp_path):
    docs = documents_from_lists([[["alpha", "beta", "gamma", "."]]])
    tok, topic_tok = build_vocabularies(docs, min_freq=1, top_fraction=0, stopwords=None)
    save_vocabularies(tok, topic_tok, tmp_path)
    tok2, topic_tok2 = load_vocabularies(tmp_path)
    assert tok2.get_vocab() == tok.get_vocab() and topic_tok2.get_vocab() == topic_tok.get_vocab()
    assert tok2("alpha beta zeta")["input_ids"] == [2, tok.get_vocab()["alpha"], tok.get_vocab()["beta"], 1]
    other_tok, other_topic = build_vocabularies(documents_from_lists([[["delta", "epsilon"]]]), min_freq=1,
                                                top_fraction=0, stopwords=None)
    with pytest.raises(ValueError, match="different corpora"):
        check_vocabularies(tok, other_topic)
    with pytest.raises(ValueError, match="Cannot build vocabularies"):
        build_vocabularies(documents_from_lists([]))
    with pytest.raises(ValueError, match="min_freq"):
        build_vocabularies(docs, min_freq=100)


def _train_briefly(model, tok, topic_tok, docs, folder, context):
    """Two TopicLMTrainer steps (README quick start), then the model and both vocabularies saved."""
    from transformers import TrainingArguments

    from topic_lm_hf import TopicContextCollator, TopicLMTrainer

    collator = TopicContextCollator(tok, topic_tok, context=context)
    args = TrainingArguments(str(folder), max_steps=2, per_device_train_batch_size=8, report_to=[], use_cpu=True,
                             disable_tqdm=True, save_strategy="no")
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(docs), data_collator=collator)
    trainer.train()
    trainer.save_model(folder)
    save_vocabularies(tok, topic_tok, folder)


@requires_data("brown", "train.txt")
def test_a_same_size_tokenizer_of_another_corpus_is_refused(wiki, tmp_path):
    """A Brown tokenizer as large as the model's own used to be accepted, and gave a perplexity."""
    from transformers import AutoModelForCausalLM

    from conftest import tiny_model
    from topic_lm_hf import evaluate_perplexity

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    other, _ = build_vocabularies(load_documents(DATA / "brown" / "train.txt"), min_freq=1, stopwords=MALLET,
                                  max_vocab_size=len(tok) - len(SPECIAL_TOKENS))
    assert len(other) == len(tok)
    _train_briefly(tiny_model("lstm_lm", tok, topic_tok), tok, topic_tok, wiki["train"].select(range(20)),
                   tmp_path, context="none")
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    valid = wiki["valid"].select(range(3))
    assert evaluate_perplexity(model, valid, "causal")["perplexity"] > 1  # with the tokenizers saved beside it
    with pytest.raises(ValueError, match="LM tokenizer is not the one the model was trained with"):
        evaluate_perplexity(model, valid, "causal", tokenizer=other)
    # A config saved before the hashes existed keeps working, with the size check only.
    old = AutoModelForCausalLM.from_pretrained(tmp_path)
    del old.config.vocab_hash
    assert evaluate_perplexity(old, valid, "causal", tokenizer=tok)["perplexity"] > 1
    with pytest.raises(ValueError, match="vocab_size"):
        check_vocabularies(build_vocabularies(wiki["valid"], min_freq=1)[0], config=old.config)


def test_a_topic_tokenizer_with_the_same_words_in_another_order_is_refused(wiki, tmp_path):
    """Same size, same words, other ids: every bag of words would be scrambled."""
    from transformers import AutoModelForCausalLM

    from conftest import tiny_model
    from topic_lm_hf import evaluate_perplexity
    from topic_lm_hf.data import UNK, _word_level_tokenizer

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    words = [w for w, _ in sorted(topic_tok.get_vocab().items(), key=lambda item: item[1]) if w != UNK]
    reordered = _word_level_tokenizer([UNK] + words[::-1], add_bos=False)
    _train_briefly(tiny_model("tcnlm", tok, topic_tok), tok, topic_tok, wiki["train"].select(range(20)), tmp_path,
                   context="others")
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.config.topic_vocab_hash != model.config.vocab_hash
    valid = wiki["valid"].select(range(3))
    with pytest.raises(ValueError, match="topic tokenizer is not the one the model was trained with"):
        evaluate_perplexity(model, valid, "paper", topic_tokenizer=reordered)
def test_streaming_gives_the_same_documents_and_vocabularies(caplog):
    import itertools

    path = VALIDATION
    docs = load_documents(path)
    stream = load_documents(path, streaming=True)
    assert isinstance(stream, datasets.IterableDataset) and stream.column_names == ["sentences"]
    assert list(itertools.islice(stream, 5)) == [docs[i] for i in range(5)]
    assert len(list(load_documents(path, streaming=True, max_documents=7))) == 7
    tok, topic_tok = build_vocabularies(load_documents(path, streaming=True), min_freq=3, stopwords=MALLET)
    tok2, topic_tok2 = build_vocabularies(docs, min_freq=3, stopwords=MALLET)
    assert tok.get_vocab() == tok2.get_vocab() and topic_tok.get_vocab() == topic_tok2.get_vocab()
    # Empty documents of a stream are skipped (logged) or raise when they are reached.
    raw = datasets.IterableDataset.from_generator(
        lambda: iter([{"body": "One. Two!", "label": 1}, {"body": "  ", "label": 0}, {"body": "Three?", "label": 1}]))
    with caplog.at_level("WARNING"):
        rows = list(load_documents(raw, text_column="body"))
    assert [r["sentences"] for r in rows] == [[["one", "."], ["two", "!"]], [["three", "?"]]]
    assert [r["label"] for r in rows] == [1, 1] and "row index 1" in caplog.text
    with pytest.raises(ValueError, match="row index 1"):
        list(load_documents(raw, text_column="body", on_empty="error"))


@pytest.mark.parametrize("streaming", [False, True])
def test_unreadable_files_are_errors_naming_the_file_and_the_byte(tmp_path, streaming):
    import re

    def load(name, **kw):
        return list(load_documents(tmp_path / name, streaming=streaming, **kw))  # a stream raises when read

    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_bytes(b"\n  \n")
    with gzip.open(tmp_path / "empty.jsonl.gz", "wb") as f:
        f.write(b"")
    for name, kw in (("empty.txt", {}), ("blank.txt", {}), ("empty.jsonl.gz", {"text_column": "text"})):
        with pytest.raises(ValueError, match=re.escape(str(tmp_path / name)) + " is empty"):
            load(name, **kw)
    (tmp_path / "latin1.txt").write_bytes("first line .\nthe caf\u00e9 .\n".encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "latin1.txt")) +
                       r" is not UTF-8 text: byte 0xe9 at byte position 20 \(line 2\)"):
        load("latin1.txt")
    with gzip.open(tmp_path / "latin1.jsonl.gz", "wb") as f:
        f.write(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"latin1.jsonl.gz is not UTF-8 text: byte 0xe9 at byte position 28 of the "
                                         r"decompressed text \(line 2\)"):
        load("latin1.jsonl.gz", text_column="text")


def test_a_text_column_without_text_is_named():
    ds = datasets.Dataset.from_dict({"text": ["One review."], "label": [1]})
    with pytest.raises(ValueError, match=r"Column 'label' of the given dataset must hold text, but it holds "
                                         r"Value\('int64'\)"):
        load_documents(ds, text_column="label")
    # A stream of unknown column types is checked row by row as it is read.
    stream = datasets.IterableDataset.from_generator(lambda: iter([{"body": "Fine."}, {"body": 42}]))
    with pytest.raises(ValueError, match=r"Column 'body' of the given dataset must hold text, but row 1 holds "
                                         r"the int 42"):
        list(load_documents(stream, text_column="body"))


def test_a_folder_for_a_corpus_says_to_give_a_file_in_it(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder: give one corpus file in it"):
        load_documents(tmp_path)


# ----------------------------------------------------------------------------------------------
# the corpora that ship with the package, and the full ones of $TOPIC_LM_DATA
# ----------------------------------------------------------------------------------------------


def _attribution_ids() -> dict[str, list[str]]:
    """The Wikipedia ids ATTRIBUTION.md lists for each file of wikipedia-sample."""
    import re

    text = (VALIDATION.parent / "ATTRIBUTION.md").read_text(encoding="utf-8")
    sections = re.split(r"^## (\S+)\.txt\.gz:.*$", text, flags=re.M)[1:]
    return {name: re.findall(r"\(id (\d+)\)$", body, re.M) for name, body in zip(sections[::2], sections[1::2])}


def test_the_npmi_reference_holds_none_of_the_sample_and_every_article_is_attributed():
    ids = _attribution_ids()
    assert {name: len(v) for name, v in ids.items()} == {"train": 900, "validation": 100, "npmi_reference": 600}
    for name, listed in ids.items():  # one line per article listed, in the files the package reads
        assert len(raw_lines(VALIDATION.parent / f"{name}.txt.gz")) == len(listed) == len(set(listed))
    assert not set(ids["npmi_reference"]) & (set(ids["train"]) | set(ids["validation"]))
    assert not set(ids["train"]) & set(ids["validation"])
    reference = set(raw_lines(EMBEDDED_CORPORA["wikipedia-sample/npmi-reference"]))
    assert not reference & set(raw_lines(EMBEDDED_CORPORA["wikipedia-sample"]) + raw_lines(VALIDATION))


@requires_data("wiki", "articles.jsonl.gz")
def test_the_sample_script_rebuilds_the_shipped_files_byte_for_byte(tmp_path):
    """scripts/make_wikipedia_sample.py is what made wikipedia-sample: the same dump gives the same bytes."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "scripts" / "make_wikipedia_sample.py"), "--articles",
                           str(DATA / "wiki" / "articles.jsonl.gz"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for shipped in VALIDATION.parent.iterdir():
        assert (tmp_path / shipped.name).read_bytes() == shipped.read_bytes(), shipped.name


def test_the_full_corpora_are_found_through_topic_lm_data(tmp_path, monkeypatch):
    from topic_lm_hf.data import data_dir

    monkeypatch.delenv("TOPIC_LM_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="set TOPIC_LM_DATA to the folder where you put the corpora") as error:
        data_dir("apnews", "train.txt")
    assert "\n" not in str(error.value)
    assert data_dir("apnews", required=False) is None
    monkeypatch.setenv("TOPIC_LM_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/apnews does not exist: TOPIC_LM_DATA="):
        data_dir("apnews")
    assert data_dir("apnews", required=False) is None
    (tmp_path / "apnews").mkdir()
    assert data_dir("apnews") == data_dir("apnews", required=False) == tmp_path / "apnews"
