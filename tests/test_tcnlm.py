"""TCNLM: the maths against literal references, the ELBO on a hand-checkable case, how generation resolves
each conditioning source, the options, and a short real-data training run. The contract of every family (save /
load, padding, state equivalence, cached generation, remote code) is checked in test_model_contract.py."""

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, TrainingArguments

from topic_lm_hf import (TopicContextCollator, TopicLMTrainer, build_vocabularies, evaluate_perplexity,
                         save_vocabularies, synthetic_documents)
from topic_lm_hf.models.configuration_tcnlm import TCNLMConfig
from topic_lm_hf.models.modeling_tcnlm import TCNLMForCausalLM, TCNLMLSTMLayer, TCNLMModel

from reference_tcnlm import explicit_weight_lstm_layer, naive_moe_probs, naive_tc_lstm_layer

# The package __init__ registers these; registering here too keeps this file independent of that.
AutoConfig.register("tcnlm", TCNLMConfig, exist_ok=True)
AutoModel.register(TCNLMConfig, TCNLMModel, exist_ok=True)
AutoModelForCausalLM.register(TCNLMConfig, TCNLMForCausalLM, exist_ok=True)

ROOT = Path(__file__).resolve().parents[1]
F32 = dict(rtol=1e-5, atol=1e-5)  # float32 precision for O(1) activations


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vocab():
    tok, topic_tok = build_vocabularies(synthetic_documents(60), min_freq=1)
    tok.padding_side = "left"
    return tok, topic_tok


def small_model(vocab_size, topic_vocab_size, lm_type="tcnlm", layers=2, num_topics=6, **kw):
    torch.manual_seed(0)
    config = TCNLMConfig(vocab_size=vocab_size, topic_vocab_size=topic_vocab_size, num_topics=num_topics,
                         embedding_size=12, hidden_size=16, num_factors=10, num_hidden_layers=layers, dropout=0.1,
                         encoder_hidden_size=16, topic_embedding_size=8, lm_type=lm_type, initializer_range=0.5,
                         **kw)
    return TCNLMForCausalLM(config).eval()


