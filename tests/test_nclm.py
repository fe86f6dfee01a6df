"""NCLM: the maths against a literal per-position reference, causality as a property (and the leaky
replication modes failing it), ETR's selection and gradients, how generation encodes its conditioning,
document features, Trainer phases and a short real-data training run. The contract of every family (save /
load, padding, state equivalence, cached generation, remote code) is checked in test_model_contract.py."""

import math
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainingArguments

from topic_lm_hf import (NCLMConfig, NCLMForCausalLM, TopicContextCollator, TopicLMTrainer, evaluate_perplexity,
                         save_vocabularies)

from reference_nclm import reference_logits

VARIANTS = [("lta", False), ("eta", False), ("leta", False), ("lta", True), ("eta", True), ("leta", True)]
IDS = [f"{v}{'+sdt' if s else ''}" for v, s in VARIANTS]


pytestmark = pytest.mark.usefixtures("one_thread")


def make(wiki, variant="leta", sentence_topics=False, seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"num_topics": 5, "embedding_size": 12, "hidden_size": 16, "encoder_hidden_size": 10, "dropout": 0.0,
          "etr_top_n": 4, "num_topic_samples": 3, "initializer_range": 0.3, **kw}
    config = NCLMConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], variant=variant,
                                        sentence_topics=sentence_topics, **kw)
    model = NCLMForCausalLM(config)
    with torch.no_grad():  # sharper NVDM weights than Glorot's, so that topics and sentences matter
        for p in model.model.topic_model.parameters():
            p.mul_(4.0)
    return model.eval()


def chunk_batch(wiki, context="preceding", max_sentence_length=6, docs=(0, 1), rows=None):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context=context,
                                    max_sentence_length=max_sentence_length, sentence_prefix=True)
    prepared = collator.prepare(wiki["valid"].select(list(docs)))
    chosen = prepared.select(rows) if rows is not None else prepared
    return collator, collator(list(chosen))


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, match", [
    (dict(variant="both"), "variant must be one of .*got 'both'"),
    (dict(sdt_mode="future"), "sdt_mode must be one of"),
    (dict(num_topics=0), "num_topics must be a positive integer, got 0"),
    (dict(alpha=1.0), r"alpha .* must be in \[0, 1\), got 1.0"),
    (dict(num_topic_samples=-1), "num_topic_samples must be a non-negative integer"),
    (dict(etr_embedding="frozen", variant="eta"), "etr_embedding='frozen' needs etr_embedding_size"),
    (dict(etr_selection="random"), "etr_selection must be one of"),
    (dict(topic_word_ids=[1, 2], topic_vocab_size=3), "topic_word_ids has 2 entries but topic_vocab_size is 3"),
    (dict(tie_word_embeddings=True, embedding_size=8, hidden_size=16), "tie_word_embeddings needs embedding_size =="),
])
def test_config_rejects_bad_values_naming_them(bad, match):
    with pytest.raises(ValueError, match=match):
        NCLMConfig(**bad)


def test_config_defaults_sizes_and_leaky_modes():
    config = NCLMConfig()
    assert (config.num_topics, config.encoder_hidden_size, config.num_topic_samples, config.hidden_size,
            config.embedding_size, config.dropout, config.alpha, config.etr_top_n) == (150, 256, 10, 600, 300, 0.4,
                                                                                      0.01, 20)
    assert config.leaky_modes() == [] and config.sdt_mode == "prefix"
    assert NCLMConfig(variant="lta").topic_representation_size == 150
    assert NCLMConfig(variant="eta").topic_representation_size == 300
    assert NCLMConfig(variant="leta", sentence_topics=True).topic_representation_size == 2 * 450
    leaky = NCLMConfig(variant="eta", sentence_topics=True, sdt_mode="minus_target",
                       etr_mask_includes_current_sentence=True)
    assert leaky.leaky_modes() == ["sdt_mode=minus_target", "etr_mask_includes_current_sentence"]


