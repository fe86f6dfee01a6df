"""The declared dependencies are the ones the package imports (plus what transformers' Trainer needs)."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
# Declared for what they do although the package never imports them itself.
USED_THROUGH = {"accelerate": "transformers.Trainer requires it for training"}


def _imported_top_level_modules() -> set[str]:
    names = set()
    for path in (ROOT / "src" / "topic_lm_hf").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "topic_lm_hf"}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[; ]", spec, 1)[0].lower().replace("_", "-") for spec in project["dependencies"]}


def test_every_declared_dependency_is_imported_or_needed_by_transformers():
    distributions = importlib.metadata.packages_distributions()
    imported = {dist.lower().replace("_", "-") for module in _imported_top_level_modules()
                for dist in distributions.get(module, [module])}
    unused = _declared() - imported - set(USED_THROUGH)
    assert unused == set(), f"declared in pyproject.toml but never used: {sorted(unused)}"


def test_every_imported_third_party_module_is_declared():
    distributions = importlib.metadata.packages_distributions()
    undeclared = {module for module in _imported_top_level_modules()
                  if not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & _declared()}
    assert undeclared == set(), f"imported but not declared in pyproject.toml: {sorted(undeclared)}"


def test_the_package_needs_no_checkout():
    """An installed wheel has no checkout around it: the benchmark harness lives in scripts/ (outside the wheel), and
    no module of the package imports it, runs git or names the checkout's folder."""
    harness = {"benchmarking", "benchmark_training"}
    for path in (ROOT / "src" / "topic_lm_hf").rglob("*.py"):
        assert path.stem not in harness, path
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            assert not [m for m in modules if m.split(".")[-1] in harness], f"{path} imports the benchmark harness"
        assert '"git"' not in text and "ROOT" not in text, f"{path} needs a checkout"
        assert not re.search(r"Path\(__file__\)[^\n]*\.parents\[", text), f"{path} looks for a checkout folder"


# ----------------------------------------------------------------------------------------------
# package data: what a fresh clone or an installed wheel has, with nothing beside it
# ----------------------------------------------------------------------------------------------

RESOURCES = ROOT / "src" / "topic_lm_hf" / "resources"


def _package_data_files() -> list[str]:
    """The files of ``resources/``, relative to the package folder (as setuptools' package-data globs see them)."""
    return sorted(str(p.relative_to(RESOURCES.parent)) for p in RESOURCES.rglob("*") if p.is_file())


