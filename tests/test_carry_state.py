"""Training with the recurrent state carried across a document (TopicLMTrainer(carry_state=True)): the
vectorised loss and gradients against a per-document loop, the state really carries, a short wikipedia-sample run
improves the causal-carry perplexity, and bad inputs get clear errors."""

import math

import pytest
import torch
from conftest import tiny_model, variants
from transformers import TrainingArguments

from topic_lm_hf import TopicContextCollator, TopicLMTrainer, documents_from_lists, evaluate_perplexity
from topic_lm_hf.carried_state import carried_state_loss

pytestmark = pytest.mark.usefixtures("one_thread")

# The families with a recurrent `state` in forward that the per-document loop is checked on (one variant each; not
# rGBN-RNN, which reads whole documents), and the overrides each needs. TCNLM's topic terms are per predicted token
# with topic_loss_normalization="lm_tokens", so each chunk's own loss is additive.
LOOP_OVERRIDES = {"tcnlm": {"topic_loss_normalization": "lm_tokens", "kl_annealing_steps": 0}}
LOOP_FAMILIES = {name: LOOP_OVERRIDES.get(name, {}) for name in variants(representative=True, reads_documents=False)}


def short_documents(wiki, sentences=(2, 5, 3)):
    """Real wikipedia-sample documents cut to different numbers of sentences (the batch then has padding chunks)."""
    docs = wiki["train"]["sentences"][:len(sentences)]
    return documents_from_lists([doc[:n] for doc, n in zip(docs, sentences)])


def documents_batch(wiki, context="preceding", max_sentence_length=8, sentence_prefix=False):
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"] if context != "none" else None,
                                    context=context, layout="documents", max_sentence_length=max_sentence_length,
                                    sentence_prefix=sentence_prefix)
    return collator([{"sentences": s} for s in short_documents(wiki)["sentences"]])


def naive_loss(model, batch, bptt_chunks=None):
    """Each document alone, chunk by chunk: the model's loss on the whole chunk (n predicted tokens) from the
    carried state, then the state after the chunk's tokens but its last (the next chunk's first), as
    causal-carry evaluation feeds them. Returns sum(n * loss) / sum(n)."""
    total, tokens = 0.0, 0
    for i in range(batch["input_ids"].shape[0]):
        state = None
        for k in range(int(batch["chunk_mask"][i].sum())):
            length = int(batch["attention_mask"][i, k].sum())
            ids = batch["input_ids"][i, k, :length].unsqueeze(0)
            bow = {key: batch[key][i, k].unsqueeze(0).double() for key in ("context_bow", "sentence_prefix_bow")
                   if key in batch}
            out = model(input_ids=ids, labels=ids, state=state, **bow)
            n = length - 1
            total = total + n * out.loss.double()
            tokens += n
            state = model(input_ids=ids[:, :-1], state=state, use_cache=True, **bow).state
            if bptt_chunks is not None and (k + 1) % bptt_chunks == 0:
                state = tuple(s.detach() for s in state)
    return total / tokens


def gradients(model, loss):
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(LOOP_FAMILIES))
@pytest.mark.parametrize("bptt_chunks", [None, 1, 2])
def test_carried_loss_and_gradients_equal_a_per_document_loop(wiki, family, bptt_chunks):
    context = "none" if family == "lstm_lm" else "preceding"
    # NCLM's sentence topics: each chunk also gets the topic words of its sentence before it (as in evaluation).
    batch = documents_batch(wiki, context, sentence_prefix=family.startswith("nclm"))
    assert batch["chunk_mask"].sum(1).unique().numel() == 3  # documents of different lengths: padding chunks
    # Evaluation mode (no dropout, no sampled topics: both computations see the same function); gradients still flow.
    model = tiny_model(family, wiki["tok"], wiki["topic_tok"], **LOOP_FAMILIES[family]).double().eval()
    double = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    out = carried_state_loss(model, double, bptt_chunks=bptt_chunks)
    expected = naive_loss(model, batch, bptt_chunks)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.lm_loss is not None and (family == "lstm_lm" or out.kl_loss is not None)
    got, want = gradients(model, out.loss), gradients(model, expected)
    assert got.keys() == want.keys() and len(got) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-8, msg=name)


def test_bptt_truncation_changes_the_gradient_not_the_loss(wiki):
    batch = documents_batch(wiki, "none")
    model = tiny_model("lstm_lm", wiki["tok"], None).eval()
    full, cut = carried_state_loss(model, batch), carried_state_loss(model, batch, bptt_chunks=1)
    assert full.loss.item() == pytest.approx(cut.loss.item(), rel=1e-6)
    g_full, g_cut = gradients(model, full.loss), gradients(model, cut.loss)
    assert not torch.allclose(g_full["model.lstm.weight_hh_l0"], g_cut["model.lstm.weight_hh_l0"])


