"""Systems on a model with several encoder towers (vision and audio, docs/design.md "N encoders"), end
to end in simulation: the profile (Algorithm 1 with N encoders, the deployed check), each system's Plan
(``planning.encoders_baselines.plan_encoders_system``), the simulator priced by ``EncodersPlanCosts``.

What ``entrain simulate`` runs for such a model. A system that cannot plan one pipeline per encoder
is not built (``plan_encoders_system``'s one-line reason). Memory: a plan whose simulated peak on a
pipeline rank is over device memory has that rank's stages recomputed one mode further (none ->
selective -> full, ``RECOMPUTE_MODES``) and is simulated again, until it fits or every over-full rank is
at full recomputation (``fit_recompute``; the actions stay as planned, every system alike); the metrics
say whether the result fits.

Entrain's plan is also made with the requested microbatch count where ``K_eff`` on the bottleneck encoder
left some replica fewer (``fit_entrain``: the faster fitting of the two, past the decision margin, as the
``microbatch count`` decision): the 1F1B warm-up of an encoder pipeline feeding an LLM pipeline wants
many microbatches, and a video that dwarfs the rest of the vision work caps ``K_eff`` at a few.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import RECOMPUTE_MODES
from entrain.core.costs.sampler import Sampler, draw_seed
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import Plan
from entrain.core.planning.bmin import PAPER_BMIN_CONFIG, DeployCheck
from entrain.core.planning.encoders import (
    Encoder,
    EncodersBMin,
    MultiEncoderConfig,
    search_encoders,
)
from entrain.core.planning.encoders_baselines import plan_encoders_system
from entrain.core.planning.encoders_bmin import find_b_min_encoders_deployed
from entrain.core.planning.encoders_plan import below_requested, generate_encoders_plan
from entrain.core.planning.extensions import MICROBATCH_COUNT
from entrain.core.planning.system_setup import DECISION_MARGIN, Decision, pick
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.core.systems import ENTRAIN
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics
from entrain.sim.run import SystemRun

__all__ = ["encoders_profile", "fit_recompute", "fit_entrain", "run_encoders_systems", "MICROBATCH_COUNT"]


def encoders_profile(
    sampler: Sampler, encoders: Sequence[Encoder], parallel: ParallelConfig
) -> tuple[EncodersBMin, list]:
    """Algorithm 1 with N encoders on a replica of ``parallel.gpus / dp`` GPUs, stability judged on the
    configuration each draw's split deploys (``planning.encoders_bmin``: the one-encoder planner's
    ``DeployCheck`` applied to every encoder group, up to the global batch), and its reference draw at
    ``b_min``: the planner's profile."""
    gpus = parallel.gpus // (parallel.dp or 1) if parallel.gpus else len(encoders) + 1
    b = find_b_min_encoders_deployed(sampler, encoders, gpus, DeployCheck(parallel), dp=parallel.dp or 1)
    return b, list(sampler(b.b_min, draw_seed(PAPER_BMIN_CONFIG.seed, b.b_min, 0)))


def run_encoders_systems(
    systems: Sequence[str],
    sampler: Sampler,
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
    unbuilt: dict[str, str],
    decisions: dict[str, list[Decision]] | None = None,
    margin: float = DECISION_MARGIN,
) -> tuple[dict[str, SystemRun], EncodersBMin]:
    """Each system's run over ``batches`` (one iteration each); a system whose Plan cannot be made is
    named in ``unbuilt`` with its one-line reason instead. Entrain's through ``fit_entrain`` (its
    decision in ``decisions[ENTRAIN]``, where given)."""
    b, profile = encoders_profile(sampler, encoders, parallel)
    runs: dict[str, SystemRun] = {}
    for system in systems:
        try:
            if system == ENTRAIN:  # plan_encoders_system's Entrain plan, with the microbatch count tried
                cfg = search_encoders(profile, encoders, parallel)[0]
            else:
                plan = plan_encoders_system(system, profile, batches, encoders, parallel)
        except ConfigError as e:
            unbuilt[system] = f"cannot be built: {e}"
            continue
        if system == ENTRAIN:
            runs[system], _, made = fit_entrain(cfg, batches, encoders, margin=margin)
            if decisions is not None:
                decisions[system] = made
        else:
            runs[system] = fit_recompute(plan, encoders)
    return runs, b


def _fitting_ms(run: SystemRun) -> float:
    return run.metrics.iteration_time_ms if run.metrics.fits_memory is not False else float("inf")


def fit_entrain(
    cfg: MultiEncoderConfig,
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    *,
    margin: float = DECISION_MARGIN,
    system: str = ENTRAIN,
) -> tuple[SystemRun, MultiEncoderConfig, list[Decision]]:
    """Entrain's plan of ``batches`` on ``cfg`` through ``fit_recompute``; where some replica got fewer
    microbatches than requested (``encoders_plan.below_requested``), the plan with the requested count
    too (``MultiEncoderConfig.microbatch_count``), and the faster one that fits taken past ``margin``
    (``system_setup.pick``; the paper's count by default and on ties): the run, the configuration it
    was planned on (its memory fit not included: the run's layout) and the decision ([] where there
    was no choice)."""
    plan = generate_encoders_plan(batches, encoders, cfg, system=system)
    paper = fit_recompute(plan, encoders)
    if not below_requested(plan):
        return paper, cfg, []
    more = replace(cfg, microbatch_count="requested")
    requested = fit_recompute(generate_encoders_plan(batches, encoders, more, system=system), encoders)
    found = {"paper": (paper, cfg), "requested": (requested, more)}
    d = pick(MICROBATCH_COUNT, "paper", {n: _fitting_ms(r) for n, (r, _) in found.items()}, margin)
    run, chosen = found[d.chosen]
    return run, chosen, [d]


def _run(plan: Plan, encoders: Sequence[Encoder]) -> SystemRun:
    costs = EncodersPlanCosts(plan.layout, encoders, plan.samples)
    iterations = simulate_plan(plan, None, costs=costs)
    metrics = compute_metrics(plan.layout, iterations, costs, plan.iterations)
    return SystemRun(plan.system, plan.layout, plan, iterations, metrics)


def fit_recompute(plan: Plan, encoders: Sequence[Encoder]) -> SystemRun:
    """``plan`` simulated; while a pipeline rank's peak is over device memory, that rank's stages one
    recomputation mode further (module docstring), the last run returned (it may still not fit)."""
    while True:
        run = _run(plan, encoders)
        m, layout = run.metrics, plan.layout
        limit = m.device_memory_bytes
        peaks = m.peak_memory_bytes_per_rank
        if m.fits_memory is not False or not peaks or limit is None:
            return run
        over = {r for r, p in enumerate(peaks) if p > limit}
        stages = tuple(
            replace(st, recompute=RECOMPUTE_MODES[RECOMPUTE_MODES.index(st.recompute) + 1])
            if st.pp_rank in over and st.recompute != RECOMPUTE_MODES[-1]
            else st
            for st in layout.stages
        )
        if stages == layout.stages:
            return run
        plan = replace(plan, layout=replace(layout, stages=stages))
