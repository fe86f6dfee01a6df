"""Text in and text out like any transformers model: the tokenizers split raw text the way the
corpora are tokenized, decode readably, and work with the text-generation pipeline and stop strings."""

import gzip
import json
import re

import datasets
import pytest
import torch
from transformers import AutoTokenizer, pipeline

from conftest import DATA, requires_data
from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, load_documents, make_bow
from topic_lm_hf.data import UNK, load_vocabularies, save_vocabularies, tokenize_text, word_tokens


def raw_reviews(n):
    with gzip.open(DATA / "imdb" / "train.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(next(f))["text"] for _ in range(n)]


def small_lm(tok):
    torch.manual_seed(0)
    config = LSTMLMConfig(vocab_size=len(tok), embedding_size=16, hidden_size=16, initializer_range=0.5)
    return LSTMLMForCausalLM(config).eval()


def test_raw_text_is_lower_cased_and_split_like_the_corpora(wiki):
    tok = wiki["tok"]
    ids = tok("The Senate, on Sunday,")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "the", "senate", ",", "on", "sunday", ","]
    text = 'Gov. Bush (R-Texas) said the U.S. wasn\'t "ready," and it\'s $7.5 million... for 40-year-old workers.'
    assert word_tokens(text) == ["gov.", "bush", "(", "r-texas", ")", "said", "the", "u.s.", "was", "n't", '"',
                                 "ready", ",", '"', "and", "it", "'s", "$", "7.5", "million", "...", "for",
                                 "40-year-old", "workers", "."]
    assert tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"]) == \
        [w if w in tok.get_vocab() else UNK for w in word_tokens(text)]
    assert tokenize_text("I felt ill. Springfield, Ill., is big.<br />Say no. No. 1 won.") == [
        ["i", "felt", "ill", "."], ["springfield", ",", "ill.", ",", "is", "big", "."], ["say", "no", "."],
        ["no.", "1", "won", "."]]


def corpus_sentences(name: str) -> list[str]:
    """The sentences of an embedded corpus's Lau-format file, as text."""
    from topic_lm_hf.data import EMBEDDED_CORPORA

    with gzip.open(EMBEDDED_CORPORA[name], "rt", encoding="utf-8") as f:
        return [s for line in f.read().splitlines() for s in line.split("\t") if s.strip()]


def test_already_tokenized_corpus_text_splits_exactly_at_its_spaces(wiki):
    """Every line of wikipedia-sample (train and validation; tokenized by tokenize_text) tokenizes as before: one
    token between spaces."""
    tok = wiki["tok"]
    vocab = tok.get_vocab()
    for name in ("wikipedia-sample", "wikipedia-sample/validation"):
        sentences = corpus_sentences(name)
        ids = tok(sentences, add_special_tokens=False)["input_ids"]
        for sentence, got in zip(sentences, ids):
            assert got == [vocab.get(w, vocab[UNK]) for w in sentence.split()], sentence


@requires_data("imdb", "train.jsonl.gz")
def test_raw_text_tokenizes_like_load_documents_and_make_bow():
    """On real raw reviews (HTML breaks, quotes, clitics), the LM tokenizer sees exactly the words of
    load_documents, and the topic tokenizer exactly the words make_bow counts."""
    reviews = raw_reviews(150)
    docs = load_documents(datasets.Dataset.from_dict({"text": reviews}), text_column="text",
                          on_empty="keep")
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    vocab = tok.get_vocab()
    encoded = tok(reviews)["input_ids"]
    for review, doc, ids in zip(reviews, docs["sentences"], encoded):
        assert ids[1:] == [vocab[w] for s in doc for w in s]
        assert vocab[UNK] not in ids
    bow = make_bow(reviews, topic_tok)
    for row, ids in zip(bow, topic_tok(reviews)["input_ids"]):
        counts = torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=len(topic_tok)).float()
        counts[0] = 0  # <unk> is never counted
        assert torch.equal(row, counts)
    assert bow.sum() > 1000