def test_training_lm_loss_equals_the_causal_carry_nll(wiki):
    """In evaluation mode the carried lm_loss times the predicted tokens is evaluate_perplexity's causal-carry
    NLL of the same documents: training optimises what that protocol measures."""
    docs = short_documents(wiki)
    model = tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"]).eval()
    batch = documents_batch(wiki, "preceding", max_sentence_length=30)
    with torch.no_grad():
        out = carried_state_loss(model, batch)
    tokens = int((batch["labels"][..., 1:] != -100).sum())
    result = evaluate_perplexity(model, docs, "causal-carry", tokenizer=wiki["tok"],
                                 topic_tokenizer=wiki["topic_tok"], batch_size=2)
    assert result["tokens"] == tokens
    assert out.lm_loss.item() * tokens == pytest.approx(result["nll"], rel=1e-5)


@pytest.mark.parametrize("family", ["lstm_lm", "tcnlm"])
def test_the_carried_state_carries(wiki, family):
    """Perturbing the words of chunk 0 changes the loss of chunk 1 under carry, and not without it (the
    context bag of words is left as it was)."""
    context = "none" if family == "lstm_lm" else "preceding"
    batch = documents_batch(wiki, context)
    # A larger initialisation than the default (0.1), so that the state after chunk 0 visibly matters.
    model = tiny_model(family, wiki["tok"], wiki["topic_tok"], initializer_range=0.5).eval()

    def chunk1_losses(batch):
        seen = []
        carried_state_loss(model, batch, chunk_callback=lambda labels, out: seen.append(out.lm_loss))
        bow = {"context_bow": batch["context_bow"][:, 1]} if "context_bow" in batch else {}
        alone = model(input_ids=batch["input_ids"][:, 1], attention_mask=batch["attention_mask"][:, 1],
                      labels=batch["labels"][:, 1], **bow).lm_loss
        return seen[1], alone

    perturbed = {k: v.clone() for k, v in batch.items()}
    real = batch["attention_mask"][:, 0].bool()
    real[:, 0] = False  # keep <bos>
    words = torch.randint(10, len(wiki["tok"]), real.shape)
    perturbed["input_ids"][:, 0] = torch.where(real, words, batch["input_ids"][:, 0])
    perturbed["labels"][:, 0] = torch.where(real, words, batch["labels"][:, 0])
    with torch.no_grad():
        (carry, alone), (carry_p, alone_p) = chunk1_losses(batch), chunk1_losses(perturbed)
    assert abs(carry.item() - carry_p.item()) > 1e-3
    assert alone.item() == alone_p.item()


def first_sentences(documents, n):
    return documents_from_lists([doc[:n] for doc in documents["sentences"]])


def make_trainer(wiki, tmp_path, family="lstm_lm", context="preceding", layout="documents", sentences=None,
                 **kwargs):
    model = tiny_model(family, wiki["tok"], wiki["topic_tok"])
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"] if context != "none" else None,
                                    context=context, layout=layout)
    trainer_args = {k: kwargs.pop(k) for k in ("carry_state", "bptt_chunks") if k in kwargs}
    args = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=5,
                report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0, max_steps=1)
    args.update(kwargs)
    train = wiki["train"].select(range(40))
    train = first_sentences(train, sentences) if sentences else train
    return TopicLMTrainer(model=model, args=TrainingArguments(**args), data_collator=collator,
                          train_dataset=collator.prepare(train), **trainer_args)


# (family, steps, sentences kept per document): TCNLM's LSTM steps through time in Python, so its documents are
# cut to keep the test to seconds.
@pytest.mark.parametrize("family, steps, sentences", [("lstm_lm", 30, None), ("tcnlm", 20, 6)])
def test_apnews_training_with_carried_state_improves_causal_carry_perplexity(wiki, tmp_path, family, steps,
                                                                             sentences):
    context = "none" if family == "lstm_lm" else "preceding"
    trainer = make_trainer(wiki, tmp_path, family, context, sentences=sentences, carry_state=True, max_steps=steps,
                           gradient_accumulation_steps=2, per_device_train_batch_size=2)
    valid = wiki["valid"].select(range(10))
    valid = first_sentences(valid, sentences) if sentences else valid

    def perplexity():
        return evaluate_perplexity(trainer.model, valid, "causal-carry", tokenizer=wiki["tok"],
                                   topic_tokenizer=wiki["topic_tok"])["perplexity"]

    before = perplexity()
    trainer.train()
    after = perplexity()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    lm_losses = [h["lm_loss"] for h in trainer.state.log_history if "lm_loss" in h]
    assert losses[-1] < losses[0] - 0.5, losses
    assert abs(lm_losses[0] - math.log(len(wiki["tok"]))) < 0.5  # per token, about ln V at initialisation
    assert math.isfinite(after) and after < before, (before, after)
    # Trainer.evaluate on documents batches: the carried state's perplexity, as evaluate_perplexity computes it.
    collator = trainer.data_collator
    metrics = trainer.evaluate(collator.prepare(valid))
    assert metrics["eval_perplexity"] == pytest.approx(after, rel=1e-4)


