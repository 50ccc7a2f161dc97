"""``entrain plan``: macroscopic planning (docs/contract.md ``entrain plan``).

Algorithm 1 finds ``b_min``, the smallest profiling batch size whose encoder:LLM GPU split is the
same in ``k = ceil(ln(alpha)/ln(1-p_error))`` validation draws (trial table like paper Tables 2,
5-11); Algorithm 2 then searches the static configuration (DP, per-component TP x CP x PP, layer
ranges per stage) from the ``b_min`` reference batch and predicts the iteration time (paper Eq. 2,
forward + backward stage times, K = B / (dp * U)).

Profiling batches are i.i.d. draws with replacement (``entrain.data.sampling.dataset_sampler``, the
sampler ``simulate`` and ``bench`` use too): from the built-in generator's first 2^16 samples of
``--seed``, or from a file's samples. Two GPU splits whose deployed configurations have Eq. 2 times
within ``--tolerance`` count as the same, and the search stops at ``--global-batch``
(docs/planner.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass

from entrain.cli.common import (
    add_common_args,
    add_entrain_extension_args,
    add_shared_flags,
    apply_paper_entrain,
    config_sampler,
    emit_json,
    warn_profile_precision,
)
from entrain.cli.config_file import add_config_arg
from entrain.config import RunConfig
from entrain.core.costs.memory import check_batches
from entrain.core.costs.sampler import Sampler
from entrain.core.errors import ConfigError
from entrain.core.model.architectures import default_precision
from entrain.core.planning.bmin import EQ2_TOLERANCE, BMinConfig
from entrain.core.planning.entry import PlanResult, plan
from entrain.core.planning.plan_file import CHECKPOINT_FLAGS, checkpoint_fingerprints
from entrain.core.planning.setups import (
    SystemSetup,
    entrain_setup,
    entrain_variant,
    setup_to_json,
    system_setups,
)
from entrain.core.planning.system_setup import Decision
from entrain.core.systems import CONFIG_ENTRAIN, ENTRAIN, SYSTEMS, get_system
from entrain.core.workers import worker_processes
from entrain.sim.choose import candidate_judge
from entrain.sim.memory_fit import deploy
from entrain.sim.towers import TOWERS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="find b_min (Algorithm 1) and the static parallel configuration (Algorithm 2)",
        description=__doc__.split("\n\n")[0],
    )
    add_common_args(p, "plan")
    add_shared_flags(p, "plan", "ep")
    add_config_arg(p)
    p.add_argument("--alpha", type=float, default=0.05, help="1 - confidence of the stability test")
    p.add_argument("--p-error", type=float, default=0.05, help="tolerated probability of a different split")
    p.add_argument(
        "--n0",
        type=int,
        default=4,
        help="first profiling batch size (doubles until stable, at most --global-batch)",
    )
    p.add_argument("--tolerance", type=float, default=EQ2_TOLERANCE,
                   help="GPU splits whose deployed configurations' Eq. 2 times differ by at most this "
                        f"fraction count as the same (default {EQ2_TOLERANCE:g}; 0 = same Eq. 2 time)")  # fmt: skip
    add_shared_flags(p, "plan", "cp")
    p.add_argument("--sizes", default="", help="extra batch sizes to test, e.g. 1,4,16,64,256")
    add_shared_flags(p, "plan", "freeze")
    p.add_argument(
        "--system",
        default=ENTRAIN,
        choices=tuple(SYSTEMS),
        help="the system whose layout and schedule options the plan carries (entrain train --plan runs it)",
    )
    add_entrain_extension_args(p)
    add_shared_flags(p, "plan", "jobs")
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="also write the JSON object (with the system's layout) to FILE, for entrain train --plan FILE",
    )
    p.set_defaults(func=run)


def _warn_profile_precision(config: RunConfig, cost) -> str | None:
    """Warn when ``--profile`` was timed in another precision than ``entrain train`` computes in by
    default on the device the profile was measured on (bf16 on CUDA, fp32 on CPU)."""
    device = str(cost.notes.get("device", "cpu")).split(":")[0]
    run = f"entrain train on {device} (its default --precision)"
    return warn_profile_precision("plan", config.model.profile, cost, default_precision(device), run)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--sizes must be a comma list of integers, got {text!r}") from None
    if any(s < 1 for s in sizes):
        raise ConfigError(f"--sizes must be positive, got {text!r}")
    return sizes


@dataclass(frozen=True)
class PlanRequest:
    """What ``entrain plan`` does: the run's configuration and plan's own flags (read once, in ``run``)."""

    config: RunConfig
    iterations: int
    alpha: float
    p_error: float
    n0: int
    tolerance: float
    sizes: tuple[int, ...] = ()
    out: str | None = None
    json: bool = False
    jobs: int = 1

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PlanRequest:
        apply_paper_entrain(args)
        own = (args.iterations, args.alpha, args.p_error, args.n0, args.tolerance, tuple(_sizes(args.sizes)))
        out, json, jobs = args.out, args.json, args.jobs
        config = RunConfig.from_args(args)  # the flags' rules (batch divisibility, degrees), before any work
        return cls(config, *own, out=out, json=json, jobs=jobs)


POOLED_GLOBAL_BATCH = 2048
"""``--jobs`` applies from this global batch on: below it a plan takes seconds, and forking the workers
(tens of ms a call, caches refilled per worker) cost more than it saved (the paper-scale default
plan: 2 s more CPU and no less wall)."""


def run(args: argparse.Namespace) -> int:
    req = PlanRequest.from_args(args)
    with worker_processes(req.jobs if req.config.parallel.global_batch >= POOLED_GLOBAL_BATCH else 1):
        return plan_command(req)


def plan_command(req: PlanRequest) -> int:
    """Algorithms 1 and 2, the system's setup and its memory check; printed, ``--json`` or ``--out``."""
    config, par = req.config, req.config.parallel
    cost = config.model.cost_model(config.model.freeze)  # a profile refuses --freeze here
    _warn_profile_precision(config, cost)
    sampler = config_sampler(config)
    if par.tp < 0 or par.cp < 0:
        raise ConfigError("--tp and --cp must be >= 0 (0 = search)")
    bmin = BMinConfig(req.alpha, req.p_error, req.n0, seed=config.data.seed, extra_sizes=tuple(req.sizes))
    searched = dataclasses.replace(par, tp=par.tp or None, cp=par.cp or None)  # 0: searched
    result = plan(sampler, cost, searched, bmin, tolerance=req.tolerance)
    if not result.b_min.converged:
        print(
            f"entrain plan: warning: Algorithm 1 did not converge: {result.b_min.reason}; "
            "the static configuration is not guaranteed stable across iterations",
            file=sys.stderr,
        )
    setup = _setup(req, result, sampler, cost)
    apart = _baseline_towers(req, sampler, cost) if setup is None else None
    towers = None
    if apart is not None:  # a baseline with one group per tower, as train plans it
        setup, run = apart
    else:
        setup = setup or _one_encoder_setup(req, result, sampler, cost)
        checks, margin = _check_batches(req, sampler, cost, setup), config.config_request().margin
        try:
            shared, no_fit = deploy(config.schedule.systems[0], setup, checks, cost, margin=margin), None
        except ConfigError as e:  # Entrain's one-line error when nothing fits: one pipeline per tower may
            shared, no_fit = None, e
        towers = _towers(req, searched, sampler, checks, shared)
        if towers is None and no_fit is not None:
            raise no_fit
        setup, run = towers or shared
    obj = {
        **to_json(result, req, cost.model, cost.hardware.name),
        **_setup_json(config.schedule.systems[0], setup, run, cost),
    }
    if req.out:
        _write(req.out, obj)
    if req.json:
        emit_json(obj)
    else:
        print_human(result, cost.model, cost.hardware.name, config.data.dataset)
        print(f"{obj['system']}: {obj['source']}")
        if towers is not None:
            d = setup.decisions[-1]
            print(
                f"{ENTRAIN}: {TOWERS}: {d.chosen} ({', '.join(f'{n} {_ms(d, n)}' for n in d.candidates)}); "
                f"this plan is the one with {d.chosen}"
            )
        if req.out:
            print(f"wrote {req.out} (entrain train --plan {req.out})")
    return 0


