"""One ``entrain train`` process: join the process group, train every system, print the summaries,
and leave (quietly under torchrun: see ``entrain.runtime.launcher``). The planner's memory check,
the simulated choices, the N-encoder planner's profile, memory check and ``encoder towers`` decision
and ``--replan auto``'s drift monitor come from ``sim``, which the runtime does not import: they are
handed to ``entrain.runtime.session.run_systems`` from here."""

from __future__ import annotations

import argparse
import os
import tempfile

from entrain.cli.common import warn_profile_precision
from entrain.cli.train_args import infer_dp, spec_of
from entrain.core.errors import EntrainError
from entrain.runtime.launcher import quiet_exit, record_worker_error


def run_under_torchrun(spec, fixed: bool) -> int:
    """A rank of the user's own torchrun: the checks of the first round (rank 0 warns about
    ``b_min`` when the stages are fixed), the device, then the rank's run."""
    from entrain.runtime.distributed import local_process_count
    from entrain.runtime.preflight import resolve_device, warn_below_b_min
    from entrain.runtime.run_folder import check_run_folder

    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0"):
        check_run_folder(spec, spec.run.overwrite)
    if os.environ["RANK"] == "0" and fixed:
        warn_below_b_min(spec)
    resolve_device(spec.run.device, local_process_count(), say=os.environ.get("LOCAL_RANK", "0") == "0")
    return run_rank(spec, under_torchrun=True)


def as_worker(args: argparse.Namespace) -> int:
    """A torchrun worker of ``entrain.cli.launch.launch``: the parent checked the flags, the run folder
    and the dataset; an Entrain error goes to ``$ENTRAIN_ERROR_DIR`` for the parent to print once,
    and Ctrl-C ends the worker quietly (the parent reports the step)."""
    from entrain.runtime.preflight import check_spec

    try:
        infer_dp(args, int(os.environ["WORLD_SIZE"]))
        spec = spec_of(args)
        check_spec(spec, int(os.environ["WORLD_SIZE"]))  # the parent warned about b_min already
    except EntrainError as e:
        record_worker_error(e)
        quiet_exit(2)
    except KeyboardInterrupt:
        quiet_exit(130)
    try:
        return run_rank(spec, under_torchrun=True)
    except EntrainError:  # run_rank recorded it before leaving the process group
        quiet_exit(2)
    except KeyboardInterrupt:
        quiet_exit(130)
    return 0


def _memory_check(system: str, setup, batches, cost, margin: float | None = None):
    """The planned setup after ``plan``'s and ``simulate``'s memory check (``sim.memory_fit.deploy``)."""
    from entrain.sim.memory_fit import deploy

    return deploy(system, setup, batches, cost, margin=margin)[0]


def _warn_profile_precision(spec, device) -> str | None:
    """The one-line warning of a ``--profile`` timed in another precision than this run's effective
    ``--precision`` (``preflight.resolve_precision`` on the device the process group runs on)."""
    from entrain.core.costs.costmodel import CostModel
    from entrain.runtime.preflight import resolve_precision

    path = spec.model.profile
    if not path:
        return None
    precision = resolve_precision(spec, device)
    run = f"this run on {device.type} (--precision {spec.model.precision or 'default'})"
    return warn_profile_precision("train", path, CostModel.load(path), precision, run)


def _encoders_profile(sampler, encoders, parallel):
    """The N-encoder planner's profile (Algorithm 1 with several encoders), as in ``simulate``."""
    from entrain.sim.encoders_run import encoders_profile

    return encoders_profile(sampler, encoders, parallel)


def _encoders_fit(plan, encoders):
    """The layout of a plan with one pipeline per encoder tower after ``simulate``'s memory check."""
    from entrain.sim.encoders_run import fit_recompute

    return fit_recompute(plan, encoders).layout


def _encoders_towers(spec, sampler, cost, one, req, gpus):
    """Entrain's ``encoder towers`` decision (and its N-encoder path's ``microbatch count``) on ``plan``'s
    draws, as ``plan`` makes it (``sim.towers.entrain_towers``); None where no plan with one pipeline per
    tower can be built."""
    from dataclasses import replace

    from entrain.core.costs.memory import MEMORY_CHECK_ITERATIONS
    from entrain.runtime.planning import run_encoders
    from entrain.sim.towers import entrain_towers

    made = entrain_towers(
        sampler, cost, run_encoders(spec), replace(spec.parallel, gpus=gpus), one, seed=spec.data.seed,
        iterations=MEMORY_CHECK_ITERATIONS, margin=req.margin,
    )  # fmt: skip
    return None if made is None else made[0]


def _judge_factory(sampler, cost, req):
    """Entrain's automatic choices decided by simulation, as in ``plan`` and ``simulate``."""
    from entrain.sim.choose import candidate_judge

    return candidate_judge(sampler, cost, req)


def _monitor_factory(spec, system, setup, cost, batches):
    """``--replan auto``'s drift monitor of ``system`` (``entrain.sim.adaptive.monitor_for``, as in
    ``simulate``); None for a system it does not re-plan."""
    from entrain.runtime.planning import planner_sampler
    from entrain.sim.adaptive import REPLAN_SYSTEMS, monitor_for

    if system not in REPLAN_SYSTEMS:
        return None
    req = spec.config_request(setup.layout.world_size * spec.parallel.tp)  # every process: a re-plan's GPUs
    return monitor_for(
        system, setup, req, cost, planner_sampler(spec, batches), total_iterations=spec.run.steps,
        settings=spec.schedule.replan_settings(),
    )  # fmt: skip


def _join(spec, under_torchrun: bool):
    """This process's process group: torchrun's, or a group of one on a file store."""
    from entrain.runtime.distributed import init_distributed

    if under_torchrun:
        return init_distributed(timeout_s=spec.run.timeout_s)
    store = tempfile.mkdtemp(prefix="entrain-store-")
    return init_distributed(
        timeout_s=spec.run.timeout_s, rank=0, world_size=1, init_method=f"file://{store}/store"
    )


def run_rank(spec, under_torchrun: bool) -> int:
    """Train every system on this rank; rank 0 prints the summaries (and the skipped-records line)."""
    import torch

    from entrain.runtime.cpu_allocator import keep_freed_memory
    from entrain.runtime.distributed import set_deterministic, shutdown
    from entrain.runtime.launcher import leave_for_replan
    from entrain.runtime.replan import ReplanRequested
    from entrain.runtime.run_metrics import summary_line
    from entrain.runtime.session import run_systems

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    keep_freed_memory()
    set_deterministic(spec.run.deterministic)
    env = _join(spec, under_torchrun)
    if env.rank == 0:
        _warn_profile_precision(spec, env.device)
    try:
        replan = {"monitor_factory": _monitor_factory} if spec.schedule.replan == "auto" else {}
        summaries = run_systems(
            spec, env, memory_check=_memory_check, judge_factory=_judge_factory,
            encoders_profile=_encoders_profile, encoders_fit=_encoders_fit, encoders_towers=_encoders_towers,
            **replan,
        )  # fmt: skip
    except ReplanRequested:
        leave_for_replan(under_torchrun)
    except BaseException as e:
        import torch.distributed as dist

        if under_torchrun and isinstance(e, EntrainError):
            record_worker_error(e)
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    if env.rank == 0:
        for s in summaries:
            print(summary_line(s), flush=True)
        skipped = next((s.skipped for s in summaries if s.skipped), None)
        if skipped:
            print(skipped, flush=True)
    shutdown()
    if under_torchrun:  # everything is written and the group is destroyed: leave at once
        quiet_exit(0)
    return 0
