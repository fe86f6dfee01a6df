"""The benchmarks' training to convergence (``train_to_convergence``): it stops when the development perplexity
stops improving and keeps the best weights, resumes an interrupted run from its last checkpoint, and never
trains a finished run again, whichever step of its ending was interrupted."""

import argparse
import json
import os

import pytest
import torch
from transformers import TrainingArguments
from benchmark_training import BenchmarkTrainer, best_dirs, plateau_factor, train_to_convergence
from conftest import TINY_CORPUS

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, documents_from_lists,
                         evaluate_perplexity)


def _run(tiny_vocabularies, mdir, max_steps=40, patience=2, **schedule):
    tok, _ = tiny_vocabularies
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8))
    collator = TopicContextCollator(tok, None, context="none")
    docs = documents_from_lists(TINY_CORPUS * 3)
    args = argparse.Namespace(max_steps=max_steps, batch_size=4, lr=0.05, clip=0.5, eval_steps=2, patience=patience,
                              seed=0, device="cpu", precision="fp32", compile_output_layer=False, **schedule)
    stats = train_to_convergence("lstm", model, collator.prepare(docs), collator, args, mdir, tok, None,
                                 documents_from_lists(TINY_CORPUS), "causal")
    return stats, model


def test_training_stops_at_the_best_development_perplexity_and_a_finished_run_is_not_redone(tiny_vocabularies,
                                                                                           tmp_path):
    tok, _ = tiny_vocabularies
    stats, _ = _run(tiny_vocabularies, tmp_path, max_steps=400, patience=2)
    history = [json.loads(line) for line in (tmp_path / "dev.jsonl").read_text().splitlines()]
    best = min(history, key=lambda h: h["perplexity"])
    # the high learning rate overfits the tiny corpus: the run stops by patience, two evaluations after its best
    assert stats["stopped_by"] == "patience" and stats["steps_trained"] < 400
    assert stats["best_step"] == best["step"] == history[-3]["step"]
    saved = LSTMLMForCausalLM.from_pretrained(tmp_path / "model").eval()
    dev = documents_from_lists(TINY_CORPUS)
    assert abs(evaluate_perplexity(saved, dev, "causal", tokenizer=tok)["perplexity"] - best["perplexity"]) < 1e-3
    assert not (tmp_path / "checkpoints").exists() and not best_dirs(tmp_path)
    # a rerun returns the same run without training (the step log is untouched)
    log = (tmp_path / "steps.jsonl").read_text()
    again, _ = _run(tiny_vocabularies, tmp_path, max_steps=400, patience=2)
    assert again == stats and (tmp_path / "steps.jsonl").read_text() == log


def test_an_ending_interrupted_after_its_record_is_completed_by_the_rerun(tiny_vocabularies, tmp_path):
    """Killed after trained.json was written but before the best weights became model/: the rerun moves them and
    removes the checkpoints, without training and without a KeyError."""
    stats, _ = _run(tiny_vocabularies, tmp_path, max_steps=400, patience=2)
    # put the run back in the state it had just before its ending
    os.replace(tmp_path / "model", tmp_path / f"best-{stats['best_step']}")
    (tmp_path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    again, _ = _run(tiny_vocabularies, tmp_path, max_steps=400, patience=2)
    assert again == stats and (tmp_path / "model" / "config.json").exists()
    assert not (tmp_path / "checkpoints").exists() and not best_dirs(tmp_path)


def test_a_run_stopped_by_its_cap_continues_under_a_larger_cap_as_one_run_would(tiny_vocabularies, tmp_path):
    """A plateau run that reached its step cap keeps its last checkpoint; the same cap again changes nothing, a larger
    one trains on from that checkpoint with the same warm-up, and the result is the run that had the larger cap from
    the start (same evaluations, same best weights). A run stopped by patience is not reopened."""
    plateau = {"schedule": "plateau", "lr_decay": 0.5, "warmup_steps": 2}
    for name in "abc":
        (tmp_path / name).mkdir()
    capped, _ = _run(tiny_vocabularies, tmp_path / "a", max_steps=12, patience=50, **plateau)
    assert capped["stopped_by"] == "max_steps" and (tmp_path / "a" / "checkpoints" / "checkpoint-12").is_dir()
    log = (tmp_path / "a" / "steps.jsonl").read_text()
    assert _run(tiny_vocabularies, tmp_path / "a", max_steps=12, patience=50, **plateau)[0] == capped
    assert (tmp_path / "a" / "steps.jsonl").read_text() == log
    continued, model = _run(tiny_vocabularies, tmp_path / "a", max_steps=24, patience=50, **plateau)
    whole, _ = _run(tiny_vocabularies, tmp_path / "b", max_steps=24, patience=50, **plateau)
    assert continued["steps_trained"] == whole["steps_trained"] == 24 and continued["best_step"] == whole["best_step"]
    # the capped run evaluated at its cap, step 12, an evaluation step here: where the cap is not one, the continued
    # run keeps that one more evaluation (benchmark_all.py's docstring says so)
    assert [h["step"] for h in continued["dev_history"]] == [h["step"] for h in whole["dev_history"]]
    assert [h["perplexity"] for h in continued["dev_history"]] == pytest.approx(
        [h["perplexity"] for h in whole["dev_history"]], rel=1e-5)
    assert (tmp_path / "a" / "steps.jsonl").read_text().startswith(log)
    a = LSTMLMForCausalLM.from_pretrained(tmp_path / "a" / "model").state_dict()
    b = LSTMLMForCausalLM.from_pretrained(tmp_path / "b" / "model").state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in b)
    plateau.pop("warmup_steps")
    stopped, _ = _run(tiny_vocabularies, tmp_path / "c", max_steps=400, patience=2, **plateau)
    assert stopped["stopped_by"] == "patience" and not (tmp_path / "c" / "checkpoints").exists()
    assert _run(tiny_vocabularies, tmp_path / "c", max_steps=800, patience=2, **plateau)[0] == stopped


