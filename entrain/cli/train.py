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
import sys

from entrain.cli.common import (
    add_attention_arg,
    add_entrain_extension_args,
    add_model_source_args,
    add_pixel_args,
    add_shared_flags,
)
from entrain.cli.config_file import add_config_arg
from entrain.cli.launch import INTERRUPTED_EXIT
from entrain.cli.launch import launch as _launch
from entrain.cli.train_args import ACTIONS, DEFAULTS, apply_demo, infer_dp, recorded_flags
from entrain.cli.train_args import spec_of as _spec
from entrain.core.systems import ENTRAIN, SYSTEMS
from entrain.runtime.launcher import (
    TERMINATED_EXIT,
    Terminated,
    launched_worker,
    sigterm_as_interrupt,
    under_torchrun,
)


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
    DEFAULTS.update({a.dest: a.default for a in p._actions})
    ACTIONS[:] = [a for a in p._actions if a.option_strings and a.dest != "help"]


def _add_degree_args(p: argparse.ArgumentParser) -> None:
    add_shared_flags(p, "train", "dp", "tp")
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="shard each stage's parameters, gradients and AdamW state over its data-parallel group "
        "(FSDP2; needs --dp 2 or more) instead of all-reducing whole gradients",
    )
    add_shared_flags(p, "train", "ep", "cp")


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
    add_shared_flags(p, "train", "precision")
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
    add_shared_flags(p, "train", "overwrite", "confine_images")
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


def run(args: argparse.Namespace) -> int:
    """Check what can be checked, then train: in this process, on the user's torchrun, or on the
    torchrun workers it starts (``entrain.cli.launch``)."""
    from entrain.cli.train_worker import as_worker, run_rank, run_under_torchrun
    from entrain.runtime.planning import fixed_stages
    from entrain.runtime.preflight import check_before_launch, check_spec, default_world_size, resolve_device
    from entrain.runtime.run_folder import interrupted_line

    if args.demo:
        apply_demo(args)
    if under_torchrun() and launched_worker():
        return as_worker(args)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.nproc
    infer_dp(args, world)
    spec = _spec(args)
    check_spec(spec, world)
    fixed = fixed_stages(spec) and not spec.schedule.plan  # the planner reports b_min itself otherwise
    if under_torchrun():  # started by the user's own torchrun
        return run_under_torchrun(spec, fixed)
    check_before_launch(spec, spec.run.overwrite, fixed)  # in the order a user fixes it
    need = world or default_world_size(spec)
    resolve_device(spec.run.device, need)
    if need > 1:  # not under torchrun: start it
        return _launch(recorded_flags(spec), spec, need)
    try:
        with sigterm_as_interrupt():  # `kill -TERM` stops this run as Ctrl-C does
            return run_rank(spec, under_torchrun=False)
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        print(
            interrupted_line(spec, "terminated" if terminated else "interrupted"), file=sys.stderr, flush=True
        )
        return TERMINATED_EXIT if terminated else INTERRUPTED_EXIT
