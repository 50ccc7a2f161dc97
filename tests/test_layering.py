"""The package's layers point one way (docs/architecture.md) and no module imports itself back in a circle.

Every ``import`` statement counts, including those inside functions: a deferred import is still a
dependency. ``core`` imports no other ``entrain`` package and no torch; ``config`` (the run
configuration) only ``core`` and the torch-free family registry; ``sim`` only ``core``; ``data`` and ``models`` sit above ``core``: a model
family may use ``data``'s readers and tokenizers for its processing rules, ``data`` never imports
``models``, and neither imports ``config``, ``sim``, ``runtime`` or ``cli``; ``runtime`` never ``cli`` or ``sim``.
``core`` and ``sim`` use only the standard library, numpy and scipy: no torch, and none of the
heavy readers (PIL, safetensors, pyarrow, transformers ...) that ``data`` and ``models`` own."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "entrain"

FORBIDDEN = {
    "core": ("entrain.", "torch", "transformers"),
    "config": ("entrain.", "torch", "transformers"),
    "sim": ("entrain.", "torch", "transformers"),
    "data": ("entrain.sim", "entrain.runtime", "entrain.cli", "entrain.models", "entrain.config"),
    "models": ("entrain.sim", "entrain.runtime", "entrain.cli", "entrain.config"),
    "runtime": ("entrain.cli", "entrain.sim"),
}
FAMILY_REGISTRY = ("entrain.models.families.base", "entrain.models.families.registry")
"""The torch-free model-family seam the run configuration asks for a model's shape and image rule."""
ALLOWED = {
    "core": ("entrain.core",),
    "config": ("entrain.core", *FAMILY_REGISTRY),
    "sim": ("entrain.core", "entrain.sim"),
}
"""Within a forbidden prefix, what a layer may still import."""


LIGHT_LIBRARIES = frozenset({"numpy", "scipy"})
"""The only libraries outside the standard library that ``core`` and ``sim`` may import."""
DEFERRED_DRAWING = ("entrain.sim.plots", "matplotlib")
"""The one exception: ``sim.plots`` imports matplotlib inside its functions, only when a figure is drawn."""


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_names(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """Every module ``path`` imports (``from a import b``: ``a.b`` when that is a module, else ``a``)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in known else base)
    return out


Graph = set[tuple[str, str]]
"""Import edges (importer, imported)."""


def import_graph() -> Graph:
    known = modules()
    return {(name, target) for name, path in known.items() for target in imported_names(path, known)}


def layer_violations(graph: Graph) -> list[str]:
    bad = []
    for src, dst in graph:
        layer = src.split(".")[1] if src.count(".") >= 1 else ""  # entrain.config: "config"
        forbidden = FORBIDDEN.get(layer, ())
        allowed = ALLOWED.get(layer, ())
        if any(dst == f or dst.startswith(f) or dst.startswith(f + ".") for f in forbidden) and not any(
            dst == a or dst.startswith(a + ".") for a in allowed
        ):
            bad.append(f"{src} imports {dst}")
    return sorted(bad)


def heavy_imports(graph: Graph) -> list[str]:
    """``core`` / ``sim`` edges to a library that is neither standard nor in ``LIGHT_LIBRARIES``."""
    bad = []
    for src, dst in graph:
        top = dst.partition(".")[0]
        if (src, top) == DEFERRED_DRAWING:
            continue
        if src.split(".")[1:2] in (["core"], ["sim"]) and top != "entrain":
            if top not in sys.stdlib_module_names and top not in LIGHT_LIBRARIES:
                bad.append(f"{src} imports {dst}")
    return sorted(bad)


def private_imports(root: pathlib.Path = PACKAGE) -> list[str]:
    """``from entrain.x import _name``: a module's private name used by another module (make it public,
    or keep the use inside the module)."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and ((node.module or "").startswith("entrain") or node.level):
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                bad += [
                    f"{path.relative_to(root.parent)}:{node.lineno} imports {node.module}.{n}" for n in names
                ]
    return bad