# ----------------------------------------------------------------------------------------------
# the maths against the literal reference
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant, sdt", VARIANTS, ids=IDS)
def test_logits_equal_the_per_position_reference(wiki, variant, sdt):
    """Every variant, on real chunks (some continue a long sentence, so their sentence prefix matters),
    in a padded batch, equals the literal reference row by row."""
    model = make(wiki, variant, sdt)
    collator, batch = chunk_batch(wiki, max_sentence_length=6)
    assert (batch["sentence_prefix_bow"].sum(-1) > 0).any() and (batch["context_bow"].sum(-1) > 0).any()
    take = list(range(min(12, batch["input_ids"].shape[0])))
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"][take], attention_mask=batch["attention_mask"][take],
                    context_bow=batch["context_bow"][take], sentence_prefix_bow=batch["sentence_prefix_bow"][take])
    for r in take:
        n = int(batch["attention_mask"][r].sum())
        ids = batch["input_ids"][r, :n].tolist()
        prefix = [w for w, c in enumerate(batch["sentence_prefix_bow"][r].tolist()) for _ in range(int(c))]
        expected = reference_logits(model, ids, batch["context_bow"][r], prefix)
        torch.testing.assert_close(out.logits[r, :n].double(), expected, rtol=1e-4, atol=1e-4)


def test_minus_target_replication_mode_equals_the_reference_row_map(wiki):
    """The official code's SDT row map: at input i, the chunk's words minus the word at i + 1 (the
    target); at the last input, all of them (evaluation feeds the chunk without its last token)."""
    model = make(wiki, "leta", True, sdt_mode="minus_target")
    _, batch = chunk_batch(wiki, context="others", max_sentence_length=8)
    for r in range(4):
        n = int(batch["attention_mask"][r].sum())
        ids = batch["input_ids"][r, :n]
        with torch.no_grad():
            got = model(input_ids=ids[None], context_bow=batch["context_bow"][r:r + 1]).logits[0]
        torch.testing.assert_close(got.double(), reference_logits(model, ids.tolist(), batch["context_bow"][r]),
                                   rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# causality: a property test that would catch a leak, and the leaky modes failing it
# ----------------------------------------------------------------------------------------------


def _document_logits(model, wiki, sentences, context, max_sentence_length=5):
    """{(sentence j, input position q in <bos> w_1 .. w_n): logits} of one document, as evaluate_perplexity
    feeds it (each chunk without its last token; contexts and sentence prefixes from the collator)."""
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context=context,
                                    max_sentence_length=max_sentence_length, sentence_prefix=True)
    rows = collator.encode_document(sentences)
    features = [{k: rows[k][i] for k in rows} for i in range(len(rows["input_ids"]))]
    batch = collator(features)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"][:, :-1], attention_mask=batch["attention_mask"][:, :-1],
                    context_bow=batch["context_bow"], sentence_prefix_bow=batch["sentence_prefix_bow"])
    result = {}
    for r, (j, k) in enumerate(zip(rows["sentence_index"], rows["chunk_index"])):
        for m in range(int(batch["attention_mask"][r, :-1].sum())):
            result[(j, k * max_sentence_length + m)] = out.logits[r, m]
    return result


def _perturb(wiki, sentences, rng):
    """Change word t' >= t of sentence j and a word of every later sentence; return (j, t, new sentences)."""
    vocab = wiki["topic_tok"].get_vocab()  # sorted by id: a seeded rng then picks the same words in every process
    vocab_words = [w for w in sorted(vocab, key=vocab.get) if w != "<unk>"]
    j = rng.randrange(len(sentences) - 1)
    t = rng.randrange(len(sentences[j]))
    new = [list(s) for s in sentences]
    for position in range(t, len(new[j])):
        if rng.random() < 0.7 or position == t:
            new[j][position] = rng.choice(vocab_words)
    for later in range(j + 1, len(new)):
        new[later][rng.randrange(len(new[later]))] = rng.choice(vocab_words)
    return j, t, new


@pytest.mark.parametrize("variant, sdt", VARIANTS, ids=IDS)
def test_causal_mode_predictions_never_depend_on_later_words(wiki, variant, sdt):
    """Changing any word at position >= t of sentence j, and words of later sentences, leaves every
    prediction made before reading word t of sentence j bit-identical (causal context + prefix SDT)."""
    model = make(wiki, variant, sdt)
    rng = random.Random(0)
    for doc in range(3):
        sentences = [s for s in wiki["valid"][doc]["sentences"] if s][:4]
        base = _document_logits(model, wiki, sentences, "preceding")
        for _ in range(3):
            j, t, new = _perturb(wiki, sentences, rng)
            changed = _document_logits(model, wiki, new, "preceding")
            # input position q reads <bos> w_1 .. w_q; word t (0-based) is at position t + 1
            for (jj, q), logits in base.items():
                if jj < j or (jj == j and q <= t):
                    assert torch.equal(logits, changed[(jj, q)]), (variant, sdt, j, t, jj, q)