def random_bow(rows, topic_vocab_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    bow = torch.randint(0, 3, (rows, topic_vocab_size), generator=g).float()
    bow[:, 0] = 0  # <unk> is never counted
    return bow


def randomize_(module, scale=0.3):
    """Move every parameter away from its structured initialisation (W_b ~ 1), so that the topic matters."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale)


# ----------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, match", [
    (dict(num_topics=0), "num_topics must be a positive integer, got 0"),
    (dict(hidden_size=-3), "hidden_size must be a positive integer, got -3"),
    (dict(num_factors=2.5), "num_factors must be a positive integer, got 2.5"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
    (dict(prior_std=0.0), "prior_std must be positive, got 0.0"),
    (dict(lm_type="moe"), "lm_type must be one of .*got 'moe'"),
    (dict(kl_annealing_steps=-1), "kl_annealing_steps must be a non-negative integer, got -1"),
    (dict(topic_vocab_size=1), "topic_vocab_size must be >= 2"),
    (dict(topic_loss_normalization="tokens"), "topic_loss_normalization must be one of .*got 'tokens'"),
])
def test_config_rejects_bad_values_naming_them(bad, match):
    with pytest.raises(ValueError, match=match):
        TCNLMConfig(**bad)


def test_config_defaults_and_hub_configs():
    config = TCNLMConfig(hidden_size=40)
    assert config.num_factors == 40 and config.encoder_hidden_size == 256 and config.diversity_weight == 0.1
    assert "state" in config.keys_to_ignore_at_inference
    sizes = {}
    for name in ("small", "large"):
        values = json.loads((ROOT / "hub_configs" / f"tcnlm-apnews-{name}.json").read_text())
        config = TCNLMConfig(**{k: v for k, v in values.items() if k != "model_type"})
        sizes[name] = (config.num_hidden_layers, config.hidden_size, config.dropout, config.encoder_hidden_size)
    assert sizes == {"small": (1, 600, 0.4, 256), "large": (2, 900, 0.4, 256)}
    for lm_type in ("naive_moe", "tcnlm"):
        values = json.loads((ROOT / "hub_configs" / f"tcnlm-table6-{lm_type.replace('_', '-')}.json").read_text())
        assert (values["lm_type"], values["num_topics"], values["hidden_size"]) == (lm_type, 30, 100)


# ----------------------------------------------------------------------------------------------
# the topic-compositional LSTM against literal references
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_state", [False, True])
def test_fast_layer_equals_naive_gate_loop_and_explicit_weight_lstm(with_state):
    torch.manual_seed(1)
    b, s, n_x, H, n_f, T = 3, 5, 7, 6, 4, 5
    layer = TCNLMLSTMLayer(n_x, H, n_f, T)
    randomize_(layer)
    x = torch.randn(b, s, n_x)
    t = torch.softmax(torch.randn(b, T) * 2, -1)
    state = (torch.randn(b, H) * 0.5, torch.randn(b, H) * 0.5) if with_state else None
    with torch.no_grad():
        fast, (h, c) = layer(x, t, state=state)
    naive, (h_naive, c_naive) = naive_tc_lstm_layer(layer, x, t, state)
    explicit, (h_explicit, c_explicit) = explicit_weight_lstm_layer(layer, x, t, state)
    torch.testing.assert_close(fast.double(), naive, **F32)
    torch.testing.assert_close(fast, explicit, **F32)
    for ours, ref in ((h, h_naive), (c, c_naive)):
        torch.testing.assert_close(ours.double(), ref, **F32)
    torch.testing.assert_close(h, h_explicit, **F32)
    torch.testing.assert_close(c, c_explicit, **F32)
    # the paper's parameter count, 4 n_f (n_x + 2T + 3 n_h), plus one bias per gate unit
    assert sum(p.numel() for p in layer.parameters()) == 4 * n_f * (n_x + 2 * T + 3 * H) + 4 * H


def test_one_hot_topic_uses_only_that_topics_factors():
    # Section 5.3: generating from topic i uses only the i-th column of W_b and U_b.
    torch.manual_seed(2)
    layer = TCNLMLSTMLayer(5, 6, 4, 3)
    randomize_(layer)
    x = torch.randn(2, 4, 5)
    onehot = torch.tensor([[0.0, 1.0, 0.0]] * 2)
    with torch.no_grad():
        out, _ = layer(x, onehot)
        layer.W_b[:, [0, 2]] = 9.0  # other topics' factors must not matter
        layer.U_b[:, [0, 2]] = -9.0
        again, _ = layer(x, onehot)
    torch.testing.assert_close(out, again)


def test_naive_moe_equals_explicit_mixture_of_expert_softmaxes(vocab):
    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok), "naive_moe", layers=1, num_topics=4)
    ids = tok(["the senate said the company will vote"], return_tensors="pt")["input_ids"].repeat(2, 1)
    mix = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 1.0, 0.0, 0.0]])
    out = model(input_ids=ids, topic_mixture=mix)
    expected = naive_moe_probs(model, ids, mix)
    torch.testing.assert_close(out.logits.double().exp(), expected, rtol=1e-5, atol=1e-7)
    # the logits are log-probabilities: the evaluation code's log_softmax leaves them unchanged
    torch.testing.assert_close(torch.log_softmax(out.logits, -1), out.logits, **F32)
    # the memory-saving training loss (checkpointed experts) equals the loss of the full mixture
    model.config.dropout = 0.0
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    loss = model(input_ids=ids, topic_mixture=mix, labels=ids).loss
    with torch.no_grad():
        reference = -torch.log(expected[:, :-1]).gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(loss.double(), reference, **F32)
    loss.backward()
    assert all(p.grad is not None for p in model.model.experts.parameters())


# ----------------------------------------------------------------------------------------------
# the objective
# ----------------------------------------------------------------------------------------------


def test_elbo_terms_on_a_hand_checkable_case():
    """T = 2 topics, V_c = 3 (<unk> + 2 words), V = 10; every quantity set by hand."""
    config = TCNLMConfig(vocab_size=10, topic_vocab_size=3, num_topics=2, embedding_size=4, hidden_size=4,
                         num_factors=2, encoder_hidden_size=3, topic_embedding_size=2, dropout=0.0,
                         diversity_weight=0.1)
    model = TCNLMForCausalLM(config).eval()
    ntm = model.model.topic_model
    with torch.no_grad():
        for layer in (ntm.posterior_mean, ntm.posterior_logvar):
            layer.weight.zero_()
        ntm.posterior_mean.bias.copy_(torch.tensor([math.log(3.0), 0.0]))  # mu = (ln 3, 0)
        ntm.posterior_logvar.bias.copy_(torch.tensor([0.0, math.log(0.25)]))  # sigma^2 = (1, 1/4)
        ntm.topic_proj.weight.copy_(torch.eye(2))
        ntm.topic_proj.bias.zero_()  # t = softmax(mu) = (3/4, 1/4)
        # logits = topic_vectors @ word_vectors^T = [[5, ln 3, 0], [5, 0, ln 3]]
        ntm.topic_vectors.copy_(torch.eye(2))
        ntm.word_vectors.copy_(torch.tensor([[5.0, 5.0], [math.log(3.0), 0.0], [0.0, math.log(3.0)]]))
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()  # uniform next-word distribution: lm_loss = ln 10
    # beta = [[0, 3/4, 1/4], [0, 1/4, 3/4]] (<unk> gets 0 whatever its logit); beta^T t = (0, 5/8, 3/8)
    torch.testing.assert_close(ntm.beta(), torch.tensor([[0, 0.75, 0.25], [0, 0.25, 0.75]]))
    bow = torch.tensor([[0.0, 2.0, 1.0], [0.0, 0.0, 3.0]])
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]])
    labels = ids.masked_fill(ids == 0, -100)  # predicted tokens: 3 + 2 = 5
    out = model(input_ids=ids, labels=labels, context_bow=bow)

    n_context = 6  # default normalisation: per context word (2 + 1 + 3 words)
    bow_nll = -(2 * math.log(5 / 8) + math.log(3 / 8)) - 3 * math.log(3 / 8)
    kl_per_doc = 0.5 * (math.log(3.0) ** 2) + 0.5 * (-math.log(0.25) + 0.25 - 1)  # vs N(0, 1)
    angle = math.acos((0.75 * 0.25 + 0.25 * 0.75) / (0.75 ** 2 + 0.25 ** 2))  # arccos(0.6), both pairs
    torch.testing.assert_close(out.topic_mixture, torch.tensor([[0.75, 0.25]] * 2))
    torch.testing.assert_close(out.lm_loss, torch.tensor(math.log(10.0)))
    torch.testing.assert_close(out.bow_loss, torch.tensor(bow_nll / n_context))
    torch.testing.assert_close(out.kl_loss, torch.tensor(2 * kl_per_doc / n_context))
    torch.testing.assert_close(out.aux_loss, torch.tensor(-0.1 * angle))
    expected = math.log(10.0) + (bow_nll + 2 * kl_per_doc) / n_context - 0.1 * angle
    torch.testing.assert_close(out.loss, torch.tensor(expected))
    # "lm_tokens": the topic terms per predicted token, so lm + bow + kl is the per-token negative ELBO
    model.config.topic_loss_normalization = "lm_tokens"
    out = model(input_ids=ids, labels=labels, context_bow=bow)
    n_tokens = 5  # predicted tokens: 3 + 2
    torch.testing.assert_close(out.bow_loss, torch.tensor(bow_nll / n_tokens))
    torch.testing.assert_close(out.kl_loss, torch.tensor(2 * kl_per_doc / n_tokens))
    torch.testing.assert_close(out.lm_loss + out.bow_loss + out.kl_loss,
                               torch.tensor(math.log(10.0) + (bow_nll + 2 * kl_per_doc) / n_tokens))
    # without a bag of words there is no topic model term
    plain = model(input_ids=ids, labels=labels, topic_ids=[0])
    assert plain.bow_loss is None and torch.allclose(plain.loss, plain.lm_loss)


def test_kl_annealing_and_posterior_sampling():
    config = TCNLMConfig(vocab_size=10, topic_vocab_size=5, num_topics=3, embedding_size=4, hidden_size=4,
                         encoder_hidden_size=4, dropout=0.0, kl_annealing_steps=4, diversity_weight=0.0)
    model = TCNLMForCausalLM(config).train()
    with torch.no_grad():
        model.model.topic_model.posterior_mean.bias.fill_(2.0)  # a KL far from 0
    ids = torch.tensor([[2, 5, 6, 3]])
    bow = torch.tensor([[0.0, 1.0, 2.0, 0.0, 1.0]])
    weights = []
    for _ in range(5):
        out = model(input_ids=ids, labels=ids, context_bow=bow)
        weights.append(((out.loss - out.lm_loss - out.bow_loss) / out.kl_loss).item())
    assert weights == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0], abs=1e-4)
    assert "kl_annealing_step" in model.state_dict()  # saved: resuming training goes on annealing


def test_kl_annealing_counter_resumes_and_starts_at_zero_when_a_checkpoint_lacks_it(tmp_path):
    from safetensors.torch import load_file, save_file

    config = TCNLMConfig(vocab_size=10, topic_vocab_size=5, num_topics=3, embedding_size=4, hidden_size=4,
                         encoder_hidden_size=4, kl_annealing_steps=4)
    model = TCNLMForCausalLM(config).train()
    ids, bow = torch.tensor([[2, 5, 6, 3]]), torch.tensor([[0.0, 1.0, 2.0, 0.0, 1.0]])
    for _ in range(3):
        model(input_ids=ids, labels=ids, context_bow=bow)
    model.save_pretrained(tmp_path)
    assert int(AutoModelForCausalLM.from_pretrained(tmp_path).kl_annealing_step) == 3
    # a checkpoint without the counter (saved by a base model, or by an older version of the package)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["kl_annealing_step"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert int(AutoModelForCausalLM.from_pretrained(tmp_path).kl_annealing_step) == 0
    # training samples theta; evaluation uses the posterior mean
    assert not torch.allclose(model(input_ids=ids, context_bow=bow).topic_mixture,
                              model(input_ids=ids, context_bow=bow).topic_mixture)
    model.eval()
    torch.testing.assert_close(model(input_ids=ids, context_bow=bow).topic_mixture, model.infer_topics(bow))


def test_diversity_regularizer_values_and_gradient():
    config = TCNLMConfig(vocab_size=10, topic_vocab_size=4, num_topics=3, embedding_size=4, hidden_size=4,
                         topic_embedding_size=3)
    ntm = TCNLMForCausalLM(config).model.topic_model
    with torch.no_grad():
        ntm.topic_vectors.copy_(torch.eye(3) * 30)  # topic k puts all its mass on word k + 1
        ntm.word_vectors.copy_(torch.cat([torch.zeros(1, 3), torch.eye(3)]))
    assert ntm.diversity().item() == pytest.approx(math.pi / 2, abs=1e-3)  # orthogonal topics, no variance
    with torch.no_grad():
        ntm.topic_vectors.fill_(0.5)  # three identical topics: every angle 0
    r = ntm.diversity()
    assert r.item() == pytest.approx(0.0, abs=2e-3)
    r.backward()
    assert torch.isfinite(ntm.topic_vectors.grad).all() and torch.isfinite(ntm.word_vectors.grad).all()


def test_every_parameter_gets_a_gradient_and_the_lm_loss_reaches_the_encoder(vocab):
    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok)).train()
    batch = tok(["the senate said", "police said the storm"], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    bow = random_bow(2, len(topic_tok))
    model(**batch, labels=labels, context_bow=bow).loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []
    # The LM term alone trains the inference network through t (joint training, eq. 17).
    model.zero_grad()
    t, _, _ = model.model.topic_model(bow, sample=True)
    lm_only = model(**batch, labels=labels, topic_mixture=t)
    assert lm_only.bow_loss is None
    lm_only.loss.backward()
    assert model.model.topic_model.encoder[0].weight.grad.abs().sum() > 0
    assert model.model.topic_model.topic_vectors.grad is None  # beta is trained by the BoW term only


# ----------------------------------------------------------------------------------------------
# remote code (the round trip, state, padding, generation and remote code of every family: test_model_contract)
# ----------------------------------------------------------------------------------------------


def test_model_file_is_flat_remote_code():
    source = (ROOT / "src" / "topic_lm_hf" / "models" / "modeling_tcnlm.py").read_text()
    imports = [line.strip() for line in source.splitlines() if line.startswith(("import ", "from "))]
    for line in imports:
        module = line.split()[1]
        assert module.split(".")[0] in ("__future__", "math", "dataclasses", "typing", "torch", "transformers") \
            or (module.startswith(".") and not module.startswith("..") and "." not in module[1:]), line


# ----------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------

def test_context_bow_is_inferred_once_and_reused(vocab, monkeypatch):
    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok))
    calls, sources = [], []
    original = model.model.topic_model.posterior
    monkeypatch.setattr(model.model.topic_model, "posterior", lambda bow: calls.append(bow.shape) or original(bow))
    model.register_forward_pre_hook(
        lambda module, args, kwargs: sources.append(  # generate's first step gets the validated conditioning
            "bow" if "context_bow" in (kwargs.get("topic_conditioning") or kwargs) else "mixture"), with_kwargs=True)
    bow = random_bow(1, len(topic_tok))
    out = model.generate(**tok(["the senate"], return_tensors="pt"), context_bow=bow, max_new_tokens=4,
                         min_new_tokens=4, num_beams=2, num_return_sequences=2)
    assert out.shape == (2, 3 + 4)  # <bos> the senate + 4
    assert calls == [torch.Size([2, len(topic_tok)])]  # once, for the two expanded beams
    assert sources == ["bow", "mixture", "mixture", "mixture"]
    # steered by the document's inferred topics: the same as giving the inferred mixture
    same = model.generate(**tok(["the senate"], return_tensors="pt"), topic_mixture=model.infer_topics(bow),
                          max_new_tokens=4, min_new_tokens=4, num_beams=2, num_return_sequences=2)
    assert torch.equal(out, same)


def test_generate_from_topics_without_a_prompt(vocab):
    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok))
    torch.manual_seed(0)
    out = model.generate(topic_ids=[3, 1], max_new_tokens=5, min_new_tokens=5, do_sample=True)
    assert out.shape == (1, 6) and out[0, 0].item() == tok.bos_token_id
    rows = model.generate(topic_ids=[[0], [1, 2], [5]], max_new_tokens=4, min_new_tokens=4)
    assert rows.shape == (3, 5) and (rows[:, 0] == tok.bos_token_id).all()
    torch.manual_seed(0)
    sampled = model.generate(topic_mixture=torch.softmax(torch.randn(2, 6), -1), max_new_tokens=4, min_new_tokens=4,
                             num_return_sequences=3, do_sample=True)
    assert sampled.shape == (6, 5)
    # topic_ids=[i] is the one-hot mixture e_i, topic_ids=[3, 1] the equal mixture of topics 3 and 1
    for ids, mix in (([4], [0, 0, 0, 0, 1.0, 0]), ([3, 1], [0, 0.5, 0, 0.5, 0, 0])):
        a = model.generate(topic_ids=ids, max_new_tokens=5, min_new_tokens=5)
        b = model.generate(topic_mixture=torch.tensor(mix), max_new_tokens=5, min_new_tokens=5)
        assert torch.equal(a, b)


@pytest.mark.parametrize("topic_ids", [[3, 1], torch.tensor([3, 1]), [[3, 1]]], ids=["list", "tensor", "rows"])
def test_num_return_sequences_with_list_and_tensor_topic_ids(vocab, topic_ids):
    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok))
    seen = []
    model.register_forward_pre_hook(  # the first step gets the conditioning generate validated, as topic_conditioning
        lambda module, args, kwargs: seen.append((kwargs.get("topic_conditioning") or kwargs).get("topic_ids")),
        with_kwargs=True)
    batch = tok(["the senate said", "police"], return_tensors="pt", padding=True)
    out = model.generate(**batch, topic_ids=topic_ids, max_new_tokens=3, num_return_sequences=2, do_sample=True)
    assert out.shape[0] == 4
    assert seen[0].tolist() == [[3, 1]] * 4  # not [3, 3, 1, 1]: the topics are shared by every row
    assert seen[1:] == [None, None]  # later steps reuse the mixture the first one resolved


def test_bad_topic_inputs_are_clear_errors(vocab):
    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok))
    prompt = tok(["the senate"], return_tensors="pt")
    cases = [
        (dict(topic_ids=[7]), r"topic_ids must be in \[0, 6\), got 7 \(the model has 6 topics\)"),
        (dict(topic_ids=[-2]), "topic_ids must be non-negative, got -2"),
        (dict(topic_ids=[]), "topic_ids is empty"),
        (dict(topic_ids=torch.tensor([[-1, -1]])), "topic_ids has a row without any topic id"),
        (dict(topic_mixture=torch.ones(5) / 5), r"topic_mixture must have shape \(b, 6\), got \(1, 5\)"),
        (dict(topic_mixture=torch.ones(6)), "each topic_mixture row must sum to 1"),
        (dict(context_bow=torch.ones(3)), f"context_bow must have {len(topic_tok)} columns"),
        (dict(topic_ids=[1], context_bow=random_bow(1, len(topic_tok))), "Give at most one of"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            model.generate(**prompt, max_new_tokens=2, **kwargs)
        with pytest.raises(ValueError, match=match):
            model(**prompt, **kwargs)
    with pytest.raises(ValueError, match="not used by the model"):
        model.generate(**prompt, topic_idz=[1], max_new_tokens=2)
    with pytest.raises(ValueError, match="input_ids must be in"):
        model(input_ids=torch.tensor([[2, len(tok) + 5]]))


# ----------------------------------------------------------------------------------------------
# real data: Trainer, perplexity protocols, topics
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(wiki, tmp_path_factory):
    """A tiny TCNLM trained for 40 steps on 120 real APNEWS documents, saved with its vocabularies."""
    torch.manual_seed(0)
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    config = TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=8, embedding_size=32,
                         hidden_size=32, num_factors=16, encoder_hidden_size=32, dropout=0.1, kl_annealing_steps=20)
    model = TCNLMForCausalLM(config)
    collator = TopicContextCollator(tok, topic_tok, context="others")
    rows = collator.prepare(wiki["train"].select(range(120)))
    held_out = collator(list(collator.prepare(wiki["valid"].select(range(4)))))

    def held_out_losses():
        model.eval()
        with torch.no_grad():
            out = model(**held_out)
        return {k: getattr(out, k).item() for k in ("loss", "lm_loss", "bow_loss", "kl_loss", "aux_loss")}

    before = held_out_losses()
    out = tmp_path_factory.mktemp("tcnlm-apnews")
    args = TrainingArguments(output_dir=str(out), max_steps=40, per_device_train_batch_size=32, learning_rate=1e-2,
                             max_grad_norm=1.0, logging_steps=10, save_strategy="no", report_to=[], use_cpu=True,
                             disable_tqdm=True, seed=0)
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    trainer.save_model(str(out))
    save_vocabularies(tok, topic_tok, out)
    return {"model": trainer.model.eval(), "logs": trainer.state.log_history, "path": out, "before": before,
            "after": held_out_losses()}


@pytest.mark.slow
def test_trainer_run_on_apnews_logs_every_loss_term_and_the_loss_falls(trained):
    logs = [entry for entry in trained["logs"] if "loss" in entry]
    assert len(logs) == 4
    for entry in logs:
        assert {"lm_loss", "kl_loss", "bow_loss", "aux_loss"} <= entry.keys()
        assert entry["aux_loss"] <= 0  # -lambda R, R >= 0
        # the logged total is the sum of its terms (KL annealed over the first 20 steps)
        assert entry["loss"] == pytest.approx(entry["lm_loss"] + entry["bow_loss"] + entry["aux_loss"]
                                              + entry["kl_loss"], abs=0.05 + entry["kl_loss"])
    before, after = trained["before"], trained["after"]  # on fixed held-out sentences
    assert after["loss"] < before["loss"] and after["lm_loss"] < before["lm_loss"] - 1.0
    assert after["bow_loss"] < before["bow_loss"]


@pytest.mark.slow
def test_evaluate_perplexity_under_every_protocol(trained, wiki):
    model = AutoModelForCausalLM.from_pretrained(trained["path"]).eval()
    docs = wiki["valid"].select(range(8))
    results = {p: evaluate_perplexity(model, docs, p) for p in ("paper", "causal", "causal-carry")}
    for protocol, result in results.items():
        assert result["protocol"] == protocol and math.isfinite(result["perplexity"])
        assert 1 < result["perplexity"] < len(wiki["tok"])
    assert results["paper"]["tokens"] == results["causal"]["tokens"] == results["causal-carry"]["tokens"]
    assert results["paper"]["context"] == "others" and results["causal"]["context"] == "preceding"


@pytest.mark.slow
def test_topics_words_inference_and_evaluation(trained, wiki):
    model = AutoModelForCausalLM.from_pretrained(trained["path"]).eval()
    topics = model.get_topics(top_n=10)  # the topic tokenizer saved next to the model
    assert len(topics) == 8 and all(len(words) == 10 and "<unk>" not in words for words in topics)
    assert topics == trained["model"].get_topics(top_n=10, topic_tokenizer=wiki["topic_tok"])
    vocabulary = set(wiki["topic_tok"].get_vocab())
    assert all(w in vocabulary for words in topics for w in words)
    collator = TopicContextCollator(wiki["tok"], wiki["topic_tok"], context="document")
    bow = collator.bag_of_words([collator.encode_document(wiki["valid"][0]["sentences"])["context_ids"][0]])
    t = model.infer_topics(bow)
    assert t.shape == (1, 8) and torch.allclose(t.sum(-1), torch.ones(1))
    text = model.generate(**wiki["tok"](["the company said"], return_tensors="pt"), context_bow=bow,
                          max_new_tokens=5, min_new_tokens=5)
    assert text.shape == (1, 4 + 5)

    pytest.importorskip("topic_lm_hf.evaluation.topics")
    from topic_lm_hf.evaluation.topic_eval import evaluate_topics

    reference = [[w for s in doc for w in s] for doc in wiki["train"]["sentences"]]
    result = evaluate_topics(model, reference, diversity_k=10)
    assert result["num_topics"] == 8 and -1 <= result["npmi"] <= 1 and 0 < result["diversity"] <= 1
    assert result["coherence"]["preset"] == "lau2014" and result["coherence"]["top_n"] == [5, 10, 15, 20]
    assert result["top_words"] == topics
    with pytest.raises(ValueError, match="not a topic model"):
        evaluate_topics(torch.nn.Linear(2, 2), reference)
    with pytest.raises(ValueError, match="Unknown preset 'lau2104'"):
        evaluate_topics(model, reference, preset="lau2104")


def test_topic_model_loss_is_the_forward_topic_terms():
    """pretrain_topic_model's objective is exactly the topic-model part of the joint loss."""
    model = small_model(30, 12, kl_annealing_steps=0)
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]])
    bow = random_bow(2, 12)
    out = model(input_ids=ids, labels=ids.masked_fill(ids == 0, -100), context_bow=bow)
    torch.testing.assert_close(model.topic_model_loss(bow), out.bow_loss + out.kl_loss + out.aux_loss)
    assert {id(p) for p in model.topic_model_parameters()} == {id(p) for p in model.model.topic_model.parameters()}


