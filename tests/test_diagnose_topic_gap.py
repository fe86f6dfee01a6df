"""scripts/diagnose_topic_gap.py as a user runs it, small: each run changes the configuration it names (an unknown
option is refused), is evaluated with its own and with another document's context, is kept and not redone, and the
table compares each with the LSTM."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import requires_data

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *variants):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "diagnose_topic_gap.py"), "--steps", "2",
                           "--valid-docs", "3", "--out", str(tmp_path), "--variant", *variants],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@requires_data("apnews", "train.txt")
def test_each_hypothesis_is_a_run_against_the_lstm(tmp_path):
    proc = _run(tmp_path, "lstm=lstm", "flat=tcnlm:topic_factor_spread=0.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    flat = json.loads((tmp_path / "flat" / "result.json").read_text())
    assert flat["values"] == {"topic_factor_spread": 0.0} and flat["protocol"] == "paper"
    assert flat["own"] > 1 and flat["mismatched"] > 1
    table = (tmp_path / "table.md").read_text()
    assert "| flat | `topic_factor_spread=0.0` | `paper` |" in table and "| lstm |" not in table
    # a rerun reads the kept results (no training: no step is logged)
    again = _run(tmp_path, "lstm=lstm", "flat=tcnlm:topic_factor_spread=0.0")
    assert again.returncode == 0 and "'step'" not in again.stdout
    wrong = _run(tmp_path, "lstm=lstm", "typo=tcnlm:topic_factor_spred=0.0")
    assert wrong.returncode == 2 and "typo: TCNLMConfig has no option 'topic_factor_spred'" in wrong.stderr
