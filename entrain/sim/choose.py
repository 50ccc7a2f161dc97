"""Choices decided by simulating the candidates on the planner's draws: ``core`` cannot simulate, so
the commands that may import the simulator hand ``candidate_judge`` to ``entrain.core.setups``
(every automatic choice of Entrain, ``setups.DECISIONS``, each departing from the paper's default
only past ``setups.DECISION_MARGIN``). A candidate simulated once is not simulated again: the
decisions are made one after the other, and each one's incumbent is a candidate of the next."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costmodel import CostModel
from entrain.core.planner import MacroscopicProfiler, Sampler
from entrain.core.setups import CandidateJudge, ConfigRequest, SystemSetup
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
        works = (w if isinstance(w, SampleWork) else cost.sample_work(w, req.tp, 1) for w in items)
        out.append([replace(w, id=f"{w.id}#{i}") for i, w in enumerate(works)])
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
    seen: dict[str, float] = {}

    def simulate(setup: SystemSetup) -> float:
        key = repr((setup.layout, sorted(setup.options.items())))
        if key not in seen:
            run = fit_memory("entrain", setup, draws, cost, setup.options, trace_iterations=0)[1]
            seen[key] = run.metrics.iteration_time_ms if run.metrics.fits_memory is not False else float("inf")
        return seen[key]

    def judge(candidates: dict[str, SystemSetup]) -> dict[str, float]:
        if not draws:
            draws.extend(planner_draws(sampler, cost, req, num_draws))
        return {name: simulate(setup) for name, setup in candidates.items()}

    return judge