def test_gumbel_topic_input_trains_the_lm_on_one_hot_topics_and_reaches_the_encoder():
    model = small_model(30, 12, lm_topic_input="gumbel").train()
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]] * 4)
    bow = random_bow(8, 12)
    out = model(input_ids=ids, labels=ids.masked_fill(ids == 0, -100), context_bow=bow)
    t = out.topic_mixture
    assert bool(((t == 0) | (t == 1)).all()) and torch.equal(t.sum(-1), torch.ones(8))  # one-hot rows
    # The LM loss alone (recomputed with the graph: the output's lm_loss is detached) reaches the encoder.
    hidden = model.model(input_ids=ids, context_bow=bow).last_hidden_state
    from topic_lm_hf.models.modeling_recurrent import causal_lm_loss
    model.zero_grad()
    causal_lm_loss(model._head(hidden), ids.masked_fill(ids == 0, -100)).backward()
    assert model.model.topic_model.posterior_mean.weight.grad.abs().sum() > 0  # straight-through gradient
    model.eval()  # evaluation and generation use the posterior-mean proportions, as with "mixture"
    torch.testing.assert_close(model(input_ids=ids, context_bow=bow).topic_mixture, model.infer_topics(bow))
    with pytest.raises(ValueError, match="lm_topic_input"):
        TCNLMConfig(lm_topic_input="onehot")


