"""``entrain simulate``: run each system's Plan (its own batcher, schedule and configuration) through
the discrete-event simulator and report iteration time, bubbles, per-microbatch variability and
memory (docs/contract.md ``entrain simulate``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

from entrain.cli.common import (
    add_common_args,
    add_entrain_extension_args,
    add_shared_flags,
    apply_paper_entrain,
    config_sampler,
    config_workload,
    emit_json,
)
from entrain.cli.config_file import add_config_arg
from entrain.cli.replan_flags import add_replan_args
from entrain.config import RunConfig
from entrain.core.errors import ConfigError
from entrain.core.planning.setups import system_setups
from entrain.core.planning.system_setup import Decision
from entrain.core.systems import ENTRAIN, default_systems, systems_where
from entrain.sim.adaptive import REPLAN_SYSTEMS, adaptive_deploy, monitor_for
from entrain.sim.choose import candidate_judge
from entrain.sim.memory_fit import deploy
from entrain.sim.run import SystemRun
from entrain.sim.towers import PER_ENCODER, SHARED, TOWERS, towers_decision

DEFAULT_SYSTEMS = default_systems("simulate")
OURS = systems_where("ours")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate each system's pipeline schedule", description=__doc__
    )
    add_common_args(p, "simulate", systems_default=DEFAULT_SYSTEMS)
    add_shared_flags(p, "simulate", "ep")
    add_config_arg(p)
    p.add_argument("--plot-dir", default=None, help="write gantt_<system>.png, fwd_time.png, memory.png here")
    p.add_argument(
        "--eager-budget-factor",
        type=float,
        default=1.25,
        help="Entrain's eager-forward activation budget factor (default 1.25)",
    )
    add_entrain_extension_args(p)
    add_replan_args(p)
    p.set_defaults(func=run)


@dataclass(frozen=True)
class SimulateRequest:
    """What ``entrain simulate`` does: the run's configuration and its own flags (read once)."""

    config: RunConfig
    iterations: int
    eager_budget_factor: float = 1.25
    plot_dir: str | None = None
    json: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimulateRequest:
        apply_paper_entrain(args)
        if args.iterations < 1:
            raise ConfigError(f"--iterations must be >= 1, got {args.iterations}")
        own = {k: getattr(args, k) for k in ("eager_budget_factor", "plot_dir", "json") if hasattr(args, k)}
        iterations = args.iterations
        return cls(RunConfig.from_args(args), iterations, **own)


def simulate_systems(args: argparse.Namespace, systems: list[str]) -> tuple[dict[str, SystemRun], dict]:
    """Run every system; returns the runs and the setups' descriptions."""
    return simulate(SimulateRequest.from_args(args), systems)


def simulate(
    req: SimulateRequest, systems: list[str], *, one_encoder: bool = False, choose_towers: bool = True
) -> tuple[dict[str, SystemRun], dict]:
    """Run every system of ``systems`` on the request's workload; the runs and the setups' descriptions.
    A model with several encoder towers takes the N-encoder path (``_simulate_encoders``) unless
    ``one_encoder`` (its towers planned as one encoder component in the first stages, 1F1B's way: a
    benchmark's comparison); there Entrain also runs on the one-encoder path and keeps the faster
    fitting layout (``choose_entrain_towers``; ``choose_towers`` False: the N-encoder plan as is)."""
    config = req.config
    cost = config.model.cost_model()
    batches = list(config_workload(config, cost).batches(config.parallel.global_batch, req.iterations))
    req_setup = dataclasses.replace(config.config_request(), model=cost.model)  # a stock checkpoint's label
    sampler = config_sampler(config)
    unbuilt: dict[str, str] = {}
    encoders = None if one_encoder else _encoders(config)
    if encoders is not None:
        runs, configs = _simulate_encoders(req, systems, batches, encoders, sampler)
        if choose_towers and ENTRAIN in runs:
            try:
                one_runs, one_configs = simulate(req, [ENTRAIN], one_encoder=True)
            except ConfigError as e:  # no one-encoder Entrain: the N-encoder plan stays, the reason noted
                print(
                    f"entrain simulate: {ENTRAIN} on the one-encoder path: {e}", file=sys.stderr, flush=True
                )
            else:
                choose_entrain_towers(
                    runs, configs, one_runs[ENTRAIN], one_configs[ENTRAIN], req_setup.margin
                )
                _speedups(runs)
        return runs, configs
    judge = candidate_judge(sampler, cost, req_setup)
    setups = system_setups(systems, req_setup, cost, sampler, judge, unbuilt=unbuilt)
    if not setups:
        raise ConfigError(
            "no system's configuration can be built: " + "; ".join(f"{n}: {w}" for n, w in unbuilt.items())
        )
    runs = {}
    for name in setups:
        setup = setups[name]
        extra = {"eager_budget_factor": req.eager_budget_factor} if name == ENTRAIN else {}
        print(f"entrain simulate: {name} ...", file=sys.stderr, flush=True)
        if config.schedule.replan == "auto" and name in REPLAN_SYSTEMS:
            setups[name], runs[name] = _adaptive(
                name, setup, batches, cost, req_setup, sampler, config, extra
            )
        else:
            options = {**setup.options, **extra}
            setups[name], runs[name] = deploy(name, setup, batches, cost, options, margin=req_setup.margin)
    if ENTRAIN in runs:
        base = runs[ENTRAIN].metrics.iteration_time_ms
        for r in runs.values():
            r.metrics.entrain_speedup = r.metrics.iteration_time_ms / base if base > 0 else None
    configs = {
        n: {**_describe(s.layout, s.source, s.b_min), "decisions": _decisions(s)} for n, s in setups.items()
    }
    return runs, {**configs, **{n: {"source": why, "not_built": why} for n, why in unbuilt.items()}}


