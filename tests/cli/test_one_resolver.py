"""One cost-model resolver (``entrain.core.costs.presets.resolve_cost_model``) and one
adapter from flags to it (``entrain.config.ModelConfig.cost_model``): no other code in ``entrain/`` hands
the resolver a ``--profile`` / ``--attention`` / ``--freeze`` of its own, and the data commands' helper
(``entrain.cli.common.resolve_cost_model``) goes through the adapter."""

from __future__ import annotations

import argparse
import ast
import pathlib

ENTRAIN = pathlib.Path(__file__).resolve().parents[2] / "entrain"
FLAG_KEYWORDS = {"profile", "attention", "freeze"}
NOT_FROM_FLAGS = {
    "entrain/data/calibration/__init__:_cost": "prices a calibration bound's preset (model, hardware and "
    "attention read from the bounds file, never a command's flags)",
}
"""Direct callers of the resolver that do not turn flags into a cost model, and why."""


def adapters(root: pathlib.Path = ENTRAIN) -> list[str]:
    """``module:function`` of every function calling a ``resolve_cost_model`` with a flag's keyword."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if "resolve_cost_model" not in text:
            continue
        tree = ast.parse(text)
        names = {"resolve_cost_model"} | {  # and what the resolver is imported as
            a.asname
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "entrain.core.costs.presets"
            for a in n.names
            if a.name == "resolve_cost_model" and a.asname
        }
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
            named = [c for c in calls if getattr(c.func, "id", getattr(c.func, "attr", None)) in names]
            if any(FLAG_KEYWORDS & {k.arg for k in c.keywords} for c in named):
                found.append(f"{path.relative_to(root.parent).with_suffix('')}:{fn.name}")
    return found


def test_one_adapter_hands_the_flags_to_the_one_resolver():
    assert [a for a in adapters() if a not in NOT_FROM_FLAGS] == ["entrain/config:cost_model"]


def test_a_second_adapter_is_caught(tmp_path):
    (tmp_path / "cli.py").write_text(
        "from entrain.core.costs.presets import resolve_cost_model as resolve\n\n"
        "def cost_of(args):\n    return resolve(args.model, profile=args.profile)\n"
    )
    assert adapters(tmp_path) == [f"{tmp_path.name}/cli:cost_of"]


def test_the_data_commands_cost_model_is_the_run_configs():
    from entrain.cli.common import hardware_label, resolve_cost_model
    from entrain.cli.main import build_parser
    from entrain.config import RunConfig

    for argv in (
        ["data", "stats", "--model", "tiny"],
        ["simulate", "--model", "tiny", "--hardware", "a40-fig4"],
    ):
        args = build_parser().parse_args(argv)
        model = RunConfig.from_args(args).model if argv[0] == "simulate" else None
        if model is not None:
            assert resolve_cost_model(args) == model.cost_model()
            assert hardware_label(args) == model.hardware_label() == "a40-fig4"
        else:
            assert hardware_label(args) == "cpu-tiny" and resolve_cost_model(args).model == "tiny"
    assert isinstance(args, argparse.Namespace)
