"""Where the package computes: every family creates its tensors on its inputs' device and in its own dtype, the
commands take ``--device``, the fast path is chosen per device, and timings synchronise the device.

No GPU is needed: a tensor created without a device lands on the ``meta`` device here (``torch.set_default_device``),
where mixing it with the model's CPU tensors fails, and one created without a dtype is float64
(``torch.set_default_dtype``), which would leak into the float32 outputs. An explicit device (a host-side table
built on the CPU on purpose) or dtype is fine."""

import argparse
from contextlib import contextmanager

import pytest
import torch

from conftest import TINY_CORPUS, topic_family_model, variants
from topic_lm_hf import TopicContextCollator, documents_from_lists
from topic_lm_hf.devices import DeviceArguments, default_device, resolve_device



@contextmanager
def implicit_tensors_elsewhere():
    """Factories without ``device=`` make meta tensors and without ``dtype=`` float64 ones, inside the block."""
    torch.set_default_device("meta")
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_device(None)
        torch.set_default_dtype(torch.float32)


def batch_for(model, tok, topic_tok, **kwargs):
    collator = TopicContextCollator.for_model(model, tok, topic_tok, **kwargs)
    rows = collator.prepare(documents_from_lists(TINY_CORPUS))
    return collator([rows[i] for i in range(len(rows))])


def floating(output) -> dict:
    return {k: v.dtype for k, v in output.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}


@pytest.mark.parametrize("family", variants())
def test_every_family_creates_its_tensors_on_its_inputs_device_and_in_its_dtype(family, tiny_vocabularies):
    tok, topic_tok = tiny_vocabularies
    model = topic_family_model(family, tok, topic_tok).train()
    batch = batch_for(model, tok, topic_tok)
    with implicit_tensors_elsewhere():
        out = model(**batch)  # training: every loss term
        out.loss.backward()
        assert set(floating(out).values()) == {torch.float32}, floating(out)
        assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
        model.eval()
        with torch.no_grad():
            evaluated = model(**{k: v for k, v in batch.items() if k != "labels"})
            assert evaluated.logits.device.type == "cpu" and evaluated.logits.dtype == torch.float32
            prompt = torch.tensor([[tok.bos_token_id] + tok.convert_tokens_to_ids(["the", "court"])], device="cpu")
            conditionings = [{}]
            if family != "lstm_lm":
                bow = torch.zeros(1, len(topic_tok), device="cpu")
                bow[0, 1:4] = 1.0
                conditionings += [{"topic_ids": [1]}, {"context_bow": bow},
                                  {"topic_ids": [1], "topic_guidance_scale": 2.0}]
            for conditioning in conditionings:
                generated = model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id,
                                           **conditioning)
                assert generated.device.type == "cpu" and generated.shape[1] >= prompt.shape[1]


@pytest.mark.parametrize("family", variants(representative=True, reads_documents=False))
def test_carried_state_training_creates_its_tensors_on_its_inputs_device(family, tiny_vocabularies):
    from topic_lm_hf.carried_state import carried_state_loss

    tok, topic_tok = tiny_vocabularies
    model = topic_family_model(family, tok, topic_tok).train()
    batch = batch_for(model, tok, topic_tok, context="preceding" if family != "lstm_lm" else "none",
                      layout="documents")
    with implicit_tensors_elsewhere():
        loss = carried_state_loss(model, batch).loss
        loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_resolve_device_defaults_to_the_gpu_when_there_is_one_and_says_what_to_pass():
    assert resolve_device(None) == default_device() == resolve_device("auto")
    assert resolve_device("cpu") == torch.device("cpu") == DeviceArguments("cpu").torch_device
    with pytest.raises(ValueError, match="the meta device holds shapes, not numbers"):  # a traceback later, before
        DeviceArguments("meta").torch_device
    with pytest.raises(ValueError, match="--device takes cpu, cuda or cuda:N, got 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        assert default_device() == torch.device("cpu")
        with pytest.raises(ValueError, match="this machine has no CUDA GPU .*pass --device cpu"):
            resolve_device("cuda")


# the commands that load a model outside the Trainer take --device; train, wsd train follow TrainingArguments
DEVICE_COMMANDS = ["evaluate", "generate", "topics", "steer", "classify", "retrieve", "demo", "wsd evaluate"]


@pytest.mark.parametrize("name", DEVICE_COMMANDS)
def test_every_command_that_runs_a_model_takes_device(name):
    from topic_lm_hf.cli import COMMANDS

    assert DeviceArguments in COMMANDS[name].arguments


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_device_this_machine_lacks_is_one_line_and_exit_code_2(tmp_path, capsys):
    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, build_vocabularies, save_vocabularies, synthetic_documents
    from topic_lm_hf.cli import main

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, embedding_size=4,
                                                         hidden_size=4))
    model.save_pretrained(tmp_path / "m")
    save_vocabularies(tok, topic_tok, tmp_path / "m")
    capsys.readouterr()
    for command in (["generate", "--topic_ids", "1"], ["topics"]):
        with pytest.raises(SystemExit) as exit_:
            main([command[0], "--model_name_or_path", str(tmp_path / "m"), "--device", "cuda", *command[1:]])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 1, err
        assert err[0].startswith(f"topic-lm {command[0]}: error: --device cuda: this machine has no CUDA GPU")
    main(["generate", "--model_name_or_path", str(tmp_path / "m"), "--device", "cpu", "--topic_ids", "1",
          "--max_new_tokens", "3"])
    assert capsys.readouterr().out.strip()


def test_on_a_gpu_the_default_path_is_float32_eager_and_says_why(monkeypatch, tmp_path):
    """The GPU defaults rest on the H200 measurement (fast_path.GPU_MEASUREMENT): bf16 autocast and the compiled
    output layer were not faster there; flags still force them."""
    from transformers import TrainingArguments

    from topic_lm_hf import fast_path

    monkeypatch.setattr(fast_path, "on_gpu", lambda training_args: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert fast_path.resolve_compile(args, None) is False and fast_path.resolve_compile(args, True) is True
    bf16, sentence = fast_path.resolve_precision(args, "auto", fast_path.resolve_compile(args, None))
    assert not bf16
    assert sentence.startswith("Training in float32 with the output layer eager: on NVIDIA H200 float32 is the "
                               "faster (measured on an H200")
    assert fast_path.resolve_precision(args, "bf16")[0]
    monkeypatch.setattr(fast_path, "on_gpu", lambda training_args: False)
    assert fast_path.resolve_compile(args, None) is True  # the CPU default


def test_the_interleaved_timing_synchronises_the_device_around_every_step(monkeypatch, tiny_vocabularies):
    import benchmarking

    tok, topic_tok = tiny_vocabularies
    model = topic_family_model("lstm_lm", tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok)
    rows = collator.prepare(documents_from_lists(TINY_CORPUS))
    calls = []
    monkeypatch.setattr(benchmarking, "synchronize", lambda device: calls.append(torch.device(device).type))
    timed = benchmarking.interleaved_step_times({"lstm": model}, {"lstm": collator}, {"lstm": rows},
                                                argparse.Namespace(batch_size=2, clip=0.5), repeats=2)
    assert calls == ["cpu"] * 2 * 4  # before and after each of the 2 warm-up and 2 timed steps
    assert timed["lstm"]["step_s"] > 0 and timed["lstm"]["first_step_s"] > 0
