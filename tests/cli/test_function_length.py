"""No function in ``entrain/cli`` is longer than about 60 lines (the CLI stays a thin layer;
long functions go to the component that owns the logic), and none in ``entrain`` longer than 80
(long functions become named steps), and no module longer than 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "entrain"
CLI = PACKAGE / "cli"
MAX_LINES = 60
MAX_LINES_ALL = 80


def long_functions(root: Path, limit: int) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = node.end_lineno - first + 1
                if length > limit:
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_cli_functions_are_short():
    assert long_functions(CLI, MAX_LINES) == []


def test_every_function_is_short():
    assert long_functions(PACKAGE, MAX_LINES_ALL) == []


@pytest.mark.parametrize("limit", [MAX_LINES, MAX_LINES_ALL])
def test_the_check_sees_a_long_function(tmp_path, limit):
    body = "\n".join(f"    x{i} = {i}" for i in range(limit))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path, limit) == [f"{tmp_path.name}/m.py:5 long ({limit + 1} lines)"]


MAX_MODULE_LINES = 600
"""No module in ``entrain`` is longer: a longer one holds more than one concern and is split by them."""


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    return [
        f"{path.relative_to(root.parent)} ({n} lines)"
        for path in sorted(root.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > limit
    ]


def test_every_module_is_short():
    assert long_modules(PACKAGE) == []


def test_the_check_sees_a_long_module(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(tmp_path) == [f"{tmp_path.name}/long.py ({MAX_MODULE_LINES + 1} lines)"]