def _encoders(config: RunConfig):
    """The encoders of a model with several encoder towers (``runtime.planning.run_encoders``, as
    ``entrain train`` plans them: an audio tower beside the vision tower, priced by the run's preset);
    None for a one-encoder model. A measured profile does not time the audio tower: refused here for
    such a model (train falls back to the one-encoder path)."""
    from entrain.runtime.planning import run_encoders

    model = config.model
    arch = model.arch()
    if getattr(arch, "audio", None) is None:
        return None
    if model.profile:
        raise ConfigError(
            f"--profile {model.profile}: {arch.name} has an audio tower beside the vision tower, which a "
            "measured profile does not time; simulate it on a hardware preset (--hardware)"
        )
    asked = [
        f
        for f, on in (
            ("--ep", (config.parallel.ep or 1) > 1),
            ("--replan auto", config.schedule.replan == "auto"),
        )
        if on
    ]
    if asked:
        raise ConfigError(
            f"{arch.name} is simulated with one pipeline per encoder, which has no {' or '.join(asked)} yet"
        )
    return run_encoders(config)


def _simulate_encoders(req: SimulateRequest, systems: list[str], batches, encoders, sampler):
    """A model with several encoder towers: every system that plans one pipeline per encoder
    (``entrain.sim.encoders_run``); the others named in ``not_built`` with their one-line reason."""
    from entrain.sim.encoders_run import run_encoders_systems

    for name in systems:
        print(f"entrain simulate: {name} ...", file=sys.stderr, flush=True)
    unbuilt: dict[str, str] = {}
    decisions: dict = {}
    margin = req.config.config_request().margin
    runs, b = run_encoders_systems(
        systems, sampler, batches, encoders, req.config.parallel, unbuilt, decisions, margin=margin
    )
    if not runs:
        raise ConfigError(
            "no system's plan can be built: " + "; ".join(f"{n}: {w}" for n, w in unbuilt.items())
        )
    _speedups(runs)
    source = f"N-encoder planner ({', '.join(e.name for e in encoders)}), b_min {b.b_min}"
    configs = {
        n: {**_describe(r.layout, source, b.b_min), "decisions": [d.to_json() for d in decisions.get(n, [])]}
        for n, r in runs.items()
    }
    return runs, {**configs, **{n: {"source": why, "not_built": why} for n, why in unbuilt.items()}}


# ``choose_entrain_towers``' decision on a model with several encoder towers (``sim.towers``, the rule
# ``plan`` and ``train`` apply too): TOWERS, PER_ENCODER (the default) or SHARED, imported above.