@pytest.mark.parametrize("leak", ["sdt", "etr_mask", "paper_context"])
def test_the_leaky_replication_modes_do_read_later_words(wiki, leak):
    """The same property fails for the paper's modes, so the test above can fail."""
    kw = {"sdt": dict(variant="lta", sentence_topics=True, sdt_mode="minus_target"),
          "etr_mask": dict(variant="eta", etr_mask_includes_current_sentence=True),
          "paper_context": dict(variant="lta")}[leak]
    model = make(wiki, **kw)
    context = "others" if leak == "paper_context" else "preceding"
    # sentences of one chunk each (at most 30 predicted tokens): the leaks are within a sentence's chunk
    sentences = [s[:20] for s in wiki["valid"][0]["sentences"] if s][:4]
    base = _document_logits(model, wiki, sentences, context, max_sentence_length=30)
    new = [list(s) for s in sentences]
    j, t = 1, 1
    if leak == "paper_context":
        new[j + 1] = ["police", "court", "election", "president"] + new[j + 1]  # a later sentence only
    else:
        new[j][len(new[j]) - 1] = "police" if new[j][-1] != "police" else "court"  # the sentence's last word
        new[j][len(new[j]) - 2] = "election"
    changed = _document_logits(model, wiki, new, context, max_sentence_length=30)
    assert not torch.equal(base[(j, t)], changed[(j, t)])


def test_a_single_sentence_document_is_scored_with_an_empty_causal_context(wiki):
    model = make(wiki, "leta", True)
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", sentence_prefix=True)
    rows = collator.encode_document([["the", "court", "said", "the", "police", "arrested", "him"]])
    assert all(len(c) == 0 for c in rows["context_ids"])
    paper = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="others").encode_document(
        [["the", "court", "said"]])
    assert paper["context_ids"] == [[]]  # the package's "others" has no words either: nothing is dropped
    result = evaluate_perplexity(model, [[["the", "court", "said", "the", "police", "arrested", "him"]]], "causal",
                                 tokenizer=wiki["tok"], topic_tokenizer=wiki["topic_tok"])
    assert result["tokens"] == 8 and math.isfinite(result["perplexity"])


def test_evaluate_perplexity_refuses_to_call_a_leaky_model_causal(wiki):
    model = make(wiki, "leta", True, sdt_mode="minus_target")
    docs = wiki["valid"].select(range(2))
    kw = dict(tokenizer=wiki["tok"], topic_tokenizer=wiki["topic_tok"])
    for protocol in ("causal", "causal-carry"):
        with pytest.raises(ValueError, match=f"sdt_mode=minus_target.*not '{protocol}'"):
            evaluate_perplexity(model, docs, protocol, **kw)
    result = evaluate_perplexity(model, docs, "paper", **kw)
    assert result["protocol"] == "paper+sdt_mode=minus_target" and result["leaky_modes"] == ["sdt_mode=minus_target"]
    assert evaluate_perplexity(make(wiki, "leta", True), docs, "causal", **kw)["leaky_modes"] == []


def test_the_sentence_prefix_bag_stands_for_the_carried_state(wiki):
    """SDT's sentence prefix reaches a chunk either from sentence_prefix_bow (causal, state reset) or through
    the carried state (causal-carry): the sentence topics agree. (That the carried state continues a sentence
    exactly, chunk after chunk, is the state equivalence of test_model_contract.py.)"""
    model = make(wiki, "leta", True)
    ids = wiki["tok"](["the court said the police arrested the man in the city after the election of the "
                         "president and the senate"], return_tensors="pt")["input_ids"]
    bow = torch.zeros(1, len(wiki["topic_tok"]))
    bow[0, 5:40] = 1
    k = 7
    with torch.no_grad():
        first = model(input_ids=ids[:, :k], context_bow=bow, use_cache=True)
    # the prefix bag of words instead of the state (the LSTM state aside): the sentence part agrees
    prefix = torch.zeros(1, len(wiki["topic_tok"]))
    lm_to_topic = {lm: t for t, lm in enumerate(model.config.topic_word_ids) if lm >= 0}
    for token in ids[0, :k].tolist():
        if token in lm_to_topic:
            prefix[0, lm_to_topic[token]] += 1
    pre_state, _ = model.model.sentence_pre_activations(ids[:, k:], None, first.state[2], None, False)
    pre_bag, _ = model.model.sentence_pre_activations(ids[:, k:], None, None, prefix, False)
    torch.testing.assert_close(pre_state, pre_bag, rtol=1e-5, atol=1e-5)


