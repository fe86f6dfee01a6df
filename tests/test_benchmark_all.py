"""scripts/benchmark_all.py in its smoke configuration, run as a program: every output is written, every number is
finite and labelled with its protocol, and a second run retrains nothing (resume). Its shared pieces are tested
through scripts/benchmarking.py / benchmark_training.py; results/README.md holds what it published."""

import importlib.util
import json
import math
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark_training import step_throughput, stopped
from benchmarking import publish
from conftest import requires_data

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "benchmark_all.py"
RESULTS = ROOT / "results" / "README.md"
SMOKE = ["--corpus", "apnews", "--max-steps", "4", "--eval-steps", "2", "--patience", "1", "--batch-size", "2",
         "--hidden", "8", "--embedding", "8", "--topics", "3", "--max-train-docs", "30", "--max-valid-docs", "4",
         "--npmi-max-documents", "20", "--steer-topics", "2", "--steer-samples", "2", "--max-new-tokens", "8",
         "--speed-repeats", "1", "--lda-max-iter", "2", "--pretrain-steps", "4", "--pretrain-eval-every", "2",
         "--guidance-scales", "1", "2", "--only", "lstm", "lstm-carry", "topic-lstm", "topic-lstm-recipe"]
PROTOCOLS = ("paper", "causal", "causal-carry")
# the smoke configuration on the corpus that ships with the package (no data needed)
WIKI_SMOKE = ["--corpus", "wiki", "--max-steps", "4", "--eval-steps", "2", "--patience", "1", "--batch-size", "2",
              "--hidden", "8", "--embedding", "8", "--topics", "3", "--max-train-docs", "30", "--max-valid-docs", "4",
              "--npmi-max-documents", "20", "--steer-topics", "2", "--steer-samples", "2", "--max-new-tokens", "8",
              "--speed-repeats", "1", "--lda-max-iter", "2", "--pretrain-steps", "4", "--pretrain-eval-every", "2",
              "--guidance-scales", "1"]
# runs the script as __main__ with matplotlib unimportable (the figures are then skipped with a message); its folder
# goes first on the path, as for ``python scripts/benchmark_all.py``, where the shared modules are
WITHOUT_MATPLOTLIB = ("import os, runpy, sys; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
                      "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
                      "runpy.run_path(sys.argv[0], run_name='__main__')")


def run_script(*argv: str, prefix: tuple = ()) -> subprocess.CompletedProcess:
    """``python [prefix] scripts/benchmark_all.py argv`` with this checkout's package, one thread."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *prefix, str(SCRIPT), *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=1800)


def test_stopped_counts_evaluations_after_the_best():
    history = [{"perplexity": p} for p in (10.0, 9.0, 9.5, 9.2)]
    assert stopped(history, patience=2)
    assert not stopped(history, patience=3)
    assert not stopped([], patience=1)


def test_the_default_cap_is_twenty_epochs():
    script = runpy.run_path(str(SCRIPT))  # its functions, without running it
    parse, step_cap = script["parse_args"], script["step_cap"]
    args = parse(["--corpus", "apnews"])
    assert (args.max_steps, args.max_epochs, args.batch_size) == (None, 20, 4)
    assert step_cap(args, 1710) == 8550  # 20 epochs of 1,710 documents, 4 per step
    assert step_cap(parse(["--corpus", "brown", "--max-epochs", "2.5"]), 380) == 950
    assert step_cap(parse(["--corpus", "apnews", "--max-steps", "7"]), 1710) == 7


def test_a_rows_held_weights_stay_out_of_training(tiny_vocabularies):
    """``hold_weights``: the gate's h-dependent weights at 0, the LSTM LM's weights frozen, none of them with a
    gradient; a row that holds nothing leaves every weight trainable. The held prior rows hold lambda by their
    configuration (``topic_prior_weight_trainable``), as a user's model would."""
    import benchmarking

    from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM

    hold = runpy.run_path(str(SCRIPT))["hold_weights"]
    tok, topic_tok = tiny_vocabularies

    def tiny(**config):
        return RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[3], embedding_size=8,
                                                                hidden_sizes=[8], topic_output_bias="beta", **config))

    for name in ("rgbn-carry-warm-recipe-prior1-p10", "rgbn-carry-warm-recipe-prior1-lrp3-p10"):
        model = tiny(**benchmarking.MODELS[name]["config"], topic_prior_weight_init=1.0)
        hold(model, benchmarking.MODELS[name])
        assert model.topic_prior_weight.item() == 1.0 and not model.topic_prior_weight.requires_grad
    model = tiny()
    hold(model, {**benchmarking.MODELS["rgbn-carry-warm-recipe-topic-gate"], "freeze_lm": True})
    gate = model.model.gates[0]
    assert not gate.hidden_proj.weight.any() and not gate.hidden_proj.weight.requires_grad
    assert not any(p.requires_grad for p in model.language_model_parameters())
    model = tiny()
    hold(model, benchmarking.MODELS["rgbn-carry-warm-recipe"])
    assert all(p.requires_grad for p in model.parameters())