def test_topic_factor_spread_sets_the_range_of_the_topic_factors():
    for spread, low, high in ((None, 0.5, 1.5), (1.0, 0.0, 2.0)):  # None: initializer_range (0.5 here)
        layer = small_model(30, 12, topic_factor_spread=spread).model.layers[0]
        for factor in (layer.W_b.detach(), layer.U_b.detach()):
            assert float(factor.min()) >= low and float(factor.max()) <= high
            assert float(factor.max() - factor.min()) > 0.9 * (high - low)
    with pytest.raises(ValueError, match="topic_factor_spread"):
        TCNLMConfig(topic_factor_spread=-1.0)


@pytest.mark.slow
def test_pretraining_the_topic_model_on_apnews_lowers_its_loss_and_leaves_the_lm_alone(wiki):
    from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, pretrain_topic_model

    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=10,
                                         embedding_size=16, hidden_size=16))
    collator = TopicContextCollator(tok, topic_tok, context="others")
    rows = collator.prepare(wiki["train"])
    lm_before = {n: p.detach().clone() for n, p in model.named_parameters() if "topic_model" not in n}
    steps = []
    losses = pretrain_topic_model(model, rows, collator, steps=40, batch_size=32, learning_rate=5e-3,
                                  callback=lambda step, loss: steps.append(step)).losses
    assert steps == list(range(40)) and len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
    assert all(torch.equal(p, lm_before[n]) for n, p in model.named_parameters() if "topic_model" not in n)
    lstm = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8))
    with pytest.raises(ValueError, match="cannot be pre-trained"):
        pretrain_topic_model(lstm, rows, collator, steps=1)


