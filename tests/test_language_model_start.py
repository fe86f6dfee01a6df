"""Starting a topic family from a trained LSTM language model (``from_language_model``): a folder saved by the LSTM
LM, trained a few steps on real wikipedia-sample text, is taken into TopicLSTM and rGBN-RNN of the same sizes; at
the start their predictions are the language model's (exactly for TopicLSTM under topic_mixture zero, within its
gate's 1.8 % for rGBN-RNN), and they train from there. Families without an LSTM of the LSTM LM's form, other
model types and other sizes are refused in one line."""

import pytest
import torch

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, RGBNRNNConfig, RGBNRNNForCausalLM, TCNLMConfig,
                         TCNLMForCausalLM, TopicContextCollator, TopicRNNConfig, TopicRNNForCausalLM)
from topic_lm_hf.models import modeling_rgbn_rnn

SIZES = dict(embedding_size=16, hidden_size=24)


@pytest.fixture(scope="module")
def chunks(wiki):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="preceding", max_sentence_length=12)
    rows = collator.prepare(wiki["train"].select(range(6)))
    return [collator([rows[i] for i in range(start, start + 8)]) for start in range(0, 40, 8)]


@pytest.fixture(scope="module")
def language_model_folder(wiki, chunks, tmp_path_factory):
    """An LSTM LM trained 20 Adam steps on real chunks, saved as a folder."""
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(wiki["tok"]), dropout=0.0, **SIZES)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(20):
        batch = chunks[step % len(chunks)]
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = tmp_path_factory.mktemp("lstm")
    model.save_pretrained(folder)
    return folder


def _logits(model, batch, **topics):
    with torch.no_grad():
        return model.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **topics).logits


def test_topiclstm_started_from_a_language_model_predicts_as_it_does_and_trains(wiki, chunks, language_model_folder):
    """The paper's TopicLSTM: exactly the LSTM's predictions under ``topic_mixture`` zero; its own topics add its
    topic term b_i^T theta, and a training step on them reaches B and the inference network."""
    lm = LSTMLMForCausalLM.from_pretrained(language_model_folder)
    config = TopicRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], cell="lstm", num_topics=5, dropout=0.0,
                                            **SIZES)
    model = TopicRNNForCausalLM.from_language_model(language_model_folder, config)
    batch = chunks[0]
    real = batch["attention_mask"].bool()
    expected = torch.log_softmax(_logits(lm, batch), -1)[real]
    got = _logits(model, batch, topic_mixture=torch.zeros(len(batch["input_ids"]), 5))[real]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(_logits(model, batch, context_bow=batch["context_bow"])[real], expected, atol=1e-3)
    model.train()
    out = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "labels", "context_bow")})
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.topic_head.weight.grad.abs().sum() > 0
    assert model.model.inference_net.mean.weight.grad.abs().sum() > 0


def test_topiclstm_by_the_steering_recipe_starts_with_its_topic_prior_off_and_its_topics_distinct(
        wiki, language_model_folder):
    """By the steering recipe (softmax theta, the shared topic output prior, the topic mixture's gate where chosen):
    the LSTM's weights are taken, the prior's weight starts at 0 and the mixture's gate nearly closed, and B keeps its
    distinct initial topics (the topic model's pre-training starts from them)."""
    from topic_lm_hf.pretraining import steering_recipe

    lm = LSTMLMForCausalLM.from_pretrained(language_model_folder)
    for extra in ({}, {"topic_output_bias": "mixture"}):
        config = TopicRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], cell="lstm", num_topics=5,
                                                **SIZES, **{**steering_recipe("topic_rnn"), **extra})
        model = TopicRNNForCausalLM.from_language_model(lm, config)
        torch.testing.assert_close(model.model.rnn.weight_hh_l0, lm.model.lstm.weight_hh_l0)
        if model.topic_prior_weight is not None:
            assert float(model.topic_prior_weight.detach()) == 0.0
        if model.topic_gate is not None:
            assert float(model.topic_gate.bias.detach()) == -4.0 and model.topic_gate.weight.abs().sum() == 0
        B = model.topic_head.weight  # (V_c, K): no two topics alike
        assert torch.cdist(B.T, B.T).triu(1)[torch.ones(5, 5).triu(1).bool()].min() > 0