def test_bos_restarts_the_sentence_topics(wiki):
    model = make(wiki, "lta", True)
    tok = wiki["tok"]
    one = tok(["the police arrested the man"], return_tensors="pt")["input_ids"]
    two = tok(["the court said", "the police arrested the man"], return_tensors="pt", padding=True)
    stream = torch.cat([two["input_ids"][0][two["attention_mask"][0].bool()], one[0]])[None]  # sentence 1, then 2
    pre_stream, _ = model.model.sentence_pre_activations(stream, None, None, None, False)
    pre_one, _ = model.model.sentence_pre_activations(one, None, None, None, False)
    torch.testing.assert_close(pre_stream[:, -one.shape[1]:], pre_one)


# ----------------------------------------------------------------------------------------------
# NVDM and ETR
# ----------------------------------------------------------------------------------------------


def test_nvdm_kl_matches_monte_carlo_and_proportions_are_on_the_simplex(wiki):
    model = make(wiki, "lta").train()
    tm = model.model.topic_model
    mean, log_sigma = torch.randn(1, 5), torch.randn(1, 5) * 0.3
    eps = torch.randn(200000, 5)
    z = mean + log_sigma.exp() * eps
    log_q = torch.distributions.Normal(mean, log_sigma.exp()).log_prob(z).sum(-1)
    log_p = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1)
    assert tm.kl(mean, log_sigma).item() == pytest.approx((log_q - log_p).mean().item(), abs=0.02)
    h, samples = tm.proportions(torch.randn(4, 5), torch.zeros(4, 5), sample=True)
    assert samples.shape == (3, 4, 5)  # num_topic_samples
    torch.testing.assert_close(h, samples.mean(0))
    torch.testing.assert_close(h.sum(-1), torch.ones(4))
    h_eval, none = tm.proportions(mean, log_sigma, sample=False)
    assert none is None and torch.allclose(h_eval, torch.softmax(mean, -1))


def test_etr_selects_only_present_words_and_averages_fewer_when_fewer_are_present(wiki):
    model = make(wiki, "eta", etr_top_n=3)
    V_c = model.config.topic_vocab_size
    W = model.model.topic_model.topic_word_weights().detach()
    vectors = model.model.topic_word_vectors()
    present = torch.zeros(3, V_c, dtype=torch.bool)
    present[0, [5, 9, 17, 40, 41]] = True  # more than N
    present[1, [7, 300]] = True  # fewer than N
    z = model.model.topic_embeddings(present)
    for k in range(model.config.num_topics):
        top = sorted([5, 9, 17, 40, 41], key=lambda w: -float(W[k, w]))[:3]
        torch.testing.assert_close(z[0, k], vectors[top].mean(0))
        torch.testing.assert_close(z[1, k], vectors[[7, 300]].mean(0))
    assert z[2].abs().sum() == 0  # nothing present: z_k = 0


def test_etr_selection_of_a_batch_equals_each_row_selected_alone(wiki):
    """The batched selection (every row's present words padded into one (K, R, P) top-k) against a naive loop that
    scores each row's present words alone, on rows with none, fewer than N and more than N present words, repeated
    rows and real contexts; and a row's z does not change with the rest of the batch."""
    model = make(wiki, "leta", etr_top_n=4)
    W = model.model.topic_model.topic_word_weights().detach()
    vectors = model.model.topic_word_vectors()
    candidates = model.model._etr_candidates()
    V_c = model.config.topic_vocab_size
    gen = torch.Generator().manual_seed(0)
    present = torch.rand(7, V_c, generator=gen) < torch.tensor([0.0, 0.0005, 0.002, 0.01, 0.05, 0.2, 0.01])[:, None]
    present[6] = present[3]  # a repeated row
    words = candidates.nonzero().squeeze(1)
    present[1] = False
    present[1, words[[3, 40]]] = True  # fewer present words than N = 4
    present[2] = False
    present[2, words[[5, 9, 17, 60, 61, 90]]] = True  # more than N
    bags = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="others")(
        [{"sentences": doc} for doc in wiki["train"]["sentences"][:3]])["context_bow"] > 0
    present = torch.cat([present, bags])
    z = model.model.topic_embeddings(present)
    assert (present & candidates).sum(1)[:3].tolist() == [0, 2, 6]
    for r in range(present.shape[0]):
        words = (present[r] & candidates).nonzero().squeeze(1)
        for k in range(model.config.num_topics):
            if words.numel() == 0:
                assert z[r, k].abs().sum() == 0
                continue
            top = words[W[k, words].topk(min(4, words.numel())).indices]
            torch.testing.assert_close(z[r, k], vectors[top].mean(0))
    torch.testing.assert_close(model.model.topic_embeddings(present[3:4]), z[3:4], rtol=1e-6, atol=1e-7)


