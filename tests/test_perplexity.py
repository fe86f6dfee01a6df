"""Perplexity: an exact hand-computed value, and causal-carry against a naive streaming loop."""

import math

import datasets
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
            # each token's NLL in float32, as the model's own logits: equal to its arithmetic's precision
            assert result["perplexity"] == pytest.approx(expected, rel=1e-7)
            assert result["nll"] == pytest.approx(-math.log(0.4 * 0.2 * 0.1 * 0.2 * 0.1 * 0.2), rel=1e-7)


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


@pytest.mark.parametrize("family,protocol,batch_size", [
    ("tcnlm", "paper", 8), ("tcnlm", "causal", 2), ("tcnlm", "causal-carry", 1), ("tcnlm", "causal-carry", 4),
    ("rgbn", "causal", 1), ("rgbn", "causal", 64)])
def test_mismatched_context_ablation_never_reads_the_documents_own_context(family, protocol, batch_size):
    """Property: under the ablation no chunk sees a word of its own document in its context, whatever the
    batching (one document per batch included: long documents fill a batch alone); without it every
    context word is the document's own, and the ablation changes nothing but the context."""
    import functools

    from conftest import topic_family_model
    from topic_lm_hf.evaluation.perplexity import mismatched_rows

    # every document has words of its own only, so a word names its document
    lists = [[["qz" + "abcde"[d] + "fghijkl"[(s * 3 + k) % 7] for k in range(5)] for s in range(6)] for d in range(5)]
    docs = documents_from_lists(lists)
    tok, topic_tok = build_vocabularies(docs, min_freq=1, top_fraction=0.0)
    model = topic_family_model(family, tok, topic_tok)
    with torch.no_grad():  # weights four times their initial scale: the topics move each token's NLL well above
        for p in model.parameters():  # float32's resolution, so that a changed context shows in the perplexity
            p.mul_(4)
    doc_of_token = {i: w[2] for w, i in tok.get_vocab().items() if w.startswith("qz")}
    doc_of_topic_word = {i: w[2] for w, i in topic_tok.get_vocab().items() if w.startswith("qz")}
    original = model.forward
    seen = {}

    def recording(mismatched):
        def forward(*args, input_ids=None, context_bow=None, **kwargs):
            ids = input_ids.reshape(-1, input_ids.shape[-1])
            bows = context_bow.reshape(-1, context_bow.shape[-1])
            for row, bow in zip(ids, bows):
                own = {doc_of_token[int(t)] for t in row if int(t) in doc_of_token}
                context = {doc_of_topic_word[int(w)] for w in bow.nonzero().flatten() if int(w) in doc_of_topic_word}
                seen.setdefault(mismatched, []).append((own, context))
            return original(*args, input_ids=input_ids, context_bow=context_bow, **kwargs)
        return functools.wraps(original)(forward)

    results = {}
    for mismatched in (False, True):
        model.forward = recording(mismatched)
        results[mismatched] = evaluate_perplexity(model, docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok,
                                                  batch_size=batch_size, mismatched_context=mismatched)
    model.forward = original
    assert results[True]["mismatched_context"] and results[True]["tokens"] == results[False]["tokens"]
    assert results[True]["perplexity"] != pytest.approx(results[False]["perplexity"], rel=1e-6)
    real = [(own, context) for own, context in seen[False] if own]
    shown = [(own, context) for own, context in seen[True] if own]
    assert len(real) == len(shown) and any(context for _, context in shown)
    assert all(context <= own for own, context in real)  # the real context: the document's own words
    assert all(len(own) == 1 and not context & own for own, context in shown)  # the ablation: never its own
    with pytest.raises(ValueError, match="at least two documents"):
        mismatched_rows(datasets.Dataset.from_dict({"doc_index": [0, 0], "context_ids": [[1], [2]]}), False)