def test_a_rows_own_schedule_settings_reach_its_training():
    """``row_arguments``: a row's rate fraction, patience, LM rate fraction and plateau patience replace the run's,
    and a row without them trains under the run's (the plateau schedule decaying at every miss)."""
    script = runpy.run_path(str(SCRIPT))
    rows, row_arguments = script["MODELS"], script["row_arguments"]
    args = script["parse_args"](["--corpus", "wiki", "--only", "lstm-carry"])
    plain = row_arguments(args, rows["lstm-carry"])
    assert (plain.lr, plain.patience, plain.lm_lr_scale, plain.lr_patience) == (args.lr, args.patience, 1.0, 1)
    held = row_arguments(args, rows["rgbn-carry-warm-recipe-prior1-lrp3-p10"])
    assert (held.patience, held.lr_patience) == (10, 3)
    twin = row_arguments(args, rows["rgbn-carry-warm-recipe-lrp3-p10-matched"])
    assert (twin.patience, twin.lr_patience) == (10, 3) and rows["rgbn-carry-warm-recipe-lrp3-p10-matched"]["matched"]
    assert row_arguments(args, rows["rgbn-carry-warm-recipe-lr8"]).lr == pytest.approx(args.lr / 8)
    assert row_arguments(args, rows["rgbn-carry-warm-recipe-lm-lr8-p10"]).lm_lr_scale == pytest.approx(1 / 8)


def test_step_throughput_leaves_out_stalled_steps():
    steps = [{"seconds": 0.2 + 0.01 * (i % 3), "tokens": 100} for i in range(50)]
    plain = step_throughput(steps)
    assert plain["stalled_steps"] == 0
    assert plain["tokens_per_s"] == pytest.approx(5000 / sum(r["seconds"] for r in steps))
    # a step during which the process was stopped for an hour: left out, counted, the speed unchanged
    stalled = step_throughput(steps[:25] + [{"seconds": 3600.0, "tokens": 100}] + steps[25:])
    assert stalled["stalled_steps"] == 1 and stalled["stalled_seconds"] == 3600.0
    assert stalled["tokens_per_s"] == pytest.approx(plain["tokens_per_s"])
    # a uniformly slower model is not "stalled"
    slow = step_throughput([{"seconds": 10 * r["seconds"], "tokens": 100} for r in steps])
    assert slow["stalled_steps"] == 0 and slow["tokens_per_s"] == pytest.approx(plain["tokens_per_s"] / 10)
    assert math.isnan(step_throughput([])["tokens_per_s"])


