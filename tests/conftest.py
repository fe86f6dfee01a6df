"""Shared fixtures: the real corpora of ../shared/data (skipped with a reason when absent)."""

import os
from pathlib import Path

import pytest
import torch

DATA = Path(os.environ.get("TOPIC_LM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MALLET = DATA / "stopwords" / "mallet_en.txt"


def requires_data(*parts: str):
    """Skip unless ../shared/data/<parts> exists (the real corpora live only beside this checkout)."""
    path = DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"real corpus {path} is absent; set TOPIC_LM_DATA to its folder")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def apnews():
    """A small real APNEWS setup: 300 training documents, 40 validation documents and their
    vocabularies (min_freq=3, MALLET stop list)."""
    if not (DATA / "apnews" / "train.txt").exists():
        pytest.skip(f"real corpus {DATA / 'apnews'} is absent; set TOPIC_LM_DATA to its folder")
    from topic_lm_hf import build_vocabularies, load_documents

    train = load_documents(DATA / "apnews" / "train.txt", max_documents=300)
    valid = load_documents(DATA / "apnews" / "valid.txt", max_documents=40)
    tok, topic_tok = build_vocabularies(train, min_freq=3, stopwords=MALLET)
    return {"train": train, "valid": valid, "tok": tok, "topic_tok": topic_tok}


def run_without_package(body: str, cwd: Path) -> dict:
    """Run ``body`` (Python source that prints one JSON line last) in a fresh interpreter in which
    ``topic_lm_hf`` cannot be imported, as on a machine that only has transformers: the way a Hub
    user loads a saved folder with ``trust_remote_code=True``. Returns the parsed JSON."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import sys, json, os
        # Neither this checkout nor an editable install elsewhere (a .pth path entry) stays on the path.
        sys.path = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "topic_lm_hf"))]
        import importlib.util
        assert importlib.util.find_spec("topic_lm_hf") is None, "the package must not be importable here"
    """) + textwrap.dedent(body)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(cwd / "modules"), "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