def choose_entrain_towers(
    runs: dict[str, SystemRun], configs: dict, one_run: SystemRun, one_config: dict, margin: float
) -> Decision:
    """Entrain on a model with several encoder towers: its N-encoder run (``runs[ENTRAIN]``, described in
    ``configs[ENTRAIN]``) or its one-encoder run (``one_run``, ``one_config``: both towers in the first
    stages), whichever simulates faster and fits (the N-encoder one unless the other is faster past
    ``margin``: ``sim.towers.towers_decision``); ``runs`` and ``configs`` then hold the chosen one, its
    ``decisions`` ending with this one (``TOWERS``)."""
    found = {PER_ENCODER: (runs[ENTRAIN], configs[ENTRAIN]), SHARED: (one_run, one_config)}
    d = towers_decision(runs[ENTRAIN], one_run, margin)
    run, described = found[d.chosen]
    runs[ENTRAIN] = run
    configs[ENTRAIN] = {**described, "decisions": [*described.get("decisions", []), d.to_json()]}
    return d


def _speedups(runs: dict[str, SystemRun]) -> None:
    if ENTRAIN in runs:
        base = runs[ENTRAIN].metrics.iteration_time_ms
        for r in runs.values():
            r.metrics.entrain_speedup = r.metrics.iteration_time_ms / base if base > 0 else None


def not_built(configs: dict) -> dict[str, str]:
    """``{system: reason}`` of the systems whose configuration could not be built (no run: they do not
    fit, as a plan over device memory does not)."""
    return {n: c["not_built"] for n, c in configs.items() if "not_built" in c}


def _decisions(setup) -> list[dict]:
    """``systems.<name>.decisions``: every automatic choice of the setup, with its candidates' times."""
    return [d.to_json() for d in setup.decisions]


def _adaptive(name, setup, batches, cost, req, sampler, config: RunConfig, extra):
    """``--replan auto``: the system re-planned on drift (``entrain.sim.adaptive``); its run carries
    ``replans`` and ``drift``, its setup is the first segment's."""
    monitor = monitor_for(
        name, setup, req, cost, sampler, total_iterations=len(batches), settings=config.schedule.replan_settings(),
        extra_options=extra,
    )  # fmt: skip
    got = adaptive_deploy(name, monitor, batches, cost, extra)
    for r in monitor.replans:
        print(f"entrain simulate: {name}: re-plan after iteration {r.iteration}: {_split(r.old_allocation)} -> "
              f"{_split(r.new_allocation)} (predicted gain {r.predicted_gain:.1%})", file=sys.stderr, flush=True)  # fmt: skip
    got.run.replans = [r.to_json() for r in monitor.replans]
    got.run.drift = [d.to_json() for d in monitor.history]
    return got.setups[0], got.run


def _split(alloc: dict) -> str:
    return f"E.PP {alloc['encoder']['pp']} / L.PP {alloc['llm']['pp']}"


def _describe(layout, source: str, b_min: int | None = None) -> dict:
    comps = {k: v.to_json() for k, v in layout.components.items()}
    return {
        "source": source,
        "b_min": b_min,
        "dp": layout.dp,
        "num_microbatches": layout.num_microbatches,
        "ranks_per_replica": layout.ranks_per_replica,
        "components": comps,
        "recompute": [st.recompute for st in layout.stages],
    }


def _config(described: dict) -> dict:
    return {k: v for k, v in described.items() if k != "decisions"}


def best_fitting_baseline(runs: dict[str, SystemRun]) -> tuple[str | None, float | None]:
    """(fastest baseline whose plan fits device memory, its time / Entrain's); a baseline that does
    not fit never counts (nor does an Entrain that does not fit)."""
    fitting = {n: r for n, r in runs.items() if n not in OURS and r.metrics.fits_memory is not False}
    if not fitting:
        return None, None
    best = min(fitting, key=lambda n: fitting[n].metrics.iteration_time_ms)
    mine = runs.get(ENTRAIN)
    if mine is None or mine.metrics.fits_memory is False or mine.metrics.iteration_time_ms <= 0:
        return best, None
    return best, fitting[best].metrics.iteration_time_ms / mine.metrics.iteration_time_ms


def _drift_json(run: SystemRun) -> dict:
    """``replans`` (every system: [] when none) and, where the monitor ran, ``drift`` per iteration."""
    out = {"replans": list(run.replans or [])}
    if run.drift is not None:
        out["drift"] = run.drift
    return out