def _setup(req: PlanRequest, result: PlanResult, sampler: Sampler, cost) -> SystemSetup | None:
    """``--system``'s setup: Entrain's from this result with the extensions asked for, a baseline's
    chosen its own way (None for a baseline that ``train`` plans with one group per encoder tower:
    ``_baseline_towers``), on which ``plan_command`` then runs the simulated memory check like
    ``simulate`` (recomputation where a rank overflows; Entrain's one-line error when nothing fits) on
    ``_check_batches``."""
    from entrain.runtime.planning import plans_towers

    config = req.config
    system = config.schedule.systems[0]
    if (
        system != ENTRAIN
        and plans_towers(system, config, config.parallel.gpus, _encoders_profile) is not None
    ):
        return None
    return _one_encoder_setup(req, result, sampler, cost)


def _check_batches(req: PlanRequest, sampler: Sampler, cost, setup: SystemSetup) -> list:
    """The global batches the memory check of ``setup`` deploys on (``costs.memory.check_batches``: the
    rule ``train`` checks the same setup by, ``--iterations`` at most)."""
    config = req.config
    return check_batches(
        sampler, cost, setup.layout, config.parallel.global_batch, config.data.seed, req.iterations
    )


def _one_encoder_setup(req: PlanRequest, result: PlanResult, sampler: Sampler, cost) -> SystemSetup:
    """``--system``'s setup on the one-encoder path (both towers of a model with several in the first stages)."""
    config = req.config
    system, seed = config.schedule.systems[0], config.data.seed
    spec = get_system(system)
    setup_req = dataclasses.replace(
        config.config_request(), dp=config.parallel.dp or result.config.dp, tp=result.config.encoder.tp
    )
    if spec.config != CONFIG_ENTRAIN:  # its DP chosen its own way (--dp where given), as train plans it
        own = dataclasses.replace(setup_req, dp=config.parallel.dp)
        return system_setups([system], own, cost, sampler)[system]
    setup = entrain_setup(result, sampler, cost, seed)
    if spec.extensions:
        setup = entrain_variant(setup, setup_req, cost, candidate_judge(sampler, cost, setup_req))
    return setup