def test_tokenizer_rules_survive_save_and_load(tmp_path, wiki):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    save_vocabularies(tok, topic_tok, tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    loaded_topic = AutoTokenizer.from_pretrained(tmp_path, subfolder="topic_tokenizer")
    text = "The Senate, on Sunday, said it's the U.S. government."
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded_topic(text)["input_ids"] == topic_tok(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == \
        " the senate, on sunday, said it's the u.s. government."
    tok2, _ = load_vocabularies(tmp_path)
    assert tok2.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_decoding_is_readable_and_encodes_back(wiki):
    tok = wiki["tok"]
    ids = tok("the senate , on sunday , said it 's ( not ) over .", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == " the senate, on sunday, said it's ( not) over."
    # Every token decodes on its own as it does in context (what stop strings rely on).
    assert "".join(tok.convert_tokens_to_string([t]) for t in tok.convert_ids_to_tokens(ids)) == tok.decode(ids)
    # Text the model can write: the sentences whose words are all in its vocabulary (an <unk> decodes to "<unk>",
    # which no text encodes back to the word it replaced). Left out too: a closing quote before "." or ")", which
    # decodes to '".' and encodes back as one unknown word (a known limit of the decoder; 2.5 % of these sentences).
    sentences = [s for s in corpus_sentences("wikipedia-sample") + corpus_sentences("wikipedia-sample/validation")
                 if not re.search(r"[\"'] [.)]", s)]
    encoded = [ids for ids in tok(sentences, add_special_tokens=False)["input_ids"] if tok.unk_token_id not in ids]
    again = tok(tok.batch_decode(encoded, skip_special_tokens=False), add_special_tokens=False)["input_ids"]
    same = sum(a == b for a, b in zip(encoded, again))
    assert len(encoded) > 1000 and same / len(encoded) > 0.98, (len(encoded), same / len(encoded))


def test_text_generation_pipeline_returns_prompt_and_continuation(wiki):
    tok = wiki["tok"]
    model = small_lm(tok)
    prompt = "The Senate, on Sunday,"
    out = pipeline("text-generation", model=model, tokenizer=tok)(prompt, max_new_tokens=6, do_sample=False)
    text = out[0]["generated_text"]
    direct = model.generate(**tok([prompt], return_tensors="pt"), max_new_tokens=6, do_sample=False)
    continuation = tok.decode(direct[0, len(tok(prompt)["input_ids"]):], skip_special_tokens=True)
    assert text == prompt + continuation
    new_words = [w for w in tok.convert_ids_to_tokens(direct[0, -6:]) if w not in tok.all_special_tokens]
    assert word_tokens(text[len(prompt):]) == new_words  # the words are separated, not run together
    assert continuation.startswith(" ") or continuation[:1] in ",.;:!?)%'n"


def test_generate_stops_at_stop_strings(wiki):
    tok = wiki["tok"]
    model = small_lm(tok)
    prompt = tok(["police said"], return_tensors="pt")
    free = model.generate(**prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    new = free[0, prompt["input_ids"].shape[1]:]
    words = tok.convert_ids_to_tokens(new)
    # Stop at the third new word; a stop string spanning two words (with their space) works too.
    for stop in (words[2], f"{words[1]} {words[2]}"):
        stopped = model.generate(**prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, stop_strings=[stop],
                                 tokenizer=tok)
        first = next(i for i in range(len(words)) if stop in tok.decode(new[:i + 1]))
        assert torch.equal(stopped[0], free[0, :prompt["input_ids"].shape[1] + first + 1]), (stop, words)
    with pytest.raises(ValueError, match="tokenizer"):
        model.generate(**prompt, max_new_tokens=3, stop_strings=["."])


def test_text_features_work_from_the_hub_without_the_package(wiki, tmp_path):
    """A folder shared with remote code: its tokenizer splits raw text and decodes readably, and the
    model generates with stop strings, in a process where topic_lm_hf cannot be imported."""
    from conftest import run_without_package
    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM
    from topic_lm_hf.hub import save_for_hub

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    torch.manual_seed(0)
    model = TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=3,
                                         embedding_size=8, hidden_size=8, encoder_hidden_size=8,
                                         topic_embedding_size=8, num_hidden_layers=2)).eval()
    save_for_hub(model, tmp_path / "repo", tok, topic_tok)
    prompt = "The Senate, on Sunday,"
    ids = tok([prompt], return_tensors="pt")
    free = model.generate(**ids, topic_ids=[1], max_new_tokens=6, min_new_tokens=6, do_sample=False)
    stop = tok.decode(free[0, -4:-2])
    expected = free[0, :-2].tolist()
    result = run_without_package(f"""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
        repo = {str(tmp_path / 'repo')!r}
        model = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True).eval()
        tok = AutoTokenizer.from_pretrained(repo, trust_remote_code=True)
        ids = tok([{prompt!r}], return_tensors="pt")
        stopped = model.generate(**ids, topic_ids=[1], max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                 stop_strings=[{stop!r}], tokenizer=tok)
        hidden = model(**ids, topic_ids=[1], output_hidden_states=True).hidden_states
        text = pipeline("text-generation", model=model, tokenizer=tok, trust_remote_code=True)({prompt!r},
                                                                                             max_new_tokens=3, do_sample=False)
        print(json.dumps({{"tokens": tok.convert_ids_to_tokens(ids["input_ids"][0]), "stopped": stopped[0].tolist(),
                          "layers": len(hidden), "text": text[0]["generated_text"]}}))
    """, tmp_path)
    assert result["tokens"] == ["<bos>", "the", "senate", ",", "on", "sunday", ","]
    assert result["stopped"] == expected and result["layers"] == 3
    assert result["text"].startswith(prompt + " ")
