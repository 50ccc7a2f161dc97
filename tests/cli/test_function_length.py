"""No function in ``entrain/cli`` is longer than about 60 lines (issue 11: the CLI stays a thin layer;
long functions go to the component that owns the logic)."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "entrain" / "cli"
MAX_LINES = 60


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


def test_the_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path, MAX_LINES) == [f"{tmp_path.name}/m.py:5 long ({MAX_LINES + 1} lines)"]