def test_official_multiply_mask_selects_absent_words_when_few_present_ones_are_positive(wiki):
    model = make(wiki, "eta", etr_top_n=3, etr_selection="multiply_mask")
    W = model.model.topic_model.topic_word_weights().detach()
    k = 0
    negative = [w for w in range(1, W.shape[1]) if W[k, w] < 0][:2]
    present = torch.zeros(1, W.shape[1], dtype=torch.bool)
    present[0, negative] = True
    z = model.model.topic_embeddings(present)
    vectors = model.model.topic_word_vectors()
    top = (W[k] * present[0]).clone()
    top[0] = float("-inf")
    chosen = top.topk(3).indices
    assert not set(chosen.tolist()) & set(negative)  # absent zeros outrank present negative words
    torch.testing.assert_close(z[0, k], vectors[chosen].mean(0))


def test_softmax_of_proportions_weights_differ_by_at_most_e(wiki):
    model = make(wiki, "eta", etr_weighting="softmax_of_proportions")
    h = torch.softmax(torch.randn(6, 5) * 5, -1)
    w = model.model.etr_weights(h)
    assert bool(((w.max(-1).values / w.min(-1).values) <= math.e + 1e-6).all())


def test_etr_gives_the_decoder_no_gradient_and_the_encoder_some(wiki):
    model = make(wiki, "eta").train()
    bow = torch.zeros(2, model.config.topic_vocab_size)
    bow[:, 10:60] = 1
    c, h, z_k, _ = model.model.document_topics(2, "cpu", context_bow=bow, sample=True)
    c.pow(2).sum().backward()  # a loss on ETR alone
    tm = model.model.topic_model
    assert tm.decoder.weight.grad is None or tm.decoder.weight.grad.abs().sum() == 0
    assert tm.encoder.weight.grad.abs().sum() > 0 and tm.posterior_mean.weight.grad.abs().sum() > 0
    assert model.model.embed_tokens.weight.grad is None  # the LM's embeddings are read without gradient


def test_frozen_etr_vectors_are_required_checked_and_saved(wiki, tmp_path):
    model = make(wiki, "leta", etr_embedding="frozen", etr_embedding_size=7)
    _, batch = chunk_batch(wiki, rows=[0, 1])
    with pytest.raises(ValueError, match="call model.set_etr_embeddings"):
        model(input_ids=batch["input_ids"], context_bow=batch["context_bow"])
    with pytest.raises(ValueError, match=r"must have shape \(\d+, 7\)"):
        model.set_etr_embeddings(torch.randn(3, 7))
    model.set_etr_embeddings(torch.randn(model.config.topic_vocab_size, 7))
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], context_bow=batch["context_bow"]).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded.model.etr_word_embeddings, model.model.etr_word_embeddings)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=batch["input_ids"], context_bow=batch["context_bow"]).logits, logits)


# ----------------------------------------------------------------------------------------------
# loss
# ----------------------------------------------------------------------------------------------


