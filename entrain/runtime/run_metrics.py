"""What one system's run records on this rank: the per-step series its summary is made of, and on rank 0
``config.json`` and ``metrics.jsonl`` (opened at the first trained step), ``--trace``'s action trace
(gathered from every rank), ``--tensorboard``'s scalars and the progress bar; MFU on a known GPU."""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

import torch

from entrain.config import RunConfig
from entrain.core.planning.setups import SystemSetup
from entrain.runtime.checkpointer import fingerprint
from entrain.runtime.preflight import resolve_precision
from entrain.runtime.run_data import RunData
from entrain.runtime.run_folder import METRICS, open_metrics, write_json

if TYPE_CHECKING:
    from entrain.runtime.distributed import DistEnv
    from entrain.runtime.replan import StepMonitor
    from entrain.runtime.tensorboard import ScalarLog
    from entrain.runtime.trace import ActionTracer
    from entrain.runtime.trainer import PipelineTrainer, StepResult

__all__ = ["RunMetrics", "SystemSummary", "model_flops", "peak_flops", "stage_std_ms", "summary_line"]


@dataclass
class SystemSummary:
    system: str
    iter_ms: float
    stage_std_ms: float
    first_loss: float
    last_loss: float
    tokens_per_s: float
    out: str
    skipped: str | None = None
    """The run's skipped-records line (``RunData.skipped``), for the final summary."""
    replans: list[dict] = field(default_factory=list)
    """``--replan auto``: every re-plan of the run (``entrain.sim.drift.Replan.to_json``)."""


def stage_std_ms(records: Sequence[dict]) -> float:
    """Per (rank, stage) -- a stage of one replica --, the population std across microbatches of
    (forward + backward) ms summed over the microbatch's subs; mean over them."""
    per_stage: dict[tuple[int, int], dict[int, float]] = {}
    for r in records:
        mbs = per_stage.setdefault((r["rank"], r["stage"]), {})
        mbs[r["mb"]] = mbs.get(r["mb"], 0.0) + r["fwd_ms"] + r["bwd_ms"]
    stds = [statistics.pstdev(v.values()) for v in per_stage.values() if len(v) > 1]
    return statistics.fmean(stds) if stds else 0.0


def summary_line(s: SystemSummary) -> str:
    return (
        f"system={s.system} iter_ms={s.iter_ms:.1f} stage_std_ms={s.stage_std_ms:.1f} "
        f"loss={s.first_loss:.4f}->{s.last_loss:.4f}" + _replans_note(s.replans)
    )


def _replans_note(replans: Sequence[dict]) -> str:
    """`` replans=N (after step S: E.PP a / L.PP b -> E.PP c / L.PP d; ...)``, each split with its
    ``dp D tp T mb U`` where the re-plan changed a degree; empty without re-plans."""
    if not replans:
        return ""

    def split(r: dict, side: str) -> str:
        a = r[f"{side}_allocation"]
        out = f"E.PP {a['encoder']['pp']} / L.PP {a['llm']['pp']}"
        if set(r.get("changed", ())) - {"split"}:
            out += f" dp {a['dp']} tp {a['encoder']['tp']} mb {r[f'{side}_microbatch_size']}"
        return out

    each = [f"after step {r['iteration']}: {split(r, 'old')} -> {split(r, 'new')}" for r in replans]
    return f" replans={len(replans)} ({'; '.join(each)})"


_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "A40": 149.7e12, "L40S": 362e12, "A10": 125e12}


