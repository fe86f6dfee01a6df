"""Shared fixtures: the real corpora of ../shared/data (skipped with a reason when absent)."""

import os
import sys
from pathlib import Path

import pytest
import torch

# The benchmark harness (scripts/benchmarking.py, scripts/benchmark_training.py) is not part of the package: the
# scripts import it as plain modules from their own folder, and the tests from there too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

DATA = Path(os.environ.get("TOPIC_LM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MALLET = DATA / "stopwords" / "mallet_en.txt"


def requires_data(*parts: str):
    """Skip unless ../shared/data/<parts> exists (the real corpora live only beside this checkout)."""
    path = DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"real corpus {path} is absent; set TOPIC_LM_DATA to its folder")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a test module (``pytestmark = pytest.mark.usefixtures("one_thread")``): recurrent
    models run many small ops per time step, and with several threads on a shared CPU synchronisation dominates."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


# Every model family of the package, as (model_type, config overrides): what "test every family" runs.
FAMILIES = {
    "lstm_lm": ("lstm_lm", {}),
    "tcnlm": ("tcnlm", {"num_topics": 4, "num_factors": 8, "encoder_hidden_size": 16, "topic_embedding_size": 8}),
    "tcnlm-naive_moe": ("tcnlm", {"num_topics": 3, "lm_type": "naive_moe", "encoder_hidden_size": 16,
                                  "topic_embedding_size": 8}),
    "topic_rnn-rnn": ("topic_rnn", {"cell": "rnn", "num_topics": 4, "inference_hidden_size": 16}),
    "topic_rnn-lstm": ("topic_rnn", {"cell": "lstm", "num_topics": 4, "inference_hidden_size": 16}),
    "topic_rnn-gru": ("topic_rnn", {"cell": "gru", "num_topics": 4, "inference_hidden_size": 16}),
    "topic_rnn-softmax": ("topic_rnn", {"cell": "lstm", "num_topics": 4, "inference_hidden_size": 16,
                                        "theta_transform": "softmax"}),
    "nclm-leta-sdt": ("nclm", {"variant": "leta", "sentence_topics": True, "num_topics": 4, "encoder_hidden_size": 16,
                               "etr_top_n": 5, "num_topic_samples": 2}),
}


def tiny_model(family: str, tok, topic_tok, **overrides):
    """A small model of ``family`` (a key of FAMILIES) sized to the two tokenizers, the way
    ``topic-lm train`` builds one (``cli.build_model``)."""
    import json

    from topic_lm_hf.cli import ModelArguments, build_model

    model_type, kwargs = FAMILIES[family]
    kwargs = {"embedding_size": 16, "hidden_size": 16, "dropout": 0.0, **kwargs, **overrides}
    # --config_overrides syntax (PretrainedConfig.update_from_string): strings unquoted, booleans true/false
    overrides_text = ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in kwargs.items())
    torch.manual_seed(0)
    # the paper's model plus the given overrides (not the command line's default steering recipe)
    return build_model(ModelArguments(model_type=model_type, config_overrides=overrides_text, recipe="paper"), tok,
                       topic_tok)


# A two-document toy corpus for tests of the generation and output-layer math (no data needed).
TINY_CORPUS = [[["the", "court", "ruled", "on", "the", "tax", "case"], ["police", "said", "the", "fire", "spread"]],
               [["the", "team", "won", "the", "game"], ["fans", "cheered", "the", "players"]]]


@pytest.fixture(scope="module")
def tiny_vocabularies():
    """LM and topic tokenizers of TINY_CORPUS ("the" is the stop word)."""
    from topic_lm_hf import build_vocabularies, documents_from_lists

    return build_vocabularies(documents_from_lists(TINY_CORPUS * 3), min_freq=1, stopwords=["the"], top_fraction=0.0)


def topic_family_model(family: str, tok, topic_tok, **overrides):
    """A small topic model in evaluation mode: ``tiny_model`` for a key of FAMILIES, or ``"rgbn_rnn"`` (two topic
    layers of 4 and 2 topics, two LSTM layers of 16)."""
    if family != "rgbn_rnn":
        return tiny_model(family, tok, topic_tok, **overrides).eval()
    from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM

    torch.manual_seed(0)
    config = RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[4, 2], hidden_sizes=[16, 16],
                                           embedding_size=16, **overrides)
    return RGBNRNNForCausalLM(config).eval()


def run_torchrun(script: Path, *args: str, processes: int = 2):
    """Run ``script`` under ``torchrun --nproc_per_node processes`` (CPU, one thread each) on a free port;
    skip when torchrun is not installed. Returns the completed process."""
    import shutil
    import socket
    import subprocess
    import sys

    torchrun = Path(sys.executable).parent / "torchrun"
    torchrun = str(torchrun) if torchrun.exists() else shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed")
    with socket.socket() as s:  # a port no other test run holds
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.run([torchrun, "--nproc_per_node", str(processes), "--master_port", str(port), str(script),
                           *args], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=300)


def finish_distributed(trainer):
    """End a torchrun test script: wait for every rank, drop every reference to the DDP-wrapped model (its reducer
    holds the gloo process group), then tear the group down. A group still referenced at interpreter exit is
    destroyed during static destruction, with its gloo threads running, and aborts the rank ("terminate called
    without an active exception")."""
    import gc

    trainer.accelerator.wait_for_everyone()
    trainer.model_wrapped = trainer.model
    trainer.accelerator.free_memory()
    gc.collect()
    trainer.accelerator.end_training()