def test_loss_is_alpha_weighted_sum_per_chunk_over_tokens(wiki):
    model = make(wiki, "leta", True, alpha=0.2, num_topic_samples=0)  # deterministic h in training too
    model.train()
    _, batch = chunk_batch(wiki)
    out = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "labels", "context_bow",
                                          "sentence_prefix_bow")})
    tokens = (batch["labels"][:, 1:] != -100).sum()
    tm = model.model.topic_model
    bow = batch["context_bow"]
    with torch.no_grad():
        mean, log_sigma = tm.posterior(bow)
        h = torch.softmax(mean, -1)
        recon = -(bow[:, 1:] * tm.word_log_probs(h)[:, 1:]).sum(-1)
    rows = (bow.sum(-1) > 0).float()
    assert out.bow_loss.item() == pytest.approx(float((recon * rows).sum() / tokens), rel=1e-5)
    assert out.kl_loss.item() == pytest.approx(float((tm.kl(mean, log_sigma) * rows).sum() / tokens), rel=1e-5)
    assert out.loss.item() == pytest.approx(0.8 * out.lm_loss.item() + 0.2 * (out.bow_loss + out.kl_loss).item(),
                                            rel=1e-5)
    assert (rows == 0).any()  # first sentences have an empty causal context: no reconstruction term
    out.loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters()), "every parameter is trained"


def test_a_continuation_chunk_without_its_sentence_prefix_is_a_clear_error_in_training(wiki):
    model = make(wiki, "lta", True).train()
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", max_sentence_length=5)
    rows = collator.prepare(wiki["valid"].select([0]))
    batch = collator([r for r in rows if r["chunk_index"] > 0][:2])
    with pytest.raises(ValueError, match=r"sentence_prefix=True"):
        model(**batch)


# ----------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------


def test_context_is_encoded_once_and_topic_ids_are_the_equal_mixture(wiki, monkeypatch):
    model = make(wiki, "leta", True)
    calls = []
    original = model.model.document_topics
    monkeypatch.setattr(model.model, "document_topics", lambda *a, **k: calls.append(1) or original(*a, **k))
    V_c = model.config.topic_vocab_size
    bow = torch.cat([torch.zeros(1, 5), torch.ones(1, V_c - 5)], 1) * (torch.rand(1, V_c) < 0.02)
    model.generate(**wiki["tok"](["the court"], return_tensors="pt"), context_bow=bow, max_new_tokens=5,
                   num_beams=2)
    assert calls == [1]
    a = model.generate(topic_ids=[1, 3], max_new_tokens=5, min_new_tokens=5)
    b = model.generate(topic_mixture=[0, 0.5, 0, 0.5, 0], max_new_tokens=5, min_new_tokens=5)
    assert torch.equal(a, b) and a[0, 0].item() == wiki["tok"].bos_token_id


def test_bad_conditioning_is_a_clear_error(wiki):
    model = make(wiki, "leta", True)
    prompt = wiki["tok"](["the senate"], return_tensors="pt")
    cases = [(dict(topic_ids=[5]), r"topic_ids must be in \[0, 5\), got 5"),
             (dict(topic_ids=["3"]), r"got '3' \(str\)"),
             (dict(topic_mixture=torch.ones(5)), "each topic_mixture row must sum to 1"),
             (dict(context_bow=torch.ones(4)), "context_bow must have .* columns"),
             (dict(topic_ids=[1], context_bow=torch.zeros(model.config.topic_vocab_size)), "Give at most one of")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            model.generate(**prompt, max_new_tokens=2, **kwargs)
        with pytest.raises(ValueError, match=match):
            model(**prompt, **kwargs)
    with pytest.raises(ValueError, match=r"topic_representation must have shape \(b, \d+\)"):
        model(**prompt, topic_representation=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="input_ids must be in"):
        model(input_ids=torch.tensor([[2, len(wiki["tok"]) + 5]]))


# ----------------------------------------------------------------------------------------------
# document features
# ----------------------------------------------------------------------------------------------


def test_document_representation_is_last_output_and_document_topics(wiki):
    model = make(wiki, "leta")
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="document", layout="sequence",
                                    label_column="label")  # unlabelled documents too
    batch = collator(list(collator.prepare(wiki["valid"].select([0, 1]))))
    assert "labels" not in batch
    reps = model.document_representation(batch)
    assert reps.shape == (2, model.config.hidden_size + model.config.document_topic_size)
    # the last top-layer output of the document <bos> s_1 <eos> <bos> s_2 <eos> ..., fed alone, and c of its bag
    n = int(batch["attention_mask"][1].sum())
    one = model.document_representation(input_ids=batch["input_ids"][1:, :n], context_bow=batch["context_bow"][1:])
    torch.testing.assert_close(reps[1:], one)
    with torch.no_grad():
        o = model.model(input_ids=batch["input_ids"][1:, :n]).last_hidden_state[:, -1]
    torch.testing.assert_close(one[:, :model.config.hidden_size], o)
    c, _, _, _ = model.model.document_topics(1, "cpu", context_bow=batch["context_bow"][1:])
    torch.testing.assert_close(one[:, model.config.hidden_size:], c)
    torch.testing.assert_close(model.document_topic_representation(batch["context_bow"][1:]), c)
    documents_layout = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="document", layout="documents")
    with pytest.raises(ValueError, match=r"one sequence per document.*layout='sequence'"):
        model.document_representation(documents_layout(list(documents_layout.prepare(wiki["valid"].select([0])))))