def test_topic_output_bias_starts_as_the_paper_model_and_adds_B_t(vocab, tmp_path):
    tok, topic_tok = vocab
    plain = small_model(len(tok), len(topic_tok))
    biased = small_model(len(tok), len(topic_tok), topic_output_bias="learned")
    assert biased.topic_bias.weight.abs().sum().item() == 0.0  # zero at initialisation
    missing, unexpected = biased.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["topic_bias.weight"] and not unexpected
    assert small_model(len(tok), len(topic_tok), topic_output_bias=True).config.topic_output_bias == "learned"
    ids = torch.tensor([[2, 5, 6, 7]])
    torch.testing.assert_close(biased(input_ids=ids, topic_ids=[1]).logits, plain(input_ids=ids, topic_ids=[1]).logits)
    with torch.no_grad():
        biased.topic_bias.weight.normal_()
    t = torch.tensor([[0.5, 0.5, 0, 0, 0, 0]])
    expected = plain(input_ids=ids, topic_mixture=t).logits + (t @ biased.topic_bias.weight.T).unsqueeze(1)
    torch.testing.assert_close(biased(input_ids=ids, topic_mixture=t).logits, expected)
    kw = dict(topic_ids=[2], max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(biased.generate(**kw), biased.generate(**kw, use_cache=False))
    biased.save_pretrained(tmp_path)
    torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(tmp_path).topic_bias.weight, biased.topic_bias.weight)
    with pytest.raises(ValueError, match="topic_output_bias"):
        TCNLMConfig(topic_output_bias="learned", lm_type="naive_moe")
    with pytest.raises(ValueError, match="topic_output_bias must be one of"):
        TCNLMConfig(topic_output_bias="topics")


