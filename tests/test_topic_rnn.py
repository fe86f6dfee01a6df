"""TopicRNN / TopicLSTM / TopicGRU: the paper's model, the pitfalls of public ports, generation's conditioning, the
classifier. The contract of every family (save / load, padding, state, cached generation, remote code) is checked in
test_model_contract.py."""

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification,
                          TrainingArguments)

import reference_topic_rnn as ref
from conftest import DATA, requires_data
from topic_lm_hf import TopicContextCollator, TopicLMTrainer, build_vocabularies, documents_from_lists
from topic_lm_hf.tasks.classification import (FeatureCollator, add_document_features, bow_logistic_regression,
                                              classification_accuracy, load_imdb_splits, majority_accuracy,
                                              train_classifier)
from topic_lm_hf.evaluation import PROTOCOLS, evaluate_perplexity
from topic_lm_hf.evaluation.sliding_window import evaluate_perplexity_sliding_window
from topic_lm_hf.models.configuration_topic_rnn import TopicRNNConfig
from topic_lm_hf.models.modeling_topic_rnn import (TopicRNNForCausalLM, TopicRNNForSequenceClassification,
                                                   TopicRNNModel, gaussian_kl)

AutoConfig.register(TopicRNNConfig.model_type, TopicRNNConfig, exist_ok=True)
AutoModel.register(TopicRNNConfig, TopicRNNModel, exist_ok=True)
AutoModelForCausalLM.register(TopicRNNConfig, TopicRNNForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(TopicRNNConfig, TopicRNNForSequenceClassification, exist_ok=True)

CELLS = ["rnn", "lstm", "gru"]
param = pytest.mark.parametrize

# A toy corpus whose stop-word indicator is known by hand: the stop list is {the, a, of, in, and},
# top_fraction=0, so the topic vocabulary is exactly the alphabetic words outside the stop list.
STOP = ["the", "a", "of", "in", "and"]
CORPUS = [
    [["the", "senate", "passed", "the", "bill", "."], ["the", "president", "signed", "a", "law", "."]],
    [["the", "team", "won", "the", "game", "."], ["fans", "cheered", "in", "the", "stadium", "."]],
    [["a", "storm", "hit", "the", "coast", "."], ["the", "senate", "and", "the", "president", "met", "."]],
]
SENTENCE = ["the", "senate", "passed", "the", "bill", "."]
# targets of "<bos> the senate passed the bill . <eos>": the senate passed the bill . <eos>
SENTENCE_INDICATORS = [1, 0, 0, 1, 0, 1, 1]


@pytest.fixture(scope="module")
def toy():
    tok, topic_tok = build_vocabularies(documents_from_lists(CORPUS), min_freq=1, stopwords=STOP, top_fraction=0)
    return tok, topic_tok


def fixed_init(model, scale=0.6):
    """Deterministic, non-trivial weights (torchtune's fixed_init_model)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(model.named_parameters())):
            p.copy_(scale * torch.sin(torch.arange(p.numel(), dtype=torch.float32) * 0.37 + i).view_as(p))
    return model


def tiny_config(tok, topic_tok, cell="gru", **kw):
    kw = {"embedding_size": 6, "hidden_size": 5, "num_topics": 3, "inference_hidden_size": 4, **kw}
    return TopicRNNConfig.from_tokenizers(tok, topic_tok, cell=cell, **kw)


def tiny_model(tok, topic_tok, cell="gru", **kw):
    return fixed_init(TopicRNNForCausalLM(tiny_config(tok, topic_tok, cell, **kw)))


def sentence_batch(tok, topic_tok, context="document", docs=CORPUS):
    collator = TopicContextCollator(tok, topic_tok, context=context)
    return collator([{"sentences": d} for d in docs])


# ----------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------


def test_config_validation(toy):
    tok, topic_tok = toy
    with pytest.raises(ValueError, match="cell"):
        TopicRNNConfig(cell="transformer")
    with pytest.raises(ValueError, match="num_topics"):
        TopicRNNConfig(num_topics=0)
    with pytest.raises(ValueError, match="topic_vocab_size"):
        TopicRNNConfig(vocab_size=50, topic_vocab_size=4, topic_word_ids=[-1, 5, 6])
    with pytest.raises(ValueError, match="is not an LM id"):
        TopicRNNConfig(vocab_size=50, topic_vocab_size=3, topic_word_ids=[-1, 5, 60])
    # A causal LM without the topic vocabulary's LM ids refuses to run instead of training without topics.
    model = TopicRNNForCausalLM(TopicRNNConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok),
                                               embedding_size=4, hidden_size=4, num_topics=2))
    with pytest.raises(ValueError, match="set_topic_vocabulary"):
        model(torch.tensor([[2, 5, 6]]))
    model.set_topic_vocabulary(tok, topic_tok)
    assert model(torch.tensor([[2, 5, 6]])).logits.shape == (1, 3, len(tok))


# ----------------------------------------------------------------------------------------------
# the pitfalls of public ports
# ----------------------------------------------------------------------------------------------


def test_indicator_is_exactly_target_outside_topic_vocabulary(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok)
    topic_words = set(topic_tok.get_vocab()) - {"<unk>"}
    vocab = tok.get_vocab()
    expected = torch.zeros(len(tok), dtype=torch.bool)
    for word, i in vocab.items():
        expected[i] = word not in topic_words
    assert torch.equal(model.stop_word_mask, expected)
    assert {w for w, i in vocab.items() if not expected[i]} == topic_words
    for word in ["the", "a", "in", "and", ".", "<eos>", "<unk>", "<pad>", "<bos>"]:
        assert bool(model.stop_word_mask[vocab[word]]), word

    # The known sentence: the indicator of each target, read back through the indicator loss.
    ids = [vocab["<bos>"]] + [vocab[w] for w in SENTENCE] + [vocab["<eos>"]]
    batch = torch.tensor([ids])
    with torch.no_grad():
        model.stop_head.weight.zero_()
        model.stop_head.bias.fill_(2.0)  # sigmoid(z) = sigmoid(2) at every position
    model.eval()
    out = model(batch, labels=batch)
    n_stop = sum(SENTENCE_INDICATORS)
    n_topic = len(SENTENCE_INDICATORS) - n_stop
    expected_bce = (n_stop * math.log1p(math.exp(-2.0)) + n_topic * math.log1p(math.exp(2.0))) / len(ids[1:])
    assert out.aux_loss.item() == pytest.approx(expected_bce, rel=1e-6)


@param("cell", CELLS)
def test_targets_are_next_tokens_and_elbo_matches_per_token_reference(toy, cell):
    """Reference parity on the known sentence: input t predicts token t + 1 with indicator l_t."""
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok, cell).eval()
    vocab = tok.get_vocab()
    ids = [vocab["<bos>"]] + [vocab[w] for w in SENTENCE] + [vocab["<eos>"]]
    bow = sentence_batch(tok, topic_tok, "document", [CORPUS[0]])["context_bow"][0]
    out = model(torch.tensor([ids]), labels=torch.tensor([ids]), context_bow=bow[None])
    reference = ref.elbo(model, [(ids, SENTENCE_INDICATORS, bow.tolist())])
    n = len(ids) - 1
    assert reference["tokens"] == n == len(SENTENCE_INDICATORS)
    assert out.lm_loss.item() == pytest.approx(-reference["word"] / n, rel=1e-5)
    assert out.aux_loss.item() == pytest.approx(-reference["indicator"] / n, rel=1e-5)
    assert out.kl_loss.item() == pytest.approx(reference["kl"] / n, rel=1e-5)
    assert out.loss.item() == pytest.approx(-reference["elbo"] / n, rel=1e-5)  # loss = -ELBO per token
    # logits are log p(y_t) with the indicator marginalised, aligned with the next token.
    terms = ref.sentence_terms(model, ids, SENTENCE_INDICATORS, out.topic_mixture[0].tolist())
    got = out.logits[0, :-1].gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(got.double(), torch.tensor(terms["log_marginal"], dtype=torch.float64), atol=1e-5)
    assert torch.allclose(out.logits[0].exp().double(), torch.tensor(terms["marginal"], dtype=torch.float64),
                          atol=1e-6)
    # Predicting two tokens ahead (the off-by-one of public ports) would give another loss.
    shifted = -sum(out.logits[0, t, ids[t + 2]].item() for t in range(n - 1)) / (n - 1)
    assert abs(shifted - (-got.mean().item())) > 1e-3


def test_elbo_terms_by_hand(toy):
    """Weights chosen so that every term is a closed-form number."""
    tok, topic_tok = toy
    model = TopicRNNForCausalLM(tiny_config(tok, topic_tok, "rnn", inference_num_layers=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.inference_net.mean.bias.copy_(torch.tensor([1.0, -2.0, 0.5]))
        model.model.inference_net.log_sigma.bias.copy_(torch.tensor([0.0, math.log(2.0), -1.0]))
    batch = sentence_batch(tok, topic_tok, "others")
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                context_bow=batch["context_bow"])
    n = int((batch["labels"][:, 1:] != -100).sum())
    rows = batch["input_ids"].shape[0]
    kl_row = 0.5 * ((1 + 1 - 1 - 0) + (4 + 4 - 1 - 2 * math.log(2.0)) + (0.25 + math.exp(-2) - 1 + 2))
    assert out.lm_loss.item() == pytest.approx(math.log(len(tok)), rel=1e-6)  # uniform words, zero bias B
    assert out.aux_loss.item() == pytest.approx(math.log(2.0), rel=1e-6)  # sigmoid(0) = 1/2
    assert out.kl_loss.item() == pytest.approx(rows * kl_row / n, rel=1e-6)  # KL per predicted token
    assert out.loss.item() == pytest.approx(math.log(len(tok)) + math.log(2.0) + rows * kl_row / n, rel=1e-6)


def test_loss_terms_share_one_per_token_scale(toy):
    """Duplicating every row of a batch changes no term (KL summed over rows with NLL averaged would)."""
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok).eval()
    batch = sentence_batch(tok, topic_tok, "others")
    double = {k: torch.cat([v, v]) for k, v in batch.items()}
    a = model(**batch)
    b = model(**double)
    for key in ("loss", "lm_loss", "aux_loss", "kl_loss"):
        assert getattr(a, key).item() == pytest.approx(getattr(b, key).item(), rel=1e-6), key
    # Training with labels needs only the observed-indicator softmax: the marginal is skipped.
    model.train()
    assert model(**batch).logits is None and model(batch["input_ids"]).logits is not None


def test_kl_annealing_ramps_the_kl_weight(toy, tmp_path):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok, kl_annealing_steps=4, kl_weight=0.8).train()
    batch = sentence_batch(tok, topic_tok)
    for step in (1, 2):
        out = model(**batch)
        assert int(model.kl_annealing_step) == step
        expected = out.lm_loss + out.aux_loss + 0.8 * step / 4 * out.kl_loss
        assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    model.save_pretrained(tmp_path)
    assert int(AutoModelForCausalLM.from_pretrained(tmp_path).kl_annealing_step) == 2  # resuming goes on
    model.eval()
    model(**batch)
    assert int(model.kl_annealing_step) == 2  # evaluation does not count
    with pytest.raises(ValueError, match="kl_annealing_steps"):
        TopicRNNConfig(kl_annealing_steps=-1)


def test_indicator_loss_is_on_logits_not_probabilities(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok).eval()
    vocab = tok.get_vocab()
    ids = torch.tensor([[vocab["<bos>"], vocab["senate"], vocab["bill"], vocab["law"]]])  # targets: topic words
    with torch.no_grad():
        model.stop_head.weight.zero_()
        model.stop_head.bias.fill_(20.0)
    # -log(1 - sigmoid(20)) = 20 (+2e-9); a sigmoid before a with-logits loss could never exceed log(1 + e) = 1.31.
    assert model(ids, labels=ids).aux_loss.item() == pytest.approx(20.0, rel=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["the", "senate", "bill", "law", "game", "fans", "a", ".", "storm",
                                          "zebra"]), min_size=1, max_size=12), min_size=1, max_size=5),
       st.integers(0, 4), st.randoms(use_true_random=False))
def test_causal_inference_net_never_sees_the_predicted_sentence(doc, j, rnd):
    """Under the causal protocol, sentence j's context bag of words (and so theta) is a function of
    sentences 0..j-1 only: rewriting sentence j and everything after it changes neither."""
    tok, topic_tok = _toy_cached()
    model = _toy_model_cached()
    assert PROTOCOLS["causal"].context == "preceding" and PROTOCOLS["causal-carry"].context == "preceding"
    j = j % len(doc)
    collator = TopicContextCollator(tok, topic_tok, context="preceding")
    words = ["senate", "bill", "law", "game", "fans", "storm", "the", "."]
    rewritten = doc[:j] + [[rnd.choice(words) for _ in range(rnd.randint(1, 12))] for _ in doc[j:]]
    rows_a = collator.encode_document(doc)
    rows_b = collator.encode_document(rewritten)
    first_a = rows_a["sentence_index"].index(j)
    first_b = rows_b["sentence_index"].index(j)
    bow_a = collator.bag_of_words([rows_a["context_ids"][first_a]])
    bow_b = collator.bag_of_words([rows_b["context_ids"][first_b]])
    assert torch.equal(bow_a, bow_b)
    # The context is exactly the topic words of the preceding sentences.
    topic_vocab = topic_tok.get_vocab()
    expected = torch.zeros(len(topic_tok))
    for sentence in doc[:j]:
        for w in sentence:
            if w in topic_vocab and w != "<unk>":
                expected[topic_vocab[w]] += 1
    assert torch.equal(bow_a[0], expected)
    theta_a = model(torch.tensor([rows_a["input_ids"][first_a]]), context_bow=bow_a).topic_mixture
    theta_b = model(torch.tensor([rows_b["input_ids"][first_b]]), context_bow=bow_b).topic_mixture
    assert torch.equal(theta_a, theta_b)


_CACHE = {}


def _toy_cached():
    if "toy" not in _CACHE:
        _CACHE["toy"] = build_vocabularies(documents_from_lists(CORPUS), min_freq=1, stopwords=STOP, top_fraction=0)
    return _CACHE["toy"]


def _toy_model_cached():
    if "model" not in _CACHE:
        _CACHE["model"] = tiny_model(*_toy_cached()).eval()
    return _CACHE["model"]


# ----------------------------------------------------------------------------------------------
# the marginal, theta, topics
# ----------------------------------------------------------------------------------------------


@param("cell", CELLS)
def test_marginal_sums_to_one_and_stop_words_get_no_topic_term(toy, cell):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok, cell)
    batch = sentence_batch(tok, topic_tok)
    for mode in (True, False):
        model.train(mode)
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       context_bow=batch["context_bow"]).logits
        assert torch.allclose(logits.exp().sum(-1), torch.ones(logits.shape[:2]), atol=1e-5)
        assert torch.allclose(torch.log_softmax(logits, -1), logits, atol=1e-5)
    theta = torch.randn(4, 3) * 5
    bias = model.topic_bias(theta)
    assert bias.shape == (4, len(tok))
    assert bool((bias[:, model.stop_word_mask] == 0).all())
    assert bool((bias[:, ~model.stop_word_mask] != 0).any())
    # Any real theta works (it is Gaussian, not a distribution over topics).
    model.eval()
    out = model(batch["input_ids"][:1], topic_mixture=torch.tensor([[-3.0, 0.0, 7.5]]))
    assert torch.allclose(out.logits.exp().sum(-1), torch.ones(1, out.logits.shape[1]), atol=1e-5)


def test_theta_is_posterior_mean_in_eval_and_a_sample_in_training(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok)
    batch = sentence_batch(tok, topic_tok)
    mu, log_sigma = model.model.inference_net(batch["context_bow"])
    model.eval()
    a = model(batch["input_ids"], context_bow=batch["context_bow"]).topic_mixture
    b = model(batch["input_ids"], context_bow=batch["context_bow"]).topic_mixture
    assert torch.equal(a, mu) and torch.equal(a, b)
    model.train()
    c = model(batch["input_ids"], context_bow=batch["context_bow"]).topic_mixture
    assert not torch.allclose(c, mu)
    assert bool((gaussian_kl(mu, log_sigma) >= 0).all())
    # No context = an empty bag of words (what the first sentence sees under the causal protocol).
    model.eval()
    empty = model(batch["input_ids"][:2]).topic_mixture
    assert torch.equal(empty, model.model.inference_net(torch.zeros(2, len(topic_tok)))[0])


def test_get_topics_are_columns_of_B_over_topic_words(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok)
    topics = model.get_topics(top_n=4, topic_tokenizer=topic_tok)
    assert len(topics) == model.config.num_topics and all(len(t) == 4 for t in topics)
    words = {v: k for k, v in topic_tok.get_vocab().items()}
    for k, topic in enumerate(topics):
        column = model.topic_head.weight[1:, k]
        assert topic == [words[i + 1] for i in column.topk(4).indices.tolist()]
        assert not set(topic) & (set(STOP) | {"<unk>", "."})


# ----------------------------------------------------------------------------------------------
# generation's conditioning, perplexity protocols (save / load, state, padding, cached generation and
# remote code of every family: test_model_contract.py)
# ----------------------------------------------------------------------------------------------


def test_generation_conditioning(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok).eval()
    calls = []
    original = model.forward

    def recording_forward(*args, **kwargs):
        given = kwargs.get("topic_conditioning") or kwargs  # the first step's: validated by generate
        calls.append(("bow" if given.get("context_bow") is not None else
                      "theta" if kwargs.get("topic_representation") is not None else "none"))
        return original(*args, **kwargs)

    model.forward = functools.wraps(original)(recording_forward)
    bow = sentence_batch(tok, topic_tok, docs=[CORPUS[0]])["context_bow"][0]  # 1-D: one bag for the batch
    out = model.generate(**tok(["the senate"], return_tensors="pt"), context_bow=bow, max_new_tokens=4,
                         do_sample=False, pad_token_id=0, eos_token_id=None)
    assert out.shape == (1, 3 + 4)
    assert calls[0] == "bow" and set(calls[1:]) == {"theta"}  # theta inferred once, then reused
    calls.clear()
    model.generate(**tok(["the senate"], return_tensors="pt"), max_new_tokens=4, do_sample=False, pad_token_id=0,
                   eos_token_id=None)
    assert calls[0] == "none" and set(calls[1:]) == {"theta"}  # the empty-context theta, also resolved once
    model.forward = original
    # topic_ids steer theta along e_k at config.steering_scale (a set of topics keeps the norm).
    prompt = tok(["the senate"], return_tensors="pt")
    scale = model.config.steering_scale
    out = model(**prompt, topic_ids=[1])
    assert torch.allclose(out.topic_mixture, torch.tensor([[0.0, scale, 0.0]]))
    two = model(**prompt, topic_ids=[[0, 2]]).topic_mixture
    assert torch.allclose(two, torch.tensor([[scale, 0.0, scale]]) / 2 ** 0.5)
    assert torch.allclose(model(**prompt, topic_ids=[1]).logits,
                          model(**prompt, topic_mixture=torch.tensor([0.0, scale, 0.0])).logits)
    calls.clear()
    model.forward = functools.wraps(original)(recording_forward)
    steered = model.generate(topic_ids=[1], max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=None)
    model.forward = original
    assert set(calls[1:]) == {"theta"}  # resolved once, then the theta is reused
    assert torch.equal(steered, model.generate(topic_mixture=torch.tensor([0.0, scale, 0.0]), max_new_tokens=4,
                                               do_sample=False, pad_token_id=0, eos_token_id=None))
    with pytest.raises(ValueError, match="topic_ids must be in"):
        model.generate(topic_ids=[3], max_new_tokens=2)
    # Any theta in R^K, without a prompt; num_return_sequences expands it correctly.
    out = model.generate(topic_mixture=torch.tensor([2.0, -1.0, 0.5]), max_new_tokens=5, do_sample=True,
                         num_return_sequences=3, pad_token_id=0, eos_token_id=None)
    assert out.shape == (3, 1 + 5) and bool((out[:, 0] == tok.bos_token_id).all())
    # A different theta steers generation somewhere else.
    greedy = [model.generate(topic_mixture=torch.tensor([[s * 8.0, 0.0, -s * 8.0]]), max_new_tokens=8,
                             do_sample=False, pad_token_id=0, eos_token_id=None) for s in (1, -1)]
    assert not torch.equal(*greedy)
    with pytest.raises(ValueError, match="at most one"):
        model.generate(topic_mixture=torch.zeros(1, 3), context_bow=bow, max_new_tokens=2)
    with pytest.raises(ValueError):
        model.generate(**tok(["the"], return_tensors="pt"), topic_mixtrue=torch.zeros(1, 3), max_new_tokens=2)


def test_perplexity_protocols_read_the_marginal(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok).eval()
    docs = documents_from_lists(CORPUS)
    results = {p: evaluate_perplexity(model, docs, p, tokenizer=tok, topic_tokenizer=topic_tok) for p in PROTOCOLS}
    window = evaluate_perplexity_sliding_window(model, docs, window=5, tokenizer=tok, topic_tokenizer=topic_tok)
    assert window["protocol"] == "topicrnn-sliding-window" and window["window"] == 5
    assert {r["tokens"] for r in results.values()} == {window["tokens"]}
    # Reference: the causal protocol by hand, token by token.
    collator = TopicContextCollator(tok, topic_tok, context="preceding")
    nll, n = 0.0, 0
    for doc in CORPUS:
        rows = collator.encode_document(doc)
        for ids, ctx in zip(rows["input_ids"], rows["context_ids"]):
            mu, _ = ref.inference(model, collator.bag_of_words([ctx])[0].tolist())
            terms = ref.sentence_terms(model, ids, [0] * len(ids), mu)
            nll -= sum(terms["log_marginal"])
            n += len(ids) - 1
    assert n == results["causal"]["tokens"]
    assert results["causal"]["perplexity"] == pytest.approx(math.exp(nll / n), rel=1e-5)


def test_sliding_window_context_is_the_previous_window(toy):
    tok, topic_tok = toy
    model = tiny_model(tok, topic_tok).eval()
    seen = []
    original = model.forward

    @functools.wraps(original)
    def recording_forward(*args, **kwargs):
        seen.append(kwargs["context_bow"].clone())
        return original(*args, **kwargs)

    model.forward = recording_forward
    doc = [["the", "senate", "passed", "the", "bill", "."], ["fans", "cheered", "."], ["storm", "hit", "coast"]]
    evaluate_perplexity_sliding_window(model, [doc], window=4, tokenizer=tok, topic_tokenizer=topic_tok)
    model.forward = original
    chunks = TopicContextCollator(tok, None, context="none").encode_document(doc)["input_ids"]
    assert len(seen) == len(chunks) == 3
    lm_words = {v: k for k, v in tok.get_vocab().items()}
    topic_vocab = topic_tok.get_vocab()
    predicted = []
    for chunk, bow in zip(chunks, seen):
        expected = torch.zeros(len(topic_tok))
        for i in predicted[-4:]:
            if lm_words[i] in topic_vocab:
                expected[topic_vocab[lm_words[i]]] += 1
        assert torch.equal(bow[0], expected)
        predicted += chunk[1:]  # <bos> is never predicted
    # window 4 before chunk 2: "the bill . <eos>" (one topic word); before chunk 3: "fans cheered . <eos>".
    assert seen[0].sum() == 0 and seen[1].sum() == 1 and seen[2].sum() == 2


# ----------------------------------------------------------------------------------------------
# training on real data
# ----------------------------------------------------------------------------------------------


@param("cell", CELLS)
def test_cells_train_on_the_wikipedia_sample(wiki, tmp_path, cell):
    torch.set_num_threads(1)
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell=cell, embedding_size=32, hidden_size=32,
                                            num_topics=8, inference_hidden_size=32)
    model = TopicRNNForCausalLM(config)
    collator = TopicContextCollator(tok, topic_tok, context="others")
    rows = collator.prepare(wiki["train"].select(range(60)))
    held_out = collator([collator.prepare(wiki["valid"].select(range(4)))[i] for i in range(48)])

    def held_out_loss():
        model.eval()
        with torch.no_grad():
            return model(**held_out).loss.item()

    before = held_out_loss()
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=25, per_device_train_batch_size=32,
                             learning_rate=1e-2, logging_steps=5, save_strategy="no", report_to=[], use_cpu=True,
                             disable_tqdm=True, max_grad_norm=1.0)
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    after = held_out_loss()
    assert after < before - 0.5, (before, after)
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert {"lm_loss", "kl_loss", "aux_loss"} <= set(logged[-1])
    assert logged[-1]["loss"] < logged[0]["loss"]


@requires_data("imdb", "train.jsonl.gz")
def test_classifier_learns_imdb_above_majority(tmp_path):
    torch.set_num_threads(1)
    train, test = load_imdb_splits(DATA / "imdb" / "train.jsonl.gz", max_train_documents=500,
                                   max_test_documents=200)
    assert train.features["label"].names == ["0", "1"] and set(test["label"]) == {0, 1}  # the shared label rules
    tok, topic_tok = build_vocabularies(train, min_freq=5, stopwords="mallet")
    config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="gru", embedding_size=16, hidden_size=16,
                                            num_topics=16, inference_hidden_size=32, inference_input="log1p",
                                            freeze_backbone=False, num_labels=2)
    model = TopicRNNForSequenceClassification(config)
    collator = TopicContextCollator(tok, topic_tok, context="document", layout="sequence", max_document_length=200,
                                    label_column="label")
    train_rows, test_rows = collator.prepare(train), collator.prepare(test)
    train_classifier(model, train_rows, collator, str(tmp_path), epochs=4, learning_rate=3e-3, batch_size=25)
    accuracy = classification_accuracy(model, test_rows, collator)
    majority = majority_accuracy(train["label"], test["label"])
    assert accuracy > majority + 0.1, (accuracy, majority)
    baseline = bow_logistic_regression(train, test)
    assert baseline["accuracy"] > majority


def test_frozen_feature_classifier_trains_only_the_head(toy, tmp_path):
    tok, topic_tok = toy
    lm = tiny_model(tok, topic_tok)
    lm.save_pretrained(tmp_path / "lm")
    clf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "lm", num_labels=2)
    docs = documents_from_lists(CORPUS * 4, label=[0, 1, 0] * 4)
    collator = TopicContextCollator(tok, topic_tok, context="document", layout="sequence", max_document_length=12,
                                    label_column="label")
    rows = collator.prepare(docs)
    batch = collator([rows[i] for i in range(4)])
    assert batch["input_ids"].shape[1] <= 12 and batch["labels"].tolist() == [0, 1, 0, 0]
    features = add_document_features(clf, rows, collator)
    assert len(features[0]["document_features"]) == 5 + 2 * 3  # h, mu, log sigma
    body = {k: v.clone() for k, v in clf.model.state_dict().items()}
    head = clf.classifier.dense.weight.clone()
    train_classifier(clf, features, FeatureCollator(), str(tmp_path / "clf"), epochs=3, learning_rate=1e-2,
                     batch_size=4)
    assert all(torch.equal(v, clf.model.state_dict()[k]) for k, v in body.items())
    assert not torch.equal(head, clf.classifier.dense.weight)
    clf.eval()
    from_tokens = clf(**{k: v for k, v in batch.items() if k != "labels"}).logits
    from_features = clf(document_features=FeatureCollator()([features[i] for i in range(4)])["document_features"])
    assert torch.allclose(from_tokens, from_features.logits, atol=1e-5)
    out = clf(**batch)
    assert out.loss is not None and out.logits.shape == (4, 2) and clf.config.problem_type == \
        "single_label_classification"
    # Fine-tunable variant: the body gets gradients.
    clf.set_backbone_frozen(False)
    clf.train()
    clf(**batch).loss.backward()
    assert clf.model.embed_tokens.weight.grad is not None
    assert math.isfinite(out.loss.item())


# ----------------------------------------------------------------------------------------------
# free bits
# ----------------------------------------------------------------------------------------------


def test_free_bits_floor_each_dimensions_batch_mean_kl_in_the_loss_only(toy):
    from topic_lm_hf.models.modeling_topic_rnn import gaussian_kl

    tok, topic_tok = toy
    batch = sentence_batch(tok, topic_tok, "others")
    plain = tiny_model(tok, topic_tok).eval()
    out = plain(**batch)
    assert torch.allclose(out.loss, out.lm_loss + out.aux_loss + out.kl_loss)
    mean, log_sigma = plain.model.inference_net(batch["context_bow"])
    kl = gaussian_kl(mean, log_sigma, per_dimension=True).detach()  # (b, K)
    n_tokens = (batch["labels"][:, 1:] != -100).sum()
    for free_bits in (0.5 * float(kl.mean(0).min() + kl.mean(0).max()), float(kl.mean(0).max()) + 1.0):
        model = tiny_model(tok, topic_tok, kl_free_bits=free_bits).eval()
        model.load_state_dict(plain.state_dict())
        freed = model(**batch)
        expected = kl.mean(0).clamp(min=free_bits).sum() * kl.shape[0] / n_tokens
        assert torch.allclose(freed.kl_loss, out.kl_loss)  # reported: the plain KL
        assert torch.allclose(freed.loss, out.lm_loss + out.aux_loss + expected)
        assert float(freed.loss.detach()) > float(out.loss.detach())
    with pytest.raises(ValueError, match="kl_free_bits"):
        TopicRNNConfig(kl_free_bits=-1.0)


# ----------------------------------------------------------------------------------------------
# theta_transform="softmax": a logistic-normal topic proportion (a departure from the paper)
# ----------------------------------------------------------------------------------------------


def test_softmax_theta_is_a_distribution_over_topics_and_topic_ids_are_pure_topics(toy, tmp_path):
    tok, topic_tok = toy
    with pytest.raises(ValueError, match="theta_transform must be None"):
        tiny_config(tok, topic_tok, theta_transform="sigmoid")
    # B's columns start as distinct random topics (std TOPIC_LOGIT_INIT_STD, as TCNLM's): near-uniform ones let
    # the KL term collapse the posterior
    from topic_lm_hf.models.modeling_conditioning import TOPIC_LOGIT_INIT_STD

    torch.manual_seed(0)
    fresh = TopicRNNForCausalLM(tiny_config(tok, topic_tok, theta_transform="softmax", num_topics=40))
    assert abs(float(fresh.topic_head.weight.detach().std()) - TOPIC_LOGIT_INIT_STD) < 0.1
    assert float(TopicRNNForCausalLM(tiny_config(tok, topic_tok, num_topics=40)).topic_head.weight.detach().std()) < 0.1
    model = tiny_model(tok, topic_tok, theta_transform="softmax").eval()
    paper = tiny_model(tok, topic_tok).eval()  # the paper's Gaussian theta, with the same weights
    missing = paper.load_state_dict(model.state_dict(), strict=False)
    assert missing.unexpected_keys == ["model.inference_net.theta_proj.weight", "model.inference_net.theta_proj.bias"]
    batch = sentence_batch(tok, topic_tok)
    mu, log_sigma = model.model.inference_net(batch["context_bow"])
    # theta = softmax(W mu + b) in eval mode; the KL is the Gaussian one, on z: the same as the paper's model.
    out = model(batch["input_ids"], context_bow=batch["context_bow"], labels=batch["labels"])
    ref = paper(batch["input_ids"], context_bow=batch["context_bow"], labels=batch["labels"])
    proj = model.model.inference_net.theta_proj
    assert torch.allclose(out.topic_mixture, torch.softmax(proj(mu), -1))
    assert torch.allclose(out.topic_mixture.sum(-1), torch.ones(len(batch["input_ids"])))
    assert torch.allclose(out.kl_loss, ref.kl_loss)
    # ... and the model is the paper's model read at theta = softmax(W mu + b).
    assert torch.allclose(out.logits, paper(batch["input_ids"], topic_mixture=out.topic_mixture).logits, atol=1e-6)
    assert torch.allclose(model.infer_topics(batch["context_bow"]), out.topic_mixture)
    # In training theta is read at a sample: still a distribution, not the one at mu.
    model.train()
    sampled = model(batch["input_ids"], context_bow=batch["context_bow"]).topic_mixture
    assert torch.allclose(sampled.sum(-1), torch.ones(len(sampled))) and not torch.allclose(sampled, out.topic_mixture)
    model.eval()
    # topic_ids are pure topics (no steering_scale), a set is the uniform mixture over it.
    prompt = tok(["the senate"], return_tensors="pt")
    assert torch.equal(model(**prompt, topic_ids=[1]).topic_mixture, torch.tensor([[0.0, 1.0, 0.0]]))
    assert torch.allclose(model(**prompt, topic_ids=[[0, 2]]).topic_mixture, torch.tensor([[0.5, 0.0, 0.5]]))
    assert torch.equal(model.generate(topic_ids=[1], max_new_tokens=4, do_sample=False, pad_token_id=0,
                                      eos_token_id=None),
                       model.generate(topic_mixture=torch.tensor([0.0, 1.0, 0.0]), max_new_tokens=4,
                                      do_sample=False, pad_token_id=0, eos_token_id=None))
    with pytest.raises(ValueError, match="sum to 1|non-negative|distribution"):
        model.generate(topic_mixture=torch.tensor([2.0, -1.0, 0.5]), max_new_tokens=2)
    # The bag-of-words likelihood is LDA's mixture of the topics' distributions softmax(B[:, k]) over the usable
    # topic words, by hand word by word.
    theta = torch.tensor([[0.2, 0.0, 0.8], [0.0, 1.0, 0.0]])
    log_probs = model.topic_word_log_probs(theta).detach()
    usable = [i for i, lm_id in enumerate(model.config.topic_word_ids) if lm_id >= 0]
    B = model.topic_head.weight.detach()
    for row in range(2):
        for w in range(len(topic_tok)):
            if w not in usable:
                assert log_probs[row, w] == float("-inf")
                continue
            p = sum(float(theta[row, k]) * math.exp(float(B[w, k])) / sum(math.exp(float(B[u, k])) for u in usable)
                    for k in range(3))
            assert abs(float(log_probs[row, w]) - math.log(p)) < 1e-5
    assert torch.allclose(log_probs[1].exp(), model.topic_word_distributions()[1], atol=1e-6)  # topic 1 itself
    model.save_pretrained(tmp_path)
    loaded = TopicRNNForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.theta_transform == "softmax"
    assert torch.equal(loaded(**prompt, topic_ids=[2]).logits, model(**prompt, topic_ids=[2]).logits)



# ----------------------------------------------------------------------------------------------
# topic_output_bias="mixture": the topic distribution mixed into the content-word branch
# ----------------------------------------------------------------------------------------------


def mixture_model(tok, topic_tok):
    model = tiny_model(tok, topic_tok, cell="lstm", theta_transform="softmax", topic_output_bias="mixture").eval()
    return model


def test_the_mixture_gate_starts_at_a_tenth_of_the_content_branch(toy):
    model = TopicRNNForCausalLM(tiny_config(*toy, cell="lstm", theta_transform="softmax",
                                            topic_output_bias="mixture"))
    h = torch.randn(7, model.config.hidden_size)
    torch.testing.assert_close(torch.sigmoid(model.topic_gate(h)), torch.full((7, 1), 0.1))
    assert model.topic_prior_weight is None


def test_the_mixture_loss_is_the_naive_per_token_mixture_and_the_logits_are_normalised(toy):
    tok, topic_tok = toy
    model = mixture_model(tok, topic_tok)
    batch = sentence_batch(tok, topic_tok)
    rows = batch["input_ids"].shape[0]
    theta = torch.softmax(torch.sin(torch.arange(rows * 3, dtype=torch.float32)).view(rows, 3) * 2, dim=-1)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                    topic_mixture=theta)
        h, _, _ = model.model.run_tokens(batch["input_ids"], batch["attention_mask"])
        log_topic = model.topic_word_log_probs(theta)  # (b, V_c)
        topic_of = {lm_id: k for k, lm_id in enumerate(model.config.topic_word_ids) if lm_id >= 0}
        total, n = 0.0, 0
        for b in range(h.shape[0]):
            for t in range(h.shape[1] - 1):
                y = int(batch["labels"][b, t + 1])
                if y == -100:
                    continue
                scores = model.lm_head(h[b, t]).double()
                g = float(torch.sigmoid(model.topic_gate(h[b, t])))
                if y not in topic_of:  # a stop word: the LM's softmax, times 1 - g (p(y | theta) = 0)
                    p = (1 - g) * torch.softmax(scores, -1)[y]
                else:  # the mixture replaces b_i^T theta
                    p = (1 - g) * torch.softmax(scores, -1)[y] + g * math.exp(float(log_topic[b, topic_of[y]]))
                total, n = total - math.log(float(p)), n + 1
    assert float(out.lm_loss) == pytest.approx(total / n, rel=1e-5)
    assert SENTENCE_INDICATORS.count(1) > 0 and n > 0
    torch.testing.assert_close(torch.logsumexp(out.logits, -1), torch.zeros(out.logits.shape[:2]),
                               atol=1e-5, rtol=0)
    model.train()  # training mode (no dropout here, theta given): the same loss from the predicted positions only
    train_out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                      topic_mixture=theta)
    assert train_out.logits is None
    assert float(train_out.lm_loss) == pytest.approx(float(out.lm_loss), rel=1e-6)
    train_out.loss.backward()
    assert model.topic_gate.weight.grad.abs().sum() > 0 and model.topic_head.weight.grad.abs().sum() > 0


def test_a_wrong_documents_topics_cost_the_mixture_at_most_the_gates_share(toy):
    """-log p_mix(y) <= -log(1 - g) - log p_LM(y) at every word: the bound that makes the mismatched-context
    ablation cheap."""
    tok, topic_tok = toy
    model = mixture_model(tok, topic_tok)
    batch = sentence_batch(tok, topic_tok)
    wrong = torch.tensor([[1.0, 0.0, 0.0]]).expand(batch["input_ids"].shape[0], 3)
    with torch.no_grad():
        mixed = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], topic_mixture=wrong).logits
        h, _, _ = model.model.run_tokens(batch["input_ids"], batch["attention_mask"])
        share = torch.sigmoid(model.topic_gate(h))  # g_t (b, s, 1)
        model.topic_gate.weight.zero_()
        model.topic_gate.bias.fill_(-40.0)  # g = 0: the LM's branch alone
        alone = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], topic_mixture=wrong).logits
    assert float(share.max()) > 0.2  # a real share, so that the bound is not trivial
    assert bool((mixed >= alone + torch.log1p(-share) - 1e-5).all())
    assert bool((mixed < alone - 1e-3).any())  # and the wrong topics do cost something


def test_mixture_generation_cached_equals_uncached_and_it_is_saved(toy, tmp_path):
    tok, topic_tok = toy
    model = mixture_model(tok, topic_tok)
    tok.padding_side = "left"
    prompt = tok(["the senate", "fans cheered in the"], return_tensors="pt", padding=True)
    kwargs = dict(topic_ids=[[1], [2]], max_new_tokens=5, min_new_tokens=5, do_sample=False)
    cached = model.generate(**prompt, **kwargs)
    assert torch.equal(model.generate(**prompt, **kwargs, use_cache=False), cached)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.topic_output_bias == "mixture"
    torch.testing.assert_close(loaded.topic_gate.bias, model.topic_gate.bias)
    assert torch.equal(loaded.generate(**prompt, **kwargs), cached)


def test_the_topic_free_loss_adds_the_lms_own_cross_entropy_without_topics(toy):
    tok, topic_tok = toy
    batch = sentence_batch(tok, topic_tok)
    theta = torch.softmax(torch.cos(torch.arange(batch["input_ids"].shape[0] * 3.0)).view(-1, 3), dim=-1)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"],
                  topic_mixture=theta)
    losses = {}
    for weight in (0.0, 0.5):
        model = tiny_model(tok, topic_tok, cell="lstm", theta_transform="softmax", topic_output_bias="mixture",
                           topic_free_loss_weight=weight).eval()
        with torch.no_grad():
            losses[weight] = float(model(**inputs).loss)
    with torch.no_grad():
        logits = model.lm_head(model.model.run_tokens(batch["input_ids"], batch["attention_mask"])[0])
        own = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    assert losses[0.5] - losses[0.0] == pytest.approx(0.5 * float(own), rel=1e-5)
    with pytest.raises(ValueError, match="topic_free_loss_weight"):
        tiny_config(tok, topic_tok, topic_free_loss_weight=-1.0)