# ----------------------------------------------------------------------------------------------
# real data: Trainer (phases, every loss term), perplexity protocols, topics
# ----------------------------------------------------------------------------------------------


def _trainer(model, wiki, out, steps, phases=None, context="preceding"):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context=context, sentence_prefix=True)
    rows = collator.prepare(wiki["train"].select(range(100)))
    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=32, learning_rate=1e-2,
                             max_grad_norm=1.0, logging_steps=5, save_strategy="no", report_to=[], use_cpu=True,
                             disable_tqdm=True, seed=0)
    return TopicLMTrainer(model=model, args=args, train_dataset=rows, data_collator=collator,
                          pretraining_phases=phases)


def test_pretraining_phases_train_only_their_part_then_everything(wiki, tmp_path):
    model = make(wiki, "leta", True, num_topics=6).train()
    lm = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("model.topic_model")}
    ntm = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("model.topic_model")}
    trainer = _trainer(model, wiki, tmp_path, 3, phases=[("topic_model", 3)])
    assert [trainer.training_phase(s) for s in range(5)] == ["topic_model"] * 3 + ["joint"] * 2
    trainer.train()
    assert all(torch.equal(p, lm[n]) for n, p in model.named_parameters() if n in lm)
    assert any(not torch.equal(p, ntm[n]) for n, p in model.named_parameters() if n in ntm)
    model = make(wiki, "leta", True, num_topics=6).train()
    ntm = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("model.topic_model")}
    _trainer(model, wiki, tmp_path, 3, phases=[("lm", 3)]).train()
    assert all(torch.equal(p, ntm[n]) for n, p in model.named_parameters() if n in ntm)
    assert model.training_phase == "joint"
    with pytest.raises(ValueError, match="pretraining_phases must be"):
        _trainer(model, wiki, tmp_path, 3, phases=[("warmup", 3)])
    from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM
    with pytest.raises(ValueError, match="has no training phases"):
        _trainer(LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(wiki["tok"]))), wiki, tmp_path, 3,
                 phases=[("lm", 3)])


@pytest.fixture(scope="module")
def trained(wiki, tmp_path_factory):
    """A tiny LETA+SDT NCLM trained for 40 steps (after 10 topic-model steps) on 100 APNEWS documents."""
    torch.manual_seed(0)
    model = make(wiki, "leta", True, num_topics=8, embedding_size=32, hidden_size=32, encoder_hidden_size=32,
                 alpha=0.1).train()
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", sentence_prefix=True)
    held_out = collator(list(collator.prepare(wiki["valid"].select(range(4)))))

    def held_out_losses():
        model.eval()
        with torch.no_grad():
            out = model(**held_out)
        return {k: getattr(out, k).item() for k in ("loss", "lm_loss", "bow_loss", "kl_loss")}

    before = held_out_losses()
    out = tmp_path_factory.mktemp("nclm-apnews")
    trainer = _trainer(model.train(), wiki, out, 50, phases=[("topic_model", 10)])
    trainer.train()
    trainer.save_model(str(out))
    save_vocabularies(wiki["tok"], wiki["topic_tok"], out)
    return {"model": trainer.model.eval(), "logs": trainer.state.log_history, "path": out, "before": before,
            "after": held_out_losses()}


