"""``entrain train``: train a vision-language model with a system's Plans on torch.distributed.

Launch as ``torchrun --standalone --nproc-per-node N -m entrain train ...`` or let ``--nproc N`` start
torchrun. ``--system`` takes one system or a comma list (each trained in turn, fresh model, run folder
``OUT/<system>``); rank 0 then prints one summary line per system on stdout. ``--demo`` is the README
main job: the tiny VLM on ``skewed`` with ``entrain`` then ``1f1b`` on 2 processes (1 encoder + 1
LLM stage).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from entrain.cli.common import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    add_attention_arg,
    add_model_source_args,
    add_pixel_args,
)
from entrain.cli.config_file import add_config_arg
from entrain.core.architectures import PRECISIONS
from entrain.core.errors import ConfigError, EntrainError
from entrain.core.systems import SYSTEMS, parse_systems

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
    p.add_argument(
        "--dataset",
        "--work-file",
        dest="dataset",
        default="skewed",
        help="built-in generator name or workload JSONL (LLaVA data arrives with the data issue)",
    )
    p.add_argument("--image-root", default=None, help="folder LLaVA image paths are relative to")
    p.add_argument("--model", default="tiny", choices=MODEL_PRESETS)
    p.add_argument("--hardware", default=None, choices=HARDWARE_PRESETS, help="cost model used to plan")
    p.add_argument(
        "--profile", default=None, metavar="FILE", help="measured profile (entrain profile) to plan with"
    )
    add_attention_arg(p)
    p.add_argument("--system", default="entrain", help=f"one of {', '.join(SYSTEMS)} (or a comma list)")
    p.add_argument("--encoder-stages", type=int, default=1)
    p.add_argument("--llm-stages", type=int, default=1)
    p.add_argument(
        "--dp", type=int, default=None, help="data-parallel replicas (default: processes / stages)"
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel degree inside every stage (each pipeline rank becomes --tp processes)",
    )
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard each stage's parameters, gradients and AdamW state over its data-parallel group "
        "(FSDP2; needs --dp 2 or more) instead of all-reducing whole gradients",
    )
    p.add_argument("--cp", type=int, default=1, help="context parallel degree (the runtime supports 1)")
    _add_batch_and_optimiser_args(p)
    _add_stock_model_args(p)
    _add_run_control_args(p)
    p.set_defaults(func=run)
    _DEFAULTS.update({a.dest: a.default for a in p._actions})


def _add_batch_and_optimiser_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--microbatch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action="store_true", help="shuffle a file's samples with the seed first")
    p.add_argument("--out", default="runs/train", help="run folder")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--betas", default="0.9,0.95", help="AdamW beta1,beta2")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping; 0 disables")
    p.add_argument("--val-every", type=int, default=0, help="validation loss every N steps (0: never)")
    p.add_argument("--val-batches", type=int, default=1, help="held-out global batches per validation")
    p.add_argument("--freeze", default="", help="comma list of encoder, vit (tower without merger), llm")
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
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="bf16: bf16 autocast compute with fp32 master weights and AdamW state (default: bf16 on CUDA, "
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
    p.add_argument(
        "--entrain-layout",
        choices=("disjoint", "shared"),
        default="disjoint",
        help="entrain/entrain-1f1b only: 'shared' = boundary-sharing layout (one min-max partition of the "
        "encoder-then-LLM layers over the pipeline ranks; our extension, not the paper's)",
    )
    p.add_argument(
        "--ramp-microbatches",
        default="0",
        help="entrain only: fill/drain ramp, 'auto' or a piece count (0 = the paper's schedule)",
    )
    p.add_argument(
        "--split-weight-grads",
        choices=("on", "off"),
        default="off",
        help="entrain only: run every backward as input gradients (sent upstream at once) then weight "
        "gradients (our extension; off = the paper's schedule)",
    )
    p.add_argument(
        "--assignment",
        choices=("paper", "two-resource", "auto"),
        default="paper",
        help="entrain only: per-iteration assignment; 'two-resource' balances encoder and LLM work together "
        "(our extension), 'auto' picks per replica and iteration by predicted makespan (default: paper)",
    )


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
    p.add_argument(
        "--demo",
        action="store_true",
        help="README main job: tiny on skewed, entrain then 1f1b, 2 processes (flags still override)",
    )


_DEFAULTS: dict = {}


def _betas(text: str) -> tuple[float, float]:
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--betas must be two comma-separated numbers, got {text!r}") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ConfigError(f"--betas must lie in [0, 1), got {text!r}")
    return b1, b2


def _ramp(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"--ramp-microbatches must be 'auto' or a count >= 0, got {text!r}")
    return n


STOCK_AND_RECORD_FLAGS = (
    "vision_model",
    "llm_model",
    "tokenizer",
    "min_pixels",
    "max_pixels",
    "precision",
    "trace",
)
"""Flags that become the same-named ``TrainSpec`` fields as they are."""


def _tensorboard(wanted: bool) -> bool:
    """``--tensorboard``, refused before any launch when the package is missing."""
    if wanted:
        from entrain.runtime.tensorboard import check_tensorboard

        check_tensorboard()
    return wanted


def _spec(args: argparse.Namespace):
    from entrain.runtime.session import TrainSpec

    systems = tuple(parse_systems(args.system))
    freeze = tuple(f.strip() for f in args.freeze.split(",") if f.strip())
    if args.checkpoint_every < 0 or args.keep_checkpoints < 1:
        raise ConfigError(
            f"--checkpoint-every must be >= 0 and --keep-checkpoints >= 1, got {args.checkpoint_every} and "
            f"{args.keep_checkpoints}"
        )
    if args.timeout_s <= 0:
        raise ConfigError(f"--timeout-s must be positive, got {args.timeout_s}")
    return TrainSpec(
        dataset=args.dataset,
        model=args.model,
        systems=systems,
        encoder_stages=args.encoder_stages,
        llm_stages=args.llm_stages,
        dp=args.dp,
        tp=args.tp,
        cp=args.cp,
        fsdp=args.fsdp,
        global_batch=args.global_batch,
        microbatch_size=args.microbatch_size,
        steps=args.steps,
        seed=args.seed,
        out=args.out,
        hardware=args.hardware,
        profile=args.profile,
        attention=args.attention,
        image_root=args.image_root,
        lr=args.lr,
        weight_decay=args.weight_decay,
        betas=_betas(args.betas),
        warmup_steps=args.warmup_steps,
        max_grad_norm=args.max_grad_norm or None,
        val_every=args.val_every,
        val_batches=args.val_batches,
        freeze=freeze,
        weights=args.weights,
        timeout_s=args.timeout_s,
        progress=not args.no_progress,
        shuffle=args.shuffle,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        on_bad_sample=args.on_bad_sample,
        confine_images=args.confine_images,
        entrain_layout=args.entrain_layout,
        ramp_microbatches=_ramp(args.ramp_microbatches),
        split_weight_grads=args.split_weight_grads == "on",
        assignment=args.assignment,
        tensorboard=_tensorboard(args.tensorboard),
        flags=run_flags(args),
        **{k: getattr(args, k) for k in STOCK_AND_RECORD_FLAGS},
    )


_FORWARDED = (
    "dataset",
    "image_root",
    "model",
    "hardware",
    "profile",
    "attention",
    "system",
    "encoder_stages",
    "llm_stages",
    "dp",
    "tp",
    "cp",
    "global_batch",
    "microbatch_size",
    "steps",
    "seed",
    "out",
    "lr",
    "weight_decay",
    "warmup_steps",
    "max_grad_norm",
    "betas",
    "val_every",
    "val_batches",
    "freeze",
    "weights",
    "on_bad_sample",
    "checkpoint_every",
    "keep_checkpoints",
    "timeout_s",
    "entrain_layout",
    "ramp_microbatches",
    "split_weight_grads",
    "assignment",
    "vision_model",
    "llm_model",
    "tokenizer",
    "min_pixels",
    "max_pixels",
    "precision",
)
_FLAGS_FORWARDED = (
    "shuffle",
    "resume",
    "no_progress",
    "overwrite",
    "confine_images",
    "tensorboard",
    "trace",
    "fsdp",
)


def run_flags(args: argparse.Namespace) -> dict:
    """The resolved flags of a run (what config.json records for ``--config``)."""
    return {k: getattr(args, k) for k in (*_FORWARDED, *_FLAGS_FORWARDED)}


def _apply_demo(args: argparse.Namespace, defaults: dict) -> None:
    """Demo values for every flag the user left at its default."""
    for key, value in DEMO.items():
        if getattr(args, key) == defaults.get(key):
            setattr(args, key, value)


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The resolved flags, spelled out for the torchrun children."""
    out = []
    for key in _FORWARDED:
        value = getattr(args, key)
        if value is not None and value != "":
            out += ["--" + key.replace("_", "-"), str(value)]
    out += ["--" + k.replace("_", "-") for k in _FLAGS_FORWARDED if getattr(args, k)]
    return out


