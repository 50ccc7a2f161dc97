"""``entrain train``: train a vision-language model with a system's Plans on torch.distributed.

Launch as ``torchrun --standalone --nproc-per-node N -m entrain train ...`` or let ``--nproc N`` start
torchrun. ``--plan FILE`` (``entrain plan --out FILE``) runs exactly that plan. Otherwise each system's
layout comes from the planner, as ``entrain simulate`` chooses it for the processes started, or from
``--encoder-stages`` / ``--llm-stages`` when given. ``--system`` takes one system or a comma list (each
trained in turn, fresh model, run folder ``OUT/<system>``); rank 0 then prints one summary line per
system on stdout. ``--demo`` is the README main job: the tiny VLM on ``skewed`` with ``entrain`` then
``1f1b`` on 2 processes (1 encoder + 1 LLM stage).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from entrain.cli.common import (
    add_attention_arg,
    add_entrain_extension_args,
    add_model_source_args,
    add_pixel_args,
    add_precision_arg,
    add_shared_flags,
    apply_paper_entrain,
    warn_profile_precision,
)
from entrain.cli.config_file import add_config_arg
from entrain.cli.plan_flags import apply_plan
from entrain.config import RunConfig
from entrain.core.errors import ConfigError, EntrainError
from entrain.core.systems import ENTRAIN, SYSTEMS, parse_systems

DEMO = {
    "model": "tiny",
    "dataset": "skewed",
    "system": "entrain,1f1b",
    "encoder_stages": 1,
    "llm_stages": 1,
    "nproc": 2,
    "global_batch": 16,
    "microbatch_size": 1,
    "steps": 8,
    "lr": 3e-3,
    "out": "runs/demo",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train a VLM with a system's Plans (torchrun)", description=__doc__
    )
    add_shared_flags(p, "train", "dataset", "image_root", "model", "hardware", "profile")
    add_attention_arg(p)
    p.add_argument(
        "--system",
        default=ENTRAIN,
        help=f"one of {', '.join(SYSTEMS)}, or a comma list trained in turn (OUT/<system>); --plan sets it",
    )
    p.add_argument(
        "--plan",
        default=None,
        metavar="FILE",
        help="run exactly this plan (entrain plan --out FILE): its system, stages and layer ranges, boundary "
        "sharing, microbatch size, global batch and schedule options; its model, dataset and pixel limits "
        "apply, and a flag that contradicts the plan is an error",
    )
    p.add_argument(
        "--allow-other-dataset",
        action="store_true",
        help="with --plan: run the plan on a --dataset other than the one it was made for",
    )
    p.add_argument(
        "--encoder-stages",
        type=int,
        default=None,
        help="fix the encoder's pipeline stages (default: chosen by the planner, as entrain simulate does)",
    )
    p.add_argument(
        "--llm-stages",
        type=int,
        default=None,
        help="fix the LLM's pipeline stages (default: chosen by the planner, as entrain simulate does)",
    )
    _add_degree_args(p)
    _add_batch_and_optimiser_args(p)
    _add_stock_model_args(p)
    _add_run_control_args(p)
    p.set_defaults(func=run)
    _DEFAULTS.update({a.dest: a.default for a in p._actions})
    _ACTIONS[:] = [a for a in p._actions if a.option_strings and a.dest != "help"]


def _add_degree_args(p: argparse.ArgumentParser) -> None:
    add_shared_flags(p, "train", "dp", "tp")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard each stage's parameters, gradients and AdamW state over its data-parallel group "
        "(FSDP2; needs --dp 2 or more) instead of all-reducing whole gradients",
    )
    add_shared_flags(p, "train", "cp")


def _add_batch_and_optimiser_args(p: argparse.ArgumentParser) -> None:
    add_shared_flags(p, "train", "global_batch", "microbatch_size")
    p.add_argument("--steps", type=int, default=10, help="optimiser steps")
    add_shared_flags(p, "train", "seed", "shuffle")
    p.add_argument("--out", default="runs/train", help="run folder")
    p.add_argument(
        "--lr", type=float, default=1e-3, help="AdamW peak learning rate (cosine decay after warm-up)"
    )
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    p.add_argument("--betas", default="0.9,0.95", help="AdamW beta1,beta2")
    p.add_argument("--warmup-steps", type=int, default=2, help="linear learning-rate warm-up steps")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping; 0 disables")
    p.add_argument("--val-every", type=int, default=0, help="validation loss every N steps (0: never)")
    p.add_argument("--val-batches", type=int, default=1, help="held-out global batches per validation")
    add_shared_flags(p, "train", "freeze")
    p.add_argument("--weights", default=None, help="local weights folder (default: random init from --seed)")


def _add_stock_model_args(p: argparse.ArgumentParser) -> None:
    """Stock Hugging Face folders, their tokenizer, image limits, precision and the run's records."""
    add_model_source_args(p)
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="tokenizer folder (AutoTokenizer) of a stock --llm-model (default: the LLM folder's own)",
    )
    add_pixel_args(p)
    add_precision_arg(
        p,
        "bf16: bf16 autocast compute with fp32 master weights and AdamW state (default: bf16 on CUDA, "
        "fp32 on CPU)",
    )
    p.add_argument(
        "--tensorboard", action="store_true", help="write TensorBoard event files under OUT/tensorboard/"
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="write OUT/trace.json: Chrome trace events of every rank's compute and communication actions",
    )
    add_config_arg(p)


