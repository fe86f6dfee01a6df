"""scripts/plot_seeds.py's table of one carried comparison over seeds, from benchmark_all.py folders: the lead over
the strongest baseline of each seed (the carried LSTM or the matched twin), the own topics' worth, the mean."""

import json

import pytest

import plot_seeds


def _folder(tmp_path, seed, lstm, topic, mismatched, matched):
    def row(ppl, label, **more):
        return {"label": label, "perplexity": {"causal-carry": {"perplexity": ppl}}, **more}

    rows = {"lstm-carry": row(lstm, "LSTM, carried state"),
            "rgbn-carry-x": row(topic, "rGBN-RNN, carried", mismatched={"perplexity": mismatched})}
    if matched is not None:
        rows["rgbn-carry-x-matched"] = row(matched, "matched")
    folder = tmp_path / f"seed-{seed}"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"results": rows}))
    return folder


def test_the_table_compares_each_seed_with_its_strongest_baseline(tmp_path, capsys):
    folders = [_folder(tmp_path, 0, 100.0, 90.0, 105.0, 95.0),  # matched is stronger: lead 5.3 %, worth 15 > 5
               _folder(tmp_path, 1, 80.0, 78.0, 79.0, 85.0),    # the LSTM is stronger: lead 2.5 %, worth 1 < 2
               _folder(tmp_path, 2, 60.0, 63.0, 70.0, 65.0)]    # behind: no lead for its topics to outweigh
    plot_seeds.main([str(f) for f in folders] + ["--topic-row", "rgbn-carry-x", "--table"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "rGBN-RNN, carried" in lines[0]
    assert lines[2] == "| 0 | 100.00 | 95.00 | 90.00 | +5.3 % | 105.00 | 15.00 | yes |"
    assert lines[3] == "| 1 | 80.00 | 85.00 | 78.00 | +2.5 % | 79.00 | 1.00 | no |"
    assert lines[4] == "| 2 | 60.00 | 65.00 | 63.00 | -5.0 % | 70.00 | 7.00 | no |"
    assert lines[5].startswith("| mean | 80.00 | 81.67 | 77.00 | +0.9 % (sd 5.3) | 84.67 | 7.67 |")


def test_a_seed_whose_twin_is_missing_is_not_compared(tmp_path, capsys):
    """Where some seed has the matched twin, a seed without it (its twin still training) has not met the strongest
    baseline: no lead, and the mean leaves it out; its ablation is still shown."""
    folders = [_folder(tmp_path, 0, 100.0, 90.0, 105.0, 95.0), _folder(tmp_path, 1, 80.0, 78.0, 79.0, None)]
    plot_seeds.main([str(f) for f in folders] + ["--topic-row", "rgbn-carry-x", "--table"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[3] == "| 1 | 80.00 | - | 78.00 | - | 79.00 | 1.00 | - |"
    assert lines[4] == "| mean (seeds 0) | 100.00 | 95.00 | 90.00 | +5.3 % | 105.00 | 15.00 | |"


def test_without_any_twin_the_lstm_is_the_baseline(tmp_path, capsys):
    folders = [_folder(tmp_path, 0, 100.0, 90.0, 105.0, None), _folder(tmp_path, 1, 80.0, 78.0, 79.0, None)]
    plot_seeds.main([str(f) for f in folders] + ["--topic-row", "rgbn-carry-x", "--table"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[2:4] == ["| 0 | 100.00 | - | 90.00 | +10.0 % | 105.00 | 15.00 | yes |",
                          "| 1 | 80.00 | - | 78.00 | +2.5 % | 79.00 | 1.00 | no |"]
    assert lines[4].startswith("| mean | 90.00 | - | 84.00 | +6.2 % (sd 5.3) |")


def test_the_mean_is_over_the_seeds_that_have_the_topic_model(tmp_path, capsys):
    """A seed whose topic model has not finished compares nothing: the mean row leaves it out and names its seeds."""
    folders = [_folder(tmp_path, 0, 100.0, 90.0, 105.0, 95.0), _folder(tmp_path, 1, 80.0, 78.0, 79.0, 75.0)]
    rows = json.loads((folders[1] / "results.json").read_text())
    del rows["results"]["rgbn-carry-x"]
    (folders[1] / "results.json").write_text(json.dumps(rows))
    plot_seeds.main([str(f) for f in folders] + ["--topic-row", "rgbn-carry-x", "--table"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[3] == "| 1 | 80.00 | 75.00 | - | - | - | - | - |"
    assert lines[4] == "| mean (seeds 0) | 100.00 | 95.00 | 90.00 | +5.3 % | 105.00 | 15.00 | |"


def test_a_named_twin_is_the_matched_baseline(tmp_path, capsys):
    """``--matched-row``: a twin whose name is not ``<topic-row>-matched`` (one twin shared by several topic rows)."""
    folder = _folder(tmp_path, 0, 100.0, 90.0, 105.0, None)
    rows = json.loads((folder / "results.json").read_text())
    rows["results"]["twin-p10-matched"] = {"label": "twin", "perplexity": {"causal-carry": {"perplexity": 95.0}}}
    (folder / "results.json").write_text(json.dumps(rows))
    plot_seeds.main([str(folder), "--topic-row", "rgbn-carry-x", "--table"])
    first = capsys.readouterr().out.strip().splitlines()[2]
    assert first == "| 0 | 100.00 | - | 90.00 | +10.0 % | 105.00 | 15.00 | yes |"
    plot_seeds.main([str(folder), "--topic-row", "rgbn-carry-x", "--matched-row", "twin-p10-matched", "--table"])
    first = capsys.readouterr().out.strip().splitlines()[2]
    assert first == "| 0 | 100.00 | 95.00 | 90.00 | +5.3 % | 105.00 | 15.00 | yes |"


def test_plot_seeds_wants_a_figure_or_a_table(tmp_path, capsys):
    folder = _folder(tmp_path, 0, 100.0, 90.0, 105.0, 95.0)
    with pytest.raises(SystemExit) as stop:
        plot_seeds.main([str(folder), "--topic-row", "rgbn-carry-x"])
    assert stop.value.code == 2 and "give --out (the figure), --table, or both" in capsys.readouterr().err


def test_the_title_names_the_corpus_and_whether_every_row_stopped_by_dev(tmp_path, capsys):
    folders = [_folder(tmp_path, seed, 100.0, 90.0, 105.0, 95.0) for seed in (0, 1)]
    for folder in folders:
        results = json.loads((folder / "results.json").read_text())
        results["context"] = {"corpus_name": "the Wikipedia sample shipped with the package"}
        (folder / "results.json").write_text(json.dumps(results))
    rows = ["rgbn-carry-x", "rgbn-carry-x-matched"]
    assert plot_seeds.title(folders, rows) == ("The Wikipedia sample shipped with the package, causal-carry, not every "
                                               "row stopped by its dev perplexity")
    for folder in folders:
        results = json.loads((folder / "results.json").read_text())
        for row in results["results"].values():
            row["early_stopped"] = True
        (folder / "results.json").write_text(json.dumps(results))
    assert plot_seeds.title(folders, rows) == ("The Wikipedia sample shipped with the package, causal-carry, each row "
                                               "stopped by its dev perplexity")
    plot_seeds.main([str(f) for f in folders] + ["--topic-row", "rgbn-carry-x", "--label", "I", "--table"])
    assert "| matched, topics uninformative | I | lead" in capsys.readouterr().out
