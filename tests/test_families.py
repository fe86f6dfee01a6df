"""What every transformers model supports, checked on every family of the package (LSTM LM, TCNLM
and its naive MoE, TopicRNN with each cell) on real APNEWS batches: loading in bfloat16, per-layer
hidden states, gradient checkpointing, resizing the token embeddings, stop strings."""

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TCNLMConfig, TCNLMForCausalLM, TopicContextCollator,
                         TopicRNNConfig, TopicRNNForCausalLM)

FAMILIES = ["lstm_lm", "tcnlm", "naive_moe", "topic_rnn-gru", "topic_rnn-lstm"]
TOPIC_FAMILIES = [f for f in FAMILIES if f != "lstm_lm"]


def make(family, tok, topic_tok, layers=2, dropout=0.0, **kw):
    torch.manual_seed(0)
    sizes = dict(embedding_size=12, hidden_size=16, num_hidden_layers=layers, dropout=dropout, initializer_range=0.3)
    if family == "lstm_lm":
        return LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), **sizes, **kw))
    if family in ("tcnlm", "naive_moe"):
        return TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=3,
                                            num_factors=8, encoder_hidden_size=16, topic_embedding_size=8,
                                            lm_type=family, **sizes, **kw))
    cell = family.split("-")[1]
    return TopicRNNForCausalLM(TopicRNNConfig.from_tokenizers(tok, topic_tok, cell=cell, num_topics=3,
                                                              inference_hidden_size=16, **sizes, **kw))


@pytest.fixture(scope="module")
def batch(apnews):
    """Left- and right-padded real sentence chunks with their context bags of words."""
    collator = TopicContextCollator(apnews["tok"], apnews["topic_tok"], context="others", max_sentence_length=12)
    rows = collator.prepare(apnews["train"].select(range(2)))
    return collator([rows[i] for i in range(6)])


def lm_inputs(family, batch, labels=True):
    keys = ["input_ids", "attention_mask"] + (["labels"] if labels else [])
    out = {k: batch[k] for k in keys}
    if family != "lstm_lm":
        out["context_bow"] = batch["context_bow"]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_forward_loss_and_generate(family, apnews, batch, tmp_path):
    tok, topic_tok = apnews["tok"], apnews["topic_tok"]
    model = make(family, tok, topic_tok).eval()
    model.save_pretrained(tmp_path)
    half = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert half.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in half.parameters())
    inputs = lm_inputs(family, batch, labels=False)
    with torch.no_grad():
        ref = torch.log_softmax(model(**inputs).logits.float(), -1)
        got = torch.log_softmax(half(**inputs).logits.float(), -1)
    real = batch["attention_mask"].bool()
    assert (got - ref)[real].abs().max() < 0.15  # bfloat16 keeps ~3 significant digits
    half.train()
    out = half(**lm_inputs(family, batch))
    assert torch.isfinite(out.loss) and abs(out.loss.item() - model.train()(**lm_inputs(family, batch)).loss.item()) < 0.1
    out.loss.backward()
    assert all(p.grad is None or p.grad.dtype == torch.bfloat16 for p in half.parameters())
    half.eval()
    prompt = tok(["the senate said"], return_tensors="pt")
    conditioning = [{}] if family == "lstm_lm" else [{"context_bow": batch["context_bow"][:1]}]
    if family in ("tcnlm", "naive_moe"):
        conditioning += [{"topic_ids": [1]}, {"topic_mixture": [0.2, 0.3, 0.5]}]
    for kwargs in conditioning:
        generated = half.generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False, **kwargs)
        assert generated.shape == (1, prompt["input_ids"].shape[1] + 5)
