"""Perplexity: an exact hand-computed value, and causal-carry against a naive streaming loop."""

import math

import pytest
import torch

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, documents_from_lists,
                         evaluate_perplexity, synthetic_documents)


def constant_model(tok, probs):
    """An LSTM LM whose next-token distribution ignores its input: softmax(bias) = probs."""
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4, dropout=0.0))
    with torch.no_grad():
        model.lm_head.weight.zero_()
        bias = torch.full((len(tok),), -1e4)
        for word, p in probs.items():
            bias[tok.convert_tokens_to_ids(word)] = math.log(p)
        model.lm_head.bias.copy_(bias)
    return model


def test_hand_computed_perplexity_counts_eos_and_unk_never_bos():
    docs = [[["a", "b", "c"]]]
    tok, topic_tok = build_vocabularies(documents_from_lists(docs), min_freq=1, stopwords=None, top_fraction=0)
    assert len(tok) == 7  # <pad> <unk> <bos> <eos> a b c
    probs = {"<unk>": 0.1, "<eos>": 0.2, "a": 0.4, "b": 0.2, "c": 0.1}
    model = constant_model(tok, probs)
    # targets: a b <unk> <eos> | c <eos>   (the input <bos> is never a target)
    expected = (0.4 * 0.2 * 0.1 * 0.2 * 0.1 * 0.2) ** (-1 / 6)
    test_docs = [[["a", "b", "zzz"], ["c"]]]
    for protocol in ("paper", "causal", "causal-carry"):
        for length in (30, 1):
            result = evaluate_perplexity(model, test_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                         max_sentence_length=length)
            assert result["tokens"] == 6 and result["protocol"] == protocol
            assert result["perplexity"] == pytest.approx(expected, rel=1e-9)
            assert result["nll"] == pytest.approx(-math.log(0.4 * 0.2 * 0.1 * 0.2 * 0.1 * 0.2), rel=1e-9)


def naive_carry_perplexity(model, tok, docs):
    """Each document as one stream: state carried from sentence to sentence, one token at a time."""
    vocab = tok.get_vocab()
    nll, count = 0.0, 0
    with torch.no_grad():
        for doc in docs:
            state = None
            for sentence in doc:
                seq = [2] + [vocab.get(w, 1) for w in sentence] + [3]
                for x, y in zip(seq[:-1], seq[1:]):
                    out = model(input_ids=torch.tensor([[x]]), state=state, use_cache=True)
                    state = out.state
                    nll -= torch.log_softmax(out.logits[0, -1].double(), -1)[y].item()
                    count += 1
    return math.exp(nll / count), count


def test_causal_carry_equals_a_naive_stream_and_differs_from_reset():
    docs = synthetic_documents(7, seed=3)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=16,
                                           num_hidden_layers=2)).eval()
    expected, count = naive_carry_perplexity(model, tok, docs["sentences"])
    # small chunks and batches: chunk boundaries, documents of different lengths leaving the batch
    carry = evaluate_perplexity(model, docs, "causal-carry", tokenizer=tok, topic_tokenizer=topic_tok,
                                batch_size=3, max_sentence_length=4)
    assert carry["tokens"] == count and carry["carry_state"] is True
    assert carry["perplexity"] == pytest.approx(expected, rel=1e-6)
    reset = evaluate_perplexity(model, docs, "causal", tokenizer=tok, topic_tokenizer=topic_tok, batch_size=5)
    assert reset["tokens"] == count and reset["perplexity"] != pytest.approx(expected, rel=1e-6)


def test_protocol_errors_and_vocabulary_mismatch():
    docs = synthetic_documents(3)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok) + 1, embedding_size=4, hidden_size=4))
    with pytest.raises(ValueError, match="protocol must be"):
        evaluate_perplexity(model, docs, "future", tokenizer=tok)
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        evaluate_perplexity(model, docs, "causal", tokenizer=tok)
    with pytest.raises(ValueError, match="Pass tokenizer"):
        evaluate_perplexity(model, docs, "causal")


@pytest.mark.parametrize("protocol", ["paper", "causal-carry"])
def test_mismatched_context_ablation_reads_another_rows_context(protocol):
    """The ablation feeds row i the context of row i + b/2 of the same batch, under any protocol,
    and changes nothing else: with the roll undone by hand the numbers are the real-context ones."""
    import functools

    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM

    docs = synthetic_documents(30, seed=1)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    model = TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=4,
                                         embedding_size=8, hidden_size=8)).eval()
    seen = {}
    original = model.forward

    def recording(mismatched):
        def forward(*args, context_bow=None, **kwargs):
            seen.setdefault(mismatched, []).append(context_bow.clone())
            return original(*args, context_bow=context_bow, **kwargs)
        return functools.wraps(original)(forward)

    results = {}
    for mismatched in (False, True):
        model.forward = recording(mismatched)
        results[mismatched] = evaluate_perplexity(model, docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                                  batch_size=8, mismatched_context=mismatched)
    model.forward = original
    assert results[True]["mismatched_context"] and "mismatched" in results[True]["context"]
    assert results[True]["tokens"] == results[False]["tokens"]
    assert results[True]["perplexity"] != results[False]["perplexity"]
    rolled = 0
    for real, shown in zip(seen[False], seen[True]):
        assert torch.equal(shown, real.roll(real.shape[0] // 2, dims=0))
        rolled += real.shape[0] > 1 and not torch.equal(shown, real)
    assert rolled > 0