def _add_run_control_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--on-bad-sample",
        choices=("error", "skip"),
        default="error",
        help="a LLaVA/Parquet dataset's bad records: stop before training with the report (error), or "
        "train on the rest and list them in OUT/skipped.jsonl (skip)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save a checkpoint every N steps in OUT/checkpoints (0: only the final one)",
    )
    p.add_argument("--keep-checkpoints", type=int, default=3, help="complete checkpoints kept (newest)")
    _add_schedule_args(p)
    _add_run_folder_args(p)


def _add_schedule_args(p: argparse.ArgumentParser) -> None:
    from entrain.cli.replan_flags import add_replan_args

    add_entrain_extension_args(p)
    add_replan_args(p)


def _add_run_folder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest complete checkpoint (same flags; --steps may grow)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run an existing --out holds (without it, or --resume, such a folder is refused)",
    )
    p.add_argument(
        "--confine-images",
        action="store_true",
        help="an image path resolving outside the dataset root makes its record bad (default: a warning)",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="longest wait of any collective or point-to-point transfer before the ranks fail with an error",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="start torchrun with this many local processes (default: what the layout needs)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_device_args(p)
    p.add_argument(
        "--demo",
        action="store_true",
        help="README main job: tiny on skewed, entrain then 1f1b, 2 processes (flags still override)",
    )


def _add_device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: one GPU per process (NCCL) when the node has enough, else CPU + gloo with a note; cuda: "
        "refuse a node with fewer GPUs than processes; cpu: CPU + gloo (default: auto, or $ENTRAIN_DEVICE)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="torch's deterministic algorithms in every process (bitwise-equal resume on GPU; slower)",
    )


_DEFAULTS: dict = {}
_ACTIONS: list[argparse.Action] = []


def _spec(args: argparse.Namespace) -> RunConfig:
    """The run's configuration from the flags; with ``--plan``, the plan file's system, batch sizes and
    layout replace the flags'."""
    apply_paper_entrain(args)
    _tensorboard(args.tensorboard)
    if args.plan:
        worker = os.environ.get("RANK", "0") != "0" or bool(os.environ.get(ERROR_DIR_ENV))
        apply_plan(args, _DEFAULTS, _ACTIONS, quiet=worker)
    if args.fsdp and args.split_weight_grads == "on":  # the runtime does not split FSDP backwards
        if os.environ.get("RANK", "0") == "0" and not os.environ.get(ERROR_DIR_ENV):  # once, by the launcher
            print(
                "entrain train: note: --fsdp runs whole backwards (--split-weight-grads off)", file=sys.stderr
            )
        args.split_weight_grads = "off"
    flags = run_flags(args)
    spec = RunConfig.from_args(args)  # no flag is read from args after this line (the config has them all)
    if spec.schedule.plan:
        from entrain.runtime.planning import plan_file

        system, setup = plan_file(spec)
        layout = setup.layout
        spec = replace(
            spec,
            parallel=replace(
                spec.parallel,
                dp=layout.dp,
                tp=layout.components["encoder"].tp,
                cp=layout.components["encoder"].cp,
                encoder_stages=None,
                llm_stages=None,
                global_batch=layout.global_batch,
                microbatch_size=layout.microbatch_size,
            ),
            schedule=replace(spec.schedule, systems=(system,)),
        )
    return replace(spec, run=replace(spec.run, flags=flags))