@pytest.mark.slow
def test_trainer_run_on_apnews_logs_every_loss_term_and_the_loss_falls(trained):
    logs = [entry for entry in trained["logs"] if "loss" in entry]
    assert len(logs) == 10
    joint = [entry for entry in logs if entry["step"] > 10]
    for entry in joint:
        assert {"lm_loss", "kl_loss", "bow_loss"} <= entry.keys()
        assert entry["loss"] == pytest.approx(0.9 * entry["lm_loss"] + 0.1 * (entry["bow_loss"] + entry["kl_loss"]),
                                              abs=0.01)
    before, after = trained["before"], trained["after"]
    assert after["loss"] < before["loss"] and after["lm_loss"] < before["lm_loss"] - 1.0
    assert after["bow_loss"] < before["bow_loss"]


@pytest.mark.slow
def test_perplexity_protocols_topics_and_steering_interface(trained, wiki):
    model = AutoModelForCausalLM.from_pretrained(trained["path"]).eval()
    docs = wiki["valid"].select(range(6))
    results = {p: evaluate_perplexity(model, docs, p) for p in ("paper", "causal", "causal-carry")}
    for protocol, result in results.items():
        assert result["protocol"] == protocol and 1 < result["perplexity"] < len(wiki["tok"])
    assert results["paper"]["tokens"] == results["causal"]["tokens"] == results["causal-carry"]["tokens"]
    mismatched = evaluate_perplexity(model, docs, "causal", mismatched_context=True)
    assert mismatched["tokens"] == results["causal"]["tokens"] and "mismatched" in mismatched["context"]
    topics = model.get_topics(top_n=10)  # the topic tokenizer saved next to the model
    assert len(topics) == 8 and all(len(t) == 10 and "<unk>" not in t for t in topics)
    dist = model.topic_word_distributions()
    assert dist.shape == (8, len(wiki["topic_tok"])) and torch.allclose(dist.sum(-1), torch.ones(8))
    assert dist[:, 0].abs().sum() == 0
    h = model.infer_topics(torch.ones(2, len(wiki["topic_tok"])))
    assert h.shape == (2, 8) and torch.allclose(h.sum(-1), torch.ones(2))
    out = model.generate(topic_ids=[3], max_new_tokens=8, min_new_tokens=8, do_sample=True)
    assert out.shape == (1, 9)


@pytest.mark.parametrize("size, hidden, layers", [("small", 600, 1), ("large", 900, 2)])
def test_hub_configs_are_the_papers_sizes_and_build(size, hidden, layers):
    from pathlib import Path

    from topic_lm_hf.arguments import ModelArguments
    from topic_lm_hf.commands import make_config

    path = Path(__file__).resolve().parents[1] / "hub_configs" / f"nclm-apnews-{size}.json"
    config = make_config(ModelArguments(config_file=str(path)))
    assert isinstance(config, NCLMConfig) and config.leaky_modes() == []
    assert (config.hidden_size, config.num_hidden_layers, config.num_topics, config.alpha) == (hidden, layers, 150, 0.01)
    assert config.topic_representation_size == 2 * (300 + 150)  # LETA + SDT, E = 300


def test_a_leaky_model_is_labelled_by_the_trainer_and_the_command_line(wiki, tmp_path, capsys):
    """Trainer.evaluate names a leaky model's perplexity eval_perplexity_leaky; `topic-lm evaluate` with its default
    protocols reports it under paper (labelled) and says which protocols it skipped, instead of failing."""
    from topic_lm_hf.cli import main

    model = make(wiki, "lta", True, sdt_mode="minus_target")
    collator = TopicContextCollator.for_model(model, wiki["tok"], wiki["topic_tok"])
    args = TrainingArguments(str(tmp_path / "out"), per_device_eval_batch_size=16, report_to=[], use_cpu=True)
    trainer = TopicLMTrainer(model=model, args=args, eval_dataset=collator.prepare(wiki["valid"].select(range(5))),
                             data_collator=collator)
    metrics = trainer.evaluate()
    assert "eval_perplexity_leaky" in metrics and "eval_perplexity" not in metrics
    model.save_pretrained(tmp_path / "m")
    save_vocabularies(wiki["tok"], wiki["topic_tok"], tmp_path / "m")
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join("\t".join(" ".join(s) for s in d["sentences"]) for d in wiki["valid"].select(range(3))))
    main(["evaluate", "--model_name_or_path", str(tmp_path / "m"), "--validation_file", str(valid)])
    out = capsys.readouterr().out
    assert "reads words it predicts (sdt_mode=minus_target" in out and "skipped: causal, causal-carry" in out
    assert "| paper+sdt_mode=minus_target |" in out