def test_the_plateau_schedule_is_constant_and_decays_at_each_evaluation_without_improvement(tiny_vocabularies,
                                                                                          tmp_path):
    """After the warm-up the plateau schedule keeps the rate until a development evaluation fails to improve on the
    best, then multiplies it by the decay, once per such evaluation, read from the evaluations alone (so a resumed
    run continues it); a run under it ends by early stopping, and its record names the schedule."""
    history = []
    assert plateau_factor(history, 0.5) == 1.0
    history += [{"perplexity": 50.0}, {"perplexity": 40.0}, {"perplexity": 45.0}, {"perplexity": 39.0},
                {"perplexity": 39.0}]
    assert plateau_factor(history, 0.5) == 0.25  # 45 and the second 39 did not improve on the best before them
    # with a patience of 2, only two misses in a row decay it, and the count restarts after each decay and each best
    assert plateau_factor(history, 0.5, patience=2) == 1.0
    history += [{"perplexity": 41.0}, {"perplexity": 39.5}, {"perplexity": 40.0}, {"perplexity": 38.0}]
    assert plateau_factor(history, 0.5) == 0.5 ** 5
    assert plateau_factor(history, 0.5, patience=2) == 0.25  # the second 39 and 41 in a row, then 39.5 and 40
    with pytest.raises(ValueError, match="at least 1"):
        plateau_factor(history, 0.5, patience=0)

    tok, _ = tiny_vocabularies
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8))
    collator = TopicContextCollator(tok, None, context="none")
    evaluations = []
    trainer = BenchmarkTrainer(model=model, args=TrainingArguments(str(tmp_path / "t"), learning_rate=0.1,
                                                                   max_steps=100, report_to=[], use_cpu=True),
                               data_collator=collator, plateau=(evaluations, 0.5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = trainer.create_scheduler(100, optimizer)
    rates = []
    for step in range(1, 11):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
        if step in (4, 6, 8):
            evaluations.append({"perplexity": {4: 30.0, 6: 31.0, 8: 29.0}[step]})
    # warm-up over 2 steps, constant, halved after the evaluation at step 6 (no better than 30), kept after step 8's
    assert rates == [0.05] + [0.1] * 5 + [0.05] * 4

    (tmp_path / "run").mkdir()
    stats, _ = _run(tiny_vocabularies, tmp_path / "run", max_steps=400, patience=2, schedule="plateau", lr_decay=0.5)
    assert stats["stopped_by"] == "patience" and stats["steps_trained"] < 400 and stats["schedule"] == "plateau"


def test_lm_lr_scale_gives_the_language_model_weights_a_fraction_of_the_rate(tiny_vocabularies, tmp_path):
    """``lm_lr_scale``: every optimizer group is split, its language-model weights (``language_model_parameters``)
    at the scaled rate, the rest at the full one, every trainable weight in exactly one group; the plateau schedule
    scales both alike. A model without language-model weights is refused in one line."""
    from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM, TCNLMConfig, TCNLMForCausalLM

    tok, topic_tok = tiny_vocabularies
    model = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[4], embedding_size=8,
                                                             hidden_sizes=[8]))
    targs = TrainingArguments(str(tmp_path / "t"), learning_rate=0.1, max_steps=100, report_to=[], use_cpu=True)
    trainer = BenchmarkTrainer(model=model, args=targs, plateau=([], 0.5), lm_lr_scale=0.125)
    optimizer = trainer.create_optimizer()
    lm = {id(p) for p in model.language_model_parameters()}
    rates = {id(p): group["lr"] for group in optimizer.param_groups for p in group["params"]}
    assert len(rates) == sum(1 for group in optimizer.param_groups for _ in group["params"])  # once each
    assert set(rates) == {id(p) for p in model.parameters() if p.requires_grad}
    assert {rates[i] for i in lm} == {0.1 * 0.125} and {r for i, r in rates.items() if i not in lm} == {0.1}
    scheduler = trainer.create_scheduler(100, optimizer)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert sorted({g["lr"] for g in optimizer.param_groups}) == [0.1 * 0.125, 0.1]  # after the 2-step warm-up
    tcnlm = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=4, embedding_size=8,
                                                         hidden_size=8))
    with pytest.raises(ValueError, match="has no language-model weights to scale the rate of"):
        BenchmarkTrainer(model=tcnlm, args=targs, lm_lr_scale=0.5).create_optimizer()
