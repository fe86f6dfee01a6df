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
