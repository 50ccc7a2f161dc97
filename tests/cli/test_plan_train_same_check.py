"""``entrain plan`` and ``entrain train`` without ``--plan`` make the same setup from the same flags:
the memory check's batches are one rule (``core.costs.memory.check_batches`` of the checked layout, at
``plan``'s default ``--iterations``), whatever ``train``'s ``--steps``, with one pipeline per encoder
tower too (the heaviest draws at a large microbatch count); a baseline's DP is its own in both
(DIP-like: not Entrain's). ``train``'s setups come from its front process stopped at the launch and the
planner callables its workers hand ``run_setups`` (``tests/train_front.py``): no rank starts."""

from __future__ import annotations

import json

from entrain.cli.main import main
from entrain.core.costs.memory import check_batches
from entrain.core.model.omni import QWEN25_OMNI_7B
from tests.train_front import train_spec, worker_setups


def test_train_checks_on_as_many_draws_as_plan_by_default():
    """``train`` without ``--plan`` checks memory on ``MEMORY_CHECK_ITERATIONS`` draws: ``plan``'s (and
    ``simulate``'s) default ``--iterations``, the flag's default being that constant."""
    from entrain.cli.main import build_parser
    from entrain.core.costs.memory import MEMORY_CHECK_ITERATIONS

    for command in ("plan", "simulate"):
        assert build_parser().parse_args([command]).iterations == MEMORY_CHECK_ITERATIONS


def _towers_config(num_microbatches: int):
    """A configuration with one pipeline per tower (vision, audio, LLM: one stage each), DP 1, U 1."""
    from entrain.core.planning.config_search import ComponentConfig
    from entrain.core.planning.encoders import MultiEncoderConfig

    def comp(name: str) -> ComponentConfig:
        return ComponentConfig(name, 1, 1, 1, ("layer",), ((0, 1),), (0.0,), (0.0,))

    return MultiEncoderConfig(
        dp=1, microbatch_size=1, num_microbatches=num_microbatches, gpus_per_replica=3, allocation=(1, 1, 1),
        encoders=(comp("vision"), comp("audio")), llm=comp("llm"), predicted_iteration_time_ms=1.0,
        memory_ok=True,
    )  # fmt: skip


def test_the_towers_memory_fit_draws_the_memory_checks_batches():
    """``runtime.planning.towers_check_batches`` (the batches ``plan`` and ``train`` fit one pipeline per
    tower on, ``fit_towers_setup``) is ``check_batches`` of the towers' layout: at 160 microbatches a
    replica the heaviest 16 of the 20 draws (2560 replica microbatches), each sample's metadata."""
    from entrain.config import ModelConfig
    from entrain.core.costs.sampler import pool_sampler
    from entrain.core.planning.encoders_plan import encoders_layout
    from entrain.data.generators import generate_samples
    from entrain.runtime.planning import towers_check_batches

    sampler = pool_sampler(generate_samples("omni", 256, 0))
    cost = ModelConfig(name=QWEN25_OMNI_7B, hardware="a40-flops").cost_model()
    config = _towers_config(160)
    got = towers_check_batches(sampler, cost, config, 160, 3, 20)
    want = check_batches(sampler, cost, encoders_layout(config), 160, 3, 20)
    assert len(want) == 16  # trimmed to the heaviest
    assert [[m.id for m in b] for b in got] == [[w.id for w in b] for b in want]
    assert [[m.vit_patches for m in b] for b in got] == [[w.meta.vit_patches for w in b] for b in want]


OMNI = ["--model", QWEN25_OMNI_7B, "--dataset", "omni", "--hardware", "a40-flops", "--global-batch", "8",
        "--microbatch-size", "2"]  # fmt: skip


def _train_setup(monkeypatch, out, argv: list[str], gpus: int, system: str):
    """``system``'s setup as ``entrain train ARGV --out OUT`` on ``gpus`` processes plans it, and the cost."""
    from entrain.runtime.run_data import load_data

    spec = train_spec(monkeypatch, [*argv, "--nproc", str(gpus), "--out", str(out)])
    cost = spec.model.cost_model()
    return worker_setups(spec, cost, load_data(spec, cost).train, gpus)[system], cost


def test_plan_and_train_fit_disttrains_towers_on_the_same_draws(tmp_path, monkeypatch):
    """``plan --system disttrain`` and ``train --system disttrain`` on the omni preset (one group per
    tower) memory-fit the same layout on the same batches: ``check_batches``' draws, whatever ``--steps``."""
    from entrain.runtime import planning

    seen: list[tuple] = []
    real = planning.check_batches

    def recorded(sampler, cost, layout, *args):
        out = real(sampler, cost, layout, *args)
        seen.append((layout, [[w.id for w in b] for b in out]))
        return out

    monkeypatch.setattr(planning, "check_batches", recorded)
    assert (
        main(["plan", *OMNI, "--gpus", "8", "--system", "disttrain", "--out", str(tmp_path / "p.json")]) == 0
    )
    _train_setup(  # its setup comes out of the same fit: the layout the test above compares
        monkeypatch, tmp_path / "run", [*OMNI, "--system", "disttrain", "--steps", "1"], 8, "disttrain"
    )
    assert len(seen) == 2 and seen[0][0].multi_encoder and seen[0] == seen[1]
    assert len(seen[0][1]) == 20  # plan's default --iterations at DP 1, not train's one step


def test_1f1b_recomputes_in_train_as_its_plan_file_says(tmp_path, monkeypatch):
    """``plan --system 1f1b --out`` decides the recomputation on its memory check's draws; ``train
    --system 1f1b --steps 1`` decides it on the same draws (not on its one batch), so it records the
    layout the plan file holds, and ``train --plan`` runs that file's."""
    path = tmp_path / "plan.json"
    assert main(["plan", *OMNI, "--gpus", "8", "--system", "1f1b", "--out", str(path)]) == 0
    written = json.loads(path.read_text())["layout"]
    assert any(s.get("recompute", "none") != "none" for s in written["stages"])  # the check decided some
    run = [*OMNI, "--system", "1f1b", "--steps", "1"]
    setup, cost = _train_setup(monkeypatch, tmp_path / "run", run, 8, "1f1b")
    assert cost.layout_with_parts(setup.layout).to_json() == written
    run = ["--plan", str(path), "--hardware", "a40-flops", "--steps", "1"]
    from_file, _ = _train_setup(monkeypatch, tmp_path / "from_file", run, 8, "1f1b")
    assert from_file.layout == cost.layout_with_parts(setup.layout)


def test_dip_keeps_its_own_dp_in_plan_as_in_train(tmp_path, monkeypatch):
    """``plan --system dip`` writes DIP-like's layout on its own DP (at most 4: ``setups``' DIP rule), not
    the DP of Entrain's Algorithm 2 the plan reports in ``config``; ``train --system dip`` on as many
    processes plans the same layout."""
    argv = ["--model", "tiny", "--dataset", "skewed", "--global-batch", "8", "--microbatch-size", "1"]
    path = tmp_path / "plan.json"
    assert main(["plan", *argv, "--gpus", "4", "--system", "dip", "--out", str(path)]) == 0
    written = json.loads(path.read_text())
    assert written["layout"]["dp"] == 2 != written["config"]["dp"]  # DIP's 4 // 2, Entrain's other
    setup, cost = _train_setup(
        monkeypatch, tmp_path / "run", [*argv, "--system", "dip", "--steps", "1"], 4, "dip"
    )
    assert cost.layout_with_parts(setup.layout).to_json() == written["layout"]
