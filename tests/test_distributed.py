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


def test_two_process_carried_state_training_finishes_with_the_same_weights_on_both_ranks(tmp_path):
    """TCNLM with its state carried across a document's chunks under two-process DDP (gloo), default settings: it
    used to hang (the ranks read documents of different lengths, so their forward passes, each of which broadcast
    the buffers, did not pair up); it finishes, and both ranks hold the same weights."""
    proc = run_torchrun(Path(__file__).parent / "ddp_train_carried.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [3, 3]
    assert ranks[0]["weights"] == ranks[1]["weights"]
