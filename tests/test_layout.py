"""The package layout the architecture promises: the analysis core imports nothing above it,
and the old flat import paths re-export the very same objects."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

import renyi

ANALYSIS = pathlib.Path(renyi.__file__).parent / "analysis"
MOVED = [
    "divergence",
    "closed_forms",
    "curves",
    "conversions",
    "composition",
    "subsampling",
    "mixtures",
    "allocation",
    "selection",
    "sampled_pld",
    "events",
    "pld",
]
# what the analysis core may import from renyi: itself and the base modules below it
ALLOWED = ("renyi.analysis", "renyi._validation", "renyi.errors", "renyi.random")


def _renyi_imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
    return [n for n in names if n == "renyi" or n.startswith("renyi.")]


@pytest.mark.parametrize(
    "path", sorted(ANALYSIS.rglob("*.py")), ids=lambda p: str(p.relative_to(ANALYSIS))
)
def test_analysis_core_imports_nothing_above_it(path: pathlib.Path) -> None:
    bad = [m for m in _renyi_imports(path) if not m.startswith(ALLOWED)]
    assert bad == [], f"{path.name} imports {bad} (the analysis core is the lowest layer)"


@pytest.mark.parametrize("name", MOVED)
def test_old_paths_re_export_the_same_objects(name: str) -> None:
    old = importlib.import_module(f"renyi.{name}")
    new = importlib.import_module(f"renyi.analysis.{name}")
    assert list(old.__all__) == list(new.__all__) and len(new.__all__) > 0
    for attr in new.__all__:
        assert getattr(old, attr) is getattr(new, attr), f"renyi.{name}.{attr}"


def test_analysis_core_imports_without_torch() -> None:
    code = (
        "import sys, renyi.analysis.events, renyi.analysis.pld, renyi.accountants;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
