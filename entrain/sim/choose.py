"""Choices decided by simulating the candidates on the planner's draws: ``core`` cannot simulate, so
the commands that may import the simulator hand ``candidate_judge`` to ``entrain.core.setups``
(Entrain's ``entrain_layout="auto"``: shared vs disjoint, ``setups.LAYOUT_MARGIN``)."""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.costmodel import CostModel
from entrain.core.planner import MacroscopicProfiler, Sampler
from entrain.core.setups import CandidateJudge, ConfigRequest, SystemSetup
from entrain.core.table_work import draw_works
from entrain.core.work import SampleWork
from entrain.sim.memory_fit import fit_memory

__all__ = ["JUDGE_DRAWS", "planner_draws", "candidate_judge"]

JUDGE_DRAWS = 2
"""Global batches a candidate is simulated on: the planner's draws of the global batch size, trials
0 and 1 (each candidate costs about 0.4 s per draw on the paper's 64-GPU setup)."""


def planner_draws(
    sampler: Sampler, cost: CostModel, req: ConfigRequest, num_draws: int = JUDGE_DRAWS
) -> list[list[SampleWork]]:
    """``num_draws`` global batches as the planner's profiler draws them (``MacroscopicProfiler``:
    seeded per batch size and trial), priced at the request's TP. Draws are with replacement, so each
    sample's id gets its position (a global batch holds every id once)."""
    profiler = MacroscopicProfiler(sampler, cost, seed=req.seed)
    out = []
    for trial in range(num_draws):
        items = profiler.draw(req.global_batch, trial)[0]
        out.append(draw_works(items, cost, req.tp, 1, numbered=True))  # column-wise for a table draw
    return out


def candidate_judge(
    sampler: Sampler, cost: CostModel, req: ConfigRequest, num_draws: int = JUDGE_DRAWS
) -> CandidateJudge:
    """``{name: Entrain's setup} -> {name: simulated iteration ms}`` on ``planner_draws`` (drawn once,
    on first use), after the simulated memory check's recomputation where a rank overflows
    (``memory_fit.fit_memory``, as ``simulate`` and ``plan`` deploy it): on memory-bound workloads
    (docvqa) neither raw candidate fits, and comparing them unfitted kept a layout 2.6 % slower. A
    plan that does not fit even so gets ``inf``."""
    draws: list[Sequence[SampleWork]] = []

    def judge(candidates: dict[str, SystemSetup]) -> dict[str, float]:
        if not draws:
            draws.extend(planner_draws(sampler, cost, req, num_draws))
        out = {}
        for name, setup in candidates.items():
            run = fit_memory("entrain", setup, draws, cost, setup.options, trace_iterations=0)[1]
            fits = run.metrics.fits_memory is not False
            out[name] = run.metrics.iteration_time_ms if fits else float("inf")
        return out

    return judge
