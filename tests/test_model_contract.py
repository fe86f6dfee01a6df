"""The contract of every model family and variant (tests/model_tester.py holds the family table and the checks):
save / load round trip, tied embeddings, padding, state equivalence, cached = uncached generation, remote code.
A family's own test file keeps only what is its own: reference parity, its maths, its options."""

import pytest

import topic_lm_hf
from model_tester import FAMILIES, GENERATION, ModelTester, RemoteCodeRun, load_contract_data

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_table_holds_every_family_of_the_package():
    """A family added to the package (topic_lm_hf.FAMILIES, the family registry) must join the
    contract's table."""
    registered = {(f.config_class, f.base_model_class, f.causal_lm_class) for f in topic_lm_hf.FAMILIES.values()}
    assert {(f.config_class, f.base_class, f.lm_class) for f in FAMILIES.values()} == registered


def test_the_table_holds_every_variant_of_the_registry():
    """The table's keys are the registry's variants (``Family.variants``), each with its family's classes and the
    configuration values that make it: a variant added to a family cannot be left out of the contract."""
    from topic_lm_hf.families import variant_of

    assert sorted(FAMILIES) == sorted(v for f in topic_lm_hf.FAMILIES.values() for v in f.variants)
    for name, entry in FAMILIES.items():
        family, values = variant_of(name)
        assert (entry.config_class, entry.base_class, entry.lm_class) == (
            family.config_class, family.base_model_class, family.causal_lm_class), name
        assert {k: entry.config.get(k, getattr(family.config_class(), k)) for k in values} == values, name


def test_the_tests_tiny_sizes_cover_every_registered_family():
    """Every registered family has tiny sizes (``Family.tiny_sizes``), so that ``conftest.tiny_model`` builds every
    variant of ``conftest.variants()`` small."""
    assert [f.model_type for f in topic_lm_hf.FAMILIES.values() if not f.tiny_sizes] == []


@pytest.fixture(scope="module")
def contract(request, tmp_path_factory):
    """The data, one tester (with its model) per family, and the remote-code run of every family, started at
    once in the background (test_hub_repo_and_saved_folder_load_with_remote_code_without_the_package, last, collects it)."""
    data = load_contract_data(request)
    testers = {name: ModelTester(name, data) for name in FAMILIES}
    remote_selected = any(item.originalname == "test_hub_repo_and_saved_folder_load_with_remote_code_without_the_package"
                          for item in request.session.items)
    return testers, RemoteCodeRun(testers, tmp_path_factory.mktemp("remote")) if remote_selected else None


@pytest.fixture(scope="module", params=list(FAMILIES))
def tester(request, contract):
    return contract[0][request.param]


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


@pytest.mark.parametrize("condition, mode", GENERATION)
def test_cached_generation_equals_uncached(tester, condition, mode):
    tester.check_generation(condition, mode)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hub_repo_and_saved_folder_load_with_remote_code_without_the_package(contract, family):
    testers, remote = contract
    results, expected = remote.result()
    testers[family].check_remote_code(results[family], expected[family])
