"""A run's layouts and Plans (no torch). Each system's setup comes from one of three places:

* ``--plan FILE`` (``entrain plan --out``): exactly that system, layout and schedule options;
* stage counts fixed by ``--encoder-stages`` / ``--llm-stages``: Algorithm 2's partitioner splits the
  layers (``entrain.core.planning.setups.fixed_stage_setup``);
* otherwise the planner, as ``entrain simulate`` chooses it (``entrain.core.planning.setups.system_setups``),
  for the processes started (GPUs = ``--nproc`` x nodes); Entrain on a model with several encoder
  towers (an audio tower beside the vision tower), where a replica has a GPU for each tower and the
  LLM, makes ``plan``'s ``encoder towers`` decision on ``plan``'s draws (``EncodersTowers``, the CLI's
  ``entrain.sim.towers.entrain_towers``: one pipeline per tower, docs/design.md "N encoders", or both
  towers in the first stages), so it runs the layout ``plan --out`` writes; DistTrain-like plans one
  pipeline per tower (one group per tower, its degrees from the N-way search on its one profiled sample of
  the same profile, as ``simulate`` plans it: ``planning.encoders_baselines``), memory-fitted on
  ``plan``'s draws (``fit_towers_setup``), so it too runs the layout ``plan --system disttrain --out``
  writes.

Then each iteration's Plan comes from the system's batcher and generator, as in the simulator."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from entrain.config import RunConfig
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.memory import MEMORY_CHECK_ITERATIONS, check_batches
from entrain.core.costs.sampler import Sampler, pool_sampler
from entrain.core.errors import ConfigError
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.plan import Layout, Plan
from entrain.core.planning.encoders import Encoder, MultiEncoderConfig, search_encoders, shape_encoders
from entrain.core.planning.encoders_baselines import (
    CONFIG_SYSTEMS,
    disttrain_encoders_sample,
    generate_config_plan,
)
from entrain.core.planning.encoders_plan import encoders_layout
from entrain.core.planning.setups import (
    CandidateJudge,
    ConfigRequest,
    SystemSetup,
    fixed_stage_setup,
    read_plan_file,
    system_setups,
)
from entrain.core.systems import DISTTRAIN, ENTRAIN, SYSTEMS, moves_across_replicas, plan_system
from entrain.core.workload.work import SampleWork

__all__ = [
    "MemoryCheck",
    "JudgeFactory",
    "fixed_stages",
    "ranks_per_replica",
    "plan_file",
    "run_setups",
    "make_plan",
    "EncodersProfile",
    "EncodersMemoryFit",
    "run_encoders",
    "EncodersTowers",
    "plans_towers",
    "encoders_setup",
    "towers_check_batches",
    "fit_towers_setup",
    "fit_encoders_setup",
    "EncodersStepPlanner",
]


def fixed_stages(spec: RunConfig) -> bool:
    """True when the flags fix the stage counts (either one given)."""
    return spec.parallel.encoder_stages is not None or spec.parallel.llm_stages is not None


def _stage_counts(spec: RunConfig) -> tuple[int, int]:
    return spec.parallel.encoder_stages or 1, spec.parallel.llm_stages or 1


def ranks_per_replica(spec: RunConfig, system: str) -> int:
    """Pipeline ranks of one replica of ``system`` with the stage counts fixed by the flags."""
    return SYSTEMS[system].ranks_per_replica(*_stage_counts(spec))


def plan_file(spec: RunConfig) -> tuple[str, SystemSetup]:
    """``--plan``'s system and setup, checked against the run's model (its name and layer counts)."""
    family, shape = spec.model.family(), spec.model.arch()
    counts = {c: len(family.layer_names(shape, c)) for c in ("encoder", "llm")}
    counts.update({e.name: e.cost.encoder.num_layers for e in run_encoders(spec) or ()})  # each tower's
    return read_plan_file(spec.schedule.plan, expect_model=spec.model.label(), layer_counts=counts)


MemoryCheck = Callable[..., SystemSetup]
"""``(system, setup, batches, cost, margin=...) -> setup``: the simulated memory check ``plan`` and
``simulate`` run (``entrain.sim.memory_fit.deploy``, whose ``recompute`` decision departs from the
planner's recomputation only past ``margin``, the run's ``--decision-margin``; the CLI passes it in,
the runtime does not import the simulator), on the batches ``plan``'s check of the same setup draws
(``costs.memory.check_batches``), not on the run's first ``--steps`` batches."""

