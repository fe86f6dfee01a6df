"""Fixed-seed parity: every family trained and evaluated through the public API gives the figures recorded in
``tests/parity_reference.json`` (perplexity under every protocol and the ablation, steering figures, generated
tokens). A refactor must not change a result; a change meant to change one regenerates the reference
(``python tests/parity.py --write``) in the same commit and says why."""

import json
import math

import pytest

from conftest import DATA, requires_data
from parity import FAMILIES, REFERENCE, all_figures

pytestmark = requires_data("apnews", "train.txt")


@pytest.fixture(scope="module")
def found():
    return all_figures(DATA)


def assert_same(got, want, where):
    if isinstance(want, dict):
        assert set(got) == set(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6), f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got} != {want}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_figures_equal_the_recorded_reference(found, family):
    reference = json.loads(REFERENCE.read_text())
    assert_same(found[family], reference[family], family)
