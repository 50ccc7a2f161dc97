"""Systems on a model with several encoder towers (vision and audio, docs/design.md "N encoders"), end
to end in simulation: the profile (Algorithm 1 with N encoders), each system's Plan
(``planning.encoders_baselines.plan_encoders_system``), the simulator priced by ``EncodersPlanCosts``.

What ``entrain simulate`` runs for such a model. A system that cannot plan one pipeline per encoder
is not built (``plan_encoders_system``'s one-line reason); no memory fitting is done (the metrics say
whether each plan fits device memory).
"""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.costs.sampler import Sampler, draw_seed
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.bmin import PAPER_BMIN_CONFIG
from entrain.core.planning.encoders import Encoder, EncodersBMin, find_b_min_encoders
from entrain.core.planning.encoders_baselines import plan_encoders_system
from entrain.core.schedules.encoder_costs import EncodersPlanCosts
from entrain.sim.executor import simulate_plan
from entrain.sim.metrics import compute_metrics
from entrain.sim.run import SystemRun

__all__ = ["encoders_profile", "run_encoders_systems"]


def encoders_profile(
    sampler: Sampler, encoders: Sequence[Encoder], parallel: ParallelConfig
) -> tuple[EncodersBMin, list]:
    """Algorithm 1 with N encoders (``find_b_min_encoders``, the paper's test, on a replica of
    ``parallel.gpus / dp`` GPUs) and its reference draw at ``b_min``, the planner's profile."""
    gpus = parallel.gpus // (parallel.dp or 1) if parallel.gpus else len(encoders) + 1
    b = find_b_min_encoders(sampler, encoders, gpus)
    return b, list(sampler(b.b_min, draw_seed(PAPER_BMIN_CONFIG.seed, b.b_min, 0)))


def run_encoders_systems(
    systems: Sequence[str],
    sampler: Sampler,
    batches: Sequence[Sequence],
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
    unbuilt: dict[str, str],
) -> tuple[dict[str, SystemRun], EncodersBMin]:
    """Each system's run over ``batches`` (one iteration each); a system whose Plan cannot be made is
    named in ``unbuilt`` with its one-line reason instead."""
    b, profile = encoders_profile(sampler, encoders, parallel)
    runs: dict[str, SystemRun] = {}
    for system in systems:
        try:
            plan = plan_encoders_system(system, profile, batches, encoders, parallel)
        except ConfigError as e:
            unbuilt[system] = str(e)
            continue
        costs = EncodersPlanCosts(plan.layout, encoders, plan.samples)
        iterations = simulate_plan(plan, None, costs=costs)
        metrics = compute_metrics(plan.layout, iterations, costs, plan.iterations)
        runs[system] = SystemRun(system, plan.layout, plan, iterations, metrics)
    return runs, b
