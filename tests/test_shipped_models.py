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
FOLDERS = ["wiki-lstm-carry", "wiki-rgbn-rnn-carry", "wiki-tcnlm-carry", "wiki-rgbn-rnn-carry-twin"]


@pytest.mark.parametrize("name", FOLDERS)
def test_a_shipped_folder_is_small_names_its_command_and_loads_without_the_package(name, tmp_path):
    folder = ROOT / "hub_models" / name
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size <= 8_000_000, f"{name}: {size / 1e6:.2f} MB"
    card = (folder / "README.md").read_text()
    results = json.loads((folder / "results.json").read_text())
    assert results["command"].startswith("OMP_NUM_THREADS=1 topic-lm train ") and results["command"] in card
    assert "--carry_state true" in results["command"] and re.search(r"--early_stopping_patience \d+", results["command"])
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
    """The LSTM's and the twin's folders reproduce their cards' perplexity (the twin's with every context empty, as it
    was trained); the demo's table shows every folder's figure as its card has it and states the rGBN-RNN's lead over
    its twin."""
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import demo, evaluate_perplexity, load_documents

    def measured(folder):
        return json.loads((ROOT / "hub_models" / folder / "results.json").read_text())["measured"]

    valid = load_documents("wikipedia-sample/validation")
    lstm_results = measured(FOLDERS[0])
    model = AutoModelForCausalLM.from_pretrained(ROOT / "hub_models" / FOLDERS[0]).eval()
    assert evaluate_perplexity(model, valid, "causal-carry")["perplexity"] == pytest.approx(
        lstm_results["causal-carry"]["perplexity"], rel=1e-4)
    assert demo.show_shipped_models(str(ROOT / "hub_models"), valid, torch.device("cpu"), seed=0)
    out = capsys.readouterr().out
    shown = dict(re.findall(r"^\| (carried [^|]+?) \| ([\d.]+) \|$", out, re.M))
    assert float(shown["carried LSTM"]) == pytest.approx(lstm_results["causal-carry"]["perplexity"], abs=0.006)
    for folder, (family, started) in zip(FOLDERS[1:3], [("rGBN-RNN", " (started from that LSTM)"), ("TCNLM", "")]):
        topic_results = measured(folder)
        assert float(shown[f"carried {family}{started}"]) == pytest.approx(
            topic_results["causal-carry"]["perplexity"], abs=0.006)
        assert float(shown[f"carried {family}, another document's topics (ablation)"]) == pytest.approx(
            topic_results["mismatched"]["perplexity"], abs=0.006)
        assert len(re.findall(rf"{family} steered by topic \d: \w+", out)) == 2
    twin_results = measured("wiki-rgbn-rnn-carry-twin")["causal-carry"]["perplexity"]
    twin = AutoModelForCausalLM.from_pretrained(ROOT / "hub_models" / "wiki-rgbn-rnn-carry-twin").eval()
    assert evaluate_perplexity(twin, valid, "causal-carry", empty_context=True)["perplexity"] == pytest.approx(
        twin_results, rel=1e-4)  # the twin's card: every context empty, as it was trained
    shown_twin = shown["carried rGBN-RNN's topic-free twin (started from that LSTM), trained alike with every context "
                       "empty"]
    assert float(shown_twin) == pytest.approx(twin_results, abs=0.006)
    assert re.search(r"the rGBN-RNN is [\d.]+ % (below|above) its topic-free twin, the strongest baseline \(", out)
    assert re.search(r"the TCNLM is [\d.]+ % (below|above) the LSTM", out)


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


def test_the_shipped_commands_parse_and_the_rgbn_rnn_is_measured_against_its_twin():
    """ship_models' commands are valid `topic-lm train` command lines: the rGBN-RNN and its topic-free twin start
    from the shipped LSTM's folder, the rGBN-RNN with its prior held, the twin with every context empty; the cards
    say how each stopped and compare the rGBN-RNN with its twin, the twin with the LSTM."""
    import ship_models

    from topic_lm_hf.cli import parse_command

    for name in ship_models.COMMANDS:
        data, model, training, _ = parse_command("train", ship_models.arguments(name, "out/ship", "hub_models"))
        assert training.output_dir.startswith("out/ship/") and model.carry_state
    rgbn, twin = (ship_models.command_line(name, "out/ship") for name in ("wiki-rgbn-rnn-carry",
                                                                          "wiki-rgbn-rnn-carry-twin"))
    assert "--language_model hub_models/wiki-lstm-carry" in rgbn and "topic_prior_weight_trainable=false" in rgbn
    assert "--empty_context true" in twin and "train_theta=mean" in twin and "--empty_context" not in rgbn
    assert ship_models.stopping("wiki-rgbn-rnn-carry") == ("10 evaluations without improvement, every 200 steps; the "
                                                           "rate halved after 3 evaluations in a row without it")
    assert ship_models.stopping("wiki-lstm-carry").endswith("the rate halved at every evaluation without improvement")
    measured = {"causal-carry": {"perplexity": 50.0}, "mismatched": {"perplexity": 58.0},
                "empty_context": {"perplexity": 57.0}, "topics": {}}
    stop = {"steps_trained": 10, "best_step": 8, "best_dev_perplexity": 49.0, "metric": "eval_lm_loss"}
    lstm, twin_measured = {"causal-carry": {"perplexity": 55.0}}, {"causal-carry": {"perplexity": 51.0}}
    card = ship_models.card("wiki-rgbn-rnn-carry", measured, stop, rgbn, [], lstm, twin_measured)
    assert "| its topic-free twin (`wiki-rgbn-rnn-carry-twin`), trained alike with every context empty | 51.00 |" in card
    assert "strongest baseline): 2.0 % lower perplexity (1.00 points); another document's topics cost it 8.00" in card
    assert "more than its lead" in card and "halved after 3 evaluations in a row" in card
    card = ship_models.card("wiki-rgbn-rnn-carry-twin", twin_measured, stop, twin, [], lstm)
    assert "| this model (every context empty, as it was trained) | 51.00 |" in card
    assert "The topic-free twin of `wiki-rgbn-rnn-carry`" in card and "+7.3 % (+4.00 points) in its favour" in card