JudgeFactory = Callable[[Sampler, CostModel, ConfigRequest], CandidateJudge]
"""``(sampler, cost, request) -> judge``: what decides Entrain's automatic choices by simulation on the
planner's draws (``entrain.sim.choose.candidate_judge``, ``entrain.core.planning.setups.DECISIONS``; the CLI
passes it in; without it Entrain keeps the paper's disjoint layout and its ``auto`` options as given)."""

EncodersProfile = Callable[[Sampler, Sequence[Encoder], object], tuple]
"""``(sampler, encoders, parallel) -> (EncodersBMin, samples)``: Algorithm 1 with several encoders and
its reference draw at ``b_min``, the N-encoder planner's profile (``entrain.sim.encoders_run.encoders_profile``;
the CLI passes it in)."""

EncodersMemoryFit = Callable[[Plan, Sequence[Encoder]], Layout]
"""``(plan, encoders) -> layout``: the plan's layout with each pipeline rank whose simulated peak is over
device memory recomputed further (``entrain.sim.encoders_run.fit_recompute``, what ``simulate`` does on
such a plan; the CLI passes it in)."""

EncodersTowers = Callable[
    [RunConfig, Sampler, CostModel, SystemSetup, ConfigRequest, int], "SystemSetup | None"
]
"""``(spec, sampler, cost, one-encoder setup, request, gpus) -> setup``: Entrain's setup on a model with
several encoder towers after the ``encoder towers`` decision (one pipeline per tower, its ``microbatch
count`` decided, or both towers in the first stages), made as ``plan`` makes it: on the batches
``plan``'s memory check draws, each candidate memory-fitted there (``entrain.sim.towers.entrain_towers``;
the CLI passes it in). None where no plan with one pipeline per tower can be built."""


def run_setups(
    spec: RunConfig,
    cost: CostModel,
    batches: Sequence[Sequence[SampleWork]],
    gpus: int,
    memory_check: MemoryCheck | None = None,
    judge_factory: JudgeFactory | None = None,
    encoders_profile: EncodersProfile | None = None,
    encoders_fit: EncodersMemoryFit | None = None,
    encoders_towers: EncodersTowers | None = None,
) -> dict[str, SystemSetup]:
    """Each system's setup for a run on ``gpus`` processes (see the module docstring); a planned one
    (not ``--plan``'s, which was checked when it was written) then goes through ``memory_check`` on the
    batches ``plan``'s check of that setup deploys on (``costs.memory.check_batches``, at ``plan``'s
    default ``--iterations``), so its recomputation is ``plan --out``'s whatever ``--steps``;
    ``judge_factory`` decides Entrain's automatic choices (``JudgeFactory``); each setup carries its
    ``decisions``. ``encoders_profile``: the N-encoder planner's profile (``EncodersProfile``; without
    it a model with several towers takes the one-encoder path); ``encoders_fit``: the memory check of
    a setup with one pipeline per tower (``EncodersMemoryFit``); ``encoders_towers``: Entrain's ``encoder
    towers`` decision (``EncodersTowers``: its setup comes out memory-fitted, as ``plan --out`` writes it;
    without it Entrain plans one pipeline per tower wherever a replica has a GPU for each)."""
    if spec.schedule.plan:
        system, setup = plan_file(spec)
        return {system: setup}
    req = spec.config_request(gpus)
    sampler = planner_sampler(spec, batches)
    judge = judge_factory(sampler, cost, req) if judge_factory is not None else None
    decided: dict[str, SystemSetup] = {}  # Entrain's encoder towers decision, memory-fitted as plan does
    if fixed_stages(spec):
        probe = [w.meta if w.meta is not None else w for w in batches[0]]
        counts = _stage_counts(spec)
        setups = {s: fixed_stage_setup(s, req, cost, probe, *counts, judge) for s in spec.schedule.systems}
    else:
        decides = {
            s
            for s in spec.schedule.systems
            if s == ENTRAIN and plans_towers(s, spec, gpus, encoders_towers) is not None
        }
        towers = {
            s: None if s in decides else encoders_setup(s, spec, sampler, gpus, encoders_profile)
            for s in spec.schedule.systems
        }
        rest = [s for s, setup in towers.items() if setup is None]
        try:
            chosen = system_setups(rest, req, cost, sampler, judge) if rest else {}
        except ConfigError:  # no one-encoder plan of Entrain's: one pipeline per tower, as planned without
            if not decides:  # the decision (the one-encoder path's error stands where that cannot be built)
                raise
            fallback = {s: encoders_setup(s, spec, sampler, gpus, encoders_profile) for s in decides}
            if any(setup is None for setup in fallback.values()):
                raise
            towers.update(fallback)
            decides, others = set(), [s for s in rest if s not in fallback]
            chosen = system_setups(others, req, cost, sampler, judge) if others else {}
        for s in decides:  # the one-encoder setup is a candidate
            made = encoders_towers(spec, sampler, cost, chosen[s], req, gpus)  # type: ignore[misc]
            if made is not None:
                decided[s] = made
        setups = {s: decided.get(s) or towers[s] or chosen[s] for s in spec.schedule.systems}
    out = {}
    for s, setup in setups.items():
        if s in decided:
            out[s] = setup
        elif setup.layout.multi_encoder:
            out[s] = fit_towers_setup(spec, s, setup, sampler, cost, encoders_fit)
        elif memory_check is None or not SYSTEMS[s].memory_fitted:  # DIP's check changes nothing
            out[s] = setup
        else:
            seed, iterations = spec.data.seed, MEMORY_CHECK_ITERATIONS  # plan's default --iterations
            check = check_batches(sampler, cost, setup.layout, req.global_batch, seed, iterations)
            out[s] = memory_check(s, setup, check, cost, margin=req.margin)
    return out


