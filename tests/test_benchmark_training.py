"""The benchmarks' training to convergence (``train_to_convergence``): it stops when the development perplexity
stops improving and keeps the best weights, resumes an interrupted run from its last checkpoint, and never
trains a finished run again, whichever step of its ending was interrupted."""

import argparse
import json
import os

import torch
from benchmark_training import best_dirs, train_to_convergence
from conftest import TINY_CORPUS

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, documents_from_lists,
                         evaluate_perplexity)


def _run(tiny_vocabularies, mdir, max_steps=40, patience=2):
    tok, _ = tiny_vocabularies
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8))
    collator = TopicContextCollator(tok, None, context="none")
    docs = documents_from_lists(TINY_CORPUS * 3)
    args = argparse.Namespace(max_steps=max_steps, batch_size=4, lr=0.05, clip=0.5, eval_steps=2, patience=patience,
                              seed=0, device="cpu", precision="fp32", compile_output_layer=False)
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