def peak_flops(device: torch.device) -> float | None:
    env = os.environ.get("ENTRAIN_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in _PEAK_FLOPS.items() if k in name), None)


def model_flops(model, plan_it, renderer) -> float:
    """6 * params * tokens per component (dense estimate, attention excluded)."""
    from entrain.models.families.registry import build_stage, family_of

    def params(component: str) -> int:
        end = len(family_of(model).layer_names(renderer.cfg.shape, component))
        return sum(p.numel() for _, p in build_stage(model, component, 0, end).owned_parameters())

    vis, llm = params("encoder"), params("llm")
    ids = [s for rep in plan_it.microbatches for mb in rep for s in mb.llm_ids]
    patches = sum(t * h * w for s in ids for t, h, w in renderer.sample(s).grid_thw)
    tokens = sum(renderer.sample(s).num_tokens for s in ids)
    return 6.0 * (vis * patches + llm * tokens)


def _gather_events(env, events: list[dict]) -> list[dict]:
    """Every rank's trace events of one step, on rank 0 (empty elsewhere)."""
    import torch.distributed as dist

    gathered = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(events, gathered, dst=0)
    return [e for part in gathered for e in part] if env.rank == 0 else []


def _write_config(spec: RunConfig, system: str, setup, env, out: str, start: int) -> None:
    """Rank 0's ``config.json``: the run's configuration, where it runs and the step it starts at;
    ``decisions``: every automatic choice the planner made for the setup (``plan``'s and ``simulate``'s
    ``decisions``; a ``--plan`` file's own)."""
    config = {
        "spec": spec.to_json(),
        "setup": setup.source,
        "decisions": [d.to_json() for d in setup.decisions],
        "flags": spec.run.flags,
        "system": system,
        "world_size": env.world_size,
        "device": str(env.device),
        "backend": env.backend,
        "layout": setup.layout.to_json(),
        "torch": torch.__version__,
        "resumed_from_step": start,
        "fingerprint": fingerprint(spec, system),
        "precision": resolve_precision(spec, env.device),
    }
    write_json(os.path.join(out, "config.json"), config)


@dataclass
class _Series:
    """The per-step numbers the summary is made of (a resumed run's earlier steps included)."""

    losses: list[float]
    times: list[float]
    tps: list[float]
    stds: list[float]

    @classmethod
    def of(cls, rows: Sequence[dict]) -> _Series:
        return cls(
            [r["loss"] for r in rows],
            [r["iteration_time_ms"] for r in rows],
            [r["tokens_per_s"] for r in rows],
            [stage_std_ms(r["stage_times"]) for r in rows],
        )

    def summary(self, system: str, out: str, data: RunData, drift) -> SystemSummary:
        """Medians over the steps after the first (a warm-up), or over the one step there is."""
        nan = float("nan")
        times, stds, tps = self.times, self.stds, self.tps
        warm = slice(1, None) if len(times) > 1 else slice(None)
        return SystemSummary(
            system=system,
            iter_ms=statistics.median(times[warm]) if times else nan,
            stage_std_ms=statistics.median(stds[warm]) if stds else 0.0,
            first_loss=self.losses[0] if self.losses else nan,
            last_loss=self.losses[-1] if self.losses else nan,
            tokens_per_s=statistics.median(tps[warm]) if tps else nan,
            out=out,
            skipped=data.skipped,
            replans=drift.replans() if drift is not None else [],
        )


@dataclass
class RunMetrics:
    """One system's records on this rank (rank 0 writes them): metrics rows, TensorBoard scalars, the
    trace, the progress bar, and the series the summary is made of."""

    spec: RunConfig
    system: str
    env: DistEnv
    out: str
    data: RunData
    setup: SystemSetup
    start: int = 0
    kept: list[dict] = field(default_factory=list)
    tracer: ActionTracer | None = None
    trace_events: list[dict] = field(default_factory=list)
    scalars: ScalarLog | None = None
    bar: object = None
    """The tqdm progress bar (rank 0 with ``--progress``)."""
    metrics: IO[str] | None = None
    series: _Series = field(default_factory=lambda: _Series([], [], [], []))

    @property
    def rank0(self) -> bool:
        return self.env.rank == 0

    def open_trace(self, trainer: PipelineTrainer, start: int) -> None:
        """``--trace``'s action tracer (a resumed run keeps the earlier steps' events) and
        ``--tensorboard``'s scalar log (rank 0; later steps purged)."""
        if self.spec.run.trace:
            from entrain.runtime.trace import ActionTracer, read_step_ends, read_trace

            self.tracer = trainer.executor.tracer = ActionTracer(self.env.rank)
            trace_path = os.path.join(self.out, "trace.json")
            if self.rank0 and start > 0 and os.path.exists(trace_path):
                kept = read_trace(trace_path) + read_step_ends(trace_path)
                self.trace_events = [e for e in kept if e["args"]["step"] < start]
        if self.spec.run.tensorboard and self.rank0:
            from entrain.runtime.tensorboard import ScalarLog

            self.scalars = ScalarLog(self.out, purge_step=start)

    def open_progress(self, start: int, kept: list[dict]) -> None:
        """The progress bar (rank 0) and the series continued from ``kept``; ``metrics.jsonl`` and
        ``config.json`` wait for the first step (``open_records``)."""
        if self.rank0 and self.spec.run.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.spec.run.steps,
                initial=start,
                desc=self.system,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )
        self.series = _Series.of(kept)
        self.start, self.kept = start, kept

    def open_records(self) -> None:
        """Rank 0, once the run's first step trained: ``config.json`` and ``metrics.jsonl`` (the ``kept``
        rows first), what makes the folder hold a run (``run_folder.RUN_MARKERS``): a start that fails
        before (a missing shard, a truncated weights file, a layout the system cannot run) leaves none,
        and the same command is accepted again once its input is fixed."""
        _write_config(self.spec, self.system, self.setup, self.env, self.out, self.start)
        self.metrics = open_metrics(os.path.join(self.out, METRICS), self.kept)

    def set_step(self, step: int) -> None:
        """The step the tracer's events belong to."""
        if self.tracer is not None:
            self.tracer.step = step

    def record(self, step: int, row: dict, res: StepResult) -> None:
        """The step into the series, the trace, ``metrics.jsonl`` and TensorBoard."""
        series = self.series
        series.losses.append(res.loss)
        series.times.append(res.iteration_time_ms)
        series.tps.append(res.tokens_per_s)
        if self.tracer is not None:
            self.trace_events += _gather_events(self.env, self.tracer.drain())
        if self.rank0:
            series.stds.append(stage_std_ms(res.records))
            if self.metrics is None:
                self.open_records()
            self.metrics.write(json.dumps(row) + "\n")
            self.metrics.flush()
        if self.scalars is not None:
            self.scalars.write(
                step, {**row, "stage_std_ms": series.stds[-1], "skipped_samples": self.data.num_skipped}
            )

    def show(self, res: StepResult) -> None:
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{res.loss:.3f}",
                iter_ms=f"{res.iteration_time_ms:.0f}",
                tok_s=f"{res.tokens_per_s:.0f}",
            )
            self.bar.update(1)

    def close(self) -> None:
        """Close the records; rank 0 writes the trace."""
        if self.metrics is not None:
            self.metrics.close()
        if self.scalars is not None:
            self.scalars.close()
        if self.tracer is not None and self.rank0 and self.trace_events:
            from entrain.runtime.trace import write_trace

            write_trace(os.path.join(self.out, "trace.json"), self.trace_events)
        if self.bar is not None:
            self.bar.close()

    def summary(self, drift: StepMonitor | None) -> SystemSummary:
        return self.series.summary(self.system, self.out, self.data, drift)
