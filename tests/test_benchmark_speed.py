"""scripts/benchmark_speed.py as a user runs it, small: every table is printed, every figure is finite, and the
results file records every model under every mode (the measured speeds are not asserted: speed is measured,
not tested)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from conftest import requires_data

ROOT = Path(__file__).resolve().parents[1]


@requires_data("apnews", "train.txt")
def test_speed_benchmark_prints_every_table_and_records_every_mode(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmark_speed.py"), "--only", "tcnlm",
                           "nclm-lta", "lstm-carry", "rgbn-carry", "--repeats", "1", "--max-train-docs", "40", "--new-tokens", "3",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for header in ("| model | fp32 tokens/s | bf16 | bf16 + compiled output layer |",
                   "| model | operations per step | host synchronisations | GFLOP per step |",
                   "| model, carried state (fast path) |", "| model | generate() tokens/s |"):
        assert header in out
    for label in ("| LSTM |", "| TCNLM |", "| NCLM LTA |", "| LSTM, carried state |", "| rGBN-RNN, carried state |"):
        assert label in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["training"]) == {f"{n}/{m}" for n in ("lstm", "tcnlm", "nclm-lta")
                                        for m in ("fp32", "bf16", "bf16+compiled")} | {"lstm-carry/bf16+compiled",
                                                                                 "rgbn-carry/bf16+compiled"}
    assert all(math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 for r in results["training"].values())
    assert all(v > 0 for v in results["activations_mib"].values())
    assert set(results["generation"]) == {"lstm", "tcnlm", "nclm-lta"}
    assert set(results["step_cost"]) == {"lstm", "tcnlm", "nclm-lta", "lstm-carry", "rgbn-carry"}
    assert all(c["operations"] > 0 and c["gflop"] > 0 and c["host_synchronisations"] >= 0
               for c in results["step_cost"].values())
