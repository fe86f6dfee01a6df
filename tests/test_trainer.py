"""Training through transformers.Trainer on real APNEWS text: loss falls, accumulation keeps the
loss scale, an interrupted run resumes exactly, and a NaN loss stops training without losing weights."""

import math

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, TopicLMTrainer
from topic_lm_hf.arguments import ModelArguments
from topic_lm_hf.commands import train
from topic_lm_hf.data import DataArguments
from topic_lm_hf.trainer import NonFiniteGradientError, NonFiniteLossError


def make_trainer(wiki, tmp_path, dropout=0.0, **args):
    tok = wiki["tok"]
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=32, hidden_size=48, dropout=dropout))
    collator = TopicContextCollator(tok, None, context="none")
    rows = collator.prepare(wiki["train"].select(range(60)))
    defaults = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=3e-3, logging_steps=1,
                    report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0)
    defaults.update(args)
    return TopicLMTrainer(model=model, args=TrainingArguments(**defaults), train_dataset=rows, data_collator=collator)


def logged(trainer, key="loss"):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_loss_falls_on_apnews_and_every_term_is_logged(wiki, tmp_path):
    trainer = make_trainer(wiki, tmp_path, max_steps=40, logging_steps=10)
    trainer.train()
    losses = logged(trainer)
    assert losses[0] == pytest.approx(logged(trainer, "lm_loss")[0], rel=1e-3)
    assert losses[-1] < losses[0] - 1.0, losses
    assert trainer.args.remove_unused_columns is False and trainer.args.label_names == ["labels"]


def test_gradient_accumulation_keeps_the_logged_loss_scale(wiki, tmp_path):
    one = make_trainer(wiki, tmp_path / "ga1", max_steps=1, per_device_train_batch_size=8, learning_rate=0.0)
    two = make_trainer(wiki, tmp_path / "ga2", max_steps=1, per_device_train_batch_size=4,
                       gradient_accumulation_steps=2, learning_rate=0.0)
    one.train()
    two.train()
    loss1, loss2 = logged(one)[0], logged(two)[0]
    assert abs(loss1 - math.log(len(wiki["tok"]))) < 0.1  # at initialisation: about ln V
    assert loss2 == pytest.approx(loss1, rel=0.02)  # not twice as large (hf-notes: accepts_loss_kwargs)


class RecordSteps(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


class RecordLogs(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_interrupted_training_resumes_from_its_last_checkpoint(wiki, tmp_path):
    data_args = DataArguments(min_freq=3, stopwords="none")
    model_args = ModelArguments(model_type="lstm_lm", config_overrides="embedding_size=16,hidden_size=24,dropout=0.3")
    docs = wiki["train"].select(range(40))

    def args(out):
        return TrainingArguments(output_dir=str(out), max_steps=6, save_steps=2, per_device_train_batch_size=8,
                                 learning_rate=3e-3, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
                                 logging_steps=1, eval_strategy="no")

    full, _, _ = train(data_args, model_args, args(tmp_path / "full"), docs, None)
    train(data_args, model_args, args(tmp_path / "cut"), docs, None, callbacks=[StopAt(4)])  # "killed" at step 4
    assert (tmp_path / "cut" / "checkpoint-4").exists()
    record = RecordSteps()
    resumed, _, _ = train(data_args, model_args, args(tmp_path / "cut"), docs, None, callbacks=[record])
    assert record.steps == [5, 6]  # it picked checkpoint-4 up instead of starting again
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_resuming_a_differently_configured_run_and_a_second_live_run_are_refused(wiki, tmp_path):
    from topic_lm_hf.checkpoints import OutputDirInUseError, OutputDirLock

    data_args = DataArguments(min_freq=3, stopwords="none")
    docs = wiki["train"].select(range(16))
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2, save_steps=2,
                             per_device_train_batch_size=8, report_to=[], use_cpu=True, disable_tqdm=True,
                             eval_strategy="no")
    small = ModelArguments(model_type="lstm_lm", config_overrides="embedding_size=16,hidden_size=24")
    train(data_args, small, args, docs, None)
    assert not (tmp_path / "run" / ".training.lock").exists()  # a finished run leaves no lock behind
    other = ModelArguments(model_type="lstm_lm", config_overrides="embedding_size=16,hidden_size=32")
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-2: .*hidden_size: 24 in the checkpoint, "
                                         r"32 in this run"):
        train(data_args, other, args, docs, None)
    holder = OutputDirLock(str(tmp_path / "busy"))
    holder.acquire()  # a live run on the folder
    try:
        busy = TrainingArguments(output_dir=str(tmp_path / "busy"), max_steps=1, report_to=[], use_cpu=True,
                                 save_strategy="no")
        with pytest.raises(OutputDirInUseError, match=r"Another training run \(pid \d+\) is writing to .*busy"):
            train(data_args, small, busy, docs, None)
    finally:
        holder.release()
    train(data_args, small, busy, docs, None)  # free again


