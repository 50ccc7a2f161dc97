"""``entrain data synth --dataset NAME --num-samples N --out DIR [--seed S]``: write a real
LLaVA-format dataset (``DIR/data.json`` + ``DIR/images/``) shaped like a built-in generator."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from entrain.cli.common import add_shared_flags
from entrain.core.errors import ConfigError
from entrain.data.generators import DATASETS


def add_synth_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``synth`` on the ``entrain data`` sub-subcommands."""
    p = subparsers.add_parser(
        "synth", help="write a LLaVA-format dataset (charts / photos) following a generator"
    )
    p.add_argument("--dataset", required=True, help=f"built-in generator: {', '.join(DATASETS)}")
    p.add_argument("--num-samples", type=int, required=True)
    p.add_argument("--out", required=True, metavar="DIR")
    add_shared_flags(p, "data synth", "seed", "overwrite")
    p.set_defaults(func=run_synth)


DATASET_FILES = ("data.json", "images")
"""What makes a folder hold a synthesised dataset."""


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` holding a dataset unless ``overwrite``, which then removes it first."""
    held = [name for name in DATASET_FILES if (out / name).exists()]
    if held and not overwrite:
        raise ConfigError(
            f"--out {out} holds a dataset ({', '.join(held)}): pass --overwrite to replace it, or choose "
            "another --out"
        )
    for name in held:
        target = out / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()


def run_synth(args: argparse.Namespace) -> int:
    from entrain.data.synth import synth_dataset

    check_out(Path(args.out), args.overwrite)
    result = synth_dataset(args.dataset, args.num_samples, args.out, args.seed)
    diffs = result.text_token_diffs
    exact = sum(d == 0 for d in diffs)
    from entrain.data.synth_video import is_video_sample

    videos = sum(is_video_sample(result.name, t) for t in result.targets)
    images = sum(len(t.images) for t in result.targets if not is_video_sample(result.name, t))
    clips = sum(len(t.audio) for t in result.targets)
    audio = f" and {clips} audio clips in {result.path.parent / 'audio'}" if clips else ""
    audio += f" and {videos} videos in {result.path.parent / 'videos'}" if videos else ""
    print(
        f"wrote {result.path} ({len(diffs)} records) and {images} images in {result.path.parent / 'images'}{audio}"
    )
    print(
        f"text tokens vs the {args.dataset} generator: {exact}/{len(diffs)} exact, "
        f"max |diff| {max(abs(d) for d in diffs)}; image sizes exact"
    )
    if result.capped:
        from entrain.data.check import DEFAULT_MAX_TOKENS

        shown = ", ".join(result.capped[:5]) + (", ..." if len(result.capped) > 5 else "")
        print(
            f"capped {len(result.capped)} sample(s) to data check's default --max-tokens {DEFAULT_MAX_TOKENS} "
            f"(text shortened or images scaled down): {shown}"
        )
    return 0
