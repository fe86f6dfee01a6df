"""rGBN-RNN trained with its LSTM state carried across the chunks of each document (``carry_token_state``), on real
Wikipedia documents (wikipedia-sample): a documents batch gives the per-token log-probabilities of ``causal-carry``
evaluation (chunk after chunk with ``state``), the default gives those of zero-state chunks as before, gradients reach
earlier chunks, and the option survives save / load."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM, TopicContextCollator, evaluate_perplexity
from topic_lm_hf.carried_state import run_carried_chunks
from topic_lm_hf.data import documents_from_lists

pytestmark = pytest.mark.usefixtures("one_thread")

# Sentences kept of the first wikipedia-sample training documents: unsorted and of different lengths (padding chunks),
# and at MAX_LENGTH tokens a chunk most sentences span several chunks.
SENTENCES = (2, 5, 1, 4)
MAX_LENGTH = 6
KEYS = ("input_ids", "attention_mask", "context_bow", "chunk_mask", "sentence_index")


def make(wiki, layers, **kw):
    torch.manual_seed(0)
    kw = {"topic_sizes": [8, 6][:layers], "hidden_sizes": [16, 12][:layers], "embedding_size": 12, "dropout": 0.0,
          "initializer_range": 0.3, **kw}
    return RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], **kw)).double().eval()


def documents(wiki):
    return [doc[:n] for doc, n in zip(wiki["train"]["sentences"], SENTENCES)]


def documents_batch(model, wiki):
    """The documents batch ``causal-carry`` evaluation collates (the same collator), in the documents' order."""
    collator = TopicContextCollator.for_model(model, wiki["tok"], wiki["topic_tok"], protocol="causal-carry",
                                              max_sentence_length=MAX_LENGTH, max_context_tokens=300)
    rows = collator.prepare(_dataset(wiki))
    return collator([rows[i] for i in range(len(rows))])


def _dataset(wiki):
    return documents_from_lists(documents(wiki))


def document_log_probs(model, batch, **kw):
    """Per-token log-probabilities (b, c, s - 1) of the targets of a documents batch in one call, and their mask."""
    with torch.no_grad():
        logits = model(**{k: batch[k] for k in KEYS}, **kw).logits
    log_probs = torch.log_softmax(logits[..., :-1, :].double(), -1)
    lp = log_probs.gather(-1, batch["input_ids"][..., 1:].unsqueeze(-1)).squeeze(-1)
    return lp, batch["attention_mask"][..., 1:].bool() & batch["chunk_mask"].bool().unsqueeze(-1)


def chunk_log_probs(model, batch, carry_lstm: bool):
    """The same, chunk after chunk as ``causal-carry`` evaluation feeds them (``run_carried_chunks``; inputs chunk[:-1],
    the mask of the real targets, ``state`` carried); ``carry_lstm=False`` zeroes the LSTM part of the state before
    every chunk (the sentence recurrence still carried): the zero-state chunks of the paper."""
    b, c, s = batch["input_ids"].shape
    lp = torch.zeros(b, c, s - 1, dtype=torch.float64)
    L = model.config.num_layers

    def step(k, chunk, state):
        if state is not None and not carry_lstm:
            state = tuple(torch.zeros_like(x) for x in state[:2 * L]) + state[2 * L:]
        ids, mask = chunk["input_ids"], chunk["attention_mask"]
        with torch.no_grad():
            out = model(input_ids=ids[:, :-1], attention_mask=mask[:, 1:], context_bow=chunk["context_bow"],
                        state=state, use_cache=True)
        log_probs = torch.log_softmax(out.logits.double(), -1)
        lp[chunk["doc"], k] = log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return out.state

    run_carried_chunks({**{k: batch[k] for k in ("input_ids", "attention_mask", "context_bow", "chunk_mask")},
                        "doc": torch.arange(b)}, step)
    return lp


