"""What every transformers model supports, checked on every variant of every family of the package that reads
sentence batches (the registry's, ``conftest.variants``: the LSTM LM, TCNLM and its naive MoE, TopicRNN with each
cell, NCLM's variants; not rGBN-RNN, which reads whole documents) on real wikipedia-sample batches: loading in bfloat16,
per-layer hidden states, gradient checkpointing, resizing the token embeddings, stop strings."""

import copy

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from conftest import variants
from topic_lm_hf import TopicContextCollator
from topic_lm_hf.families import topic_families, variant_of

FAMILIES = variants(reads_documents=False)
TOPIC_FAMILIES = variants(topic_only=True, reads_documents=False)
# This file's sizes per model_type besides the common ones of make(): three topics in every topic family.
SIZES = {"lstm_lm": {}, "tcnlm": dict(num_topics=3, num_factors=8, encoder_hidden_size=16, topic_embedding_size=8),
         "topic_rnn": dict(num_topics=3, inference_hidden_size=16),
         "nclm": dict(num_topics=3, encoder_hidden_size=16, etr_top_n=4, num_topic_samples=2)}


def make(family, tok, topic_tok, layers=2, dropout=0.0, **kw):
    """A small model of variant ``family``: the common sizes, its family's ``SIZES``, the variant's configuration
    values (``Family.variants``), then ``kw``."""
    torch.manual_seed(0)
    record, values = variant_of(family)
    sizes = dict(embedding_size=12, hidden_size=16, num_hidden_layers=layers, dropout=dropout, initializer_range=0.3)
    kwargs = {**sizes, **SIZES.get(record.model_type, {"num_topics": 3}), **values, **kw}
    if not record.is_topic_model:
        return record.causal_lm_class(record.config_class(vocab_size=len(tok), **kwargs))
    return record.causal_lm_class(record.config_class.from_tokenizers(tok, topic_tok, **kwargs))


@pytest.fixture(scope="module")
def batch(wiki):
    """Left- and right-padded real sentence chunks with their context bags of words."""
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="others", max_sentence_length=12,
                                    sentence_prefix=True)
    rows = collator.prepare(wiki["train"].select(range(2)))
    return collator([rows[i] for i in range(6)])


def lm_inputs(family, batch, labels=True):
    keys = ["input_ids", "attention_mask"] + (["labels"] if labels else [])
    out = {k: batch[k] for k in keys}
    if family != "lstm_lm":
        out["context_bow"] = batch["context_bow"]
    if family.startswith("nclm"):
        out["sentence_prefix_bow"] = batch["sentence_prefix_bow"]  # NCLM's sentence topics
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_forward_loss_and_generate(family, wiki, batch, tmp_path):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
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
    losses = []
    for m in (model, half):
        torch.manual_seed(1)  # the same theta samples
        losses.append(m.train()(**lm_inputs(family, batch)))
    assert torch.isfinite(losses[1].loss) and abs(losses[1].loss.item() - losses[0].loss.item()) < 0.1
    losses[1].loss.backward()
    assert all(p.grad is None or p.grad.dtype == torch.bfloat16 for p in half.parameters())
    half.eval()
    prompt = tok(["the senate said"], return_tensors="pt")
    conditioning = [{}] if family == "lstm_lm" else [{"context_bow": batch["context_bow"][:1]}]
    if family in ("tcnlm", "tcnlm-naive_moe"):
        conditioning += [{"topic_ids": [1]}, {"topic_mixture": [0.2, 0.3, 0.5]}]
    for kwargs in conditioning:
        generated = half.generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False, **kwargs)
        assert generated.shape == (1, prompt["input_ids"].shape[1] + 5)


