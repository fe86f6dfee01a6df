"""Two processes (torchrun, CPU, gloo): DDP training through TopicLMTrainer, loss terms gathered."""

import json
from pathlib import Path

from conftest import run_torchrun


def test_two_process_ddp_training(tmp_path):
    proc = run_torchrun(Path(__file__).parent / "ddp_train.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2
    logs = [h for h in result["log"] if "loss" in h]
    assert len(logs) == 3 and all("lm_loss" in h for h in logs)
    assert (tmp_path / "model.safetensors").exists()
