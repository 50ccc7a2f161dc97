"""``entrain data synth --dataset NAME --num-samples N --out DIR [--seed S]``: write a real
LLaVA-format dataset (``DIR/data.json`` + ``DIR/images/``) shaped like a built-in generator."""

from __future__ import annotations

import argparse

from entrain.data.generators import DATASETS


def add_synth_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``synth`` on the ``entrain data`` sub-subcommands."""
    p = subparsers.add_parser(
        "synth", help="write a LLaVA-format dataset (charts / photos) following a generator"
    )
    p.add_argument("--dataset", required=True, help=f"built-in generator: {', '.join(DATASETS)}")
    p.add_argument("--num-samples", type=int, required=True)
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_synth)


def run_synth(args: argparse.Namespace) -> int:
    from entrain.data.synth import synth_dataset

    result = synth_dataset(args.dataset, args.num_samples, args.out, args.seed)
    diffs = result.text_token_diffs
    exact = sum(d == 0 for d in diffs)
    print(
        f"wrote {result.path} ({len(diffs)} records) and {len(diffs)} images in {result.path.parent / 'images'}"
    )
    print(
        f"text tokens vs the {args.dataset} generator: {exact}/{len(diffs)} exact, "
        f"max |diff| {max(abs(d) for d in diffs)}; image sizes exact"
    )
    return 0