def _tensorboard(wanted: bool) -> bool:
    """``--tensorboard``, refused before any launch when the package is missing."""
    if wanted:
        from entrain.runtime.tensorboard import check_tensorboard

        check_tensorboard()
    return wanted


NOT_RECORDED = {
    "nproc": "the launcher's own: the workers it starts are the processes",
    "demo": "its values are recorded as the flags it sets",
    "config": "the file's values are recorded as the flags they set",
    "paper_entrain": "recorded as the four extension flags it sets",
}
"""``train`` flags that ``config.json`` does not record (every other flag is: ``run_flags``), and why."""

NOT_IN_CONFIG = {
    **dict.fromkeys(
        ("nproc", "demo", "config", "paper_entrain"), "a launcher flag: its effect is other flags"
    ),
    "allow_other_dataset": "with --plan: the dataset actually run is fingerprinted (--dataset)",
}
"""``train`` flags without a ``RunConfig`` field (so outside the resume fingerprint), and why."""


def run_flags(args: argparse.Namespace) -> dict:
    """The resolved flags of a run (what config.json records for ``--config``)."""
    return {a.dest: getattr(args, a.dest) for a in _ACTIONS if a.dest not in NOT_RECORDED}


def recorded_flags(spec: RunConfig) -> argparse.Namespace:
    """The run's flags as ``config.json`` records them (``spec.run.flags``), the others at their
    defaults: what the launcher forwards to its workers."""
    return argparse.Namespace(**{**_DEFAULTS, **spec.run.flags})


def _apply_demo(args: argparse.Namespace, defaults: dict) -> None:
    """Demo values for every flag the user left at its default."""
    for key, value in DEMO.items():
        if getattr(args, key) == defaults.get(key):
            setattr(args, key, value)


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The resolved flags (every one that differs from its default), spelled out for the torchrun
    children, which build the same ``RunConfig`` from them."""
    out = []
    for action in _ACTIONS:
        value = getattr(args, action.dest)
        if value == action.default or action.dest == "nproc":
            continue
        flag = action.option_strings[0]
        out += [flag] if action.nargs == 0 else [flag, str(value)]
    return out


ERROR_DIR_ENV = "ENTRAIN_ERROR_DIR"
"""Set by the parent for its torchrun workers: each writes its Entrain error message to
``rank<N>.txt`` there instead of stderr, and the parent prints each distinct message once."""


def _launch(args: argparse.Namespace, spec, nproc: int) -> int:
    from entrain.cli.launch import ERROR_EXIT, INTERRUPTED_EXIT
    from entrain.runtime.replan import REPLAN_EXIT

    cmd = [
        sys.executable,
        "-m",
        "entrain.cli.launch",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "entrain",
        "train",
        *_child_argv(args),
    ]
    errors = tempfile.mkdtemp(prefix="entrain-errors-")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # a fresh rendezvous store per restart round: the shared agent store keeps the previous round's
    # gloo addresses, which a restarted group then tries to connect to
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env[ERROR_DIR_ENV] = errors
    proc = subprocess.Popen(cmd, env=env)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: let torchrun stop the workers
        proc.wait()
        rc = INTERRUPTED_EXIT
    try:
        messages = _worker_errors(errors)
    finally:
        shutil.rmtree(errors, ignore_errors=True)
    if rc == REPLAN_EXIT and not messages:  # a re-plan checkpointed: the group again, on the new layout
        return _launch(relaunch_args(args, spec), spec, nproc)
    if rc == 0:
        return 0
    if rc == INTERRUPTED_EXIT:
        print(interrupted_line(spec), file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    for message in messages:
        print(f"entrain train: error: {message}", file=sys.stderr, flush=True)
    if not messages:
        print(
            f"entrain train: error: a training process failed with exit status {rc} (its output is above)",
            file=sys.stderr,
            flush=True,
        )
    return ERROR_EXIT if messages else rc


def relaunch_args(args: argparse.Namespace, spec) -> argparse.Namespace:
    """The flags of the worker group after a re-plan (``entrain.runtime.replan``): the new plan file,
    resumed from the re-plan's checkpoint (resharded onto the new layout)."""
    from entrain.runtime.replan import read_state
    from entrain.runtime.session import system_out

    state = read_state(system_out(spec, spec.schedule.systems[0]))
    if state is None:
        raise EntrainError(f"a worker asked for a re-plan but {spec.run.out} holds no re-plan state")
    print(
        f"entrain train: re-plan after step {state['step'] - 1}: restarting on {state['plan']}",
        file=sys.stderr,
        flush=True,
    )
    return argparse.Namespace(
        **{**vars(args), "plan": state["plan"], "resume": True, "overwrite": False,
           "encoder_stages": None, "llm_stages": None, "dp": None},
    )  # fmt: skip