@pytest.mark.parametrize("layers, coupling", [(1, "same"), (2, "same"), (2, "reversed")])
def test_a_documents_batch_with_carried_token_state_is_causal_carry_evaluation(wiki, layers, coupling):
    model = make(wiki, layers, coupling=coupling, carry_token_state=True)
    batch = documents_batch(model, wiki)
    c = batch["chunk_mask"].sum(1)
    assert len(set(c.tolist())) > 1 and bool((~batch["chunk_mask"].bool()).any())  # padding chunks
    continued = (batch["input_ids"][..., 0] != model.config.bos_token_id) & batch["chunk_mask"].bool()
    assert bool(continued.any())  # sentences longer than one chunk
    lp, mask = document_log_probs(model, batch)
    want = chunk_log_probs(model, batch, carry_lstm=True)
    torch.testing.assert_close(lp[mask], want[mask], rtol=0, atol=1e-6)
    # the LSTM state matters: without it only the documents' first chunks agree
    zero = chunk_log_probs(model, batch, carry_lstm=False)
    assert (zero[:, 0] - want[:, 0])[mask[:, 0]].abs().max() < 1e-9
    assert (zero[:, 1:] - want[:, 1:])[mask[:, 1:]].abs().max() > 1e-3
    # lm_loss of the batch (labels) is the mean NLL, and evaluate_perplexity's causal-carry NLL is its sum
    with torch.no_grad():
        out = model(**{k: batch[k] for k in KEYS}, labels=batch["labels"])
    nll = -want[mask].sum()
    assert out.lm_loss.item() == pytest.approx((nll / mask.sum()).item(), rel=1e-6)
    result = evaluate_perplexity(model, _dataset(wiki), "causal-carry", tokenizer=wiki["tok"],
                                 topic_tokenizer=wiki["topic_tok"], max_sentence_length=MAX_LENGTH)
    # (evaluate_perplexity takes each token's NLL in float32, the model's own precision)
    assert result["tokens"] == int(mask.sum()) and result["nll"] == pytest.approx(nll.item(), rel=1e-7)
    # per-layer hidden states come back per chunk, as without the option
    with torch.no_grad():
        hidden = model(**{k: batch[k] for k in KEYS}, output_hidden_states=True).hidden_states
    assert len(hidden) == layers + 1 and hidden[-1].shape[:3] == batch["input_ids"].shape


@pytest.mark.parametrize("layers", [1, 2])
def test_the_default_runs_every_chunk_from_a_zero_state_as_before(wiki, layers):
    model = make(wiki, layers)
    assert model.config.carry_token_state is False
    batch = documents_batch(model, wiki)
    lp, mask = document_log_probs(model, batch)
    torch.testing.assert_close(lp[mask], chunk_log_probs(model, batch, carry_lstm=False)[mask], rtol=0, atol=1e-6)
    # the same weights with the option: forward(carry_token_state=False) is the default, and paper / causal
    # evaluation (every chunk from a zero state by definition) does not change
    carried = make(wiki, layers, carry_token_state=True)
    carried.load_state_dict(model.state_dict())
    assert torch.equal(document_log_probs(carried, batch, carry_token_state=False)[0], lp)
    assert not torch.allclose(document_log_probs(carried, batch)[0][mask], lp[mask])
    kw = dict(tokenizer=wiki["tok"], topic_tokenizer=wiki["topic_tok"], max_sentence_length=MAX_LENGTH)
    assert evaluate_perplexity(carried, _dataset(wiki), "causal", **kw)["nll"] == \
        pytest.approx(evaluate_perplexity(model, _dataset(wiki), "causal", **kw)["nll"], rel=1e-12)


