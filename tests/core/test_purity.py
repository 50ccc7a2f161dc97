"""entrain.core and entrain.sim never import torch/transformers, and core never imports the torch
side of the package."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_core_and_sim_import_with_torch_blocked():
    code = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['transformers'] = None\n"
        "import entrain.core, entrain.sim\n"
        "for pkg in (entrain.core, entrain.sim):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_core_imports_nothing_above_it():
    forbidden = ("entrain.runtime", "entrain.models", "entrain.cli", "entrain.sim", "torch", "transformers")
    for path in (ROOT / "entrain" / "core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{path.relative_to(ROOT)} imports {name}"