def test_a_second_run_on_a_folder_is_refused_before_its_topic_model_is_pre_trained(wiki, tmp_path):
    """The lock covered the Trainer only: a second topic-lm train on a live run's folder pre-trained (resuming the
    first run's pre-training checkpoint under its own settings) before it was refused, or replaced the first run's
    model. The whole command holds it now."""
    from topic_lm_hf.checkpoints import OutputDirInUseError, OutputDirLock

    data_args = DataArguments(min_freq=3, stopwords="none")
    docs = wiki["train"].select(range(16))
    recipe = ModelArguments(model_type="tcnlm", pretrain_topic_model_steps=4,
                            config_overrides="embedding_size=16,hidden_size=16,num_topics=3")
    busy = TrainingArguments(output_dir=str(tmp_path / "busy"), max_steps=1, report_to=[], use_cpu=True,
                             save_strategy="no", per_device_train_batch_size=8)
    holder = OutputDirLock(str(tmp_path / "busy"))
    holder.acquire()  # a live run on the folder
    try:
        with pytest.raises(OutputDirInUseError, match=r"Another training run \(pid \d+\) is writing to .*busy"):
            train(data_args, recipe, busy, docs, None)
        assert not (tmp_path / "busy" / "pretraining").exists()  # nothing of the second run was written
    finally:
        holder.release()
    train(data_args, recipe, busy, docs, None)  # free again: pre-training and training run under one lock
    assert (tmp_path / "busy" / "config.json").exists() and not (tmp_path / "busy" / ".training.lock").exists()


def test_a_nan_loss_stops_training_and_keeps_the_weights(wiki, tmp_path):
    trainer = make_trainer(wiki, tmp_path, max_steps=5)
    with torch.no_grad():
        trainer.model.lm_head.bias[5] = float("nan")
    with pytest.raises(NonFiniteLossError, match="nonfinite-step-0"):
        trainer.train()
    assert (tmp_path / "nonfinite-step-0" / "model.safetensors").exists()


def test_resuming_a_checkpoint_of_another_model_is_an_error(wiki, tmp_path):
    """`topic-lm train` of a TCNLM into a folder that holds an LSTM run's checkpoints: resuming
    used to load the LSTM weights it could into the TCNLM (strict=False) and fail later on the
    optimizer state with a puzzling message."""
    data_args = DataArguments(min_freq=3, stopwords="none")
    docs = wiki["train"].select(range(30))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, save_steps=2, per_device_train_batch_size=8,
                             report_to=[], use_cpu=True, disable_tqdm=True, eval_strategy="no")
    train(data_args, ModelArguments(model_type="lstm_lm", config_overrides="embedding_size=16,hidden_size=16"),
          args, docs, None)
    tcnlm = ModelArguments(model_type="tcnlm", config_overrides="embedding_size=16,hidden_size=16,num_topics=3")
    with pytest.raises(ValueError, match=r"Cannot resume from .*checkpoint-2: .*model_type: 'lstm_lm' in the "
                                         r"checkpoint, 'tcnlm' in this run.*another output_dir"):
        train(data_args, tcnlm, args, docs, None)


class OverflowingBackwardAt(TrainerCallback):
    """Fault injection: at one optimizer step the backward pass gives an infinite gradient to one
    weight while the loss stays finite (an overflow in backward)."""

    def __init__(self, step):
        self.step, self.armed = step, False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        model.lm_head.bias.register_hook(lambda grad: grad + float("inf") if self.armed else grad)

    def on_step_begin(self, args, state, control, **kwargs):
        self.armed = state.global_step + 1 == self.step


def all_finite(folder):
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t.float()).all()) for t in load_file(folder / "model.safetensors").values())


