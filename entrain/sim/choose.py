"""Choices decided by simulating the candidates on the planner's draws: ``core`` cannot simulate, so
the commands that may import the simulator hand ``candidate_judge`` to ``entrain.core.planning.setups``
(every automatic choice of Entrain, ``setups.DECISIONS``, each departing from the paper's default
only past ``setups.DECISION_MARGIN``). A candidate simulated once is not simulated again: the
decisions are made one after the other, and each one's incumbent is a candidate of the next."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.sampler import MacroscopicProfiler, Sampler
from entrain.core.costs.table_work import draw_works
from entrain.core.planning.setups import CandidateJudge, ConfigRequest, SystemSetup
from entrain.core.schedules.common import ScheduleOptions
from entrain.core.systems import ENTRAIN
from entrain.core.workload.work import SampleWork
from entrain.sim.memory_fit import below_requested_by, fit_memory, fit_memory_best
from entrain.sim.replica_sample import JUDGE_REPLICAS, estimated_iteration_ms, heaviest_replicas, sub_layout

__all__ = ["JUDGE_DRAWS", "TWINS", "planner_draws", "candidate_judge"]

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


def _all_paper(choices) -> bool:
    return all(c == "paper" for it in choices for c in (it if isinstance(it, list) else [it]))


TWINS = (
    ("memory_split", False, True, lambda p: "memory_split" not in p),
    ("ramp_microbatches", 0, "auto", lambda p: all(r[0] == 0 for it in p.get("ramp_chosen", []) for r in it)),
    ("pair_order", "paper", "auto", lambda p: _all_paper(p.get("pair_order_chosen", []))),
    ("dp_resplit", False, True, lambda p: _all_paper(p.get("dp_split_chosen", []))),
    ("assignment", "paper", "auto",
     lambda p: _all_paper(p.get("assignment_chosen", [])) and _all_paper(p.get("dp_split_chosen", []))),
)  # fmt: skip
"""``(option, the candidate's value, its twin's, twin plan's options -> the twin ran the candidate's
plan)``: a candidate whose twin (the same setup with the option at the per-iteration or where-needed
value) was simulated without a memory-check step and chose, everywhere, what the candidate fixes (no
cut, no ramp, the paper's pair order, split and assignment) has the same plan, so the twin's time is reused."""

_DEFAULTS = ScheduleOptions().to_json()


def _key(layout, options: dict) -> str:
    return repr((layout, sorted((k, v) for k, v in options.items() if v != _DEFAULTS.get(k, object()))))


def _paper_count(seen: dict, setup: SystemSetup) -> tuple | None:
    """For a ``requested`` microbatch count candidate, ``seen``'s ``judged_ms`` entry of the same setup at
    the paper's count, else None."""
    if setup.options.get("microbatch_count") != "requested":
        return None
    return seen.get(_key(setup.layout, {**setup.options, "microbatch_count": "paper"}))


def _twin_ms(seen: dict, setup: SystemSetup) -> float | None:
    """The time of ``setup``'s twin in ``seen`` where the twin ran ``setup``'s plan (``TWINS``; the paper's
    microbatch count where ``K_eff`` fell nowhere below the requested one), else None."""
    for option, value, twin, same in TWINS:
        if setup.options.get(option, _DEFAULTS[option]) != value:
            continue
        ms, plan_options, _, _ = seen.get(_key(setup.layout, {**setup.options, option: twin}), _UNKNOWN)
        if plan_options is not None and same(plan_options):
            return ms
    paper = _paper_count(seen, setup)
    return paper[0] if paper is not None and not paper[2] else None  # K_eff nowhere below it: one plan


_UNKNOWN = (None, None, True, True)
"""A cache entry whose plan the judge did not see (a reused twin time): no twin of it is reused."""


def candidate_judge(
    sampler: Sampler,
    cost: CostModel,
    req: ConfigRequest,
    num_draws: int = JUDGE_DRAWS,
    replicas: int = JUDGE_REPLICAS,
) -> CandidateJudge:
    """``{name: Entrain's setup} -> {name: simulated iteration ms}`` on ``planner_draws`` (drawn once,
    on first use), after the simulated memory check's recomputation where a rank overflows
    (``memory_fit.fit_memory``, as ``simulate`` and ``plan`` deploy it): on memory-bound workloads
    (docvqa) neither raw candidate fits, and comparing them unfitted kept a layout 2.6 % slower. A
    plan that does not fit even so gets ``inf``. A candidate already simulated, or whose ``TWINS``
    twin ran its plan, is not simulated again. Above ``replicas`` replicas a candidate is simulated on
    a sub-cluster of that many and its full iteration time estimated (``judged_ms``).

    The judge carries ``deployed``: the same on the same draws, after the memory check a command
    deploys with (``memory_fit.fit_memory_best``: every recomputation start, per rank and per layer,
    with and without eager forwards, the fastest that fits); ``deployed.recomputes(setup)``: whether that
    plan recomputes on some stage. It costs several simulations a
    candidate, so it is asked only where the plain check cannot tell candidates apart
    (``planning.extensions``, ``CLOSE_CALLS``) and for the layout, whose candidates differ in what each
    rank holds (``extensions._entrain_layout``)."""
    draws: list[Sequence[SampleWork]] = []
    seen: dict[str, tuple] = {}  # judged_ms's tuple per candidate, plain check
    deployed_seen: dict[str, tuple] = {}  # the same, deployed check
    splits: dict[str, tuple] = {}  # the heaviest replicas of the draws' DP split, per layout

    def simulate(setup: SystemSetup) -> float:
        key = _key(setup.layout, setup.options)
        if key not in seen:
            reused = _twin_ms(seen, setup)
            if reused is not None:
                seen[key] = (reused, *_UNKNOWN[1:])
            else:
                seen[key] = judged_ms(setup, draws, cost, replicas, splits=splits)
        return seen[key][0]

    def judge(candidates: dict[str, SystemSetup]) -> dict[str, float]:
        if not draws:
            draws.extend(planner_draws(sampler, cost, req, num_draws))
        return {name: simulate(setup) for name, setup in candidates.items()}

    def deployed(candidates: dict[str, SystemSetup]) -> dict[str, float]:
        if not draws:
            draws.extend(planner_draws(sampler, cost, req, num_draws))
        for setup in candidates.values():
            key = _key(setup.layout, setup.options)
            if key not in deployed_seen:
                paper = _paper_count(deployed_seen, setup)
                if paper is not None and not paper[2]:
                    deployed_seen[key] = paper  # K_eff nowhere below the requested count: one plan
                    continue
                deployed_seen[key] = judged_ms(
                    setup, draws, cost, replicas, splits=splits, deployed=True, margin=req.margin
                )
        return {name: deployed_seen[_key(s.layout, s.options)][0] for name, s in candidates.items()}

    def recomputes(setup: SystemSetup) -> bool:
        deployed({"setup": setup})
        return deployed_seen[_key(setup.layout, setup.options)][3]

    deployed.recomputes = recomputes  # type: ignore[attr-defined]
    judge.deployed = deployed  # type: ignore[attr-defined]
    return judge


def judged_ms(
    setup: SystemSetup,
    draws: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    replicas: int,
    system: str = ENTRAIN,
    splits: dict[str, tuple] | None = None,
    deployed: bool = False,
    margin: float = 0.0,
) -> tuple[float, dict | None, bool, bool]:
    """``(simulated iteration ms after the memory check, or inf where it does not fit; the plan's
    options, or None where the check changed the layout; whether some replica's ``K_eff`` fell below
    the requested count, ``memory_fit.below_requested_by``: where the requested count gives another plan;
    whether the plan recomputes on some stage)`` of ``setup`` on ``draws``. Above
    ``replicas`` replicas: on a sub-cluster of the ``replicas`` heaviest replicas of each draw's DP
    split (``replica_sample``; it depends on the layout alone, not on the schedule options, and is
    kept in ``splits`` for the next candidate on the same layout), with the full DP's all-reduce.
    ``deployed``: the memory check a command deploys with (``fit_memory_best``) instead of the
    planner's recomputation escalated per rank (``fit_memory``), its ``recompute`` decision with
    ``margin`` as deploying Entrain takes it."""
    full = setup.layout
    layout, batches, split = full, draws, None
    if full.dp > replicas:
        layout = sub_layout(full, replicas)
        splits = {} if splits is None else splits
        key = repr((full, replicas))
        if key not in splits:
            splits[key] = tuple(zip(*(heaviest_replicas(d, full, cost, layout.dp) for d in draws)))
        batches, split = splits[key]
    sub = replace(setup, layout=layout)
    if deployed:
        got, run = fit_memory_best(
            system, sub, batches, cost, setup.options, trace_iterations=0, margin=margin, assignments=split
        )
    else:
        got, run = fit_memory(
            system, sub, batches, cost, setup.options, trace_iterations=0, assignments=split
        )
    if run.metrics.fits_memory is False:
        ms = float("inf")
    elif layout is full:
        ms = run.metrics.iteration_time_ms
    else:
        ms = estimated_iteration_ms(run, replace(got.layout, dp=full.dp), cost)
    recomputes = any(st.recompute != "none" for st in got.layout.stages)
    return ms, run.plan.options if got.layout == layout else None, below_requested_by(system, run), recomputes