def _setup_json(system: str, setup: SystemSetup, run, cost) -> dict:
    """The plan-file keys of the setup (``entrain.core.planning.setups.setup_to_json``: with one pipeline
    per encoder, each encoder's stages and the LLM's, the microbatch count in its schedule options),
    whether its run fits memory, and ``decisions``: every automatic choice with its candidates' times."""
    decisions = [d.to_json() for d in setup.decisions]
    if not setup.layout.multi_encoder:
        setup = dataclasses.replace(setup, layout=cost.layout_with_parts(setup.layout))  # the family's parts
    return {**setup_to_json(system, setup), "fits_memory": run.metrics.fits_memory, "decisions": decisions}


def _ms(d: Decision, name: str) -> str:
    ms = d.candidates[name]
    return "does not fit" if ms == float("inf") else f"{ms:.1f} ms"


def _towers(req: PlanRequest, parallel, sampler: Sampler, checks: list, shared: tuple | None) -> tuple | None:
    """Entrain on a model with several encoder towers (``runtime.planning.run_encoders``): its setup and
    run after the ``encoder towers`` decision (``sim.towers.choose_towers``, the rule ``simulate`` and
    ``train`` apply) between its plan with one pipeline per tower and ``shared`` (this plan, both towers
    in the first stages, after the memory check; None: it fits nowhere), both on the memory check's
    batches ``checks``. None
    for another system or model, or where no plan with one pipeline per tower can be built."""
    from entrain.runtime.planning import run_encoders
    from entrain.sim.towers import choose_towers

    config = req.config
    encoders = run_encoders(config) if config.schedule.systems[0] == ENTRAIN else None
    if encoders is None:
        return None
    unbuilt: dict[str, str] = {}
    made = choose_towers(sampler, encoders, parallel, checks, shared, config.config_request().margin, unbuilt)
    if made is None and ENTRAIN in unbuilt:
        print(f"entrain plan: one pipeline per encoder: {unbuilt[ENTRAIN]}", file=sys.stderr)
    return made


def _encoders_profile(sampler: Sampler, encoders, parallel):
    """The N-encoder planner's profile (``sim.encoders_run.encoders_profile``), as ``train`` hands it in."""
    from entrain.sim.encoders_run import encoders_profile

    return encoders_profile(sampler, encoders, parallel)


def _baseline_towers(req: PlanRequest, sampler: Sampler, cost) -> tuple | None:
    """A baseline's setup and run with one group per encoder tower where ``train`` plans one
    (``runtime.planning.encoders_setup``, the rule ``train`` applies: DistTrain-like on a model with
    several towers and a GPU per tower and for the LLM in a replica), its layout memory-fitted as
    ``train`` fits it (``runtime.planning.fit_towers_setup`` with ``simulate``'s ``fit_recompute``, on
    the draws of ``--iterations``); None otherwise."""
    from entrain.runtime.planning import encoders_setup, fit_towers_setup
    from entrain.sim.encoders_run import fit_recompute

    config = req.config
    system = config.schedule.systems[0]
    setup = encoders_setup(system, config, sampler, config.parallel.gpus, _encoders_profile)
    if setup is None:
        return None
    runs = []

    def fit(plan, encoders):
        runs.append(fit_recompute(plan, encoders))
        return runs[-1].layout

    return fit_towers_setup(config, system, setup, sampler, cost, fit, req.iterations), runs[-1]