def test_beta_topic_prior_is_lambda_log_ratio_on_topic_words_and_steers(vocab, tmp_path):
    """topic_output_bias="beta": logits + lambda * log(V_c (beta^T t)_w) on topic words, 0 elsewhere;
    lambda = 0 is the paper's model; with lambda > 0, topic_ids=[k] favours topic k's top words."""
    tok, topic_tok = vocab
    torch.manual_seed(0)
    config = TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=6, embedding_size=12, hidden_size=16,
                                         num_factors=10, encoder_hidden_size=16, topic_embedding_size=8,
                                         topic_output_bias="beta", dropout=0.0)
    model = TCNLMForCausalLM(config).eval()
    plain = TCNLMForCausalLM(TCNLMConfig(**{**config.to_dict(), "topic_output_bias": None})).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    ids = torch.tensor([[2, 5, 6, 7]])
    assert float(model.topic_prior_weight.detach()) == 0.0
    assert float(TCNLMForCausalLM(TCNLMConfig(**{**config.to_dict(), "topic_prior_weight_init": 1.5})).topic_prior_weight.detach()) == 1.5
    torch.testing.assert_close(model(input_ids=ids, topic_ids=[1]).logits, plain(input_ids=ids, topic_ids=[1]).logits)
    with torch.no_grad():
        model.topic_prior_weight.fill_(2.0)
    t = torch.tensor([[0.25, 0.75, 0, 0, 0, 0]])
    beta = model.model.topic_model.beta().detach()
    expected = plain(input_ids=ids, topic_mixture=t).logits.clone()
    topic_vocab, lm_vocab = topic_tok.get_vocab(), tok.get_vocab()
    n_words = sum(1 for w in topic_vocab if w != topic_tok.unk_token and w in lm_vocab)
    for word, j in topic_vocab.items():  # a literal loop over the topic words
        if word != topic_tok.unk_token and word in lm_vocab:
            expected[..., lm_vocab[word]] += 2.0 * math.log(float(t[0] @ beta[:, j]) * n_words)
    torch.testing.assert_close(model(input_ids=ids, topic_mixture=t).logits, expected, rtol=1e-4, atol=1e-4)
    # steering: the next-word mass on topic k's top-5 words is larger under topic_ids=[k] than under the prior
    top = [lm_vocab[w] for w in model.get_topics(top_n=5, topic_tokenizer=topic_tok)[3] if w in lm_vocab]
    steered = torch.softmax(model(input_ids=ids, topic_ids=[3]).logits[0, -1], -1)[top].sum()
    prior = torch.softmax(model(input_ids=ids).logits[0, -1], -1)[top].sum()
    assert float(steered.detach()) > 2 * float(prior.detach())
    kw = dict(topic_ids=[3], max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(model.generate(**kw), model.generate(**kw, use_cache=False))
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert float(again.topic_prior_weight.detach()) == 2.0 and again.config.topic_word_ids == config.topic_word_ids
    with pytest.raises(ValueError, match="needs config.topic_word_ids"):
        small_model(len(tok), len(topic_tok), topic_output_bias="beta")(input_ids=ids)


def test_one_topic_trains_with_a_finite_loss():
    """T = 1 (a factorised LSTM without topics): the diversity regulariser has no pair of topics and is 0."""
    config = TCNLMConfig(vocab_size=10, topic_vocab_size=5, num_topics=1, embedding_size=4, hidden_size=4,
                         encoder_hidden_size=4)
    model = TCNLMForCausalLM(config).train()
    ids, bow = torch.tensor([[2, 5, 6, 3]]), torch.tensor([[0.0, 1.0, 2.0, 0.0, 1.0]])
    out = model(input_ids=ids, labels=ids, context_bow=bow)
    assert torch.isfinite(out.loss) and float(out.aux_loss) == 0.0
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ----------------------------------------------------------------------------------------------
# the recurrence's hand-written backward through time
# ----------------------------------------------------------------------------------------------

def _reference_recurrence(gates_x, q, U_c, U_a, h, c, keep):
    """TCNLMRecurrence step by step under autograd (the per-step loop the layer ran before)."""
    s, g, b, H = gates_x.shape
    f = q.shape[-1]
    outputs = []
    for m in range(s):
        u = (h @ U_c.t()).view(b, g, f).transpose(0, 1)
        a = torch.baddbmm(gates_x[m], u * (q[m] if q.dim() == 4 else q), U_a.transpose(1, 2))
        i_gate, f_gate, o_gate = torch.sigmoid(a[0]), torch.sigmoid(a[1]), torch.sigmoid(a[3])
        c_new = f_gate * c + i_gate * torch.tanh(a[2])
        h_new = o_gate * torch.tanh(c_new)
        if keep is None:
            h, c = h_new, c_new
            outputs.append(h_new)
        else:
            h, c = torch.where(keep[m], h_new, h), torch.where(keep[m], c_new, c)
            outputs.append(h_new * keep[m])
    return torch.stack(outputs), h, c


def _recurrence_inputs(s=5, b=3, H=4, f=3, padded=True, dtype=torch.float64, seed=0, per_step=False):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype).requires_grad_()  # noqa: E731
    keep = None
    if padded:  # left padding in row 0, right padding in row 1, none in row 2
        keep = torch.ones(s, b, 1, dtype=torch.bool)
        keep[:2, 0] = False
        keep[-1, 1] = False
    q = rand(s, 4, b, f) if per_step else rand(4, b, f)  # U_b t of every step (a carried document), or one per row
    return rand(s, 4, b, H), q, rand(4 * f, H), rand(4, H, f), rand(b, H), rand(b, H), keep


