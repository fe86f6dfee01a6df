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