def _write(path: str, obj: dict) -> None:
    import json
    import os

    folder = os.path.dirname(path)
    try:
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)
    except OSError as e:
        raise ConfigError(f"--out {path}: cannot write it ({e.strerror})") from None


def to_json(result: PlanResult, req: PlanRequest, model: str, hardware: str) -> dict:
    b, cfg = result.b_min, result.config
    vision = req.config.data.vision(req.config.model)
    return {
        "b_min": b.b_min,
        "k_trials": b.k_trials,
        "trials": [t.to_json() for t in b.trials],
        "config": cfg.to_json(),
        "predicted_iteration_time_ms": cfg.predicted_iteration_time_ms,
        "converged": b.converged,
        "reason": b.reason,
        "tolerance": b.tolerance,
        "max_batch_size": b.max_batch_size,
        "allocation": list(b.allocation),
        "gpus_per_replica": b.gpus_per_replica,
        "dataset": req.config.data.dataset,
        "model": model,
        **_model_source(req.config),
        "min_pixels": vision.min_pixels,
        "max_pixels": vision.max_pixels,
        "hardware": hardware,
        "gpus": req.config.parallel.gpus,
        "global_batch": req.config.parallel.global_batch,
        "alpha": b.alpha,
        "p_error": b.p_error,
        "n0": b.n0,
        "seed": b.seed,
    }


MODEL_SOURCE_FLAGS = CHECKPOINT_FLAGS
"""The checkpoint folders a plan records (``model_source``) so that ``train --plan`` finds the model
the plan was made for without the flags again."""


def _model_source(config: RunConfig) -> dict:
    """``{"model_source": {flag dest: absolute folder}, "checkpoint_fingerprint": {flag dest: sha256}}``
    of the checkpoint flags given ({}: a preset): ``train --plan`` refuses a folder whose content differs."""
    given = {k: getattr(config.model, k) for k in MODEL_SOURCE_FLAGS if getattr(config.model, k)}
    if not given:
        return {}
    folders = {k: os.path.abspath(v) for k, v in given.items()}
    return {"model_source": folders, "checkpoint_fingerprint": checkpoint_fingerprints(folders)}


def print_human(result: PlanResult, model: str, hardware: str, dataset: str) -> None:
    b, cfg = result.b_min, result.config
    print(f"entrain plan: {dataset} on {model} / {hardware}")
    print(
        f"Algorithm 1: alpha {b.alpha:g}, p_error {b.p_error:g} -> k = {b.k_trials} validation batches; "
        f"{b.gpus_per_replica} GPUs per replica (dp {cfg.dp})"
    )
    print(f"  {'batch size':>10}  {'encoder:LLM GPUs seen':<32} {'stable':<7} Eq. 2 gap")
    for t in b.trials:
        seen = ", ".join(f"{e}:{m}" for e, m in t.allocations_seen)
        gap = "-" if t.allocation_stable else f"{t.eq2_gap:.2%}"
        print(f"  {t.batch_size:>10}  {seen:<32} {'yes' if t.stable else 'no':<7} {gap}")
    note = "" if b.converged else f" (not converged: {b.reason})"
    print(f"b_min = {b.b_min}{note}; split {b.allocation[0]}:{b.allocation[1]}")
    print(
        f"Algorithm 2: dp {cfg.dp}, microbatch size {cfg.microbatch_size}, "
        f"K = {cfg.num_microbatches} microbatches per replica"
    )
    for comp in (cfg.encoder, cfg.llm):
        print(f"  {comp.name}: tp {comp.tp} cp {comp.cp} pp {comp.pp}")
        for s, ((f, e), ms) in enumerate(zip(comp.layer_ranges, comp.stage_ms)):
            names = comp.layer_names
            span = names[f] if e - f == 1 else f"{names[f]}..{names[e - 1]}"
            print(f"    stage {s}: layers [{f}, {e}) {span:<28} {ms:10.1f} ms")
    print(f"predicted iteration time (paper Eq. 2): {cfg.predicted_iteration_time_ms:.1f} ms")
