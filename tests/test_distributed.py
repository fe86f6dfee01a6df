"""Two processes (torchrun, CPU, gloo): DDP training through TopicLMTrainer, loss terms gathered."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun is not installed")
def test_two_process_ddp_training(tmp_path):
    torchrun = str(Path(sys.executable).parent / "torchrun") if (Path(sys.executable).parent / "torchrun").exists() \
        else shutil.which("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", "29517",
                           str(Path(__file__).parent / "ddp_train.py"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2
    logs = [h for h in result["log"] if "loss" in h]
    assert len(logs) == 3 and all("lm_loss" in h for h in logs)
    assert (tmp_path / "model.safetensors").exists()