def _worker_errors(folder: str) -> list[str]:
    """The first error a worker wrote (the cause; a peer's failure follows it), with a count of the
    later distinct ones on the same line."""
    out: dict[str, None] = {}
    for name in sorted(os.listdir(folder), key=lambda n: int(n.split("-")[0])):  # time_ns-rank<N>.txt
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            out[f.read().strip()] = None
    messages = [m for m in out if m]
    if len(messages) > 1:
        return [f"{messages[0]} (then {len(messages) - 1} later error(s) on other ranks)"]
    return messages


def interrupted_line(spec) -> str:
    """``interrupted at step N; continue with --resume``: N = the steps the interrupted system completed
    (rows in its ``metrics.jsonl``)."""
    from entrain.runtime.session import system_out

    done = 0
    for system in spec.schedule.systems:
        path = os.path.join(system_out(spec, system), "metrics.jsonl")
        try:
            with open(path, encoding="utf-8") as f:
                done = sum(1 for line in f if line.strip())
        except OSError:
            done = 0
        if done < spec.run.steps:
            break
    return f"interrupted at step {done}; continue with --resume"


RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
"""What makes a folder hold a run."""


def check_run_folder(spec, overwrite: bool) -> None:
    """Refuse an ``--out`` that holds a run, unless ``--resume`` continues it or ``--overwrite``
    replaces it (a second run must not delete the first one's checkpoints by accident)."""
    if spec.run.resume or overwrite:
        return
    from entrain.runtime.session import system_out

    for out in dict.fromkeys([spec.run.out, *(system_out(spec, s) for s in spec.schedule.systems)]):
        held = [m for m in RUN_MARKERS if os.path.exists(os.path.join(out, m))]
        if held:
            raise ConfigError(
                f"--out {out} holds a run ({', '.join(held)}): pass --resume to continue it, --overwrite to "
                "replace it, or choose another --out"
            )