@pytest.mark.parametrize("padded,per_step", [(False, False), (True, False), (True, True)],
                         ids=["no-padding", "padding", "topics-per-step"])
def test_the_recurrences_backward_through_time_equals_autograds_and_passes_gradcheck(padded, per_step):
    from topic_lm_hf.models.modeling_tcnlm import TCNLMRecurrence

    inputs = _recurrence_inputs(padded=padded, per_step=per_step)
    assert torch.autograd.gradcheck(TCNLMRecurrence.apply, inputs, eps=1e-6, atol=1e-8)
    # against the step-by-step loop: the outputs, the last state and every gradient (with a loss that weighs the
    # outputs and the final state differently, so that each backward path counts)
    leaves = inputs[:-1]
    weights = [torch.randn_like(x) for x in _reference_recurrence(*inputs)]
    grads = []
    for run in (TCNLMRecurrence.apply, _reference_recurrence):
        out = run(*inputs)
        loss = sum((o * w).sum() for o, w in zip(out, weights))
        grads.append((out, torch.autograd.grad(loss, leaves)))
    for got, want in zip(grads[0][0], grads[1][0]):
        torch.testing.assert_close(got, want)
    for got, want in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(got, want)


def test_the_layer_on_real_batches_equals_its_step_by_step_form_in_float32(vocab):
    """A small TCNLM on a padded batch with a carried state: the loss and every gradient equal those of the same
    layer run step by step under autograd (float32 rounding)."""
    from topic_lm_hf.models import modeling_tcnlm

    tok, topic_tok = vocab
    model = small_model(len(tok), len(topic_tok)).train()
    batch = tok(["the senate said on monday", "police"], return_tensors="pt", padding=True)
    state = tuple(torch.randn(2, 2, model.config.hidden_size) * 0.1 for _ in range(2))
    runs = []
    original = modeling_tcnlm.TCNLMRecurrence.apply
    for recurrence in (original, _reference_recurrence):
        modeling_tcnlm.TCNLMRecurrence.apply = recurrence
        try:
            torch.manual_seed(0)
            out = model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100),
                        context_bow=random_bow(2, len(topic_tok)), state=state)
            runs.append((out.loss.detach(), torch.autograd.grad(out.loss, list(model.parameters()))))
        finally:
            modeling_tcnlm.TCNLMRecurrence.apply = original
    torch.testing.assert_close(runs[0][0], runs[1][0])
    for got, want in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