def test_rgbn_rnn_started_from_a_language_model_passes_its_lstm_through_its_gate(wiki, chunks, language_model_folder,
                                                                                  monkeypatch):
    lm = LSTMLMForCausalLM.from_pretrained(language_model_folder)
    config = RGBNRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], topic_sizes=[6], dropout=0.0,
                                           embedding_size=SIZES["embedding_size"], hidden_sizes=[SIZES["hidden_size"]])
    batch = chunks[1]
    real = batch["attention_mask"].bool()
    expected = torch.log_softmax(_logits(lm, batch), -1)[real]
    theta = torch.zeros(len(batch["input_ids"]), 6)
    model = RGBNRNNForCausalLM.from_language_model(lm, config)
    gap = (torch.log_softmax(_logits(model, batch, topic_mixture=theta), -1)[real] - expected).abs().max()
    assert 0 < gap < 0.5  # 1.8 % of the topic candidate comes through
    monkeypatch.setattr(modeling_rgbn_rnn, "LANGUAGE_MODEL_GATE_BIAS", 40.0)  # the gate closed: the LSTM exactly
    closed = RGBNRNNForCausalLM.from_language_model(lm, config)
    got = torch.log_softmax(_logits(closed, batch, topic_mixture=theta), -1)[real]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_what_cannot_start_from_a_language_model_is_refused_in_one_line(wiki, language_model_folder):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    tcnlm = TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=5, **SIZES)
    with pytest.raises(ValueError, match="TCNLMForCausalLM has no LSTM of the LSTM LM's form"):
        TCNLMForCausalLM.from_language_model(language_model_folder, tcnlm)
    gru = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="gru", num_topics=5, **SIZES)
    with pytest.raises(ValueError, match="cell='gru' has no LSTM"):
        TopicRNNForCausalLM.from_language_model(language_model_folder, gru)
    wider = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="lstm", num_topics=5, embedding_size=16,
                                           hidden_size=32)
    with pytest.raises(ValueError, match=r"weight_ih_l0 is \(96, 16\) .* is \(128, 16\): build the configuration"):
        TopicRNNForCausalLM.from_language_model(language_model_folder, wider)
    deeper = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="lstm", num_topics=5, num_hidden_layers=2, **SIZES)
    with pytest.raises(ValueError, match="more LSTM layers than the language model's 1"):
        TopicRNNForCausalLM.from_language_model(language_model_folder, deeper)
    small = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="lstm", num_topics=5, **SIZES)
    not_an_lstm = TopicRNNForCausalLM(small)
    with pytest.raises(ValueError, match="takes an LSTM language model .* got 'topic_rnn'"):
        TopicRNNForCausalLM.from_language_model(not_an_lstm, small)
    projected = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=16, hidden_size=24,
                                               tie_word_embeddings=True))
    with pytest.raises(ValueError, match="projects its LSTM's outputs"):
        TopicRNNForCausalLM.from_language_model(projected, small)
    two_layers = RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[6, 3], embedding_size=16,
                                               hidden_sizes=[24, 24])
    with pytest.raises(ValueError, match="rGBN-RNN with 2 layers reads every layer's output"):
        RGBNRNNForCausalLM.from_language_model(language_model_folder, two_layers)