def test_a_nonfinite_gradient_is_not_applied_and_the_advised_recovery_works(wiki, tmp_path):
    """Used to: apply the step, save NaN weights as checkpoint-4 and as nonfinite-step-4, so that
    resuming from the last checkpoint, as the error advised, failed again."""
    data_args = DataArguments(min_freq=3, stopwords="none")
    model_args = ModelArguments(model_type="lstm_lm", config_overrides="embedding_size=16,hidden_size=16")
    docs = wiki["train"].select(range(40))

    def args(learning_rate):
        return TrainingArguments(output_dir=str(tmp_path), max_steps=6, save_steps=2, per_device_train_batch_size=8,
                                 learning_rate=learning_rate, max_grad_norm=1.0, report_to=[], use_cpu=True,
                                 disable_tqdm=True, seed=0, eval_strategy="no")

    with pytest.raises(NonFiniteGradientError, match=r"gradient norm is (nan|inf) .*at step 4.*nonfinite-step-3"):
        train(data_args, model_args, args(3e-3), docs, None, callbacks=[OverflowingBackwardAt(4)])
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]  # step 4 never happened
    assert all_finite(tmp_path / "checkpoint-2") and all_finite(tmp_path / "nonfinite-step-3")
    record = RecordSteps()
    model, _, _ = train(data_args, model_args, args(1e-3), docs, None, callbacks=[record])  # the advised recovery
    assert record.steps == [3, 4, 5, 6]
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_a_run_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(wiki, tmp_path, monkeypatch):
    """The kill leaves checkpoint-4 without trainer_state.json (Trainer writes it last); resuming
    used to pick checkpoint-4 and fail with FileNotFoundError."""
    from topic_lm_hf import TopicLMTrainer
    from topic_lm_hf.checkpoints import last_complete_checkpoint

    data_args = DataArguments(min_freq=3, stopwords="none")
    model_args = ModelArguments(model_type="lstm_lm", config_overrides="embedding_size=16,hidden_size=24,dropout=0.3")
    docs = wiki["train"].select(range(40))

    def args(out):
        return TrainingArguments(output_dir=str(out), max_steps=6, save_steps=2, per_device_train_batch_size=8,
                                 learning_rate=3e-3, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
                                 eval_strategy="no")

    full, _, _ = train(data_args, model_args, args(tmp_path / "full"), docs, None)
    save_rng_state = TopicLMTrainer._save_rng_state

    def killed_at_checkpoint_4(self, output_dir):
        if output_dir.endswith("checkpoint-4"):
            raise KeyboardInterrupt("killed while writing checkpoint-4")
        return save_rng_state(self, output_dir)

    monkeypatch.setattr(TopicLMTrainer, "_save_rng_state", killed_at_checkpoint_4)
    with pytest.raises(KeyboardInterrupt):
        train(data_args, model_args, args(tmp_path / "cut"), docs, None)
    monkeypatch.undo()
    cut = tmp_path / "cut"
    assert (cut / "checkpoint-4" / "model.safetensors").exists()
    assert not (cut / "checkpoint-4" / "trainer_state.json").exists()
    assert last_complete_checkpoint(cut) == str(cut / "checkpoint-2")
    (cut / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4, "log_hist')  # truncated
    assert last_complete_checkpoint(cut) == str(cut / "checkpoint-2")
    record = RecordSteps()
    resumed, _, _ = train(data_args, model_args, args(cut), docs, None, callbacks=[record])
    assert record.steps == [3, 4, 5, 6]
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("model_type", ["tcnlm", "topic_rnn", "lstm_lm"])
def test_evaluation_during_training_logs_the_lm_perplexity_and_each_loss_term(wiki, tmp_path, model_type):
    """eval_loss of a topic model is its whole objective; eval_perplexity is the LM's alone and
    equals evaluate_perplexity under the protocol of the evaluation batches (paper)."""
    from topic_lm_hf import evaluate_perplexity

    valid = wiki["valid"].select(range(6))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, eval_strategy="steps", eval_steps=4,
                             save_strategy="no", per_device_train_batch_size=8, per_device_eval_batch_size=16,
                             report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    overrides = "embedding_size=16,hidden_size=16" + (",num_topics=3" if model_type != "lstm_lm" else "")
    record = RecordLogs()
    model, tok, topic_tok = train(DataArguments(min_freq=3, stopwords="none"),
                                  ModelArguments(model_type=model_type, config_overrides=overrides, recipe="paper"),
                                  args,
                                  wiki["train"].select(range(40)), valid, callbacks=[record])
    logs = [h for h in record.logs if "eval_loss" in h][-1]
    terms = {"tcnlm": ["lm_loss", "kl_loss", "bow_loss", "aux_loss"], "topic_rnn": ["lm_loss", "kl_loss", "aux_loss"],
             "lstm_lm": ["lm_loss"]}[model_type]
    assert all(f"eval_{term}" in logs for term in terms), logs
    reference = evaluate_perplexity(model.eval(), valid, "paper", tokenizer=tok, topic_tokenizer=topic_tok)
    assert logs["eval_perplexity"] == pytest.approx(reference["perplexity"], rel=1e-4)
    if model_type == "lstm_lm":
        assert logs["eval_perplexity"] == pytest.approx(math.exp(logs["eval_loss"]), rel=1e-4)
    else:
        assert logs["eval_perplexity"] < 0.9 * math.exp(logs["eval_loss"])  # not the whole objective


def test_no_pin_memory_warning_when_training_on_cpu(tmp_path, recwarn):
    """Plain TrainingArguments (pin_memory on by default) on a CPU run: TopicLMTrainer turns pinning off,
    so PyTorch's "pin_memory ... no accelerator" warning never appears (the README's snippets)."""
    from transformers import TrainingArguments

    from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, TopicLMTrainer,
                             build_vocabularies, synthetic_documents)

    docs = synthetic_documents(20)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    collator = TopicContextCollator(tok, topic_tok, context="none")
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to="none")
    if args.device.type != "cpu":
        pytest.skip("this checks a CPU run; the machine has an accelerator")
    assert args.dataloader_pin_memory  # the transformers default, as in the README's snippets
    trainer = TopicLMTrainer(model=LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8,
                                                                  hidden_size=8)),
                             args=args, train_dataset=collator.prepare(docs), data_collator=collator)
    trainer.train()
    assert not args.dataloader_pin_memory
    assert not [w for w in recwarn.list if "pin_memory" in str(w.message)]


