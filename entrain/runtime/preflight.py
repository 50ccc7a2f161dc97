"""What ``entrain train`` checks before any training process starts, in the order a user fixes it: the
run folder, a resumed run's configuration, the dataset's size, the batch against ``b_min``; and the
device and the number of processes to start. ``check_spec`` (what the runtime cannot run) runs both
before the launch and again in every worker, with the number of processes started; ``resolve_precision``
is the run's precision on its device."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from entrain.config import RunConfig
from entrain.core.costs.presets import trainable_parts
from entrain.core.errors import ConfigError
from entrain.core.ir.p2p_check import SHARED_QUEUE_ENV, rules_from_env
from entrain.core.ir.parallel import check_stage_count
from entrain.core.model.architectures import PRECISIONS
from entrain.core.systems import (
    DFLOP,
    DISTTRAIN,
    DISTTRAIN_PAPER,
    ENCODER_REBALANCE,
    ONE_F_ONE_B,
    SYSTEMS,
    get_system,
)
from entrain.runtime.planning import fixed_stages, plan_file, ranks_per_replica
from entrain.runtime.run_folder import check_run_folder, system_out

if TYPE_CHECKING:
    import torch

B_MIN_POOL = 4096


def check_before_launch(spec: RunConfig, overwrite: bool, fixed: bool) -> None:
    """Everything that can be checked before a process starts; ``fixed``: the stages are fixed by
    flags (the planner reports ``b_min`` itself otherwise)."""
    check_run_folder(spec, overwrite)
    if spec.run.resume:
        check_resume(spec)
    check_dataset_size(spec)
    refuse_shared_gpu_queue(spec.schedule.systems, device=spec.run.device)
    if fixed:
        warn_below_b_min(spec)


SHARED_QUEUE_SAFE = (ONE_F_ONE_B, DISTTRAIN, DISTTRAIN_PAPER, ENCODER_REBALANCE, DFLOP)
"""The systems whose every Plan is deadlock-free when all communicators of a GPU share one hardware
queue (``entrain.core.ir.p2p_check.NcclRules.shared_queue``; tests/core/test_p2p_nccl_rules.py replays each
system's Plans under it: the others deadlock in some layout)."""


def refuse_shared_gpu_queue(
    systems: Sequence[str], env: Mapping[str, str] = os.environ, device: str = "auto"
) -> None:
    """Refuse, before launch, a run of a system that can deadlock when ``CUDA_DEVICE_MAX_CONNECTIONS``
    is 1 (every communicator of a GPU on one queue: a send waiting for its receive holds back the
    rank's other channels); ``device``: ``--device`` (``cpu``: no GPU queue, nothing to refuse)."""
    if device == "cpu" or not rules_from_env(env).shared_queue:
        return
    unsafe = [s for s in systems if s not in SHARED_QUEUE_SAFE]
    if unsafe:
        raise ConfigError(
            f"{SHARED_QUEUE_ENV}=1 puts every communicator of a GPU on one queue, where {', '.join(unsafe)} "
            f"can deadlock; unset it (or set it above 1), or run only {', '.join(SHARED_QUEUE_SAFE)}"
        )


def check_resume(spec: RunConfig) -> None:
    """Refuse ``--resume`` into a run folder written by another configuration (before any launch)."""
    from entrain.runtime.checkpoint import check_resumable
    from entrain.runtime.checkpointer import fingerprint

    for system in spec.schedule.systems:
        check_resumable(system_out(spec, system), fingerprint(spec, system))


def check_dataset_size(spec: RunConfig) -> None:
    """Refuse a file dataset with fewer usable samples than one global batch (plus the held-out
    validation batches), before any process starts. A LLaVA/Parquet file is screened for it (under
    ``--on-bad-sample error`` a bad record stops here with the report), after the checkpoint's tokenizer
    is checked to write the model's vision tokens (``check_vision_tokens``)."""
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import (
        detect_format,
        read_raw_work_jsonl,
        read_workload_jsonl,
        resolve_dataset_file,
    )
    from entrain.runtime.run_data import screen

    if is_builtin(spec.data.dataset):
        return
    path = resolve_dataset_file(spec.data.dataset)
    fmt = detect_format(path)
    if fmt == "conversation":  # with the run's tokenizer: a record without a label token is bad
        from entrain.models.families.token_check import check_vision_tokens
        from entrain.runtime.model_source import model_config, model_family

        cfg, tokenizer = model_config(spec)
        check_vision_tokens(model_family(spec), cfg, tokenizer)
        usable = len(screen(spec, None, tokenizer=tokenizer).samples)
    elif fmt == "workload":
        metas = read_workload_jsonl(path)
        if metas and all(m.answer_tokens == 0 for m in metas):
            raise ConfigError(
                f"{path}: every sample has answer_tokens 0: no supervised (label) token, nothing to learn"
            )
        usable = len(metas)
    else:
        usable = len(read_raw_work_jsonl(path))
    held_out = spec.data.val_batches if spec.data.val_every > 0 else 0
    need = spec.parallel.global_batch * (1 + held_out)
    if usable < need:
        what = f"--global-batch {spec.parallel.global_batch}" + (
            f" and {held_out} held-out validation batch(es)" if held_out else ""
        )
        raise ConfigError(f"{path}: {usable} usable sample(s), but {what} need(s) at least {need}")


def default_world_size(spec: RunConfig) -> int:
    """Processes to start without ``--nproc``: what a plan file or fixed stages need; else 2 (the
    smallest disjoint pipeline), 1 when every system is colocated (DIP)."""
    need = world_size_of(spec)
    if need is not None:
        return need
    per_replica = 1 if all(SYSTEMS[s].colocated for s in spec.schedule.systems) else 2
    return per_replica * spec.parallel.dp_or_1 * spec.parallel.tp


def _is_conversation_file(dataset: str) -> bool:
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import detect_format

    return not is_builtin(dataset) and os.path.exists(dataset) and detect_format(dataset) == "conversation"


def warn_below_b_min(spec: RunConfig) -> int | None:
    """Warn on stderr when the per-replica batch is below ``b_min`` (Algorithm 1 under the run's cost
    model, on a pool of ``B_MIN_POOL`` samples of the dataset); returns b_min (None: not checked --
    colocated systems only, or a LLaVA/Parquet file, whose metadata pass would be a second screening)."""
    from entrain.core.costs.sampler import pool_sampler
    from entrain.core.planning.bmin import BMinConfig, below_b_min_warning, find_b_min
    from entrain.data.generators import generate_samples, is_builtin
    from entrain.data.workload_io import read_samples, resolve_dataset_file

    if all(SYSTEMS[s].colocated for s in spec.schedule.systems) or _is_conversation_file(spec.data.dataset):
        return None
    if is_builtin(spec.data.dataset):
        pool = generate_samples(
            spec.data.dataset, B_MIN_POOL, spec.data.seed, vision=spec.data.vision(spec.model)
        )
    else:
        path = resolve_dataset_file(spec.data.dataset)
        pool = read_samples(path, spec.data.vision(spec.model), image_root=spec.data.image_root)[:B_MIN_POOL]
    dp = spec.parallel.dp_or_1
    gpus = dp * ((spec.parallel.encoder_stages or 1) + (spec.parallel.llm_stages or 1))
    result = find_b_min(
        pool_sampler(pool),
        spec.model.cost_model(),
        replace(spec.parallel, gpus=gpus, dp=dp),
        BMinConfig(seed=spec.data.seed, max_batch_size=B_MIN_POOL),
    )
    warning = below_b_min_warning(spec.parallel.global_batch, dp, result.b_min)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return result.b_min


def resolve_device(requested: str, num_local_procs: int, say: bool = True) -> str:
    """The device type of this node's ``num_local_procs`` processes (``distributed.choose_device``;
    ``--device auto`` defers to ``$ENTRAIN_DEVICE``), exported as ``ENTRAIN_DEVICE`` for this process
    and those it starts; the CPU fallback's note goes to stderr when ``say``."""
    from entrain.runtime.distributed import DEVICE_ENV, node_device

    if requested == "auto":
        requested = os.environ.get(DEVICE_ENV, "auto")
    kind, note = node_device(requested, num_local_procs)
    if note and say:
        print(note, file=sys.stderr, flush=True)
    os.environ[DEVICE_ENV] = kind
    return kind


def check_spec(spec: RunConfig, world_size: int | None = None) -> None:
    """Refuse what the runtime cannot run, before any process group starts (the batch and range
    rules themselves are ``ParallelConfig``'s)."""
    par = spec.parallel
    if par.cp > 1:
        raise ConfigError(
            f"the runtime executes Plans with CP = 1; the encoder and llm have CP = {par.cp} "
            "(the planner and simulator cover it)"
        )
    from entrain.runtime.model_source import model_family, model_source
    from entrain.runtime.parallelize import check_tp

    family = model_family(spec)
    shape = family.shape(model_source(spec))
    check_tp(shape, par.tp, family)
    if par.ep_or_1 > 1:
        from entrain.runtime.expert_parallel import check_ep

        experts = getattr(shape, "num_experts", None)
        check_ep(par.ep_or_1, par.dp or par.ep_or_1, num_experts=experts, tp=par.tp or 1, fsdp=par.fsdp)
        if spec.schedule.split_weight_grads is True:
            raise ConfigError("--ep with --split-weight-grads on is not supported by the runtime; pick one")
    if spec.model.precision is not None and spec.model.precision not in PRECISIONS:
        raise ConfigError(f"--precision {spec.model.precision!r}: choose from {', '.join(PRECISIONS)}")
    _check_something_trains(spec.model.freeze)
    if par.fsdp and par.dp_or_1 < 2:
        raise ConfigError("--fsdp shards each stage over its data-parallel group: it needs --dp 2 or more")
    if par.fsdp and spec.schedule.split_weight_grads is True:
        raise ConfigError("--fsdp with --split-weight-grads on is not supported by the runtime; pick one")
    for comp, n in (("encoder", par.encoder_stages), ("llm", par.llm_stages)):
        if n is not None:
            check_stage_count(comp, n, family.layer_names(shape, comp), shape.name)
    need = world_size_of(spec)
    if world_size is not None and need is not None and need != world_size:
        raise ConfigError(_world_mismatch(spec, need, world_size))
    if world_size is not None and need is None:
        _check_planner_world(spec, world_size)


def _check_something_trains(freeze: Sequence[str]) -> None:
    if not trainable_parts(freeze):
        raise ConfigError(
            f"--freeze {','.join(freeze)} leaves no trainable parameter (the merger trains unless "
            "'encoder' is frozen, the LLM unless 'llm' is): nothing to learn; freeze fewer parts"
        )


def _check_planner_world(spec: RunConfig, world_size: int) -> None:
    """The planner needs whole replicas of at least 2 pipeline ranks (1 for DIP) on the processes,
    each pipeline rank being ``--tp`` processes."""
    dp, tp = spec.parallel.dp_or_1, spec.parallel.tp
    least = max(1 if get_system(s).colocated else 2 for s in spec.schedule.systems)
    per_replica = dp * tp
    if world_size % per_replica or world_size // per_replica < least:
        need = per_replica * max(least, -(-world_size // per_replica))
        if tp == 1:
            raise ConfigError(
                f"dp {dp} needs {need} processes, but {world_size} were started: start {need} processes "
                f"(--nproc {need}), or another multiple of {dp} with at least {least} pipeline ranks a replica"
            )
        raise ConfigError(
            f"--tp {tp} makes every pipeline rank {tp} processes: dp {dp} x {least} pipeline ranks x tp {tp} "
            f"needs {need} processes, but {world_size} were started: start {need} (--nproc {need}) or lower --tp"
        )


def _world_mismatch(spec: RunConfig, need: int, world_size: int) -> str:
    par = spec.parallel
    if spec.schedule.plan:
        return (
            f"the plan {spec.schedule.plan} runs on {need} processes, but {world_size} were started: "
            f"start {need} processes (--nproc {need})"
        )
    per = max(ranks_per_replica(spec, s) for s in spec.schedule.systems) * par.tp
    system = next(
        s for s in spec.schedule.systems if par.dp_or_1 * ranks_per_replica(spec, s) * par.tp == need
    )
    hint = (
        f"start {need} processes (--nproc {need})"
        if world_size % per
        else f"start {need} processes (--nproc {need}) or pass --dp {world_size // per}"
    )
    return (
        f"{system} with {par.encoder_stages} encoder + {par.llm_stages} LLM stages and dp {par.dp_or_1} needs "
        f"{need} processes, but {world_size} were started: {hint}"
    )


def world_size_of(spec: RunConfig) -> int | None:
    """Processes the run needs: the plan file's, or dp x ranks per replica x tp with the stage counts
    fixed by flags; None when the planner chooses the layout for the processes it is given."""
    if spec.schedule.plan:
        return plan_file(spec)[1].layout.world_size
    if not fixed_stages(spec):
        return None
    par = spec.parallel
    return max(par.dp_or_1 * ranks_per_replica(spec, s) * par.tp for s in spec.schedule.systems)


def resolve_precision(spec: RunConfig, device: torch.device) -> str:
    """``--precision``, or bf16 on CUDA and fp32 on CPU when not given. bf16 runs the forward and
    backward under ``torch.autocast`` (CPU and CUDA both support bf16 autocast); parameters,
    gradients and AdamW state stay fp32."""
    if spec.model.precision is not None:
        return spec.model.precision
    return "bf16" if device.type == "cuda" else "fp32"