def towers_check_batches(
    sampler: Sampler,
    cost: CostModel,
    config: MultiEncoderConfig,
    global_batch: int,
    seed: int,
    iterations: int,
) -> list[list]:
    """The global batches a setup with one pipeline per encoder tower is memory-fitted on, by ``plan``
    and ``train`` alike (so ``train`` runs the layout ``plan --out`` writes, whatever its ``--steps``):
    ``costs.memory.check_batches`` of its layout (``encoders_layout``), the one rule of every memory
    check's draws; each sample's ``SampleMeta`` (raw work as drawn), ids made unique."""
    batches = check_batches(sampler, cost, encoders_layout(config), global_batch, seed, iterations)
    return [[w if w.meta is None else replace(w.meta, id=w.id) for w in works] for works in batches]


def fit_towers_setup(
    spec: RunConfig,
    system: str,
    setup: SystemSetup,
    sampler: Sampler,
    cost: CostModel,
    fit: EncodersMemoryFit | None,
    iterations: int = MEMORY_CHECK_ITERATIONS,
) -> SystemSetup:
    """``setup`` (one pipeline per encoder tower) memory-fitted by ``fit`` on ``towers_check_batches``
    (``iterations``: ``plan``'s ``--iterations``; ``train``'s, ``MEMORY_CHECK_ITERATIONS``, its default)."""
    if fit is None:
        return setup
    par = spec.parallel
    batches = towers_check_batches(sampler, cost, setup.config, par.global_batch, spec.data.seed, iterations)
    return fit_encoders_setup(spec, system, setup, batches, fit)


def fit_encoders_setup(
    spec: RunConfig, system: str, setup: SystemSetup, batches: Sequence, fit: EncodersMemoryFit | None
) -> SystemSetup:
    """``setup`` (one pipeline per encoder tower) with the layout ``fit`` gives its Plan of ``batches``
    (unchanged without ``fit``)."""
    if fit is None:
        return setup
    encoders = run_encoders(spec)
    plan = EncodersStepPlanner(encoders, setup.config, system).plan(batches)
    return replace(setup, layout=fit(plan, encoders))


def run_encoders(spec: RunConfig) -> tuple[Encoder, ...] | None:
    """The N-encoder planner's encoders of the run's model (``planning.encoders.shape_encoders`` on its
    hardware preset); None for a model with one encoder, or with a measured profile (it times the
    towers as one encoder)."""
    if spec.model.profile:
        return None
    m = spec.model
    return shape_encoders(m.arch(), m.hardware_label(), freeze=m.freeze, attention=m.attention)


def plans_towers(
    system: str, spec: RunConfig, gpus: int, profile: object | None
) -> tuple[Encoder, ...] | None:
    """The towers of a run that plans ``system`` with one pipeline per tower (a candidate at least):
    Entrain or DistTrain-like (``encoders_baselines.CONFIG_SYSTEMS``), a model with several towers
    (``run_encoders``), a GPU per tower and for the LLM in a replica, and the N-encoder planner handed
    in (``profile``, any of its callables); None otherwise. ``--replan auto`` is refused there."""
    encoders = run_encoders(spec) if profile is not None and system in CONFIG_SYSTEMS else None
    if encoders is None or gpus // spec.parallel.dp_or_1 < len(encoders) + 1:
        return None
    if spec.schedule.replan == "auto":
        raise ConfigError(
            f"--replan auto: {system} plans one pipeline per encoder tower "
            f"({', '.join(e.name for e in encoders)}) here, which the drift monitor does not re-plan; run without it"
        )
    return encoders


