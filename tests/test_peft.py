"""Adapters on the output layer take part in training: a PEFT LoRA on ``lm_head`` (alone or with the embeddings)
trains with ``transformers.Trainer`` in every family, and saves, reloads and merges to the same logits."""

import pytest
import torch

from topic_lm_hf import TopicContextCollator, build_vocabularies, load_documents

from conftest import tiny_model, variants

peft = pytest.importorskip("peft", reason="peft is not installed (pip install -e .[test])")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus():
    """A handful of real documents (wikipedia-sample, shipped with the package) and their vocabularies."""
    docs = load_documents("wikipedia-sample", max_documents=12)
    tok, topic_tok = build_vocabularies(docs, min_freq=1, stopwords="mallet")
    return docs, tok, topic_tok


@pytest.mark.parametrize("targets", [["lm_head"], ["lm_head", "embed_tokens"]], ids=["lm_head", "lm_head+embed"])
@pytest.mark.parametrize("family", variants(representative=True))
def test_a_lora_on_lm_head_trains_saves_reloads_and_merges(tmp_path, corpus, family, targets):
    from transformers import Trainer, TrainingArguments

    docs, tok, topic_tok = corpus
    model = tiny_model(family, tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train")
    rows = collator.prepare(docs)
    if hasattr(model, "set_training_corpus_size"):
        model.set_training_corpus_size(len(rows))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    before = {n: p.detach().clone() for n, p in lora.named_parameters() if p.requires_grad}
    assert before and all("lora_" in n for n in before)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=3,
                             learning_rate=1e-2, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
                             remove_unused_columns=False, label_names=["labels"], seed=0)
    Trainer(model=lora, args=args, train_dataset=rows, data_collator=collator).train()
    # every LoRA matrix moved: lm_head's A and B (B starts at zero, so A moves only once B has), and the others'
    moved = {n for n, p in lora.named_parameters() if p.requires_grad and not torch.equal(p, before[n])}
    assert moved == set(before), sorted(set(before) - moved)

    batch = collator([rows[i] for i in range(3)])
    batch.pop("labels")
    lora.eval()
    with torch.no_grad():
        expected = lora(**batch).logits
    lora.save_pretrained(tmp_path / "adapter")
    loaded = peft.PeftModel.from_pretrained(tiny_model(family, tok, topic_tok), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected)
        merged = loaded.merge_and_unload().eval()
        assert type(merged) is type(model)
        torch.testing.assert_close(merged(**batch).logits, expected, rtol=1e-4, atol=1e-4)


def test_a_forward_hook_on_lm_head_runs_in_training_and_the_loss_is_unchanged(corpus):
    docs, tok, topic_tok = corpus
    model = tiny_model("lstm_lm", tok, topic_tok).train()
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train")
    batch = collator([collator.prepare(docs)[i] for i in range(3)])
    fused = model(**batch).loss
    calls = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    try:
        hooked = model(**batch).loss
    finally:
        handle.remove()
    assert len(calls) == 1  # the layer ran as a module, at the predicted positions only
    torch.testing.assert_close(hooked, fused)


READ_BY_WEIGHT = [("nclm-leta-sdt", {}, "compose"), ("nclm-leta-sdt", {"diversity_weight": 1.0}, "decoder"),
                  ("nclm-leta-sdt", {}, "encoder"),
                  ("topic_rnn-lstm", {"theta_transform": "softmax", "bow_loss_weight": 1.0}, "topic_head")]


@pytest.mark.parametrize("family, overrides, target", READ_BY_WEIGHT,
                         ids=[f"{f}-{t}" + ("-" + "-".join(o) if o else "") for f, o, t in READ_BY_WEIGHT])
