"""Entrain on a model with several encoder towers (an audio tower beside the vision tower): the
``encoder towers`` decision, one rule for ``simulate``, ``plan`` and ``train`` (docs/design.md, "N
encoders").

The two candidates, simulated on the same global batches:

* ``PER_ENCODER`` (the default): one pipeline per tower, Entrain's N-encoder setup
  (``entrain_encoders_setup``: Algorithm 1 with N encoders, ``search_encoders``' best, then
  ``encoders_run.fit_entrain``: the ``microbatch count`` decision and the memory fit);
* ``SHARED``: both towers in the first stages, the one-encoder path's setup after its memory check.

``towers_decision`` takes the N-encoder one unless the other is faster past the decision margin or it
does not fit (``system_setup.pick``). ``plan`` decides on its memory check's batches
(``costs.memory.check_batches``) and ``train`` without ``--plan`` on the same draws
(``entrain_towers``), so ``train`` runs the layout ``plan --out`` writes; ``simulate`` decides on the
batches it simulates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.memory import check_batches
from entrain.core.costs.sampler import Sampler
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.encoders import Encoder, search_encoders
from entrain.core.planning.encoders_plan import encoders_options
from entrain.core.planning.system_setup import Decision, SystemSetup, pick
from entrain.core.systems import ENTRAIN
from entrain.sim.encoders_run import encoders_profile, fit_entrain
from entrain.sim.memory_fit import deploy
from entrain.sim.run import SystemRun

__all__ = [
    "TOWERS",
    "PER_ENCODER",
    "SHARED",
    "fitting_ms",
    "towers_decision",
    "encoders_source",
    "entrain_encoders_setup",
    "choose_towers",
    "entrain_towers",
]

TOWERS = "encoder towers"
"""The decision's name: ``PER_ENCODER`` (the default) or ``SHARED``."""
PER_ENCODER = "one pipeline per encoder"
SHARED = "both in the first stages"


def fitting_ms(run: SystemRun) -> float:
    """The run's iteration ms; ``inf`` where it does not fit device memory."""
    return run.metrics.iteration_time_ms if run.metrics.fits_memory is not False else float("inf")


def towers_decision(per_encoder: SystemRun, shared: SystemRun | None, margin: float) -> Decision:
    """The ``encoder towers`` decision on the two candidates' runs of the same batches (``shared`` None:
    no one-encoder plan fits device memory, its time ``inf``)."""
    ms = {
        PER_ENCODER: fitting_ms(per_encoder),
        SHARED: float("inf") if shared is None else fitting_ms(shared),
    }
    return pick(TOWERS, PER_ENCODER, ms, margin)


def encoders_source(encoders: Sequence[Encoder], b_min: int) -> str:
    """How an N-encoder setup was chosen (its ``source``)."""
    return f"N-encoder planner ({', '.join(e.name for e in encoders)}), b_min {b_min}"


def entrain_encoders_setup(
    sampler: Sampler,
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
    batches: Sequence[Sequence],
    margin: float,
) -> tuple[SystemSetup, SystemRun]:
    """Entrain's setup with one pipeline per tower and its run of ``batches`` (samples with token
    metadata): the configuration ``search_encoders`` finds on the N-encoder profile, its microbatch
    count decided and its layout memory-fitted on ``batches`` (``fit_entrain``); the setup's ``config``
    carries the chosen count, its ``options`` the count where it is not the paper's."""
    b, profile = encoders_profile(sampler, encoders, parallel)
    found = search_encoders(profile, encoders, parallel)
    if not found:
        raise ConfigError(
            f"no configuration gives each of {', '.join(e.name for e in encoders)} and the LLM a GPU of a replica "
            f"on {parallel.gpus} GPUs"
        )
    run, cfg, made = fit_entrain(found[0], batches, encoders, margin=margin)
    setup = SystemSetup(
        run.layout, encoders_options(cfg), encoders_source(encoders, b.b_min), b_min=b.b_min, profile=profile,
        config=cfg, decisions=tuple(made),
    )  # fmt: skip
    return setup, run


def choose_towers(
    sampler: Sampler,
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
    batches: Sequence[Sequence],
    shared: tuple[SystemSetup, SystemRun] | None,
    margin: float,
    unbuilt: dict[str, str] | None = None,
) -> tuple[SystemSetup, SystemRun] | None:
    """Entrain's setup and run after the ``encoder towers`` decision: ``entrain_encoders_setup`` on
    ``batches`` (``SampleWork`` with token metadata, ids unique) against ``shared`` (the one-encoder
    setup after its memory check on the same batches, and its run; None where nothing of that path fits
    device memory: the memory check's error); the chosen one carries the
    decision after its own. None where the batches hold raw work (one encoder's work only) or no plan
    with one pipeline per tower can be built (its reason in ``unbuilt[ENTRAIN]``)."""
    if any(w.meta is None for b in batches for w in b):
        return None
    metas = [[replace(w.meta, id=w.id) for w in b] for b in batches]
    try:
        per = entrain_encoders_setup(sampler, encoders, parallel, metas, margin)
    except ConfigError as e:
        if unbuilt is not None:
            unbuilt[ENTRAIN] = str(e)
        return None
    d = towers_decision(per[1], None if shared is None else shared[1], margin)
    setup, run = per if d.chosen == PER_ENCODER or shared is None else shared
    return replace(setup, decisions=(*setup.decisions, d)), run


def entrain_towers(
    sampler: Sampler,
    cost: CostModel,
    encoders: Sequence[Encoder],
    parallel: ParallelConfig,
    one: SystemSetup,
    *,
    seed: int,
    iterations: int,
    margin: float,
    unbuilt: dict[str, str] | None = None,
) -> tuple[SystemSetup, SystemRun] | None:
    """What ``train`` without ``--plan`` decides as ``plan`` does: Entrain's one-encoder setup ``one``
    (before its memory check) deployed on the batches ``plan``'s memory check draws
    (``check_batches`` of its layout, ``iterations`` at most: ``plan``'s ``--iterations``), then
    ``choose_towers`` on them. None as ``choose_towers``, or where ``one`` has
    no Algorithm 2 configuration; the memory check's error where neither path fits."""
    if one.config is None:
        return None
    checks = check_batches(sampler, cost, one.layout, parallel.global_batch, seed, iterations)
    try:
        shared, no_fit = deploy(ENTRAIN, one, checks, cost, margin=margin), None
    except ConfigError as e:  # no one-encoder plan fits: one pipeline per tower may
        shared, no_fit = None, e
    made = choose_towers(sampler, encoders, parallel, checks, shared, margin, unbuilt)
    if made is None and no_fit is not None:
        raise no_fit
    return made