def test_gradients_flow_through_the_carried_state_and_the_option_saves(wiki, tmp_path):
    model = make(wiki, 2, carry_token_state=True, dropout=0.2).train()
    batch = documents_batch(model, wiki)
    out = model(**batch)
    out.loss.backward()
    for lstm in model.model.lstms:
        assert all(p.grad is not None and p.grad.abs().max() > 0 for p in lstm.parameters())
    model.model._tlasgr_pending = None
    model.zero_grad()
    # a later chunk's predictions depend on the tokens of the document's first chunk (and only with the option)
    model.eval()
    embeds = model.model.embed_tokens(batch["input_ids"]).detach()
    for carry in (True, False):
        x = embeds.clone().requires_grad_()
        logits = model(inputs_embeds=x, **{k: batch[k] for k in KEYS[1:]}, carry_token_state=carry).logits
        logits[1, 1].sum().backward()
        assert (x.grad[1, 0].abs().max() > 0) == carry
    # inputs_embeds give what input_ids give
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_embeds=embeds, **{k: batch[k] for k in KEYS[1:]}).logits,
                                   model(**{k: batch[k] for k in KEYS}).logits)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).double().eval()
    assert loaded.config.carry_token_state is True
    torch.testing.assert_close(document_log_probs(loaded, batch)[0], document_log_probs(model, batch)[0])
    with pytest.raises(ValueError, match="carry_token_state must be a bool"):
        RGBNRNNConfig(carry_token_state="yes")


def test_train_theta_mean_gives_the_language_model_the_posterior_mean_in_training(wiki):
    """``train_theta="mean"`` (a matched topic-free baseline's constant topics): in training the LM reads the posterior
    mean, so two passes agree and equal evaluation's under ``eval_theta="mean"``; the default draws a sample."""
    batch = documents_batch(make(wiki, 1), wiki)
    inputs = {k: batch[k] for k in KEYS}
    mean = make(wiki, 1, carry_token_state=True, train_theta="mean")
    with torch.no_grad():
        first, second = mean.train()(**inputs).logits, mean(**inputs).logits
        mean.model._tlasgr_pending = None
        torch.testing.assert_close(first, second)
        torch.testing.assert_close(first, mean.eval()(**inputs).logits)
        sampled = make(wiki, 1, carry_token_state=True).train()
        assert not torch.allclose(sampled(**inputs).logits, sampled(**inputs).logits)
        sampled.model._tlasgr_pending = None
    assert mean.config.to_dict()["train_theta"] == "mean"
    with pytest.raises(ValueError, match="train_theta must be one of"):
        RGBNRNNConfig(train_theta="median")


def test_the_learned_topic_term_reads_each_chunks_topics_in_a_documents_batch_as_chunk_by_chunk(wiki, tmp_path):
    """``topic_output_bias="learned"``: B theta^1 (normalised) added to the logits, B zero at initialisation (the
    model is then the one without it, weight for weight); once B is not zero, a documents batch gives the
    log-probabilities of causal-carry evaluation chunk after chunk (each chunk's own theta), another document's
    context changes them, and B survives save / load."""
    plain = make(wiki, 1, carry_token_state=True)
    model = make(wiki, 1, carry_token_state=True, topic_output_bias="learned")
    assert model.topic_bias.weight.shape == (len(wiki["tok"]), 8) and not model.topic_bias.weight.any()
    missing = model.load_state_dict(plain.state_dict(), strict=False).missing_keys  # every other weight alike
    assert missing == ["topic_bias.weight"]
    batch = documents_batch(model, wiki)
    lp, mask = document_log_probs(model, batch)
    torch.testing.assert_close(lp[mask], document_log_probs(plain, batch)[0][mask], rtol=0, atol=1e-9)
    with torch.no_grad():
        model.topic_bias.weight.normal_(0, 2.0)
    lp, mask = document_log_probs(model, batch)
    torch.testing.assert_close(lp[mask], chunk_log_probs(model, batch, carry_lstm=True)[mask], rtol=0, atol=1e-6)
    assert (lp - document_log_probs(plain, batch)[0])[mask].abs().max() > 1e-2
    other = {**batch, "context_bow": batch["context_bow"].roll(1, dims=0)}  # each document given another's contexts
    assert (document_log_probs(model, other)[0] - lp)[mask].abs().max() > 1e-3
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).double().eval()
    torch.testing.assert_close(again.topic_bias.weight, model.topic_bias.weight)
