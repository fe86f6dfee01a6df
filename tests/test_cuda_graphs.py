"""Captured training steps (topic_lm_hf.cuda_graphs): what a CPU can check of them.

A CUDA graph can only be captured on a GPU (``scripts/gpu_check.py``'s ``graphs-tcnlm`` part does it and times it).
What makes a step capturable is checked here: under ``host_reads_deferred`` the training step of every family that
declares ``supports_cuda_graphs`` reads nothing on the host (no synchronisation in forward and backward), and its
loss and gradients equal the eager step's, on the padded batch the captured step takes. The refusals are one line."""

import pytest
import torch

from conftest import tiny_model, variants

from topic_lm_hf.families import variant_of

CAPTURABLE = [v for v in variants() if variant_of(v)[0].causal_lm_class.supports_cuda_graphs]


def chunk_batch(model, wiki, rows=6):
    from topic_lm_hf import TopicContextCollator

    collator = TopicContextCollator.for_model(model, wiki["tok"], wiki["topic_tok"], protocol="train")
    prepared = collator.prepare(wiki["train"].select(range(4)))
    batch = collator([prepared[i] for i in range(rows)])
    assert batch["input_ids"].shape[1] % 32 != 0  # so that the bucket pads it
    return batch


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_tcnlm_declares_a_capturable_step():
    assert "tcnlm" in CAPTURABLE and "lstm_lm" not in CAPTURABLE  # cuDNN's LSTM did not train captured


# the steering recipe's TCNLM adds the topic output prior (a row bias) to the output layer
# the LSTM LM's deferred step (run_rnn's path) is checked too, although cuDNN's LSTM is not captured
@pytest.mark.parametrize("family, overrides", [(v, {}) for v in CAPTURABLE + ["lstm_lm"]] +
                         [("tcnlm", {"topic_output_bias": "beta", "topic_prior_weight_init": 1.0})])
def test_a_deferred_step_reads_nothing_on_the_host_and_equals_the_eager_step(family, overrides, wiki):
    from benchmarking import OperationCounter

    from topic_lm_hf.cuda_graphs import pad_batch
    from topic_lm_hf.models.modeling_recurrent import host_reads_deferred

    model = tiny_model(family, wiki["tok"], wiki["topic_tok"], dropout=0.0, **overrides).train()
    batch = chunk_batch(model, wiki)
    eager_loss, eager_grads = loss_and_grads(model, batch)
    padded = pad_batch(batch, 32, model.config.pad_token_id)
    assert padded["input_ids"].shape[1] == 32 and padded["labels"][:, batch["labels"].shape[1]:].eq(-100).all()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with OperationCounter() as ops, host_reads_deferred():
        loss = model(**padded).loss
        loss.backward()
    assert ops.syncs == 0, dict(ops.syncs_by_name)
    torch.testing.assert_close(loss.detach(), eager_loss, rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads) == set(eager_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_deferred_step_is_off_outside_its_block(wiki):
    from topic_lm_hf.models.modeling_recurrent import host_reads_are_deferred, host_reads_deferred

    with host_reads_deferred():
        assert host_reads_are_deferred()
    assert not host_reads_are_deferred()
    model = tiny_model("lstm_lm", wiki["tok"], wiki["topic_tok"]).train()
    batch = chunk_batch(model, wiki)
    batch["input_ids"][0, 0] = model.config.vocab_size  # the eager step checks its ids
    with pytest.raises(ValueError, match="mismatched tokenizer"):
        model(**batch)


def test_a_family_that_cannot_be_captured_and_a_cpu_are_refused_in_one_line(wiki):
    from topic_lm_hf.cuda_graphs import GraphedTrainingStep

    for family in ("topic_rnn-lstm", "lstm_lm"):
        with pytest.raises(ValueError, match="cannot train from a captured step") as error:
            GraphedTrainingStep(tiny_model(family, wiki["tok"], wiki["topic_tok"]))
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="needs the model on a CUDA GPU"):
        GraphedTrainingStep(tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"]))


def test_the_trainer_refuses_cuda_graphs_on_a_cpu(wiki, tmp_path):
    from transformers import TrainingArguments

    from topic_lm_hf import TopicContextCollator, TopicLMTrainer

    model = tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"])
    collator = TopicContextCollator.for_model(model, wiki["tok"], wiki["topic_tok"], protocol="train")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=1)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(wiki["train"].select(range(2))),
                       data_collator=collator, cuda_graphs=True)


def test_topic_lm_train_refuses_cuda_graphs_on_a_cpu_with_exit_code_2(tmp_path, capsys):
    from topic_lm_hf.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", "--model_type", "tcnlm", "--output_dir", str(tmp_path / "run"), "--use_cpu", "true",
              "--cuda_graphs", "true", "--max_steps", "1"])
    assert stop.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_batch_is_checked_before_a_replay_in_one_host_read(wiki):
    from benchmarking import OperationCounter

    from topic_lm_hf.cuda_graphs import check_batch

    model = tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"])
    batch = chunk_batch(model, wiki)
    with OperationCounter() as ops:
        check_batch(batch, model.config.vocab_size)
    assert ops.syncs == 1
    bad = {**batch, "input_ids": batch["input_ids"].clone()}
    bad["input_ids"][0, 0] = model.config.vocab_size
    with pytest.raises(ValueError, match="mismatched tokenizer"):
        check_batch(bad, model.config.vocab_size)
    bad = {**batch, "context_bow": batch["context_bow"].clone()}
    bad["context_bow"][1, 2] = float("nan")
    with pytest.raises(ValueError, match="finite, non-negative counts"):
        check_batch(bad, model.config.vocab_size)
    bad = {**batch, "attention_mask": batch["attention_mask"].flip(1)}  # padding on the left
    with pytest.raises(ValueError, match="pad on the right"):
        check_batch(bad, model.config.vocab_size)