@pytest.mark.parametrize("family,protocol", [("tcnlm", "paper"), ("tcnlm", "causal-carry"), ("rgbn", "causal")])
def test_empty_context_gives_every_chunk_an_empty_bag_and_changes_nothing_else(wiki, family, protocol):
    """``empty_context=True`` (how a topic model held at uninformative topics is evaluated): every call sees an
    all-zero context bag of words, on chunk and on documents batches, the same tokens are predicted, and the
    perplexity equals the one of the same model whose forward zeroes the bags itself."""
    import functools

    from conftest import topic_family_model

    docs = wiki["valid"].select(range(4))
    model = topic_family_model(family, wiki["tok"], wiki["topic_tok"])
    original, seen = model.forward, []

    def forward(*args, zero=False, context_bow=None, **kwargs):
        seen.append(float(context_bow.abs().sum()))
        return original(*args, context_bow=context_bow * 0 if zero else context_bow, **kwargs)

    results = {}
    for name, empty, zero in (("own", False, False), ("empty", True, False), ("zeroed", False, True)):
        seen.clear()
        model.forward = functools.wraps(original)(functools.partial(forward, zero=zero))
        results[name] = evaluate_perplexity(model, docs, protocol, tokenizer=wiki["tok"],
                                            topic_tokenizer=wiki["topic_tok"], empty_context=empty)
        assert (sum(seen) == 0) == empty, name  # the real contexts hold words; the empty ones none
    model.forward = original
    assert results["empty"]["tokens"] == results["own"]["tokens"] and results["empty"]["empty_context"]
    assert results["empty"]["perplexity"] == pytest.approx(results["zeroed"]["perplexity"], rel=1e-9)
    assert results["empty"]["perplexity"] != results["own"]["perplexity"]
    with pytest.raises(ValueError, match="not both"):
        evaluate_perplexity(model, docs, protocol, tokenizer=wiki["tok"], topic_tokenizer=wiki["topic_tok"],
                            empty_context=True, mismatched_context=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_nll_equals_a_float64_loop_over_the_real_targets(dtype):
    """The evaluators' NLL sum (float32 per token, float64 sum) against a float64 log_softmax token by token,
    padding left out, with a vocabulary entry at -inf (a family that rules words out) and bf16 logits."""
    from topic_lm_hf.evaluation.perplexity import token_nll

    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 11) * 4).to(dtype)
    logits[..., 7] = float("-inf")
    targets = torch.randint(0, 7, (3, 5))
    mask = torch.rand(3, 5) > 0.3
    want = sum(-torch.log_softmax(logits[i, j].double(), -1)[targets[i, j]].item()
               for i in range(3) for j in range(5) if mask[i, j])
    got = token_nll(logits, targets, mask)
    assert got.dtype == torch.float64 and got.shape == () and got.item() == pytest.approx(want, rel=1e-6)
    assert token_nll(logits, targets, torch.zeros_like(mask)).item() == 0.0


def reads_of_model_outputs(model):
    """An ``OperationCounter`` that counts only the host reads (``.item()``, ``.tolist()``, ``nonzero``, ...: on a GPU
    each one waits for the device) of what ``model.forward`` returned and of everything computed from it, outside
    ``forward`` (``counter.syncs``); and the calls of ``forward`` (``counter.calls``)."""
    from benchmarking import OperationCounter, is_host_synchronisation
    from torch.utils._pytree import tree_leaves

    class Counter(OperationCounter):
        def __init__(self):
            super().__init__()
            self.calls, self.inside, self.ids, self.keep = 0, 0, set(), []

        def tag(self, values):
            tensors = [t for t in tree_leaves(values) if isinstance(t, torch.Tensor)]
            self.ids.update(id(t) for t in tensors)
            self.keep.extend(tensors)  # the ids stay theirs

        def tagged(self, values) -> bool:
            return not self.inside and any(isinstance(v, torch.Tensor) and id(v) in self.ids
                                           for v in tree_leaves(values))

        def read_on_host(self, tensor):
            self.syncs += self.tagged(tensor)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if self.tagged((args, kwargs)):
                self.syncs += is_host_synchronisation(func.overloadpacket.__name__, args, kwargs)
                self.tag(out)
            return out

    counter, original = Counter(), model.forward

    def forward(*args, **kwargs):
        counter.calls, counter.inside = counter.calls + 1, counter.inside + 1
        try:
            out = original(*args, **kwargs)
        finally:
            counter.inside -= 1
        counter.tag([v for v in out.values() if isinstance(v, torch.Tensor)])
        return out

    model.forward = forward
    return counter


@pytest.mark.parametrize("family,protocol", [("lstm_lm", "causal"), ("lstm_lm", "causal-carry"), ("tcnlm", "paper"),
                                             ("rgbn", "causal"), ("rgbn", "causal-carry"), ("lstm_lm", "sliding")])
def test_an_evaluation_reads_its_totals_on_the_host_once_whatever_the_number_of_batches(wiki, family, protocol):
    """The evaluators keep the NLL sum and the token count on the model's device and read them once at the end: no
    host read of a model's output per batch (on a GPU, each would make the host wait for the queue to drain)."""
    from conftest import topic_family_model
    from topic_lm_hf.evaluation import evaluate_perplexity_sliding_window

    model = topic_family_model(family, wiki["tok"], wiki["topic_tok"])
    docs = wiki["valid"].select(range(6))
    vocabularies = {"tokenizer": wiki["tok"], "topic_tokenizer": wiki["topic_tok"]}
    want = (evaluate_perplexity_sliding_window(model, docs, **vocabularies) if protocol == "sliding" else
            evaluate_perplexity(model, docs, protocol, batch_size=64, **vocabularies))
    with reads_of_model_outputs(model) as counter:
        got = (evaluate_perplexity_sliding_window(model, docs, batch_size=2, **vocabularies) if protocol == "sliding"
               else evaluate_perplexity(model, docs, protocol, batch_size=2, **vocabularies))
    assert counter.calls > 3 and counter.syncs == 1, (counter.calls, counter.syncs)
    assert got["tokens"] == want["tokens"] and got["perplexity"] == pytest.approx(want["perplexity"], rel=1e-9)