def base_forward(model, family, batch, **kwargs):
    """The base model's forward (``model`` is a *ForCausalLM or a base model)."""
    base = getattr(model, "model", model)
    extra = {} if family == "lstm_lm" else {"context_bow": batch["context_bow"]}
    return base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **extra, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_output_hidden_states_has_the_embeddings_and_every_layer(family, wiki, batch, tmp_path):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = make(family, tok, topic_tok, layers=2).eval()
    inputs = lm_inputs(family, batch, labels=False)
    plain = model(**inputs)
    out = model(**inputs, output_hidden_states=True)
    torch.testing.assert_close(out.logits, plain.logits)
    assert plain.hidden_states is None and isinstance(out.hidden_states, tuple) and len(out.hidden_states) == 3
    embeddings, first, second = out.hidden_states
    torch.testing.assert_close(embeddings, model.get_input_embeddings()(batch["input_ids"]))
    base = base_forward(model, family, batch)
    torch.testing.assert_close(second, base.last_hidden_state)
    b, s = batch["input_ids"].shape
    expected = (b, s, 3, 16) if family == "tcnlm-naive_moe" else (b, s, 16)
    assert first.shape == second.shape == expected
    padding = ~batch["attention_mask"].bool()
    assert first[padding].abs().sum() == 0 and second[padding].abs().sum() == 0
    # The first entry after the embeddings is the first layer's output: a one-layer model with the same
    # first-layer weights has it as its last hidden state.
    one = make(family, tok, topic_tok, layers=1).eval()
    missing, unexpected = one.load_state_dict(model.state_dict(), strict=False)
    assert not missing and unexpected
    torch.testing.assert_close(base_forward(one, family, batch).last_hidden_state, first)
    # The base model is a transformers ModelOutput (AutoModel), with a tuple form like every model's.
    model.save_pretrained(tmp_path)
    auto = AutoModel.from_pretrained(tmp_path).eval()
    auto_out = base_forward(auto, family, batch, output_hidden_states=True)
    assert type(auto) is type(model.model) and auto_out.last_hidden_state.shape == expected
    torch.testing.assert_close(auto_out.hidden_states[1], first)
    assert isinstance(base_forward(auto, family, batch, return_dict=False), tuple)
    assert isinstance(model(**inputs, return_dict=False), tuple)


def test_generate_returns_hidden_states_of_every_step(wiki):
    model = make("lstm_lm", wiki["tok"], wiki["topic_tok"]).eval()
    prompt = wiki["tok"](["the senate said"], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False, output_hidden_states=True,
                         return_dict_in_generate=True)
    assert len(out.hidden_states) == 3 and all(len(step) == 3 for step in out.hidden_states)
    assert out.hidden_states[0][2].shape == (1, prompt["input_ids"].shape[1], 16)
    assert out.hidden_states[1][2].shape == (1, 1, 16)


@pytest.mark.parametrize("layers, dropout", [(2, 0.0), (1, 0.3)])
@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_gives_the_same_gradients(family, layers, dropout, wiki, batch, monkeypatch):
    from topic_lm_hf.models import modeling_recurrent, modeling_tcnlm

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = make(family, tok, topic_tok, layers=layers, dropout=dropout).train()
    assert model.supports_gradient_checkpointing

    def loss_and_grads():
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout masks and theta samples in both runs
        loss = model(**lm_inputs(family, batch)).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = loss_and_grads()
    model.activation_checkpointing_enable()
    assert model.model.gradient_checkpointing
    calls = []
    layer_fn = "_run_layer" if family == "tcnlm" else "_run_one_layer"
    module = modeling_tcnlm if family == "tcnlm" else modeling_recurrent
    original = getattr(module, layer_fn)
    monkeypatch.setattr(module, layer_fn, lambda *a: calls.append(1) or original(*a))
    loss_ckpt, grads_ckpt = loss_and_grads()
    n_layers = layers * (3 if family == "tcnlm-naive_moe" else 1)
    assert len(calls) == 2 * n_layers  # every layer ran once more in the backward pass: it was a checkpoint
    torch.testing.assert_close(loss_ckpt, loss)
    assert grads_ckpt.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)
    model.activation_checkpointing_disable()
    assert not model.model.gradient_checkpointing