def encoders_setup(
    system: str, spec: RunConfig, sampler: Sampler, gpus: int, profile: EncodersProfile | None
) -> SystemSetup | None:
    """The setup with one pipeline per encoder tower, when the run plans one: Entrain or DistTrain-like
    (``encoders_baselines.CONFIG_SYSTEMS``), a model with several towers (``run_encoders``) and a GPU
    per tower and for the LLM in a replica; None otherwise (the one-encoder path: both towers in the
    first stages). Entrain's configuration is ``search_encoders``' best on Algorithm 1's profile
    (``profile``), DistTrain-like's the search's best on its one profiled sample of that profile
    (``disttrain_encoders_sample``), as ``simulate`` plans them (``plan_encoders_system``)."""
    encoders = plans_towers(system, spec, gpus, profile)
    if encoders is None:
        return None
    parallel = replace(spec.parallel, gpus=gpus)
    b, samples = profile(sampler, encoders, parallel)
    names = ", ".join(e.name for e in encoders)
    if system == DISTTRAIN:
        one = disttrain_encoders_sample(samples, encoders)
        cfg = search_encoders([one], encoders, parallel)[0]
        source = f"DistTrain-like N-encoder ({names}), one profiled sample {one.id}"
        return SystemSetup(encoders_layout(cfg), {}, source, profile=[one], config=cfg)
    cfg = search_encoders(samples, encoders, parallel)[0]
    source = f"N-encoder planner ({names}), b_min {b.b_min}"
    return SystemSetup(encoders_layout(cfg), {}, source, b_min=b.b_min, profile=samples, config=cfg)


@dataclass
class EncodersStepPlanner:
    """``(step, batch) -> one-iteration Plan`` with one pipeline per encoder tower, ``system``'s
    (``planning.encoders_baselines.generate_config_plan`` on the searched configuration); picklable, as
    ``plan_prefetch.StepPlanner``."""

    encoders: tuple[Encoder, ...]
    config: MultiEncoderConfig
    system: str = ENTRAIN
    layout: Layout | None = None
    """The run's layout, when the memory check changed the configuration's recomputation
    (``fit_encoders_setup``): the Plans carry it."""

    def __call__(self, step: int, batch: Sequence[SampleWork]) -> Plan:
        return self.plan([batch])

    def plan(self, batches: Sequence[Sequence[SampleWork]]) -> Plan:
        """One iteration per global batch, checked deadlock-free (``entrain.core.ir.p2p``)."""
        plan = generate_config_plan(self.system, batches, self.encoders, self.config)
        if self.layout is not None:
            plan = replace(plan, layout=self.layout)
        check_plan(plan)
        return plan


def planner_sampler(spec: RunConfig, batches: Sequence[Sequence[SampleWork]]) -> Sampler:
    """A built-in generator's: ``plan``'s and ``simulate``'s (the same draws for the same seed and
    ``--min-pixels`` / ``--max-pixels``); a
    file's: draws from the samples this run trains on (screened: ``--on-bad-sample skip`` leaves the
    bad records out of the planner's population as well)."""
    from entrain.data.generators import is_builtin
    from entrain.data.sampling import dataset_sampler

    if is_builtin(spec.data.dataset):
        return dataset_sampler(
            spec.data.dataset,
            spec.data.seed,
            image_root=spec.data.image_root,
            vision=spec.data.vision(spec.model),
        )
    return pool_sampler([w.meta if w.meta is not None else w for batch in batches for w in batch])


def make_plan(
    system: str,
    layout: Layout,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict | None = None,
) -> Plan:
    """One iteration per global batch in ``batches``, by ``system``'s batcher and generator: the same
    Plans the simulator runs (``entrain.core.systems.plan_system``), each iteration's point-to-point
    programs checked deadlock-free under NCCL's semantics (``entrain.core.ir.p2p``) before any runs, with
    the channels between replicas where the system moves encoder work across them
    (``entrain.core.systems.moves_across_replicas``; a plan that moves it without them is refused)."""
    plan = plan_system(system, layout, batches, cost, options)
    check_plan(plan, cross_replica=moves_across_replicas(system, options))
    return plan
