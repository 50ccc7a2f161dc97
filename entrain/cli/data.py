"""``entrain data``: dataset tools. ``stats`` summarises a dataset's token and work distributions
(docs/contract.md ``entrain data``); ``check``, ``synth`` and ``families`` register beside it in
``add_parser``."""

from __future__ import annotations

import argparse
import importlib
import sys

import numpy as np

from entrain.cli.common import (
    add_attention_arg,
    add_model_source_args,
    add_pixel_args,
    add_shared_flags,
    emit_json,
    hardware_label,
    model_label,
    resolve_cost_model,
    vision_limits,
)
from entrain.core.errors import ConfigError
from entrain.core.workload.samples import SampleMeta
from entrain.data.generators import canonical_name, generate_samples, is_builtin
from entrain.data.workload_io import read_samples, resolve_dataset_file, sample_works

DEFAULT_NUM_SAMPLES = 10_000
QUANTITIES = ("text_tokens", "image_tokens", "vit_patches", "encoder_llm_ratio")
AUDIO_QUANTITY = "audio_tokens"
"""LLM tokens of the samples' audio clips: in ``--json`` always, a row of the table when any sample has audio."""
VIDEO_QUANTITY = "video_tokens"
"""LLM tokens of the samples' videos: in ``--json`` always, a row of the table when any sample has video."""


# Sub-subcommands living in their own modules: module -> its registration function.
EXTENSIONS: dict[str, str] = {
    "entrain.cli.data_check": "add_check_parser",
    "entrain.cli.data_synth": "add_synth_parser",
    "entrain.cli.data_families": "add_families_parser",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="dataset statistics, checks and synthesis")
    sub = p.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    _add_stats_parser(sub)
    for module_name, register in EXTENSIONS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:  # not built yet
                continue
            raise
        getattr(module, register)(sub)


def _add_stats_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="token and encoder:LLM work-ratio distributions of a dataset")
    add_shared_flags(p, "data stats", "dataset", "model", "hardware", "profile")
    add_model_source_args(p)
    add_pixel_args(p)
    add_attention_arg(p)
    p.add_argument("--num-samples", type=int, default=None,
                   help=f"samples to draw (default {DEFAULT_NUM_SAMPLES}); a file's first N (default all)")  # fmt: skip
    add_shared_flags(p, "data stats", "seed", "json", "image_root")
    p.add_argument(
        "--plot", default=None, metavar="FILE.png", help="write text/vision token CDFs (paper Fig. 3)"
    )
    p.set_defaults(func=run_stats)


def _load(args: argparse.Namespace) -> tuple[str, list[SampleMeta]]:
    if is_builtin(args.dataset):
        name = canonical_name(args.dataset)
        n = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
        return name, generate_samples(name, n, args.seed, vision=vision_limits(args))
    samples = read_samples(
        resolve_dataset_file(args.dataset), vision_limits(args), image_root=getattr(args, "image_root", None)
    )
    return args.dataset, samples if args.num_samples is None else samples[: args.num_samples]


def _summary(x: np.ndarray) -> dict[str, float]:
    p5, p50, p95 = np.percentile(x, [5, 50, 95])
    return {"mean": float(x.mean()), "p5": float(p5), "p50": float(p50), "p95": float(p95)}


def compute_stats(samples: list[SampleMeta], cost) -> tuple[dict, dict[str, np.ndarray]]:
    """docs/contract.md's ``data stats`` object and the per-sample columns it summarises."""
    works = sample_works(samples, cost)
    cols = {
        "text_tokens": np.array([s.text_tokens for s in samples], dtype=float),
        "image_tokens": np.array([s.image_tokens for s in samples], dtype=float),
        "vit_patches": np.array([s.vit_patches for s in samples], dtype=float),
        "encoder_llm_ratio": np.array([w.encoder / w.llm for w in works], dtype=float),
        AUDIO_QUANTITY: np.array([s.audio_tokens for s in samples], dtype=float),
        VIDEO_QUANTITY: np.array([s.video_tokens for s in samples], dtype=float),
    }
    quantities = (*QUANTITIES, AUDIO_QUANTITY, VIDEO_QUANTITY)
    return {"num_samples": len(samples), **{q: _summary(cols[q]) for q in quantities}}, cols


def run_stats(args: argparse.Namespace) -> int:
    if args.num_samples is not None and args.num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
    name, samples = _load(args)
    if not samples:
        raise ConfigError(f"--dataset {args.dataset}: no samples to summarise")
    cost = resolve_cost_model(args)
    stats, cols = compute_stats(samples, cost)
    if args.plot:
        plot_token_cdfs(cols, name, args.plot)
    hardware = None if args.profile else hardware_label(args)
    if args.json:
        attention = None if args.profile else cost.notes.get("attention")
        emit_json({**stats, "dataset": name, "seed": args.seed, "model": model_label(args), "hardware": hardware,
                   "profile": args.profile, "attention": attention})  # fmt: skip
        return 0
    source = f"profile {args.profile}" if args.profile else f"{model_label(args)} on {hardware}"
    attention = cost.notes.get("attention", {})
    if any(impl != "flash" for impl in attention.values()):
        source += " with " + ",".join(f"{c}={impl}" for c, impl in attention.items()) + " attention"
    print(
        format_stats(stats, f"{name}: {stats['num_samples']} samples, seed {args.seed}; ratio under {source}")
    )
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def format_stats(stats: dict, title: str) -> str:
    lines = [title, f"{'quantity':<20}{'mean':>10}{'p5':>10}{'p50':>10}{'p95':>10}"]
    extra = [q for q in (AUDIO_QUANTITY, VIDEO_QUANTITY) if q in stats and stats[q]["mean"] > 0]
    for q in (*QUANTITIES, *extra):
        s = stats[q]
        fmt = "{:>10.2f}" if q == "encoder_llm_ratio" else "{:>10.0f}"
        lines.append(f"{q:<20}" + "".join(fmt.format(s[k]) for k in ("mean", "p5", "p50", "p95")))
    return "\n".join(lines)


def plot_token_cdfs(cols: dict[str, np.ndarray], name: str, path: str) -> None:
    """Two panels like paper Fig. 3: text tokens and vision tokens (ViT patches and merged LLM image
    tokens) per sample, empirical CDFs on log2 x axes."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_text, ax_vis) = plt.subplots(1, 2, figsize=(9, 3.4), constrained_layout=True)
    _cdf(ax_text, cols["text_tokens"], "text tokens", "-")
    _cdf(ax_vis, cols["vit_patches"], "ViT patches", "-")
    _cdf(ax_vis, cols["image_tokens"], "LLM image tokens (2x2 merged)", "--")
    ax_text.set_title(f"{name}: text tokens per sample", fontsize=10)
    ax_vis.set_title(f"{name}: vision tokens per sample", fontsize=10)
    for ax in (ax_text, ax_vis):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_token_label))
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("CDF")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    ax_text.set_xlabel("tokens (log2)")
    ax_vis.set_xlabel("tokens (log2)")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _token_label(x: float, _pos: int) -> str:
    """Powers of two as 32, 512, 1K, 16K (paper Fig. 3's axis labels)."""
    return f"{x / 1024:g}K" if x >= 1024 else f"{x:g}"


def _cdf(ax, values: np.ndarray, label: str, style: str) -> None:
    x = np.sort(values[values > 0])
    if x.size:
        ax.step(x, np.arange(1, x.size + 1) / x.size, style, where="post", label=label)