def test_a_lora_on_a_layer_read_by_its_weight_takes_effect_trains_and_merges_to_the_same_model(corpus, family,
                                                                                                overrides, target):
    """LoRA on a layer the model reads by its weight (NCLM's compose, its topic decoder and encoder, TopicRNN's topic
    head under the softmax topics) used to be skipped: the unmerged model equalled the base, the adapter got no
    gradient, merging changed the logits, and get_topics ignored it. Now the adapter's delta is part of the weight
    read: unmerged differs from the base and equals merged (logits and topics), and every LoRA matrix gets a
    gradient."""
    docs, tok, topic_tok = corpus
    base = tiny_model(family, tok, topic_tok, **overrides).eval()
    collator = TopicContextCollator.for_model(base, tok, topic_tok, protocol="train")
    batch = collator([collator.prepare(docs)[i] for i in range(3)])
    with torch.no_grad():
        base_out = base(**batch)
    lora = peft.get_peft_model(tiny_model(family, tok, topic_tok, **overrides),
                               peft.LoraConfig(r=2, lora_alpha=4, target_modules=[target], init_lora_weights=False))
    assert any(target in name for name, _ in lora.named_modules() if "lora_A" in name)
    lora.train()
    lora(**batch).loss.backward()
    grads = {n: p.grad for n, p in lora.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and bool(g.abs().sum() > 0) for g in grads.values()), \
        sorted(n for n, g in grads.items() if g is None or not bool(g.abs().sum() > 0))
    lora.eval()
    with torch.no_grad():
        unmerged = lora(**batch)
        topics = lora.get_topics(top_n=5, topic_tokenizer=topic_tok)
        assert float((unmerged.logits - base_out.logits).abs().max()) > 1e-5
        merged = lora.merge_and_unload().eval()
        again = merged(**batch)
        torch.testing.assert_close(again.logits, unmerged.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(again.loss, unmerged.loss, rtol=1e-4, atol=1e-4)
        assert merged.get_topics(top_n=5, topic_tokenizer=topic_tok) == topics


def test_rgbn_under_a_lora_trains_with_topic_lm_trainer_keeps_its_topics_and_reloads_the_same(tmp_path, corpus):
    """rGBN-RNN wrapped by PEFT: TopicLMTrainer sees through the PeftModel (it used to refuse the documents batch
    with a misleading message and never set the corpus size), and TLASGR-MCMC leaves the frozen base's Phi and Pi
    as they were (it used to update them, the adapter did not save them, and the reloaded adapter gave another
    loss)."""
    from transformers import TrainingArguments

    from topic_lm_hf import TopicLMTrainer

    docs, tok, topic_tok = corpus
    model = tiny_model("rgbn", tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="train")
    rows = collator.prepare(docs)
    phi_before = model.model.phi(1).clone()
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["lm_head"]))
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, max_steps=3,
                             learning_rate=1e-2, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
                             remove_unused_columns=False, label_names=["labels"], seed=0)
    TopicLMTrainer(model=lora, args=args, train_dataset=rows, data_collator=collator).train()
    assert model.config.tlasgr_corpus_size == len(rows)
    assert torch.equal(model.model.phi(1), phi_before)
    batch = collator([rows[i] for i in range(2)])
    lora.eval()
    with torch.no_grad():
        expected = lora(**batch).loss
    lora.save_pretrained(tmp_path / "adapter")
    loaded = peft.PeftModel.from_pretrained(tiny_model("rgbn", tok, topic_tok), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).loss, expected)


def test_an_adapter_trained_on_one_family_is_refused_by_another(tmp_path, corpus):
    """A LoRA on ``lm_head`` of a saved LSTM, loaded into a TCNLM of the same sizes: PEFT matches weights by module
    name and shape only, and it used to load silently (the TCNLM then ran the LSTM's adapter). Both ways of loading
    refuse it, naming the adapter's family; the LSTM itself still takes it."""
    docs, tok, topic_tok = corpus
    tiny_model("lstm_lm", tok, topic_tok).save_pretrained(tmp_path / "lstm")
    from transformers import AutoModelForCausalLM

    lstm = AutoModelForCausalLM.from_pretrained(tmp_path / "lstm")
    lora = peft.get_peft_model(lstm, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["lm_head"]))
    lora.save_pretrained(tmp_path / "adapter")
    tcnlm = tiny_model("tcnlm", tok, topic_tok)
    assert tcnlm.lm_head.weight.shape == lstm.lm_head.base_layer.weight.shape  # PEFT alone would load it
    with pytest.raises(ValueError, match=r"a lstm_lm model; this model is a tcnlm: load the adapter into a lstm_lm"):
        peft.PeftModel.from_pretrained(tcnlm, tmp_path / "adapter")
    with pytest.raises(ValueError, match="a lstm_lm model; this model is a tcnlm"):
        tiny_model("tcnlm", tok, topic_tok).load_adapter(str(tmp_path / "adapter"))
    peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "lstm"), tmp_path / "adapter")
    AutoModelForCausalLM.from_pretrained(tmp_path / "lstm").load_adapter(str(tmp_path / "adapter"))