@pytest.mark.parametrize("family", ["lstm_lm", "tcnlm"])
def test_reentrant_checkpointing_gives_the_same_gradients(family, wiki, batch):
    model = make(family, wiki["tok"], wiki["topic_tok"]).train()

    def grads():
        model.zero_grad()
        torch.manual_seed(1)
        model(**lm_inputs(family, batch)).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain = grads()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    for a, b in zip(grads(), plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", ["tcnlm", "topic_rnn-lstm"])
def test_trainer_with_gradient_checkpointing_trains_the_same_weights(family, wiki, tmp_path):
    from transformers import TrainingArguments

    from topic_lm_hf import TopicLMTrainer

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    collator = TopicContextCollator(tok, topic_tok, context="others")
    rows = collator.prepare(wiki["train"].select(range(8)))
    trained = {}
    for checkpointing in (False, True):
        model = make(family, tok, topic_tok)
        args = TrainingArguments(output_dir=str(tmp_path / str(checkpointing)), max_steps=3,
                                 per_device_train_batch_size=8, learning_rate=1e-2, report_to=[], use_cpu=True,
                                 disable_tqdm=True, save_strategy="no", seed=0, activation_checkpointing=checkpointing)
        trainer = TopicLMTrainer(model=model, args=args, train_dataset=rows, data_collator=collator)
        trainer.train()
        assert model.model.gradient_checkpointing is checkpointing
        trained[checkpointing] = model.state_dict()
    for name, value in trained[False].items():
        torch.testing.assert_close(trained[True][name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("config_class", [f.config_class for f in topic_families()])
def test_topic_word_ids_of_another_topic_vocabulary_are_refused(config_class, wiki):
    """Every topic config checks topic_word_ids against its topic vocabulary (TopicConfigMixin)."""
    good = config_class.from_tokenizers(wiki["tok"], wiki["topic_tok"])
    assert good.topic_word_ids == [int(i) for i in good.topic_word_ids] and \
        len(good.topic_word_ids) == good.topic_vocab_size
    with pytest.raises(ValueError, match="topic_word_ids has .* entries but topic_vocab_size is .*mismatched"):
        config_class.from_tokenizers(wiki["tok"], wiki["topic_tok"], topic_word_ids=good.topic_word_ids[:-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_embedding_accessors_reach_the_modules_the_model_uses(family, wiki):
    """transformers' own accessors (``embed_tokens`` / ``lm_head``) serve every family: the LM, its body."""
    model = make(family, wiki["tok"], wiki["topic_tok"])
    assert model.get_input_embeddings() is model.model.embed_tokens is model.model.get_input_embeddings()
    assert model.get_output_embeddings() is model.lm_head
    replacement = torch.nn.Embedding(*model.model.embed_tokens.weight.shape)
    model.set_input_embeddings(replacement)
    assert model.model.embed_tokens is replacement and model.get_input_embeddings() is replacement
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features)
    model.set_output_embeddings(head)
    assert model.lm_head is head and model.get_output_embeddings() is head


@pytest.mark.parametrize("family", FAMILIES)
def test_resize_token_embeddings_after_adding_words(family, wiki, batch, tmp_path):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    tok = copy.deepcopy(tok)  # words are added to it
    model = make(family, tok, topic_tok).eval()
    inputs = lm_inputs(family, batch, labels=False)
    with torch.no_grad():
        before = model(**inputs).logits  # a first forward (TopicRNN caches its word -> topic map here)
    old_size = len(tok)
    assert tok.add_tokens(["zzyzx", "qwrtp"]) == 2
    model.resize_token_embeddings(len(tok))
    assert model.config.vocab_size == len(tok) == old_size + 2
    text = tok(["the senate said zzyzx qwrtp"], return_tensors="pt")
    assert text["input_ids"][0, -2:].tolist() == [old_size, old_size + 1]
    with torch.no_grad():
        after = model(**inputs).logits
        assert after.shape == (*before.shape[:2], old_size + 2) and torch.isfinite(after).all()
        if family in ("lstm_lm", "tcnlm"):  # plain softmax layers: the old words' scores are unchanged
            torch.testing.assert_close(after[..., :old_size], before)
        extra = {} if family == "lstm_lm" else {"context_bow": batch["context_bow"][:1]}
        out = model(**text, labels=text["input_ids"], **extra)
        assert torch.isfinite(out.loss)
        generated = model.generate(**text, max_new_tokens=3, min_new_tokens=3, do_sample=False, **extra)
    assert generated.shape[1] == text["input_ids"].shape[1] + 3
    if family.startswith("topic_rnn"):
        assert model.stop_word_mask.shape == (old_size + 2,) and model.stop_word_mask[-2:].all()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, after)


@pytest.mark.parametrize("family", TOPIC_FAMILIES)
def test_stop_strings_with_topic_conditioning(family, wiki, batch):
    tok = wiki["tok"]
    model = make(family, tok, wiki["topic_tok"]).eval()
    prompt = tok(["police said"], return_tensors="pt")
    bow = batch["context_bow"][:1]
    free = model.generate(**prompt, context_bow=bow, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    n = prompt["input_ids"].shape[1]
    stop = tok.decode(free[0, n + 1:n + 3])  # the 2nd and 3rd new words, e.g. " the senate"
    stopped = model.generate(**prompt, context_bow=bow, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             stop_strings=[stop], tokenizer=tok)
    first = next(i for i in range(8) if stop in tok.decode(free[0, n:n + i + 1]))
    assert torch.equal(stopped[0], free[0, :n + first + 1])
