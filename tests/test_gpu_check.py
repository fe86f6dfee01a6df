"""scripts/gpu_check.py in the mode CI runs (``--device cpu --tiny``): every part finishes, and results.json and
tables.md name every family (the figures are measured, not asserted)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from conftest import requires_data

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("LSTM", "TCNLM", "TopicLSTM", "NCLM LETA", "rGBN-RNN, 1 layer")


@requires_data("apnews", "train.txt")
def test_gpu_check_runs_on_a_cpu_and_records_every_family(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--tiny",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["ok"] and results["device"] == "cpu" and results["tiny"]
    parts = results["parts"]
    assert set(parts) == {"steps-eager", "generation", "carried", "graphs-lstm", "graphs-tcnlm"} | {
        f"cli-{n}" for n in ("lstm", "tcnlm", "topic-lstm", "nclm-leta", "rgbn")}
    for name in ("graphs-lstm", "graphs-tcnlm"):  # on a CPU only the eager steps (a graph needs a GPU)
        graphs = parts[name]["result"]
        assert graphs["modes"] == ["eager"] and graphs["timing"]["eager"]["tokens_per_s"] > 0
        assert all(math.isfinite(x) for x in graphs["check"]["losses"]["eager"])
    carried = parts["carried"]["result"]  # the unified benchmark's carried rows, trained on the device
    assert set(carried["rows"]) == {"lstm-carry", "rgbn-carry"}
    for row in carried["rows"].values():
        assert row["steps_trained"] > 0 and math.isfinite(row["perplexity"]["causal-carry"]["perplexity"])
        assert row["stopped_by"] in ("max_steps", "patience")
    assert carried["rows"]["rgbn-carry"]["mismatched"]["base_protocol"] == "causal-carry"
    assert "rGBN-RNN, carried state" in (tmp_path / "tables.md").read_text()
    steps = parts["steps-eager"]["result"]
    assert {"fp32", "bf16", steps["default_mode"]} <= set(steps["modes"])
    carried_rows = {"LSTM, carried state", "rGBN-RNN, carried state", "TCNLM, carried state"}  # beside the families
    for mode in steps["modes"].values():
        assert set(mode["families"]) == set(FAMILIES) | carried_rows
        assert all(math.isfinite(f["tokens_per_s"]) and f["tokens_per_s"] > 0 for f in mode["families"].values())
        assert mode["families"]["LSTM"]["ratio_to_lstm"] == 1.0
    for name in ("lstm", "tcnlm", "topic-lstm", "nclm-leta", "rgbn"):
        commands = parts[f"cli-{name}"]["result"]["commands"]
        assert [commands[c]["exit_code"] for c in ("train", "evaluate", "generate")] == [0, 0, 0], commands
        assert commands["generate"]["output_tail"].strip()  # generated text
        if name != "lstm":
            assert "--topic_ids 1 --topic_guidance_scale 2" in commands["generate"]["argv"]
    costs = steps["step_cost"]  # one eager step of each: operations and host synchronisations
    assert set(costs) == set(FAMILIES) | carried_rows
    assert all(c["operations"] > 0 and c["host_synchronisations"] >= 0 for c in costs.values())
    assert set(parts["generation"]["result"]) == set(FAMILIES)
    tables = (tmp_path / "tables.md").read_text()
    assert all(f"| {family} |" in tables for family in FAMILIES) and "Default path here" in tables
