"""The fast training path: the output layer at the predicted positions only (against a naive loop), compiled
(against eager), bf16 autocast through the Trainer on a CPU, and the choice of precision (topic_lm_hf.fast_path)."""

import logging

import pytest
import torch
from torch import nn
from transformers import TrainingArguments

from topic_lm_hf import TopicContextCollator, TopicLMTrainer
from topic_lm_hf.fast_path import cpu_bf16_flags, fast_training_arguments
from topic_lm_hf.models import modeling_recurrent
from topic_lm_hf.models.modeling_recurrent import causal_lm_loss, compiled_linear_cross_entropy, next_token_loss

from conftest import tiny_model, variants

pytestmark = pytest.mark.usefixtures("one_thread")

CPUINFO_BF16 = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
CPUINFO_PLAIN = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n"


def naive_next_token_loss(features, labels, output, row_bias=None, row_bias_mask=None):
    """One position at a time: -log softmax(W h_t + c + m_t * bias_row)[y_{t+1}], averaged over the labelled ones."""
    total, count = 0.0, 0
    for i in range(labels.shape[0]):
        for t in range(labels.shape[1] - 1):
            y = int(labels[i, t + 1])
            if y == -100:
                continue
            logits = output(features[i, t]).double()
            if row_bias is not None:
                scale = 1.0 if row_bias_mask is None else float(row_bias_mask[i, t])
                logits = logits + scale * row_bias[i].double()
            total += -torch.log_softmax(logits, -1)[y]
            count += 1
    return total / count


def random_case(seed=0, b=4, s=7, f=6, v=11):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(b, s, f, generator=g)
    labels = torch.randint(0, v, (b, s), generator=g)
    labels[0, 4:] = -100  # right padding
    labels[1, :3] = -100  # left padding
    labels[2, 0] = -100
    output = nn.Linear(f, v)
    with torch.no_grad():
        output.weight.copy_(torch.randn(v, f, generator=g))
    return features, labels, output, torch.randn(b, v, generator=g), (torch.rand(b, s - 1, generator=g) > 0.5).float()


@pytest.mark.parametrize("bias", ["none", "row", "row-masked"])
def test_next_token_loss_equals_a_naive_loop_over_positions(bias):
    features, labels, output, row_bias, mask = random_case()
    kwargs = {"none": {}, "row": {"row_bias": row_bias}, "row-masked": {"row_bias": row_bias, "row_bias_mask": mask}}
    got = next_token_loss(features, labels, output, **kwargs[bias])
    want = naive_next_token_loss(features, labels, output, **kwargs[bias])
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    if bias != "row-masked":  # and the full-logits path of evaluation
        full = output(features) + (row_bias.unsqueeze(1) if bias == "row" else 0)
        torch.testing.assert_close(got, causal_lm_loss(full, labels), rtol=1e-6, atol=1e-6)


def test_next_token_loss_of_a_batch_without_labels_is_zero_not_nan():
    features, labels, output, _, _ = random_case()
    assert next_token_loss(features, torch.full_like(labels, -100), output).item() == 0.0


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_compiled_output_layer_equals_eager_in_value_and_gradient(bf16):
    """Stated tolerance: float32 1e-5 relative; under bf16 autocast 2e-2 relative on the loss (both run the matrix
    product in bf16; they round differently) and 5e-2 on the gradients."""
    if compiled_linear_cross_entropy() is None:
        pytest.skip(f"torch.compile does not work here: {modeling_recurrent._COMPILED['error', 'cpu']}")
    features, labels, output, row_bias, mask = random_case(s=12, f=16, v=300)
    features.requires_grad_(True)
    row_bias.requires_grad_(True)
    results = []
    for compiled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = next_token_loss(features, labels, output, row_bias, mask, compiled=compiled)
        assert loss.dtype == torch.float32  # the log-sum-exp in float32 whatever the autocast dtype
        results.append((loss, grads(loss, features, output.weight, row_bias)))
    (eager, eager_grads), (comp, comp_grads) = results
    tol = dict(rtol=2e-2, atol=1e-3) if bf16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comp, eager, **tol)
    for g_comp, g_eager in zip(comp_grads, eager_grads):
        torch.testing.assert_close(g_comp, g_eager, **(dict(rtol=5e-2, atol=5e-3) if bf16 else tol))


def test_compile_output_layer_falls_back_to_eager_with_one_warning(monkeypatch, caplog):
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        return run

    monkeypatch.setattr(modeling_recurrent, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", broken_compile)
    from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM

    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=20, embedding_size=8, hidden_size=8))
    with caplog.at_level(logging.WARNING):
        assert model.compile_output_layer() is False
    assert model.output_layer_compiled is False
    assert [r.getMessage() for r in caplog.records] == [
        "The output layer stays eager: torch.compile does not work here (RuntimeError: InvalidCxxCompiler: No "
        "working C++ compiler found)."]
    model.train()
    ids = torch.randint(4, 20, (2, 5))
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)  # and training goes on, eagerly