@requires_data("apnews", "train.txt")
@requires_data("wiki", "articles.jsonl.gz")
def test_smoke_run_then_resume(tmp_path):
    out = tmp_path / "all"
    proc = run_script(*SMOKE, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    results = report["results"]
    assert list(results) == ["lstm", "lstm-carry", "topic-lstm", "topic-lstm-recipe"]
    # the steering recipe's row: its topic model pre-trained first (recorded), the recipe's configuration
    pre = results["topic-lstm-recipe"]["train"]["pretraining"]
    assert 1 <= pre["steps"] <= 4 and pre["stopped_by"] in ("patience", "steps") and pre["dev_losses"]
    assert (pre["batch_size"], pre["learning_rate"]) == (64, 3e-3)  # the recipe's, as topic-lm train pre-trains
    config = json.loads((out / "topic-lstm-recipe" / "model" / "config.json").read_text())
    assert (config["topic_output_bias"], config["theta_transform"], config["bow_loss_weight"]) == ("beta", "softmax", 1.0)
    assert "topic_output_bias" not in json.loads((out / "topic-lstm" / "model" / "config.json").read_text()) or \
        json.loads((out / "topic-lstm" / "model" / "config.json").read_text())["topic_output_bias"] is None
    for name, r in results.items():
        for protocol in PROTOCOLS:
            assert math.isfinite(r["perplexity"][protocol]["perplexity"]) and r["perplexity"][protocol]["tokens"] > 0
        assert 1 <= r["best_step"] <= r["steps_trained"] <= 4
        assert r["dev_protocol"] == ("causal-carry" if name == "lstm-carry" else "causal")
        assert math.isfinite(r["train_tokens_per_s"]) and math.isfinite(r["interleaved_ratio_to_lstm"])
    topic = results["topic-lstm"]
    assert topic["mismatched"]["base_protocol"] == "paper" and math.isfinite(topic["mismatched"]["perplexity"])
    assert math.isfinite(topic["topics"]["npmi"]) and 0 < topic["topics"]["diversity"] <= 1
    assert topic["steering"]["accuracy_lda"] is not None and topic["steering"]["fluency_ratio"] > 0
    # steered at every guidance scale; the reported setting is the most accurate fluent one, or plain conditioning
    assert set(topic["steering_by_scale"]) == {"1", "2"} and topic["steering"]["guidance_scale"] in (1.0, 2.0)
    fluent = {s: v for s, v in topic["steering_by_scale"].items() if v["fluency_ratio"] <= 1.5}
    chosen = f"{topic['steering']['guidance_scale']:g}"
    assert (chosen in fluent and topic["steering_by_scale"][chosen]["accuracy_lda"] ==
            max(v["accuracy_lda"] for v in fluent.values())) if fluent else chosen == "1"
    # the gain over the LSTM under causal, split by the ablation under causal
    assert topic["mismatched-causal"]["base_protocol"] == "causal"
    gain = report["comparison"]["causal"]["topic-lstm"]
    lstm_causal = results["lstm"]["perplexity"]["causal"]["perplexity"]
    assert gain["gain"] == pytest.approx(lstm_causal - topic["perplexity"]["causal"]["perplexity"])
    assert gain["from_own_topics"] == pytest.approx(topic["mismatched-causal"]["perplexity"] -
                                                    topic["perplexity"]["causal"]["perplexity"])
    assert ("share_from_own_topics" in gain) == (gain["gain"] > 0)
    carry = report["comparison"]["causal_carry"]
    assert carry["best_topic_model"] == "topic-lstm" and math.isfinite(carry["percent"])
    assert [p["ranking"] for p in report["comparison"]["papers"].values()][0] == ["TopicRNN", "LSTM"]
    # the dev split: a fixed 5 % of train.txt, never valid.txt
    assert report["context"]["dev_documents"] == 2 and report["context"]["train_documents"] == 28

    table = (out / "table.md").read_text()
    assert table.strip() in proc.stdout  # the table printed is the table written
    header = next(line for line in table.splitlines() if line.startswith("| model"))
    for column in ("ppl paper", "ppl causal", "ppl causal-carry", "ppl ablation (protocol)", "NPMI lau2014",
                   "steering acc.", "fluency ratio", "train tokens/s", "ratio to LSTM", "interleaved ratio",
                   "stopped by", "vs LSTM (causal)", "steering s", "lift"):
        assert column in header
    title = table.splitlines()[0]
    assert all(word in title for word in ("APNEWS", "size `cpu`", "at most 4 steps", "device cpu", "code"))
    assert "causal-carry" in table.split("#### Comparisons")[1]
    assert "Under **causal**: the best topic model" in table.split("#### Comparisons")[1]
    assert "Not in this table (not finished in this run's folder): TCNLM; TCNLM, carried state;" in table
    assert report["settings"]["max_steps"] == 4
    if importlib.util.find_spec("matplotlib") is not None:
        for figure in ("perplexity.png", "steering.png", "dev_curves.png"):
            assert (out / figure).stat().st_size > 0

    # resume, without matplotlib: nothing is retrained, nothing measured again, no figure (and a message)
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = run_script(*SMOKE, "--out", str(out), prefix=("-c", WITHOUT_MATPLOTLIB))
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["results"]["lstm"]["perplexity"] == results["lstm"]["perplexity"]
    changed = {p.name for p, t in written.items() if p.stat().st_mtime_ns != t}
    assert changed <= {"results.json", "table.md", "benchmark.log", "settings.json"}
    assert "figures skipped" in again.stdout
    assert "trained earlier" in (out / "benchmark.log").read_text().split("====")[-1]

    refused = run_script(*SMOKE, "--out", str(out), "--max-steps", "3")  # a smaller cap than its rows had
    assert refused.returncode != 0 and "holds results of other settings" in refused.stderr

    # publishing into a results page: the block after the page's last published block, the files beside it
    page = tmp_path / "site" / "results" / "README.md"
    page.parent.mkdir(parents=True)
    page.write_text("# Results\n\n## One budget\n\nearlier tables\n\n<!-- benchmark_all brown-cpu start -->\nBrown\n"
                    "<!-- benchmark_all brown-cpu end -->\n\n## Per family\n\nmore\n")
    publish(out, page, "apnews-cpu")
    first = page.read_text()
    assert first.index("<!-- benchmark_all brown-cpu end -->") < first.index("<!-- benchmark_all apnews-cpu start -->") \
        < first.index(table.splitlines()[0]) < first.index("<!-- benchmark_all apnews-cpu end -->") \
        < first.index("## Per family")
    assert (page.parent / "apnews-cpu" / "table.md").read_text() == table
    if (out / "perplexity.png").exists():
        assert "![perplexity](apnews-cpu/perplexity.png)" in first
        assert (page.parent / "apnews-cpu" / "perplexity.png").exists()
    publish(out, page, "apnews-cpu")  # idempotent
    assert page.read_text() == first
    empty = tmp_path / "empty" / "README.md"  # a page without blocks (or without a file) gets it at its end
    empty.parent.mkdir()
    empty.write_text("# Results\n")
    publish(out, empty, "apnews-cpu")
    assert empty.read_text().startswith("# Results\n\n<!-- benchmark_all apnews-cpu start -->")


def test_a_larger_cap_continues_the_rows_the_smaller_one_stopped(tmp_path):
    """Under the plateau schedule a rerun may raise the folder's cap: a row that the smaller cap stopped trains on
    from its last checkpoint with the warm-up of the first cap, and is measured again; a row that its development
    perplexity stopped is not retrained; a smaller cap is refused."""
    out = tmp_path / "all"
    base = [*WIKI_SMOKE, "--eval-steps", "50", "--out", str(out)]  # the shipped corpus: a fresh clone runs it
    first = run_script(*base, "--max-steps", "100", "--patience", "100", "--only", "lstm")
    assert first.returncode == 0, first.stderr[-3000:]
    capped = json.loads((out / "lstm" / "train.json").read_text())
    assert capped["stopped_by"] == "max_steps" and capped["steps_trained"] == 100
    at_cap = json.loads((out / "lstm" / "eval.json").read_text())
    assert json.loads((out / "settings.json").read_text())["warmup_steps"] == 2
    lower = run_script(*base, "--max-steps", "60", "--patience", "100", "--only", "lstm")
    assert lower.returncode != 0 and "holds results of other settings" in lower.stderr
    again = run_script(*base, "--max-steps", "200", "--patience", "100", "--only", "lstm")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped by its cap of 100 steps earlier: continuing to at most 200" in again.stdout
    continued = json.loads((out / "lstm" / "train.json").read_text())
    assert continued["steps_trained"] == 200 and continued["max_steps"] == 200
    assert continued["dev_history"][:len(capped["dev_history"])] == capped["dev_history"]
    settings = json.loads((out / "settings.json").read_text())
    assert (settings["max_steps"], settings["warmup_steps"]) == (200, 2)  # 2 % of the first cap, not of 200
    evaluated = json.loads((out / "lstm" / "eval.json").read_text())  # the weights of the longer run, measured
    assert evaluated["causal"]["perplexity"] != at_cap["causal"]["perplexity"]
    results = json.loads((out / "results.json").read_text())["results"]["lstm"]
    assert results["steps_trained"] == 200
    assert results["perplexity"]["causal"]["perplexity"] == evaluated["causal"]["perplexity"]
    assert "linear warm-up over 2 steps" in (out / "table.md").read_text()


def _benchmark_all_commands(text: str) -> list[list[str]]:
    return [shlex.split(line, comments=True)[2:] for line in text.replace("\\\n", " ").splitlines()
            if line.startswith("python scripts/benchmark_all.py")]


def test_documented_commands_parse_and_published_blocks_are_the_tables():
    """The benchmark_all commands of README.md and results/README.md parse with the script's own parser (in a
    separate interpreter), and every block of results/README.md is its results/<key>/table.md (what the script
    wrote), with its figures present."""
    commands = _benchmark_all_commands((ROOT / "README.md").read_text()) + \
        _benchmark_all_commands(RESULTS.read_text())
    assert commands
    check = ("import json, os, runpy, sys; sys.path.insert(0, os.path.dirname(sys.argv[1])); "
             "parse = runpy.run_path(sys.argv[1])['parse_args']; "
             "print(json.dumps([[parse(argv).readme, parse(argv).names] for argv in json.loads(sys.argv[2])]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", check, str(SCRIPT), json.dumps(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for readme, names in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert readme == "results/README.md" and names

    page = RESULTS.read_text()
    blocks = re.findall(r"<!-- benchmark_all (\S+) start -->\n(.*?)<!-- benchmark_all \1 end -->", page, re.S)
    assert {key for key, _ in blocks} >= {"apnews-cpu", "brown-cpu"}
    for key, body in blocks:
        assert (RESULTS.parent / key / "table.md").read_text().strip() in body, key
        for image in re.findall(r"\]\(([^)]+\.png)\)", body):
            assert image.startswith(f"{key}/") and (RESULTS.parent / image).exists(), image
        results = json.loads((RESULTS.parent / key / "results.json").read_text())
        assert results["context"]["corpus"] == key.split("-")[0]


def test_warm_started_and_matched_rows_on_the_shipped_corpus(tmp_path):
    """On the corpus that ships with the package (no data needed): a row started from the run's carried LSTM refuses
    to run before it; ``*-matched`` rows are trained and evaluated with every context empty (their dev and
    validation perplexities say so); the comparison names the strongest baseline (the carried LSTM or a matched row)
    and each topic row against its matched twin."""
    smoke = [*WIKI_SMOKE, "--out", str(tmp_path / "wiki")]
    proc = run_script(*smoke, "--only", "rgbn-carry-warm")
    assert proc.returncode != 0 and "train lstm-carry first" in proc.stderr
    proc = run_script(*smoke, "--only", "lstm-carry", "rgbn-carry-warm-recipe", "rgbn-carry-warm-recipe-matched")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "wiki" / "results.json").read_text())
    matched = report["results"]["rgbn-carry-warm-recipe-matched"]
    assert all(matched["eval"][p]["empty_context"] for p in PROTOCOLS) and "mismatched" not in matched
    assert not report["results"]["rgbn-carry-warm-recipe"]["eval"]["causal-carry"]["empty_context"]
    carry = report["comparison"]["causal_carry"]
    assert carry["best_topic_model"] == "rgbn-carry-warm-recipe"
    best = min(("lstm-carry", "rgbn-carry-warm-recipe-matched"),
               key=lambda n: report["results"][n]["perplexity"]["causal-carry"]["perplexity"])
    assert carry["best_baseline"] == best
    twin = report["comparison"]["matched"]["rgbn-carry-warm-recipe"]
    assert twin["matched_perplexity"] == matched["perplexity"]["causal-carry"]["perplexity"]
    assert "topics held uninformative" in (tmp_path / "wiki" / "table.md").read_text()


def test_a_chunk_trained_topic_row_is_compared_with_its_matched_twin_under_causal(tmp_path):
    """The unified tables' chunk-trained rows have matched twins too (``tcnlm-recipe-matched``: the same model,
    every context empty): the twin is not a topic model of the comparison, and the topic row's ``causal`` entry
    names the twin's perplexity and the difference, which the table prints."""
    smoke = [*WIKI_SMOKE, "--out", str(tmp_path / "wiki"), "--only", "lstm", "tcnlm-recipe", "tcnlm-recipe-matched"]
    proc = run_script(*smoke)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "wiki" / "results.json").read_text())
    twin = report["results"]["tcnlm-recipe-matched"]
    assert all(twin["eval"][p]["empty_context"] for p in PROTOCOLS) and "mismatched-causal" not in twin
    causal = report["comparison"]["causal"]
    assert set(causal) == {"tcnlm-recipe"}
    row, a = causal["tcnlm-recipe"], report["results"]["tcnlm-recipe"]["perplexity"]["causal"]["perplexity"]
    assert row["matched_perplexity"] == twin["perplexity"]["causal"]["perplexity"]
    assert row["percent_to_matched"] == pytest.approx(100 * (row["matched_perplexity"] - a) / row["matched_perplexity"])
    assert f"{row['matched_perplexity']:.2f}" in (tmp_path / "wiki" / "table.md").read_text()
