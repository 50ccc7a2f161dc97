"""The systems registry (``entrain.core.systems.SYSTEMS``) is the only list of systems:
no system's name is typed as a string outside the registry, the system's own schedule module and the
tests (plus the allow-list below, each entry with its reason); every schema enum of system names is
the registry's list; the lists code used to keep by hand are derived from ``SystemSpec`` fields."""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from entrain.core.systems import SYSTEMS, default_systems, systems_where

PACKAGE = Path(__file__).resolve().parents[2] / "entrain"
REGISTRY = "core/systems.py"

ALLOWED_FILES: dict[str, str] = {}
"""Files that may type any system's name (none: paper Table 1 is keyed by the registry's constants)."""
ALLOWED = {
    # (file, string) -> how many times; "entrain" is also the package's and the command's name.
    ("cli/main.py", "entrain"): 1,  # argparse prog: the command's name
    ("cli/launch.py", "entrain"): 1,  # `python -m entrain train` for the launched workers: the package
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of the module, its classes and functions (and attribute
    docstrings: a bare string statement)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                out.add(id(stmt.value))
    return out


def _names_typed(path: Path) -> Counter:
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    return Counter(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in SYSTEMS
        and id(node) not in docs
    )


def _own_module(name: str) -> str:
    generator = SYSTEMS[name].generator
    module = sys.modules[getattr(generator, "func", generator).__module__]  # a functools.partial's own
    return Path(module.__file__).resolve().relative_to(PACKAGE).as_posix()


def stray_names(package: Path = PACKAGE) -> list[str]:
    """``file: 'name' xN`` for each system name typed where it may not be."""
    stray = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel == REGISTRY or rel in ALLOWED_FILES:
            continue
        for name, count in sorted(_names_typed(path).items()):
            if rel == _own_module(name) or count <= ALLOWED.get((rel, name), 0):
                continue
            stray.append(f"{rel}: {name!r} x{count}")
    return stray


def test_no_system_name_typed_outside_the_registry():
    stray = stray_names()
    assert not stray, (
        "system names typed outside core/systems.py (use SYSTEMS or its constants): " + "; ".join(stray)
    )


def test_allow_list_is_still_needed():
    """An allow-list entry that no longer matches anything must go (the list stays minimal)."""
    for (rel, name), count in ALLOWED.items():
        assert _names_typed(PACKAGE / rel)[name] == count, (rel, name)
    for rel in ALLOWED_FILES:
        assert _names_typed(PACKAGE / rel), rel


def test_scan_sees_code_not_docstrings(tmp_path):
    (tmp_path / "a.py").write_text('"""disttrain in a docstring"""\nX = "disttrain"\nY = f"{X} dip"\n')
    assert stray_names(tmp_path) == ["a.py: 'disttrain' x1"]


def _enums(node):
    if isinstance(node, dict):
        if isinstance(node.get("enum"), list):
            yield node["enum"]
        for v in node.values():
            yield from _enums(v)
    elif isinstance(node, list):
        for v in node:
            yield from _enums(v)


@pytest.mark.parametrize("schema", sorted(p.name for p in (PACKAGE / "schemas").glob("*.json")))
def test_schema_enums_of_systems_are_the_registry(schema):
    doc = json.loads((PACKAGE / "schemas" / schema).read_text())
    for enum in _enums(doc):
        if set(enum) & set(SYSTEMS):
            assert enum == list(SYSTEMS), f"{schema}: enum {enum} is not the registry's {list(SYSTEMS)}"


def test_derived_lists():
    """The lists that were typed by hand, now derived from ``SystemSpec`` fields (same values)."""
    from entrain.cli.assign import DEFAULT_SYSTEMS as ASSIGN_DEFAULT
    from entrain.cli.simulate import DEFAULT_SYSTEMS as SIMULATE_DEFAULT
    from entrain.sim.adaptive import REPLAN_SYSTEMS
    from entrain.sim.memory_fit import MEMORY_FITTED, SPLIT_STAGES

    assert (
        SIMULATE_DEFAULT
        == default_systems("simulate")
        == "entrain,entrain-1f1b,1f1b,disttrain,dip,dip-greedy"
    )
    assert ASSIGN_DEFAULT == default_systems("assign") == "entrain,1f1b,disttrain,dip"
    assert MEMORY_FITTED == (
        "entrain", "entrain-1f1b", "1f1b", "disttrain", "disttrain-paper", "encoder-rebalance", "dflop"
    )  # fmt: skip
    assert SPLIT_STAGES == REPLAN_SYSTEMS == systems_where("ours") == ("entrain", "entrain-1f1b")


def test_systems_sharing_a_generator_plan_as_it_does():
    """``disttrain`` and ``disttrain-paper`` differ from ``1f1b`` only upstream (batcher,
    configuration): the same assignment gives the same actions; ``entrain-1f1b`` is Entrain's
    generator without the eager forward."""
    from entrain.core.systems import generate_plan
    from tests.sim.fixtures import deferral_assignment, disjoint_layout, one_iteration, raw_samples, toy_cost

    samples = raw_samples({s: (2.0, 3.0) for s in "abcdef"})
    groups = [["a", "b"], ["c"], ["d", "e"], ["f"]]

    def plan(system: str, deferred: dict):
        its = one_iteration(deferral_assignment(groups, deferred))
        return generate_plan(system, disjoint_layout(2, 2, k=4), its, samples, toy_cost())

    plain = plan("1f1b", {})
    for system in ("disttrain", "disttrain-paper"):
        got = plan(system, {})
        assert got.system == system and got.iterations == plain.iterations
    eager, lazy = plan("entrain", {"b": (0, 1)}), plan("entrain-1f1b", {"b": (0, 1)})
    assert "eager_budget_factor" in eager.options and "eager_budget_factor" not in lazy.options
