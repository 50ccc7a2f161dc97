"""NCCL pipelines on several GPUs: every system of the registry
(``entrain.core.systems.SYSTEMS``) on a 2-process layout, and TP / FSDP inside the stages, give the
CPU float64 single-process reference gradients (before and after clipping), grad norm and loss. One
process per GPU (``cuda:RANK``, NCCL), spawned; one group per process count runs all its cases."""

from __future__ import annotations

import pytest

from entrain.core.systems import SYSTEMS, get_system
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm, fuse_parts
from entrain.runtime.data import SampleRenderer
from entrain.runtime.parallelize import StageParallelism
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from . import test_exact_gradients as exact
from .cases import MAX_GRAD_NORM, SEED, batch_metas, plan_for, works
from .gpu_harness import run_spawned
from .harness import assert_matches_reference, train_step_before_clip
from .test_gpu_exact_gradients import TOL_FP32
from .test_stage_parallel import _with_tp

references = exact.references  # the CPU float64 references (a module fixture)

# (name, system, encoder stages, llm stages, dp, K, tp, fsdp)
TWO_PROCESS_CASES = [
    (f"{s}-{'2+2' if get_system(s).colocated else '1+1'}", s, *((2, 2) if get_system(s).colocated else (1, 1)),
     1, 4, 1, False)
    for s in SYSTEMS
] + [
    ("dip-1+1-tp2", "dip", 1, 1, 1, 4, 2, False),
    ("dip-1+1-dp2", "dip", 1, 1, 2, 2, 1, False),
    ("dip-1+1-dp2-fsdp", "dip", 1, 1, 2, 2, 1, True),
]  # fmt: skip
FOUR_PROCESS_CASES = [(f"{s}-2+2", s, 2, 2, 1, 4, 1, False) for s in ("entrain", "1f1b", "disttrain")] + [
    ("1f1b-1+1-tp2", "1f1b", 1, 1, 1, 4, 2, False),
    ("dip-1+1-dp2-tp2-fsdp", "dip", 1, 1, 2, 2, 2, True),
]


def processes(case: tuple) -> int:
    """Processes a case needs: its Plan's ranks times its TP degree."""
    _, system, enc, llm, dp, _, tp, _ = case
    return dp * get_system(system).ranks_per_replica(enc, llm) * tp


def case_plans(cases: list[tuple]) -> list[tuple]:
    """``(name, plan, StageParallelism)`` per case (the Plan's components at the case's TP degree)."""
    batch = works(batch_metas())
    return [
        (name, _with_tp(plan_for(system, enc, llm, dp, k, batch), tp), StageParallelism(tp=tp, fsdp=fsdp))
        for name, system, enc, llm, dp, k, tp, fsdp in cases
    ]


def _train(env, cases) -> dict:
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    out = {}
    for name, plan, parallel in cases:
        renderer = SampleRenderer(cfg, dict(metas), seed=SEED, device=env.device)
        trainer = PipelineTrainer(
            layout=plan.layout,
            model=build_vlm(cfg, seed=SEED),
            env=env,
            renderer=renderer,
            optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM),
            parallel=parallel,
        )
        result, before = train_step_before_clip(trainer, plan.iterations[0])
        out[name] = (fuse_parts(before), fuse_parts(trainer.named_grads()), result.loss, result.grad_norm)
    return {"device": str(env.device), "cases": out}


def check_against_reference(results: list[dict], ref, names: list[str]) -> None:
    """Each case's gradients, gathered over ranks, against the reference (``TOL_FP32``)."""
    for name in names:
        before, after = {}, {}
        for rank_result in results:
            b, a, _, _ = rank_result["cases"][name]
            before.update(b)
            after.update(a)
        _, _, loss, grad_norm = results[0]["cases"][name]
        assert_matches_reference(
            name, before=before, after=after, loss=loss, grad_norm=grad_norm, ref=ref, tol=TOL_FP32
        )


def _run(cases: list[tuple], world: int, folder, references) -> None:
    assert {processes(c) for c in cases} == {world}
    results = run_spawned(_train, world, folder, case_plans(cases), timeout_s=300)
    assert all(r["device"] == f"cuda:{i}" for i, r in enumerate(results)), [r["device"] for r in results]
    check_against_reference(results, references["plain"], [c[0] for c in cases])


@pytest.mark.gpu(min_gpus=2)
def test_every_system_and_tp_fsdp_on_two_gpus_match_the_reference(references, tmp_path):
    _run(TWO_PROCESS_CASES, 2, tmp_path, references)


@pytest.mark.gpu(min_gpus=4)
def test_four_gpu_pipelines_and_tp_fsdp_match_the_reference(references, tmp_path):
    _run(FOUR_PROCESS_CASES, 4, tmp_path, references)


def test_the_two_gpu_cases_cover_every_system_on_two_processes():
    """CPU: the 2-GPU test's case list names every registered system, each on 2 processes (its Plan
    included), and TP and FSDP."""
    assert {c[1] for c in TWO_PROCESS_CASES} == set(SYSTEMS)
    assert {processes(c) for c in TWO_PROCESS_CASES} == {2}
    assert any(c[6] > 1 for c in TWO_PROCESS_CASES) and any(c[7] for c in TWO_PROCESS_CASES)
    for name, plan, parallel in case_plans(TWO_PROCESS_CASES):
        assert plan.layout.world_size * parallel.tp == 2, name
    assert {processes(c) for c in FOUR_PROCESS_CASES} == {4}
