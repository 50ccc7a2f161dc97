"""``entrain profile``: measure per-layer forward / backward times of a model preset on this machine and
write a cost model JSON (the analytic presets' schema) for ``--profile`` of every other command."""

from __future__ import annotations

import argparse
import sys

from entrain.cli.common import MODEL_PRESETS, default_hardware
from entrain.core.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure per-layer costs of a model on this machine", description=__doc__
    )
    p.add_argument("--model", default="tiny", choices=MODEL_PRESETS)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument(
        "--tokens",
        default="64,256,1024,4096",
        help="comma list of sequence-unit sizes (ViT patches per image / LLM tokens per sample)",
    )
    p.add_argument("--repeats", type=int, default=5, help="timed runs per size (median), after one warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--verbose", action="store_true", help="per-layer times on stderr")
    p.set_defaults(func=run)


def _tokens(text: str) -> list[int]:
    try:
        values = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ConfigError(f"--tokens must be a comma list of integers, got {text!r}") from None
    if len(values) < 3 or values[0] < 4:
        raise ConfigError(f"--tokens needs at least 3 distinct sizes >= 4 to fit a, b, c; got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    tokens = _tokens(args.tokens)
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    import torch

    from entrain.core.presets import build_cost_model
    from entrain.models.config import get_model_config
    from entrain.models.vlm import build_vlm
    from entrain.runtime.profiler import profile_model

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no GPU")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    cfg = get_model_config(args.model)
    model = build_vlm(cfg, seed=args.seed).to(device)
    analytic = build_cost_model(args.model, default_hardware(args.model))
    log = (lambda m: print(m, file=sys.stderr)) if args.verbose else None
    cost = profile_model(
        model, cfg, analytic, tokens=tokens, device=device, repeats=args.repeats, progress=log
    )
    cost.save(args.out)
    print(
        f"wrote {args.out}: {len(cost.encoder.layers)} encoder + {len(cost.llm.layers)} LLM layers "
        f"profiled on {device}",
        file=sys.stderr,
    )
    return 0