def test_cpu_bf16_flags_reads_proc_cpuinfo():
    assert cpu_bf16_flags(CPUINFO_BF16) == ["avx512_bf16"]
    assert cpu_bf16_flags(CPUINFO_PLAIN) == []
    assert cpu_bf16_flags("flags : amx_bf16 amx_tile avx512_bf16") == ["avx512_bf16", "amx_bf16"]


@pytest.mark.parametrize("precision, cpuinfo, bf16, message", [
    ("auto", CPUINFO_BF16, True, "Training in bf16 autocast (this CPU has AVX512-BF16; --precision fp32 turns it "
                                 "off)."),
    ("auto", CPUINFO_PLAIN, False, "Training in float32: this CPU (x86_64) lacks AVX512-BF16 and AMX: bf16 would "
                                   "be emulated, slower than float32 (--precision bf16 forces bf16)."),
    ("bf16", CPUINFO_PLAIN, True, "Training in bf16 autocast (--precision bf16; --precision fp32 turns it off)."),
    ("fp32", CPUINFO_BF16, False, "Training in float32 (--precision fp32)."),
])
def test_fast_training_arguments_chooses_bf16_where_it_is_fast_and_says_so(tmp_path, caplog, monkeypatch, precision,
                                                                           cpuinfo, bf16, message):
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with caplog.at_level(logging.INFO, logger="topic_lm_hf.fast_path"):
        got = fast_training_arguments(args, precision, cpuinfo=cpuinfo)
    assert got.bf16 is bf16 and got.use_cpu
    assert got.mixed_precision == ("bf16" if bf16 else "no")
    assert [r.getMessage() for r in caplog.records] == [message]


def test_fast_training_arguments_refuses_contradictions(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=True)
    with pytest.raises(ValueError, match="--precision fp32 contradicts --bf16 true"):
        fast_training_arguments(args, "fp32")
    with pytest.raises(ValueError, match="precision must be one of"):
        fast_training_arguments(args, "fp16")
    assert fast_training_arguments(args, "auto", cpuinfo=CPUINFO_PLAIN).bf16  # an explicit --bf16 true is kept


@pytest.mark.parametrize("family", variants(representative=True, reads_documents=False))
def test_trainer_trains_every_family_in_bf16_on_a_cpu_with_the_compiled_output_layer(wiki, tmp_path, family):
    """TrainingArguments(bf16=True, use_cpu=True): the Trainer's own autocast runs the models in bf16,
    the weights stay float32 (and are saved so), the loss terms are finite and float32."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = tiny_model(family, tok, topic_tok)
    autocast = []  # what the recurrent body runs under
    model.get_input_embeddings().register_forward_hook(lambda m, i, o: autocast.append(
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
    collator = TopicContextCollator.for_model(model, tok, topic_tok)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8, logging_steps=1,
                             report_to=[], use_cpu=True, bf16=True, save_strategy="no", disable_tqdm=True)
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(wiki["train"].select(range(20))),
                             data_collator=collator, compile_output_layer=True)
    trainer.train()
    assert model.output_layer_compiled or compiled_linear_cross_entropy() is None
    assert autocast and set(autocast) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    # After training the model object computes in float32 again, as its saved weights will after loading
    # (accelerate leaves an autocast wrapper on model.forward; TopicLMTrainer.train removes it).
    autocast.clear()
    trainer.save_model(str(tmp_path / "saved"))
    loaded = type(model).from_pretrained(tmp_path / "saved").eval()
    batch = collator([collator.prepare(wiki["valid"].select(range(2)))[i] for i in range(4)])
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**inputs).logits, loaded(**inputs).logits)
    assert autocast == [False]


def test_the_padded_rows_of_the_compiled_path_change_neither_loss_nor_gradient(monkeypatch):
    """On a GPU the compiled output layer pads its rows to a bucket (COMPILED_ROW_BUCKET: a few shapes, no
    recompilation limit); padded rows are ignored targets with a zero bias and scale. Forced here on the CPU."""
    if compiled_linear_cross_entropy() is None:
        pytest.skip(f"torch.compile does not work here: {modeling_recurrent._COMPILED['error', 'cpu']}")
    monkeypatch.setitem(modeling_recurrent.COMPILED_ROW_BUCKET, "cpu", 64)
    features, labels, output, row_bias, mask = random_case(s=12, f=16, v=300)
    features.requires_grad_(True)
    row_bias.requires_grad_(True)
    results = []
    for compiled in (False, True):
        loss = next_token_loss(features, labels, output, row_bias, mask, compiled=compiled)
        results.append((loss, grads(loss, features, output.weight, row_bias)))
    assert int((labels[:, 1:] != -100).sum()) % 64  # the case does pad
    (eager, eager_grads), (comp, comp_grads) = results
    torch.testing.assert_close(comp, eager, rtol=1e-5, atol=1e-6)
    for g_comp, g_eager in zip(comp_grads, eager_grads):
        torch.testing.assert_close(g_comp, g_eager, rtol=1e-5, atol=1e-6)
