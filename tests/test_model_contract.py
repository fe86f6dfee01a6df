"""The contract of every model family and variant (tests/model_tester.py holds the family table and the checks):
save / load round trip, tied embeddings, padding, state equivalence, cached = uncached generation, remote code.
A family's own test file keeps only what is its own: reference parity, its maths, its options."""

import pytest

from model_tester import CONDITIONS, FAMILIES, MODES, ModelTester, load_contract_data, run_remote_code

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def contract(request):
    """The data and one tester (with its model) per family, built once for the module."""
    data = load_contract_data(request)
    testers = {}

    def tester(name):
        if name not in testers:
            testers[name] = ModelTester(name, data)
        return testers[name]

    return tester


@pytest.fixture(scope="module", params=list(FAMILIES))
def tester(request, contract):
    return contract(request.param)


def test_save_and_auto_load_round_trip(tester, tmp_path):
    tester.check_save_load_round_trip(tmp_path)


def test_tied_embeddings_store_one_matrix(tester, tmp_path):
    tester.check_tied_embeddings(tmp_path)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_unpadded_rows(tester, side):
    tester.check_padded_rows_equal_unpadded_rows(side)


@pytest.mark.parametrize("side", ["left", "right"])
def test_state_equivalence(tester, side):
    tester.check_state_equivalence(side)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("condition", CONDITIONS)
def test_cached_generation_equals_uncached(tester, condition, mode):
    tester.check_generation(condition, mode)


@pytest.fixture(scope="module")
def remote_code(contract, tmp_path_factory):
    """Every family saved for the Hub and loaded in one process where the package cannot be imported."""
    return run_remote_code({name: contract(name) for name in FAMILIES}, tmp_path_factory.mktemp("remote"))


def test_saved_folder_loads_with_remote_code_without_the_package(tester, remote_code):
    results, expected = remote_code
    tester.check_remote_code(results[tester.name], expected[tester.name])