def internal_cycles(graph: Graph) -> list[list[str]]:
    """The package's strongly connected components of more than one module."""
    edges = [(a, b) for a, b in graph if a.startswith("entrain") and b.startswith("entrain")]
    names = sorted({n for e in edges for n in e})
    index = {n: i for i, n in enumerate(names)}
    rows, cols = [index[a] for a, _ in edges], [index[b] for _, b in edges]
    adjacency = coo_matrix(([1] * len(edges), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(adjacency, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for name, label in zip(names, labels):
        groups.setdefault(int(label), []).append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def test_layers_point_one_way():
    assert layer_violations(import_graph()) == []


def test_core_and_sim_import_no_heavy_library():
    assert heavy_imports(import_graph()) == []


@pytest.mark.parametrize("lib", ["PIL.Image", "safetensors.torch", "pyarrow.parquet", "matplotlib.pyplot"])
def test_a_heavy_library_in_core_or_sim_is_caught(lib):
    graph = import_graph() | {("entrain.core.ir.plan", lib), ("entrain.sim.run", lib)}
    assert heavy_imports(graph) == [f"entrain.core.ir.plan imports {lib}", f"entrain.sim.run imports {lib}"]


def test_no_private_name_is_imported_across_modules():
    assert private_imports() == []


def test_a_private_import_is_caught(tmp_path):
    pkg = tmp_path / "entrain"
    pkg.mkdir()
    (pkg / "a.py").write_text("from entrain.b import _helper, public\nfrom .b import __version__\n")
    assert private_imports(pkg) == ["entrain/a.py:1 imports entrain.b._helper"]


def test_no_import_cycles():
    assert internal_cycles(import_graph()) == []


@pytest.mark.parametrize(
    ("edge", "expect"),
    [
        (("entrain.core.ir.plan", "entrain.data.generators"), "layer"),
        (("entrain.sim.run", "entrain.data.workload_io"), "layer"),
        (("entrain.core.ir.plan", "torch"), "layer"),
        (("entrain.config", "entrain.data.sampling"), "layer"),
        (("entrain.runtime.session", "entrain.cli.common"), "layer"),
        (("entrain.data.check", "entrain.runtime.data"), "layer"),
        (("entrain.data.check", "entrain.models.families.registry"), "layer"),
        (("entrain.data.sampling", "entrain.config"), "layer"),
        (("entrain.models.families.base", "entrain.config"), "layer"),
        (("entrain.models.families.base", "entrain.runtime.data"), "layer"),
        (("entrain.models.families.base", "entrain.sim.run"), "layer"),
        (("entrain.core.ir.plan", "entrain.core.planning.entry"), "cycle"),
    ],
)
def test_a_planted_violation_is_caught(edge, expect):
    graph = import_graph()
    if expect == "cycle":
        graph |= {edge, edge[::-1]}
        assert internal_cycles(graph)
    else:
        graph.add(edge)
        assert f"{edge[0]} imports {edge[1]}" in layer_violations(graph)


CORE_FLOORS = ("workload", "model", "ir", "costs", "assignment", "schedules", "systems", "planning")
"""``core``'s subpackages from the lowest floor up (``entrain/core/__init__.py``): a module imports
only from its own floor or a lower one. The helpers (``errors``, ``files``, ``workers``,
``safetensors_header``) sit below every floor."""
CORE_HELPERS = ("errors", "files", "workers", "safetensors_header")


def core_floor(module: str) -> int | None:
    """The floor of an ``entrain.core`` module (-1 for a helper), None outside ``core`` or for ``core`` itself."""
    parts = module.split(".")
    if parts[:2] != ["entrain", "core"] or len(parts) < 3:
        return None
    if parts[2] in CORE_HELPERS:
        return -1
    return CORE_FLOORS.index(parts[2])


def core_arrows_up(graph: Graph) -> list[str]:
    bad = []
    for src, dst in graph:
        src_floor, dst_floor = core_floor(src), core_floor(dst)
        if src_floor is not None and dst_floor is not None and dst_floor > src_floor:
            bad.append(f"{src} ({CORE_FLOORS[src_floor] if src_floor >= 0 else 'helper'}) imports {dst}")
    return sorted(bad)


def test_every_core_module_is_on_a_floor():
    names = [m for m in modules() if m.startswith("entrain.core.")]
    assert [m for m in names if m.split(".")[2] not in CORE_FLOORS + CORE_HELPERS] == []


def test_core_imports_point_down_its_floors():
    assert core_arrows_up(import_graph()) == []


@pytest.mark.parametrize(
    "edge",
    [
        ("entrain.core.schedules.action_costs", "entrain.core.planning.entry"),
        ("entrain.core.ir.plan", "entrain.core.costs.costmodel"),
        ("entrain.core.errors", "entrain.core.workload.samples"),
    ],
)
def test_a_planted_arrow_up_in_core_is_caught(edge):
    assert core_arrows_up(import_graph() | {edge}) != []