def test_a_started_model_with_its_language_model_frozen_trains_its_topic_path_alone(wiki, chunks,
                                                                                    language_model_folder, tmp_path):
    """``freeze_language_model``: the weights taken from the LSTM LM (embeddings, LSTM, output layer) get no gradient
    and stay out of Trainer's optimizer, so a step moves the topic path alone; ``frozen=False`` trains them again."""
    from transformers import Trainer, TrainingArguments

    lm = LSTMLMForCausalLM.from_pretrained(language_model_folder)
    config = RGBNRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], topic_sizes=[6], dropout=0.0,
                                           embedding_size=SIZES["embedding_size"], hidden_sizes=[SIZES["hidden_size"]])
    model = RGBNRNNForCausalLM.from_language_model(lm, config)
    taken = model.language_model_parameters()
    assert {id(p) for p in taken} == {id(p) for p in (model.model.embed_tokens.weight, *model.model.lstms[0].parameters(),
                                                     model.lm_head.weight, model.lm_head.bias)}
    model.freeze_language_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path), learning_rate=1e-2, report_to=[]))
    optimizer = trainer.create_optimizer()
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized and not optimized & {id(p) for p in taken}
    batch = chunks[2]
    model.train()(**{k: batch[k] for k in ("input_ids", "attention_mask", "labels", "context_bow")}).loss.backward()
    optimizer.step()
    moved = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}
    lm_names = {name for name, p in model.named_parameters() if any(p is q for q in taken)}
    assert moved and not moved & lm_names and any(name.startswith("model.gates.0") for name in moved)
    torch.testing.assert_close(model.model.lstms[0].weight_hh_l0, lm.model.lstm.weight_hh_l0)
    model.freeze_language_model(False)
    assert all(p.requires_grad for p in taken)
    tcnlm = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], num_topics=5, **SIZES))
    with pytest.raises(ValueError, match="TCNLMForCausalLM has no LSTM language model's weights to freeze"):
        tcnlm.freeze_language_model()


@pytest.mark.parametrize("model_class,config_class,sizes", [
    (RGBNRNNForCausalLM, RGBNRNNConfig, dict(topic_sizes=[6], embedding_size=SIZES["embedding_size"],
                                             hidden_sizes=[SIZES["hidden_size"]])),
    (TopicRNNForCausalLM, TopicRNNConfig, dict(cell="lstm", num_topics=5, **SIZES))])
def test_a_held_topic_prior_keeps_its_weight_through_the_start_training_and_saving(
        wiki, chunks, language_model_folder, tmp_path, model_class, config_class, sizes):
    """``topic_prior_weight_trainable=False``: the shared prior's lambda stays at ``topic_prior_weight_init`` when
    the model starts from a language model (a learned one starts at 0), stays out of Trainer's optimizer while the
    LSTM's weights move, and is held again in the model loaded from its folder."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    lm = LSTMLMForCausalLM.from_pretrained(language_model_folder)

    def started(**prior):
        config = config_class.from_tokenizers(wiki["tok"], wiki["topic_tok"], dropout=0.0, topic_output_bias="beta",
                                              topic_prior_weight_init=1.0, **sizes, **prior)
        return model_class.from_language_model(lm, config)

    learned = started()
    assert float(learned.topic_prior_weight.detach()) == 0.0 and learned.topic_prior_weight.requires_grad
    model = started(topic_prior_weight_trainable=False)
    assert float(model.topic_prior_weight.detach()) == 1.0 and not model.topic_prior_weight.requires_grad
    assert not torch.allclose(_logits(model, chunks[1], topic_ids=[[1]] * 8),
                              _logits(learned, chunks[1], topic_ids=[[1]] * 8))  # the held prior acts from the start
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path), learning_rate=1e-2, report_to=[]))
    optimizer = trainer.create_optimizer()
    assert not any(p is model.topic_prior_weight for group in optimizer.param_groups for p in group["params"])
    before = model.lm_head.weight.detach().clone()
    batch = chunks[2]
    model.train()(**{k: batch[k] for k in ("input_ids", "attention_mask", "labels", "context_bow")}).loss.backward()
    optimizer.step()
    assert float(model.topic_prior_weight.detach()) == 1.0 and not torch.equal(model.lm_head.weight, before)
    model.save_pretrained(tmp_path / "held")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "held")
    assert loaded.config.topic_prior_weight_trainable is False
    assert float(loaded.topic_prior_weight.detach()) == 1.0 and not loaded.topic_prior_weight.requires_grad
