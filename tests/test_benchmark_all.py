"""scripts/benchmark_all.py in its smoke configuration: every output is written, every number is finite and labelled
with its protocol, and a second run retrains nothing (resume)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from conftest import requires_data

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
pytestmark = [requires_data("apnews", "train.txt"), requires_data("wiki", "articles.jsonl.gz"),
              pytest.mark.usefixtures("one_thread")]

SMOKE = ["--corpus", "apnews", "--max-steps", "4", "--eval-steps", "2", "--patience", "1", "--batch-size", "2",
         "--hidden", "8", "--embedding", "8", "--topics", "3", "--max-train-docs", "30", "--max-valid-docs", "4",
         "--npmi-max-documents", "20", "--steer-topics", "2", "--steer-samples", "2", "--max-new-tokens", "8",
         "--speed-repeats", "1", "--lda-max-iter", "2", "--only", "lstm", "lstm-carry", "topic-lstm"]
PROTOCOLS = ("paper", "causal", "causal-carry")


@pytest.fixture(scope="module")
def benchmark_all():
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("benchmark_all", SCRIPTS / "benchmark_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stopped_counts_evaluations_after_the_best(benchmark_all):
    history = [{"perplexity": p} for p in (10.0, 9.0, 9.5, 9.2)]
    assert benchmark_all.stopped(history, patience=2)
    assert not benchmark_all.stopped(history, patience=3)
    assert not benchmark_all.stopped([], patience=1)


def test_step_throughput_leaves_out_stalled_steps(benchmark_all):
    steps = [{"seconds": 0.2 + 0.01 * (i % 3), "tokens": 100} for i in range(50)]
    plain = benchmark_all.step_throughput(steps)
    assert plain["stalled_steps"] == 0
    assert plain["tokens_per_s"] == pytest.approx(5000 / sum(r["seconds"] for r in steps))
    # a step during which the process was stopped for an hour: left out, counted, the speed unchanged
    stalled = benchmark_all.step_throughput(steps[:25] + [{"seconds": 3600.0, "tokens": 100}] + steps[25:])
    assert stalled["stalled_steps"] == 1 and stalled["stalled_seconds"] == 3600.0
    assert stalled["tokens_per_s"] == pytest.approx(plain["tokens_per_s"])
    # a uniformly slower model is not "stalled"
    slow = benchmark_all.step_throughput([{"seconds": 10 * r["seconds"], "tokens": 100} for r in steps])
    assert slow["stalled_steps"] == 0 and slow["tokens_per_s"] == pytest.approx(plain["tokens_per_s"] / 10)
    assert math.isnan(benchmark_all.step_throughput([])["tokens_per_s"])


def test_smoke_run_then_resume(benchmark_all, tmp_path, monkeypatch, capsys):
    out = tmp_path / "all"
    report = benchmark_all.main([*SMOKE, "--out", str(out)])
    results = report["results"]
    assert list(results) == ["lstm", "lstm-carry", "topic-lstm"]
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
    carry = report["comparison"]["causal_carry"]
    assert carry["best_topic_model"] == "topic-lstm" and math.isfinite(carry["percent"])
    assert [p["ranking"] for p in report["comparison"]["papers"].values()][0] == ["TopicRNN", "LSTM"]
    # the dev split: a fixed 5 % of train.txt, never valid.txt
    assert report["context"]["dev_documents"] == 2 and report["context"]["train_documents"] == 28

    table = (out / "table.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| model"))
    for column in ("ppl paper", "ppl causal", "ppl causal-carry", "ppl ablation (protocol)", "NPMI lau2014",
                   "steering acc.", "fluency ratio", "train tokens/s", "ratio to LSTM", "interleaved ratio"):
        assert column in header
    title = table.splitlines()[0]
    assert all(word in title for word in ("APNEWS", "size `cpu`", "at most 4 steps", "device cpu", "code"))
    assert "causal-carry" in table.split("#### Comparisons")[1]
    assert json.loads((out / "results.json").read_text())["settings"]["max_steps"] == 4
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "perplexity.png").stat().st_size > 0 and (out / "steering.png").stat().st_size > 0

    # publishing into a README: a block at the end of its Results section, the files beside it; idempotent
    readme = tmp_path / "site" / "README.md"
    readme.parent.mkdir()
    readme.write_text("# x\n\n## Results\n\nearlier tables\n\n## Layout\n\nfolders\n")
    benchmark_all.publish(out, readme, "apnews-cpu")
    first = readme.read_text()
    assert first.index("earlier tables") < first.index("<!-- benchmark_all apnews-cpu start -->") \
        < first.index(table.splitlines()[0]) < first.index("<!-- benchmark_all apnews-cpu end -->") \
        < first.index("## Layout")
    assert (readme.parent / "results" / "apnews-cpu" / "table.md").read_text() == table
    if (out / "perplexity.png").exists():
        assert "![perplexity](results/apnews-cpu/perplexity.png)" in first
        assert (readme.parent / "results" / "apnews-cpu" / "perplexity.png").exists()
    benchmark_all.publish(out, readme, "apnews-cpu")
    assert readme.read_text() == first

    # resume: nothing is retrained, nothing measured again
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = benchmark_all.main([*SMOKE, "--out", str(out)])
    assert again["results"]["lstm"]["perplexity"] == results["lstm"]["perplexity"]
    changed = {p.name for p, t in written.items() if p.stat().st_mtime_ns != t}
    assert changed <= {"results.json", "table.md", "benchmark.log", "settings.json", "perplexity.png", "steering.png"}
    assert "trained earlier" in (out / "benchmark.log").read_text().split("====")[-1]

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # without matplotlib: no figures, and a message
    (tmp_path / "no-figures").mkdir()
    benchmark_all.figures(report, tmp_path / "no-figures")
    assert "figures skipped" in capsys.readouterr().out and not list((tmp_path / "no-figures").iterdir())

    with pytest.raises(SystemExit):  # other settings in the same folder are refused
        benchmark_all.main([*SMOKE, "--out", str(out), "--max-steps", "5"])


def test_readme_commands_and_published_blocks(benchmark_all):
    """The README's benchmark_all commands parse, and every published block is its results/<key>/table.md (what the
    script wrote), with its figures present."""
    import re
    import shlex

    root = SCRIPTS.parent
    readme = (root / "README.md").read_text()
    commands = [shlex.split(line, comments=True)[2:] for line in readme.replace("\\\n", " ").splitlines()
                if line.startswith("python scripts/benchmark_all.py")]
    assert commands
    for argv in commands:
        args = benchmark_all.parse_args(argv)
        assert args.readme == "README.md" and args.names
    blocks = re.findall(r"<!-- benchmark_all (\S+) start -->\n(.*?)<!-- benchmark_all \1 end -->", readme, re.S)
    assert {key for key, _ in blocks} >= {"apnews-cpu", "brown-cpu"}
    for key, body in blocks:
        assert (root / "results" / key / "table.md").read_text().strip() in body, key
        for image in re.findall(r"\]\((results/[^)]+\.png)\)", body):
            assert (root / image).exists(), image
        results = json.loads((root / "results" / key / "results.json").read_text())
        assert results["context"]["corpus"] == key.split("-")[0]
