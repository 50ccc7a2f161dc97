"""The benchmark scripts stand on the package and on each other's public names only: no script imports
``tests``, none imports another script's private name, and no scripts import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def script_imports(root: Path = BENCHMARKS) -> dict[str, list[tuple[str, list[str]]]]:
    """Per script (module name), every (imported module, names) of its ``import`` statements,
    those inside functions included."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(root.glob("*.py")):
        found = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(a.name, []) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((node.module, [a.name for a in node.names]))
        out[path.stem] = found
    return out


def problems(imports: dict[str, list[tuple[str, list[str]]]]) -> list[str]:
    scripts = set(imports)
    bad = []
    for me, found in imports.items():
        for module, names in found:
            top = module.partition(".")[0]
            if top == "tests":
                bad.append(f"{me} imports {module}")
            if top in scripts and top != me:
                bad += [
                    f"{me} imports {top}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
                ]
    return sorted(bad)


def circles(imports: dict[str, list[tuple[str, list[str]]]]) -> list[list[str]]:
    names = sorted(imports)
    index = {n: i for i, n in enumerate(names)}
    edges = {
        (index[me], index[m.partition(".")[0]])
        for me, found in imports.items()
        for m, _ in found
        if m.partition(".")[0] in index and m.partition(".")[0] != me
    }
    rows, cols = [a for a, _ in edges], [b for _, b in edges]
    graph = coo_matrix(([1] * len(edges), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(graph, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for name, label in zip(names, labels):
        groups.setdefault(int(label), []).append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def test_no_script_imports_tests_or_another_scripts_private_name():
    assert problems(script_imports()) == []


def test_no_scripts_import_each_other_in_a_circle():
    assert circles(script_imports()) == []


def test_the_checks_see_a_planted_import(tmp_path):
    (tmp_path / "a.py").write_text("from b import _helper, public\nfrom tests.runtime import harness\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    found = script_imports(tmp_path)
    assert problems(found) == ["a imports b._helper", "a imports tests.runtime"]
    assert circles(found) == [["a", "b"]]