ERROR_DIR_ENV = "ENTRAIN_ERROR_DIR"
"""Set by the parent for its torchrun workers: each writes its Entrain error message to
``rank<N>.txt`` there instead of stderr, and the parent prints each distinct message once."""


def _launch(args: argparse.Namespace, spec, nproc: int) -> int:
    from entrain.cli.launch import ERROR_EXIT, INTERRUPTED_EXIT

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


def _worker_errors(folder: str) -> list[str]:
    """The workers' error messages, each distinct one once, in rank order."""
    out: dict[str, None] = {}
    for name in sorted(os.listdir(folder), key=lambda n: int("".join(c for c in n if c.isdigit()) or 0)):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            out[f.read().strip()] = None
    return [m for m in out if m]


def interrupted_line(spec) -> str:
    """``interrupted at step N; continue with --resume``: N = the steps the interrupted system completed
    (rows in its ``metrics.jsonl``)."""
    from entrain.runtime.session import system_out

    done = 0
    for system in spec.systems:
        path = os.path.join(system_out(spec, system), "metrics.jsonl")
        try:
            with open(path, encoding="utf-8") as f:
                done = sum(1 for line in f if line.strip())
        except OSError:
            done = 0
        if done < spec.steps:
            break
    return f"interrupted at step {done}; continue with --resume"


RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints")
"""What makes a folder hold a run."""


def check_run_folder(spec, overwrite: bool) -> None:
    """Refuse an ``--out`` that holds a run, unless ``--resume`` continues it or ``--overwrite``
    replaces it (a second run must not delete the first one's checkpoints by accident)."""
    if spec.resume or overwrite:
        return
    from entrain.runtime.session import system_out

    for out in dict.fromkeys([spec.out, *(system_out(spec, s) for s in spec.systems)]):
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

    if is_builtin(spec.dataset):
        return
    path = resolve_dataset_file(spec.dataset)
    fmt = detect_format(path)
    if fmt == "conversation":
        usable = len(screen(spec, None).samples)
    elif fmt == "workload":
        usable = len(read_workload_jsonl(path))
    else:
        usable = len(read_raw_work_jsonl(path))
    held_out = spec.val_batches if spec.val_every > 0 else 0
    need = spec.global_batch * (1 + held_out)
    if usable < need:
        what = f"--global-batch {spec.global_batch}" + (
            f" and {held_out} held-out validation batch(es)" if held_out else ""
        )
        raise ConfigError(f"{path}: {usable} usable sample(s), but {what} need(s) at least {need}")


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _infer_dp(args: argparse.Namespace, world: int | None) -> None:
    """``--dp`` from the process count (``--nproc`` or torchrun's WORLD_SIZE) when not given."""
    if args.dp is not None or world is None:
        return
    per_replica = max(
        SYSTEMS[s].ranks_per_replica(args.encoder_stages, args.llm_stages) for s in parse_systems(args.system)
    )
    per_replica *= max(1, args.tp)
    if world % per_replica:
        lower = max(per_replica, world // per_replica * per_replica)
        raise ConfigError(
            f"{world} processes cannot form whole replicas of {per_replica} pipeline ranks ({args.encoder_stages} "
            f"encoder + {args.llm_stages} LLM stages): start a multiple of {per_replica} processes (e.g. "
            f"--nproc {lower} or {lower + per_replica}) or change --encoder-stages / --llm-stages"
        )
    args.dp = world // per_replica


def _check_resume(spec) -> None:
    """Refuse ``--resume`` into a run folder written by another configuration (before any launch)."""
    from entrain.runtime.checkpoint import check_resumable
    from entrain.runtime.session import fingerprint, system_out

    for system in spec.systems:
        check_resumable(system_out(spec, system), fingerprint(spec, system))


def _is_conversation_file(dataset: str) -> bool:
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import detect_format

    return not is_builtin(dataset) and os.path.isfile(dataset) and detect_format(dataset) == "conversation"


B_MIN_POOL = 4096


def warn_below_b_min(spec) -> int | None:
    """Warn on stderr when the per-replica batch is below ``b_min`` (Algorithm 1 under the run's cost
    model, on a pool of ``B_MIN_POOL`` samples of the dataset); returns b_min (None: not checked --
    colocated systems only, or a LLaVA/Parquet file, whose metadata pass would be a second screening)."""
    from entrain.core.planner import find_b_min, pool_sampler
    from entrain.data.generators import generate_samples, is_builtin
    from entrain.data.workload_io import read_samples, resolve_dataset_file
    from entrain.runtime.session import resolve_cost, spec_vision

    if all(SYSTEMS[s].colocated for s in spec.systems) or _is_conversation_file(spec.dataset):
        return None
    if is_builtin(spec.dataset):
        pool = generate_samples(spec.dataset, B_MIN_POOL, spec.seed, vision=spec_vision(spec))
    else:
        pool = read_samples(resolve_dataset_file(spec.dataset), spec_vision(spec), image_root=spec.image_root)
        pool = pool[:B_MIN_POOL]
    dp = spec.dp_or_1
    result = find_b_min(
        pool_sampler(pool),
        resolve_cost(spec),
        gpus=dp * (spec.encoder_stages + spec.llm_stages),
        dp=dp,
        seed=spec.seed,
        max_batch_size=B_MIN_POOL,
    )
    per_replica = spec.global_batch // dp
    if per_replica < result.b_min:
        print(
            f"entrain: warning: --global-batch {spec.global_batch} ({per_replica} per replica) is below b_min "
            f"= {result.b_min} for this dataset and layout (Algorithm 1): the encoder/LLM work split varies "
            f"from batch to batch at this size, so the balance guarantee no longer holds; use "
            f"--global-batch {result.b_min * dp} or more",
            file=sys.stderr,
            flush=True,
        )
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
    from entrain.runtime.session import check_spec, world_size_of

    check_spec(spec, world)
    if under_torchrun:  # started by the user's own torchrun
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0"):
            check_run_folder(spec, args.overwrite)
        if os.environ["RANK"] == "0":
            warn_below_b_min(spec)
        return _run_rank(spec, under_torchrun=True)
    # everything that can be checked before a process starts, in the order a user fixes it
    check_run_folder(spec, args.overwrite)
    if spec.resume:
        _check_resume(spec)
    check_dataset_size(spec)
    warn_below_b_min(spec)
    need = world_size_of(spec)
    if need > 1:  # not under torchrun: start it (``--nproc`` defaults to what the layout needs)
        return _launch(args, spec, need)
    try:
        return _run_rank(spec, under_torchrun=False)
    except KeyboardInterrupt:
        print(interrupted_line(spec), file=sys.stderr, flush=True)
        return 130


def _as_worker(args: argparse.Namespace) -> int:
    """A torchrun worker of ``_launch``: the parent checked the flags, the run folder and the dataset;
    an Entrain error goes to ``$ENTRAIN_ERROR_DIR/rank<N>.txt`` for the parent to print once, and
    Ctrl-C ends the worker quietly (the parent reports the step)."""
    from entrain.runtime.session import check_spec

    try:
        _infer_dp(args, int(os.environ["WORLD_SIZE"]))
        spec = _spec(args)
        check_spec(spec, int(os.environ["WORLD_SIZE"]))  # the parent warned about b_min already
        return _run_rank(spec, under_torchrun=True)
    except EntrainError as e:
        path = os.path.join(os.environ[ERROR_DIR_ENV], f"rank{os.environ['RANK']}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(str(e))
        _quiet_exit(2)
    except KeyboardInterrupt:
        _quiet_exit(130)
    return 0


def _quiet_exit(code: int) -> None:
    """Leave a failed worker at once, like a finished one (see ``_run_rank``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_rank(spec, under_torchrun: bool) -> int:
    import torch

    from entrain.runtime.distributed import init_distributed, shutdown
    from entrain.runtime.session import run_systems, summary_line

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if under_torchrun:
        env = init_distributed(timeout_s=spec.timeout_s)
    else:
        store = tempfile.mkdtemp(prefix="entrain-store-")
        env = init_distributed(
            timeout_s=spec.timeout_s, rank=0, world_size=1, init_method=f"file://{store}/store"
        )
    try:
        summaries = run_systems(spec, env)
    except BaseException:
        import torch.distributed as dist

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