def check_dataset_size(spec) -> None:
    """Refuse a file dataset with fewer usable samples than one global batch (plus the held-out
    validation batches), before any process starts. A LLaVA/Parquet file is screened for it (under
    ``--on-bad-sample error`` a bad record stops here with the report)."""
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import (
        detect_format,
        read_raw_work_jsonl,
        read_workload_jsonl,
        resolve_dataset_file,
    )
    from entrain.runtime.session import screen

    if is_builtin(spec.data.dataset):
        return
    path = resolve_dataset_file(spec.data.dataset)
    fmt = detect_format(path)
    if fmt == "conversation":  # with the run's tokenizer: a record without a label token is bad
        from entrain.runtime.model_source import model_config

        usable = len(screen(spec, None, tokenizer=model_config(spec)[1]).samples)
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


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _infer_dp(args: argparse.Namespace, world: int | None) -> None:
    """``--dp`` from the process count (``--nproc`` or torchrun's WORLD_SIZE) when the stages are fixed
    by flags and ``--dp`` is not given (the planner chooses it otherwise)."""
    fixed = args.encoder_stages is not None or args.llm_stages is not None
    if args.dp is not None or world is None or not fixed or args.plan:
        return
    enc, llm = args.encoder_stages or 1, args.llm_stages or 1
    per_replica = max(SYSTEMS[s].ranks_per_replica(enc, llm) for s in parse_systems(args.system))
    per_replica *= max(1, args.tp)
    if world % per_replica:
        lower = max(per_replica, world // per_replica * per_replica)
        unit, tp_note = ("processes", f" x --tp {args.tp}") if args.tp > 1 else ("pipeline ranks", "")
        raise ConfigError(
            f"{world} processes cannot form whole replicas of {per_replica} {unit} ({enc} encoder + {llm} LLM "
            f"stages{tp_note}): start a multiple of {per_replica} processes (e.g. "
            f"--nproc {lower} or {lower + per_replica}) or change --encoder-stages / --llm-stages"
        )
    args.dp = world // per_replica


def default_world_size(spec: RunConfig) -> int:
    """Processes to start without ``--nproc``: what a plan file or fixed stages need; else 2 (the
    smallest disjoint pipeline), 1 when every system is colocated (DIP)."""
    from entrain.runtime.session import world_size_of

    need = world_size_of(spec)
    if need is not None:
        return need
    per_replica = 1 if all(SYSTEMS[s].colocated for s in spec.schedule.systems) else 2
    return per_replica * spec.parallel.dp_or_1 * spec.parallel.tp


def _check_resume(spec) -> None:
    """Refuse ``--resume`` into a run folder written by another configuration (before any launch)."""
    from entrain.runtime.checkpoint import check_resumable
    from entrain.runtime.session import fingerprint, system_out

    for system in spec.schedule.systems:
        check_resumable(system_out(spec, system), fingerprint(spec, system))


def _is_conversation_file(dataset: str) -> bool:
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import detect_format

    return not is_builtin(dataset) and os.path.exists(dataset) and detect_format(dataset) == "conversation"


B_MIN_POOL = 4096


def warn_below_b_min(spec) -> int | None:
    """Warn on stderr when the per-replica batch is below ``b_min`` (Algorithm 1 under the run's cost
    model, on a pool of ``B_MIN_POOL`` samples of the dataset); returns b_min (None: not checked --
    colocated systems only, or a LLaVA/Parquet file, whose metadata pass would be a second screening)."""
    from entrain.core.planning.bmin import below_b_min_warning, find_b_min
    from entrain.core.planning.profile import pool_sampler
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
    result = find_b_min(
        pool_sampler(pool),
        spec.model.cost_model(),
        gpus=dp * ((spec.parallel.encoder_stages or 1) + (spec.parallel.llm_stages or 1)),
        dp=dp,
        seed=spec.data.seed,
        max_batch_size=B_MIN_POOL,
    )
    warning = below_b_min_warning(spec.parallel.global_batch, dp, result.b_min)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return result.b_min


def run(args: argparse.Namespace) -> int:
    if args.demo:
        _apply_demo(args, _DEFAULTS)
    under_torchrun = _under_torchrun()
    if under_torchrun and os.environ.get(ERROR_DIR_ENV):
        return _as_worker(args)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.nproc
    _infer_dp(args, world)
    spec = _spec(args)
    from entrain.runtime.planning import fixed_stages
    from entrain.runtime.session import check_spec

    check_spec(spec, world)
    fixed = fixed_stages(spec) and not spec.schedule.plan  # the planner reports b_min itself otherwise
    if under_torchrun:  # started by the user's own torchrun
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0"):
            check_run_folder(spec, spec.run.overwrite)
        if os.environ["RANK"] == "0" and fixed:
            warn_below_b_min(spec)
        from entrain.runtime.distributed import local_process_count

        resolve_device(spec.run.device, local_process_count(), say=os.environ.get("LOCAL_RANK", "0") == "0")
        return _run_rank(spec, under_torchrun=True)
    # everything that can be checked before a process starts, in the order a user fixes it
    check_run_folder(spec, spec.run.overwrite)
    if spec.run.resume:
        _check_resume(spec)
    check_dataset_size(spec)
    if fixed:
        warn_below_b_min(spec)
    need = world or default_world_size(spec)
    resolve_device(spec.run.device, need)
    if need > 1:  # not under torchrun: start it
        return _launch(recorded_flags(spec), spec, need)
    try:
        return _run_rank(spec, under_torchrun=False)
    except KeyboardInterrupt:
        print(interrupted_line(spec), file=sys.stderr, flush=True)
        return 130


def resolve_device(requested: str, num_local_procs: int, say: bool = True) -> str:
    """The device type of this node's ``num_local_procs`` processes (``distributed.choose_device``;
    ``--device auto`` defers to ``$ENTRAIN_DEVICE``), exported as ``ENTRAIN_DEVICE`` for this process
    and those it starts; the CPU fallback's note goes to stderr when ``say``."""
    from entrain.runtime.distributed import DEVICE_ENV, choose_device, visible_gpus

    if requested == "auto":
        requested = os.environ.get(DEVICE_ENV, "auto")
    kind, note = choose_device(requested, num_local_procs, visible_gpus())
    if note and say:
        print(note, file=sys.stderr, flush=True)
    os.environ[DEVICE_ENV] = kind
    return kind


def _as_worker(args: argparse.Namespace) -> int:
    """A torchrun worker of ``_launch``: the parent checked the flags, the run folder and the dataset;
    an Entrain error goes to ``$ENTRAIN_ERROR_DIR/rank<N>.txt`` for the parent to print once, and
    Ctrl-C ends the worker quietly (the parent reports the step)."""
    from entrain.runtime.session import check_spec

    try:
        _infer_dp(args, int(os.environ["WORLD_SIZE"]))
        spec = _spec(args)
        check_spec(spec, int(os.environ["WORLD_SIZE"]))  # the parent warned about b_min already
    except EntrainError as e:
        _record_worker_error(e)
        _quiet_exit(2)
    except KeyboardInterrupt:
        _quiet_exit(130)
    try:
        return _run_rank(spec, under_torchrun=True)
    except EntrainError:  # _run_rank recorded it before leaving the process group
        _quiet_exit(2)
    except KeyboardInterrupt:
        _quiet_exit(130)
    return 0


def _record_worker_error(error: EntrainError) -> None:
    """Write a worker's error for the parent, named by the time it happened: the cause is written
    before this rank leaves the process group, so before any peer can fail on its absence."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return
    path = os.path.join(folder, f"{time.time_ns()}-rank{os.environ['RANK']}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(error))


def _quiet_exit(code: int) -> None:
    """Leave a failed worker at once, like a finished one (see ``_run_rank``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _memory_check(system: str, setup, batches, cost, margin: float | None = None):
    """The planned setup after ``plan``'s and ``simulate``'s memory check (``sim.memory_fit.deploy``)."""
    from entrain.sim.memory_fit import deploy

    return deploy(system, setup, batches, cost, margin=margin)[0]


def _warn_profile_precision(spec, device) -> str | None:
    """The one-line warning of a ``--profile`` timed in another precision than this run's effective
    ``--precision`` (``session.resolve_precision`` on the device the process group runs on)."""
    from entrain.core.costmodel import CostModel
    from entrain.runtime.session import resolve_precision

    path = spec.model.profile
    if not path:
        return None
    precision = resolve_precision(spec, device)
    run = f"this run on {device.type} (--precision {spec.model.precision or 'default'})"
    return warn_profile_precision("train", path, CostModel.load(path), precision, run)


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
    req = spec.config_request(setup.layout.world_size)
    return monitor_for(
        system, setup, req, cost, planner_sampler(spec, batches), total_iterations=spec.run.steps,
        settings=spec.schedule.replan_settings(),
    )  # fmt: skip


def _leave_for_replan(under_torchrun: bool) -> None:
    """After a re-plan's checkpoint: leave the process group with ``REPLAN_EXIT`` (the launcher restarts
    the group on the new plan); a run without a launcher cannot restart itself and says how to continue."""
    from entrain.runtime.distributed import shutdown
    from entrain.runtime.replan import REPLAN_EXIT

    shutdown()
    how = "continue with --resume --plan OUT/replan/plan-<step>.json (entrain train --nproc N does it by itself)"
    if not under_torchrun:
        raise EntrainError(f"the drift monitor re-planned: {how}")
    if not os.environ.get(ERROR_DIR_ENV) and os.environ.get("RANK") == "0":
        print(f"entrain: the drift monitor re-planned; {how}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(REPLAN_EXIT)


def _run_rank(spec, under_torchrun: bool) -> int:
    import torch

    from entrain.runtime.cpu_allocator import keep_freed_memory
    from entrain.runtime.distributed import init_distributed, set_deterministic, shutdown
    from entrain.runtime.replan import ReplanRequested
    from entrain.runtime.session import run_systems, summary_line

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    keep_freed_memory()
    set_deterministic(spec.run.deterministic)
    if under_torchrun:
        env = init_distributed(timeout_s=spec.run.timeout_s)
    else:
        store = tempfile.mkdtemp(prefix="entrain-store-")
        env = init_distributed(
            timeout_s=spec.run.timeout_s, rank=0, world_size=1, init_method=f"file://{store}/store"
        )
    if env.rank == 0:
        _warn_profile_precision(spec, env.device)
    try:
        replan = {"monitor_factory": _monitor_factory} if spec.schedule.replan == "auto" else {}
        summaries = run_systems(spec, env, memory_check=_memory_check, judge_factory=_judge_factory, **replan)
    except ReplanRequested:
        _leave_for_replan(under_torchrun)
    except BaseException as e:
        import torch.distributed as dist

        if under_torchrun and isinstance(e, EntrainError):
            _record_worker_error(e)
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
    if under_torchrun:
        # Everything is written and the group is destroyed. Leave without the interpreter's teardown:
        # gloo's threads racing C++ static destructors abort ~1 launch in 10 with "terminate called
        # without an active exception" (cpu-feasibility.md section 6.8), failing a finished run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
