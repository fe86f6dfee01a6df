"""The models that ship with the repository (hub_models/, written by scripts/ship_models.py): Hub-ready folders that
load in a fresh interpreter without this package, at most 8 MB each, whose cards name the command that trained them
and whose measured perplexity the folder reproduces; the demo shows them first."""

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import run_without_package

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["wiki-lstm-carry", "wiki-rgbn-rnn-carry", "wiki-tcnlm-carry"]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_shipped_folder_is_small_names_its_command_and_loads_without_the_package(name, tmp_path):
    folder = ROOT / "hub_models" / name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size <= 8_000_000, f"{name}: {size / 1e6:.2f} MB"
    card = (folder / "README.md").read_text()
    results = json.loads((folder / "results.json").read_text())
    assert results["command"].startswith("OMP_NUM_THREADS=1 topic-lm train ") and results["command"] in card
    assert "--carry_state true" in results["command"] and "--early_stopping_patience 3" in results["command"]
    assert results["training"]["stopped_by"] == "development perplexity"
    assert f"{results['measured']['causal-carry']['perplexity']:.2f}" in card
    loaded = run_without_package(f"""
        import json, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        tok = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
        ids = tok(["the first world war"], return_tensors="pt")
        with torch.no_grad():
            logits = model(**ids).logits
        print(json.dumps({{"type": model.config.model_type, "finite": bool(torch.isfinite(logits).all()),
                          "shape": list(logits.shape)}}))
    """, tmp_path)
    assert loaded["finite"] and loaded["shape"][-1] == len(json.loads((folder / "tokenizer.json").read_text())
                                                           ["model"]["vocab"])


def test_the_shipped_folders_reproduce_their_cards_and_the_demo_shows_them(capsys):
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import demo, evaluate_perplexity, load_documents

    valid = load_documents("wikipedia-sample/validation")
    lstm_results = json.loads((ROOT / "hub_models" / FOLDERS[0] / "results.json").read_text())["measured"]
    model = AutoModelForCausalLM.from_pretrained(ROOT / "hub_models" / FOLDERS[0]).eval()
    assert evaluate_perplexity(model, valid, "causal-carry")["perplexity"] == pytest.approx(
        lstm_results["causal-carry"]["perplexity"], rel=1e-4)
    assert demo.show_shipped_models(str(ROOT / "hub_models"), valid, torch.device("cpu"), seed=0)
    out = capsys.readouterr().out
    shown = dict(re.findall(r"^\| (carried [^|]+?) \| ([\d.]+) \|$", out, re.M))
    assert float(shown["carried LSTM"]) == pytest.approx(lstm_results["causal-carry"]["perplexity"], abs=0.006)
    for folder, (family, started) in zip(FOLDERS[1:], [("rGBN-RNN", " (started from that LSTM)"), ("TCNLM", "")]):
        topic_results = json.loads((ROOT / "hub_models" / folder / "results.json").read_text())["measured"]
        assert float(shown[f"carried {family}{started}"]) == pytest.approx(
            topic_results["causal-carry"]["perplexity"], abs=0.006)
        assert float(shown[f"carried {family}, another document's topics (ablation)"]) == pytest.approx(
            topic_results["mismatched"]["perplexity"], abs=0.006)
        assert len(re.findall(rf"{family} steered by topic \d: \w+", out)) == 2


def test_the_demo_says_when_the_shipped_models_are_not_there(tmp_path, capsys):
    from topic_lm_hf import demo, load_documents

    valid = load_documents("wikipedia-sample/validation", max_documents=2)
    assert not demo.show_shipped_models(str(tmp_path / "hub_models"), valid, torch.device("cpu"), seed=0)
    assert "no trained models in" in capsys.readouterr().out


def test_writing_one_topic_models_folder_compares_it_with_the_shipped_lstm(tmp_path):
    import ship_models

    assert ship_models.baseline({}, tmp_path) is None  # no LSTM measured, none written: the card has no comparison
    shipped = json.loads((ROOT / "hub_models" / FOLDERS[0] / "results.json").read_text())["measured"]
    assert ship_models.baseline({}, ROOT / "hub_models") == shipped
    measured_now = {"causal-carry": {"perplexity": 1.0}}
    assert ship_models.baseline({"wiki-lstm-carry": {"measured": measured_now}}, ROOT / "hub_models") == measured_now
    measured = {"causal-carry": {"perplexity": 50.0}, "mismatched": {"perplexity": 53.0},
                "empty_context": {"perplexity": 52.0}, "topics": {}}
    stop = {"steps_trained": 10, "best_step": 8, "best_dev_perplexity": 49.0, "metric": "eval_lm_loss"}
    card = ship_models.card("wiki-tcnlm-carry", measured, stop, "topic-lm train ...", [],
                            {"causal-carry": {"perplexity": 55.0}})
    assert "| the carried LSTM (`wiki-lstm-carry`) | 55.00 |" in card and "9.1 % lower perplexity (5.00 points)" in card
    assert "own topics are worth 3.00 of them" in card
    behind = ship_models.card("wiki-tcnlm-carry", measured, stop, "topic-lm train ...", [],
                              {"causal-carry": {"perplexity": 45.0}})
    assert "11.1 % higher perplexity (5.00 points behind it)" in behind and "% lower" not in behind