@pytest.mark.parametrize("family", ["lstm", "nclm"])
def test_gradient_accumulation_equals_the_big_batch(family, wiki, tmp_path):
    """Two micro-batches of 6 documents' chunks accumulated make the same SGD update as one batch of both: each
    micro-batch's token mean is weighted by its share of the step's predicted tokens (rows differ in length)."""
    from transformers import TrainingArguments

    from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, NCLMConfig, NCLMForCausalLM, TopicContextCollator,
                             TopicLMTrainer)

    def make():
        torch.manual_seed(0)
        if family == "lstm":
            return LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(wiki["tok"]), embedding_size=16, hidden_size=16,
                                                  dropout=0.0))
        return NCLMForCausalLM(NCLMConfig.from_tokenizers(wiki["tok"], wiki["topic_tok"], variant="leta",
                                                          num_topics=5, embedding_size=12, hidden_size=16,
                                                          encoder_hidden_size=10, dropout=0.0, etr_top_n=4,
                                                          num_topic_samples=0))  # no sampling: deterministic

    updates = {}
    for batch, accumulation in ((16, 1), (8, 2), (4, 4)):
        model = make()
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        collator = TopicContextCollator.for_model(model, wiki["tok"], wiki["topic_tok"])
        args = TrainingArguments(str(tmp_path / f"{batch}"), max_steps=1, per_device_train_batch_size=batch,
                                 gradient_accumulation_steps=accumulation, learning_rate=0.5, optim="sgd",
                                 lr_scheduler_type="constant", max_grad_norm=0.0, report_to=[], use_cpu=True,
                                 save_strategy="no", seed=0, disable_tqdm=True)
        trainer = TopicLMTrainer(model=model, args=args, data_collator=collator,
                                 train_dataset=collator.prepare(wiki["train"].select(range(12))))
        trainer.train()
        updates[accumulation] = torch.cat([(p.detach() - before[k]).flatten() for k, p in model.named_parameters()])
    for accumulation in (2, 4):
        torch.testing.assert_close(updates[accumulation], updates[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family, collator_kwargs, message", [
    ("nclm-leta-sdt", {"context": "none"}, r"NCLMForCausalLM reads the document's bag of words, but the collator gives none"),
    ("tcnlm", {"context": "none"}, "its topic part would get no training signal"),
    ("rgbn_rnn", {"context": "preceding", "layout": "sentences"},
     r"RGBNRNNForCausalLM reads whole documents, but the collator gives layout='sentences'"),
])
def test_set_ups_that_would_train_part_of_the_model_on_nothing_are_refused(tmp_path, family, collator_kwargs,
                                                                          message):
    from conftest import tiny_model
    from topic_lm_hf import build_vocabularies, documents_from_lists

    docs = documents_from_lists([[["the", "court", "ruled"], ["the", "judge", "said"]]] * 4)
    tok, topic_tok = build_vocabularies(docs, min_freq=1, stopwords=["the"], top_fraction=0.0)
    if family == "rgbn_rnn":
        from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM

        model = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[3, 2], hidden_sizes=[8, 8],
                                                                 embedding_size=8))
    else:
        model = tiny_model(family, tok, topic_tok)
    collator = TopicContextCollator(tok, topic_tok, **collator_kwargs)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    trainer = TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(docs), data_collator=collator)
    with pytest.raises(ValueError, match=message):
        trainer.train()