def to_json(runs: dict[str, SystemRun], configs: dict, req: SimulateRequest) -> dict:
    top = runs.get(ENTRAIN) or next(iter(runs.values()))
    best, ratio = best_fitting_baseline(runs)
    return {
        "systems": {
            n: {
                **r.metrics.to_json(),
                "config": _config(configs[n]),
                "decisions": configs[n].get("decisions", []),
                **_drift_json(r),
            }
            for n, r in runs.items()
        },  # fmt: skip
        "not_built": not_built(configs),
        "best_fitting_baseline": best,
        "entrain_vs_best_fitting_baseline": ratio,
        "ideal_ms": top.metrics.ideal_ms,
        "lower_bound_ms": top.metrics.lower_bound_ms,
        "dataset": req.config.data.dataset,
        "model": req.config.model.arch().name,
        "hardware": req.config.model.hardware_label(),
        "iterations": req.iterations,
        "global_batch": req.config.parallel.global_batch,
        "microbatch_size": req.config.parallel.microbatch_size,
        "seed": req.config.data.seed,
    }


def table(runs: dict[str, SystemRun], configs: dict) -> str:
    cols = (f"{'system':<16}{'iter ms':>10}{'vs entrain':>11}{'bubble':>8}{'enc std':>9}{'llm std':>9}"
            f"{'peak GB':>9}{'mem GB':>11}{'ideal':>9}{'part.ideal':>11}{'lower bd':>10}  config")  # fmt: skip
    lines = [cols, "-" * len(cols)]
    for name, r in runs.items():
        m = r.metrics
        c = configs[name]["components"]
        speed = f"{m.entrain_speedup:.2f}x" if m.entrain_speedup else "-"
        peaks = m.peak_memory_bytes_per_rank
        mem = "-" if not peaks else f"{max(peaks) / 1e9:.1f}" + ("" if m.fits_memory else " OOM")
        enc = "encoder" if "encoder" in c else None
        pps = " / ".join(f"{'E' if k == 'encoder' else k[0].upper()}.PP {v['pp']}" for k, v in c.items())
        cfg = f"{pps} (tp {c['llm']['tp']}, dp {configs[name]['dp']})"
        if name in OURS and enc and c["encoder"]["pp"] + c["llm"]["pp"] > configs[name]["ranks_per_replica"]:
            cfg += f", {configs[name]['ranks_per_replica']} ranks: one shares the encoder/LLM boundary"
        lines.append(
            f"{name:<16}{m.iteration_time_ms:>10.1f}{speed:>11}{m.bubble_ratio:>8.3f}{m.encoder_fwd_std_ms:>9.1f}"
            f"{m.llm_fwd_std_ms:>9.1f}{m.peak_activation_bytes / 1e9:>9.2f}{mem:>11}{m.ideal_ms:>9.1f}"
            f"{m.partition_ideal_ms:>11.1f}{m.lower_bound_ms:>10.1f}  {cfg}"
        )
    lines += [f"{name:<16}does not fit: {why}" for name, why in not_built(configs).items()]
    best, ratio = best_fitting_baseline(runs)
    if ratio is not None:
        lines += [
            "",
            f"Entrain vs best fitting baseline ({best}): {ratio:.2f}x (baselines marked OOM do not count)",
        ]
    lines += ["", "times in ms (forward+backward, per iteration, mean over iterations); vs entrain = "
              "iteration time / Entrain's; std = per-microbatch forward time std; peak GB = activations; mem GB = "
              "model state (weights, grads, AdamW) + activations on the fullest rank, OOM = over device memory"]  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    req = SimulateRequest.from_args(args)
    runs, configs = simulate(req, list(req.config.schedule.systems))
    if req.plot_dir:
        from entrain.sim.plots import write_all

        for path in write_all(list(runs.values()), req.plot_dir):
            print(f"entrain simulate: wrote {path}", file=sys.stderr)
    if req.json:
        emit_json(to_json(runs, configs, req))
        return 0
    par = req.config.parallel
    print(f"entrain simulate: dataset {req.config.data.dataset}, model {req.config.model.arch().name}, "
          f"{req.iterations} iterations, global batch {par.global_batch}, microbatch size {par.microbatch_size}")  # fmt: skip
    print(table(runs, configs))
    for d in configs.get(ENTRAIN, {}).get("decisions", []):
        if d["name"] in (TOWERS, "microbatch count"):
            times = ", ".join(
                f"{n} " + ("does not fit" if v is None else f"{v:.1f} ms") for n, v in d["candidates"].items()
            )
            print(f"{ENTRAIN}: {d['name']}: {d['chosen']} ({times})")
    return 0
