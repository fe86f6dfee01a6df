"""Shared fixtures: the package's own real corpus (``wikipedia-sample``, always there), and the full corpora of
``$TOPIC_LM_DATA`` for the tests that need them (skipped with a reason when absent)."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

# `make test` runs the suite on every core (pytest-xdist, one process per core): each worker computes with one torch
# thread (and so do the commands it starts), and loads remote code from its own modules cache, not one that another
# worker writes at the same moment. Set before torch and transformers are imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix=f"hf-modules-{os.environ['PYTEST_XDIST_WORKER']}-")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], True)

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from topic_lm_hf.data import MALLET_STOPWORDS

# The benchmark harness (scripts/benchmarking.py, scripts/benchmark_training.py) is not part of the package: the
# scripts import it as plain modules from their own folder, and the tests from there too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

# The full corpora (README: Corpora): $TOPIC_LM_DATA, else, in this project's development setup, the folder beside the
# checkout (TOPIC_LM_DATA set to an empty folder turns that off: the suite as a fresh clone runs it).
DATA = Path(os.environ.get("TOPIC_LM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
if DATA.is_dir():  # the package (and the commands the tests run) find the corpora where the tests do
    os.environ.setdefault("TOPIC_LM_DATA", str(DATA))
MALLET = MALLET_STOPWORDS  # the package's copy of MALLET's stop list, the papers' (and build_vocabularies' default)


def requires_data(*parts: str):
    """Skip unless $TOPIC_LM_DATA/<parts> exists: the full corpora are not part of the repository."""
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
def wiki():
    """A small real setup from the corpus that ships with the package (``wikipedia-sample``): 300 training
    documents, 40 validation documents and their vocabularies (min_freq=3, MALLET stop list)."""
    from topic_lm_hf import build_vocabularies, load_documents

    train = load_documents("wikipedia-sample", max_documents=300)
    valid = load_documents("wikipedia-sample/validation", max_documents=40)
    tok, topic_tok = build_vocabularies(train, min_freq=3, stopwords="mallet")
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


def variants(topic_only: bool = False, representative: bool = False, reads_documents: Optional[bool] = None,
             **instead: str) -> list[str]:
    """The names of the registered families' variants (``topic_lm_hf.families``), in the registry's order: what
    "test every family" runs, so that a family added to the registry is tested without editing a list.

    ``representative``: one variant per family, where a test keeps a small budget: the family's representative
    (``Family.representative``, its first variant: the paper's full model), unless ``instead`` names another for
    its model_type (``nclm="nclm-leta"``). ``topic_only``: only the families with topics. ``reads_documents``:
    only the families whose causal LM reads whole documents (``True``: rGBN-RNN) or only those that read sentence
    chunks (``False``: the families a state is carried for from chunk to chunk, whose sentence and sequence batches
    the tests build)."""
    from topic_lm_hf.families import FAMILIES

    unknown = set(instead) - set(FAMILIES)
    assert not unknown, f"instead names no registered family: {sorted(unknown)}"
    names = []
    for family in FAMILIES.values():
        if (topic_only and not family.is_topic_model) or \
                reads_documents not in (None, bool(family.causal_lm_class.reads_documents)):
            continue
        if representative:
            names.append(instead.get(family.model_type, family.representative))
        else:
            names.extend(family.variants)
    return names


def tiny_model(family: str, tok, topic_tok, **overrides):
    """A small model of variant ``family`` (a name of :func:`variants`) sized to the two tokenizers, the way
    ``topic-lm train`` builds one (``commands.build_model``): its family's ``tiny_sizes``, the variant's configuration
    values, then ``overrides``. A configuration with per-layer sizes (rGBN-RNN's lists or tuples), which
    ``--config_overrides`` cannot give, is built with ``from_tokenizers`` instead."""
    import json

    from topic_lm_hf.arguments import ModelArguments
    from topic_lm_hf.commands import build_model
    from topic_lm_hf.families import variant_of

    record, values = variant_of(family)
    kwargs = {**record.tiny_sizes, **values, **overrides}
    torch.manual_seed(0)
    if any(isinstance(v, (list, tuple)) for v in kwargs.values()):
        return record.causal_lm_class(record.config_class.from_tokenizers(tok, topic_tok, **kwargs))
    # --config_overrides syntax (PretrainedConfig.update_from_string): strings unquoted, booleans true/false
    overrides_text = ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in kwargs.items())
    # the paper's model plus the given overrides (not the command line's default steering recipe)
    return build_model(ModelArguments(model_type=record.model_type, config_overrides=overrides_text, recipe="paper"),
                       tok, topic_tok)


# A two-document toy corpus for tests of the generation and output-layer math (no data needed).
TINY_CORPUS = [[["the", "court", "ruled", "on", "the", "tax", "case"], ["police", "said", "the", "fire", "spread"]],
               [["the", "team", "won", "the", "game"], ["fans", "cheered", "the", "players"]]]


@pytest.fixture(scope="module")
def tiny_vocabularies():
    """LM and topic tokenizers of TINY_CORPUS ("the" is the stop word)."""
    from topic_lm_hf import build_vocabularies, documents_from_lists

    return build_vocabularies(documents_from_lists(TINY_CORPUS * 3), min_freq=1, stopwords=["the"], top_fraction=0.0)


def topic_family_model(family: str, tok, topic_tok, **overrides):
    """A small model of variant ``family`` in evaluation mode (:func:`tiny_model`)."""
    return tiny_model(family, tok, topic_tok, **overrides).eval()


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
                          timeout=180)


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