def test_every_package_data_file_is_declared_in_pyproject():
    import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["topic_lm_hf"]
    files = _package_data_files()
    assert {"resources/mallet_en.txt", "resources/NOTICE.md", "resources/wikipedia_sample/train.txt.gz",
            "resources/wikipedia_sample/validation.txt.gz", "resources/wikipedia_sample/npmi_reference.txt.gz",
            "resources/wikipedia_sample/ATTRIBUTION.md"} <= set(files)
    undeclared = [f for f in files if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert undeclared == [], f"in resources/ but not in [tool.setuptools.package-data]: {undeclared}"


def test_the_embedded_corpus_is_small_and_its_files_are_those_the_package_reads():
    from topic_lm_hf.data import EMBEDDED_CORPORA, MALLET_STOPWORDS

    sample = RESOURCES / "wikipedia_sample"
    assert sum(p.stat().st_size for p in sample.glob("*.gz")) <= 3_000_000  # compressed, all splits together
    assert {p.resolve() for p in EMBEDDED_CORPORA.values()} == {p.resolve() for p in sample.glob("*.txt.gz")}
    assert MALLET_STOPWORDS.resolve() == (RESOURCES / "mallet_en.txt").resolve()


def test_no_development_setup_path_in_the_package():
    """Help texts, docstrings and defaults name $TOPIC_LM_DATA or the package's own data, never the development
    setup's folder beside the checkout."""
    for path in (ROOT / "src" / "topic_lm_hf").rglob("*.py"):
        assert "shared/data" not in path.read_text(), path


@pytest.mark.slow
def test_a_built_wheel_holds_the_stop_list_and_the_corpus(tmp_path):
    """`pip wheel .` (here without build isolation or dependencies: offline) packs every file of resources/."""
    import shutil
    import subprocess
    import zipfile

    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    source = tmp_path / "src-copy"  # a copy, so that the build leaves nothing in the checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "out", "build", "*.egg-info",
                                                                "__pycache__", "results", "tests"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("topic_lm_hf-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in _package_data_files() if f"topic_lm_hf/{f}" not in names]
    assert missing == [], f"not in {wheel.name}: {missing}"


# ----------------------------------------------------------------------------------------------
# remote code: the files an exported folder holds beside the weights, read without the checkout
# ----------------------------------------------------------------------------------------------

MODELS = ROOT / "src" / "topic_lm_hf" / "models"
# What a shipped file may not point to: the checkout's notes, scripts, tests, results and README sections.
CHECKOUT_REFERENCE = re.compile(r"docs/|hf-notes|scripts/|tests/|results/|hub_configs|modeling_cards|README"
                                r"|[\w./-]+\.md\b|topic_lm_hf\.models\.(?:modeling|configuration)_")


def _remote_code_files() -> list[Path]:
    """The code files ``save_pretrained`` copies beside the weights, for every family: each configuration and
    modeling file with the files it imports (as transformers' ``custom_object_save`` collects them)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    shipped = set()
    for path in MODELS.glob("*.py"):
        if path.name.startswith(("configuration_", "modeling_")):
            shipped |= {path.name} | {Path(f).name for f in get_relative_import_files(str(path))}
    return sorted(MODELS / name for name in shipped)


def _public_names(module_name: str) -> list[str]:
    import importlib

    return list(getattr(importlib.import_module(module_name), "__all__", []))


def test_the_remote_code_names_nothing_an_exported_folder_lacks():
    """A shipped file refers to no note, script, test or README of the checkout, to sibling files by their own
    names (which ship too), and to the package only by a public name (``topic_lm_hf...`` listed in ``__all__``)."""
    import importlib

    files = _remote_code_files()
    assert {p.name for p in files} == {p.name for p in MODELS.glob("*.py")} - {"__init__.py"}
    for path in files:
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            assert not CHECKOUT_REFERENCE.search(line), f"{path.name}:{number} points outside an exported folder: {line}"
        for name in re.findall(r"(?<![\w.])(?:~?\.)?((?:modeling|configuration)_\w+)", text):
            assert (MODELS / f"{name}.py").is_file(), f"{path.name} names {name}, which is not a file that ships"
        for reference in set(re.findall(r"topic_lm_hf(?:\.\w+)+", text)):
            parts = reference.split(".")
            try:
                importlib.import_module(reference)
                module, attribute = reference, None
            except ModuleNotFoundError:
                module, attribute = ".".join(parts[:-1]), parts[-1]
            public = _public_names(module)
            assert public and (attribute is None or attribute in public), \
                f"{path.name} refers to {reference}, which is not a public name of the package"


def test_no_installed_module_names_the_checkouts_design_notes():
    """The wheel installs every module of the package, where the project's design notes do not exist: a module
    says what it needs inline or cites the paper or public code."""
    package = MODELS.parent
    for path in package.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.search(r"docs/|hf-notes|shared/", line), f"{path.relative_to(package)}:{number}: {line}"


def test_every_remote_code_file_declares_its_public_names():
    """Each configuration and modeling file has an ``__all__`` of names it defines, and lists every name that
    another module of the package imports from it."""
    import ast
    import importlib

    declared = {}
    for path in sorted(MODELS.glob("*.py")):
        if path.name.startswith(("configuration_", "modeling_")):
            module = importlib.import_module(f"topic_lm_hf.models.{path.stem}")
            assert hasattr(module, "__all__"), f"{path.name} has no __all__"
            undefined = [n for n in module.__all__ if not hasattr(module, n)]
            assert undefined == [], f"{path.name}: __all__ lists {undefined}, which it does not define"
            declared[path.stem] = set(module.__all__)
    for path in (ROOT / "src" / "topic_lm_hf").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] in declared:
                source = node.module.split(".")[-1]
                unlisted = [a.name for a in node.names if a.name not in declared[source]]
                assert unlisted == [], f"{path.relative_to(ROOT)} imports {unlisted} not in {source}.__all__"


def test_no_private_name_is_imported_across_modules():
    """A name with a leading underscore stays in its module: what another module imports is public."""
    import ast

    for path in (ROOT / "src" / "topic_lm_hf").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("topic_lm_hf")):
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert private == [], f"{path.relative_to(ROOT)}:{node.lineno} imports private {private}"
