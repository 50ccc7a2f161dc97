"""``entrain profile``: measure per-layer forward / backward times of a model preset on this machine and
write a cost model JSON (the analytic presets' schema) for ``--profile`` of every other command.

One layer per layer kind is measured and replicated onto the layers of that kind (``--all-layers``
measures each one), in the precision training computes in (``--precision``, as ``entrain train``'s:
bf16 autocast, by default on CUDA); the profile records it, and ``plan`` / ``train`` warn when it
differs from the run's. Per layer and phase the fit quality (R^2, worst relative residual) is printed on
stderr; a layer whose quadratic misses a measurement by more than 20 % gets a monotone
piecewise-linear table instead (see docs/profiling.md).
"""

from __future__ import annotations

import argparse
import sys

from entrain.cli.common import (
    add_model_source_args,
    add_shared_flags,
    emit_json,
    model_source_of,
    resolve_cost_model,
)
from entrain.core.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure per-layer costs of a model on this machine", description=__doc__
    )
    add_shared_flags(p, "profile", "model")
    add_model_source_args(p)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    add_shared_flags(p, "profile", "precision")
    p.add_argument(
        "--tokens",
        default="64,256,1024,4096",
        help="comma list of sequence-unit sizes (ViT patches per image / LLM tokens per sample); "
        "2 sizes fit b, c only",
    )
    p.add_argument("--repeats", type=int, default=5, help="timed runs per size (median), at most")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per size before the timed ones")
    p.add_argument(
        "--budget-s",
        type=float,
        default=1.0,
        help="wall seconds per layer and size after which timed runs stop early (at least one runs)",
    )
    p.add_argument("--all-layers", action="store_true", help="measure every layer, not one per kind")
    add_shared_flags(p, "profile", "seed")
    p.add_argument(
        "--from-trace",
        default=None,
        metavar="RUN",
        help="refit the run's cost model from RUN/trace.json (entrain train --trace) instead of timing layers: "
        "per-stage times and per-action overheads by least squares (docs/profiling.md); the model is the run's",
    )
    p.add_argument(
        "--also-trace",
        action="append",
        default=[],
        metavar="RUN",
        help="with --from-trace: another traced run of the same model and cost model whose Plan cuts the "
        "components at other layers (e.g. the Entrain run next to a 1F1B one); every run is fitted at once, "
        "per layer group, so each cut is priced as the runs ran it (repeatable)",
    )
    p.add_argument(
        "--fit-groups",
        choices=("kinds", "cuts"),
        default=None,
        help="with --also-trace: the layers one scale is fitted for: 'kinds' (default) = the layers of one kind wherever "
        "they sit (any cut is then priced from the traces), 'cuts' = the layer ranges between the runs' stage "
        "cuts (a cut no run made is priced by the run's cost model's split of its range)",
    )
    p.add_argument("--out", required=True, help="profile JSON to write")
    add_shared_flags(p, "profile", "json")
    p.add_argument("--verbose", action="store_true", help="measured times per size on stderr")
    p.set_defaults(func=run)


def _tokens(text: str) -> list[int]:
    try:
        values = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise ConfigError(f"--tokens must be a comma list of integers, got {text!r}") from None
    if len(values) < 2 or values[0] < 4:
        raise ConfigError(f"--tokens needs at least 2 distinct sizes >= 4 to fit a curve; got {text!r}")
    return values


def _fit_line(fit) -> str:
    table = " table" if fit.table else ""
    return (
        f"{fit.component:7s} {fit.layer:12s} {fit.kind:16s} {fit.phase}  R^2 {fit.quadratic.r2:7.4f}  "
        f"worst residual {fit.quadratic.worst_rel_residual:6.1%}{table}"
    )


def _target(args: argparse.Namespace):
    """``(shape, model config)`` to time: the family's runtime config of the preset, or of a checkpoint
    model's own transformers modules built from config.json; the weights are not read (they do not
    change the times), nor is a tokenizer."""
    from entrain.models.families.registry import family_of_source

    source = model_source_of(args)
    family = family_of_source(source)
    shape = family.shape(source)
    if not source.is_stock:
        return shape, family.runtime_config(source)[0]
    return shape, family.runtime_config(source, shape)[0]


def _device(name: str | None):
    """The device to time on; a CPU runs one thread with freed memory kept, as `entrain train`
    workers do (``entrain.runtime.cpu_allocator``)."""
    import torch

    from entrain.runtime.cpu_allocator import keep_freed_memory

    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no GPU")
    device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
        keep_freed_memory()
    return device


def run(args: argparse.Namespace) -> int:
    if args.also_trace and args.from_trace is None:
        raise ConfigError("--also-trace needs --from-trace (the runs to fit together)")
    if args.fit_groups and not args.also_trace:
        raise ConfigError("--fit-groups needs --also-trace (it groups the layers of a fit over several runs)")
    args.fit_groups = args.fit_groups or "kinds"
    if args.from_trace is not None:
        from entrain.cli.profile_trace import run_from_trace

        return run_from_trace(args)
    return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    """Time the layers (without ``--from-trace``)."""
    tokens = _tokens(args.tokens)
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be at least 0, got {args.warmup}")
    import torch

    from entrain.core.model.architectures import default_precision
    from entrain.runtime.profiler import profile_model

    arch, model_cfg = _target(args)
    threads = torch.get_num_threads()
    device = _device(args.device)
    precision = args.precision or default_precision(device.type)

    def log(fit) -> None:
        print(_fit_line(fit), file=sys.stderr)
        if args.verbose:
            print(f"    ms {[round(m, 3) for m in fit.ms]} at {list(fit.xs)}", file=sys.stderr)

    try:
        cost, fits = profile_model(
            model_cfg,
            resolve_cost_model(args),  # the preset whose layers are timed (no --hardware: the default)
            tokens=tokens,
            device=device,
            repeats=args.repeats,
            warmup=args.warmup,
            budget_s=args.budget_s,
            all_layers=args.all_layers,
            seed=args.seed,
            progress=log,
            precision=precision,
        )
    finally:
        torch.set_num_threads(threads)
    cost.save(args.out)
    print(
        f"wrote {args.out}: {len(cost.encoder.layers)} encoder + {len(cost.llm.layers)} LLM layers of "
        f"{arch.name} from {len(fits) // 2} measured layers on {device} in {precision}; "
        f"{sum(f.table for f in fits)} of {len(fits)} fits use a table",
        file=sys.stderr,
    )
    _print_experts(cost.notes.get("experts"))
    if args.json:
        emit_json(
            {
                "model": arch.name,
                "device": str(device),
                "precision": precision,
                "tokens": tokens,
                "out": args.out,
                "layers": cost.notes["layers"],
                "fits": [f.to_json() for f in fits],
                **({"experts": cost.notes["experts"]} if "experts" in cost.notes else {}),
            }
        )
    return 0


def _print_experts(experts: dict | None) -> None:
    """The mixture-of-experts block's fit on stderr (``entrain.runtime.profile_experts``)."""
    if experts:
        f, b = experts["fwd"], experts["bwd"]
        print(
            f"experts: {f['slot_ms'] * 1e3:.3f} / {b['slot_ms'] * 1e3:.3f} us per routed slot, "
            f"{f['call_ms']:.3f} / {b['call_ms']:.3f} ms per expert called (fwd / bwd); "
            "written to every sparse layer's experts.measured",
            file=sys.stderr,
        )