def test_bad_inputs_get_clear_errors(wiki, tmp_path):
    with pytest.raises(ValueError, match="layout='documents'"):
        make_trainer(wiki, tmp_path, layout="sentences", carry_state=True)
    with pytest.raises(ValueError, match="context='preceding'"):
        make_trainer(wiki, tmp_path, context="others", carry_state=True)
    with pytest.raises(ValueError, match="bptt_chunks must be"):
        make_trainer(wiki, tmp_path, carry_state=True, bptt_chunks=0)
    with pytest.raises(ValueError, match="option of carry_state"):
        make_trainer(wiki, tmp_path, bptt_chunks=2)
    with pytest.raises(ValueError, match="label smoothing"):
        make_trainer(wiki, tmp_path, carry_state=True, label_smoothing_factor=0.1)
    # a sentences batch given to the carried loss
    model = tiny_model("lstm_lm", wiki["tok"], None)
    sentences = TopicContextCollator(wiki["tok"], None, context="none")
    batch = sentences([{"sentences": s} for s in short_documents(wiki)["sentences"]])
    with pytest.raises(ValueError, match=r"documents batches .* without chunk_mask"):
        carried_state_loss(model, batch)
    # a documents batch given to a sentence model without carry_state
    trainer = make_trainer(wiki, tmp_path, context="none")
    with pytest.raises(ValueError, match="carry_state=True"):
        trainer.train()
    # models that cannot carry: no state; rGBN-RNN (documents natively); a leaky option
    from topic_lm_hf import LSTMLMForSequenceClassification, RGBNRNNConfig, RGBNRNNForCausalLM

    with pytest.raises(ValueError, match="takes no recurrent state"):
        carried_state_loss(LSTMLMForSequenceClassification(model.config), documents_batch(wiki, "none"))
    rgbn = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], topic_sizes=(4,),
                                                            hidden_sizes=(8,), embedding_size=8))
    with pytest.raises(ValueError, match="reads whole documents"):
        carried_state_loss(rgbn, documents_batch(wiki))
    leaky = tiny_model("nclm-leta-sdt", wiki["tok"], wiki["topic_tok"], sdt_mode="minus_target")
    with pytest.raises(ValueError, match="reads words it predicts"):
        carried_state_loss(leaky, documents_batch(wiki))


@pytest.mark.parametrize("family", ["tcnlm", "topic_rnn-lstm"])
def test_a_documents_batch_counts_once_for_kl_annealing(wiki, family):
    model = tiny_model(family, wiki["tok"], wiki["topic_tok"], kl_annealing_steps=100).train()
    batch = documents_batch(wiki)
    assert batch["chunk_mask"].shape[1] > 1
    carried_state_loss(model, batch)
    assert int(model.kl_annealing_step) == 1  # as one sentences batch, not once per chunk


def test_resumed_carried_training_equals_the_uninterrupted_run(wiki, tmp_path):
    kwargs = dict(context="none", sentences=4, carry_state=True, bptt_chunks=3, max_steps=4, save_strategy="steps",
                  save_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    whole = make_trainer(wiki, tmp_path / "whole", **kwargs)
    whole.train()
    resumed = make_trainer(wiki, tmp_path / "resumed", **kwargs)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-2"))
    for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, msg=name)


def test_carried_training_checks_the_model_once_when_the_trainer_is_built(wiki, tmp_path, monkeypatch):
    """TopicLMTrainer(carry_state=True) checks the model (stateful, not leaky, ...) when it is built; its batches
    are not checked against the model again (each documents batch still is checked as a batch)."""
    import topic_lm_hf.carried_state as carried_state

    calls = []
    monkeypatch.setattr(carried_state, "check_carry_state_model", lambda model: calls.append(model))
    trainer = make_trainer(wiki, tmp_path, context="none", carry_state=True, max_steps=3)
    trainer.train()
    assert calls == []  # the trainer's own check ran in __init__ (the name it imported), none per batch
    carried_state_loss(trainer.model, documents_batch(wiki, "none"))
    assert len(calls) == 1  # a direct call checks the model it is given
