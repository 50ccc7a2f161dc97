"""One training run on this rank: data -> Plans -> model -> steps -> run folder.

Every rank computes the same Plans locally (they are deterministic functions of the dataset order,
seed and config); rank 0 writes ``config.json``, ``plan.json`` and ``metrics.jsonl`` and shows the
progress bar on stderr. Shutdown waits on every pending send, runs a barrier, then destroys the
process group (cpu-feasibility.md section 6.8).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.plan import ComponentLayout, Layout, Plan
from entrain.core.work import SampleWork
from entrain.runtime.planning import COLOCATED_SYSTEMS, make_plan, runtime_layout

__all__ = ["TrainSpec", "SystemSummary", "build_layout", "check_spec", "run_systems", "summary_line"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSpec:
    """Everything a rank needs to run ``entrain train`` (the CLI's flags, resolved)."""

    dataset: str
    model: str
    systems: tuple[str, ...]
    encoder_stages: int
    llm_stages: int
    dp: int | None
    tp: int = 1
    cp: int = 1
    global_batch: int
    microbatch_size: int
    steps: int
    seed: int
    out: str
    hardware: str | None = None
    profile: str | None = None
    image_root: str | None = None
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 2
    max_grad_norm: float | None = 1.0
    val_every: int = 0
    val_batches: int = 1
    freeze: tuple[str, ...] = ()
    weights: str | None = None
    timeout_s: float = 300.0
    progress: bool = True
    shuffle: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp_or_1 * self.microbatch_size)

    @property
    def dp_or_1(self) -> int:
        return self.dp or 1


@dataclass
class SystemSummary:
    system: str
    iter_ms: float
    stage_std_ms: float
    first_loss: float
    last_loss: float
    tokens_per_s: float
    out: str


def _ranks_per_replica(spec: TrainSpec, system: str) -> int:
    colocated = system in COLOCATED_SYSTEMS
    return spec.encoder_stages if colocated else spec.encoder_stages + spec.llm_stages


def check_spec(spec: TrainSpec, world_size: int | None = None) -> None:
    """Refuse what the runtime cannot run, before any process group starts."""
    for name, degree in (("TP", spec.tp), ("CP", spec.cp)):
        if degree > 1:
            raise ConfigError(
                f"the runtime executes Plans with TP = CP = 1; the encoder and llm have {name} = {degree} "
                "(the planner and simulator cover it)"
            )
    from entrain.models.config import get_model_config

    cfg = get_model_config(spec.model)
    for comp, n in (("encoder", spec.encoder_stages), ("llm", spec.llm_stages)):
        layers = len(cfg.layer_names(comp))
        if not 1 <= n <= layers:
            raise ConfigError(
                f"--{comp}-stages {n}: the {spec.model} {comp} has {layers} layers "
                f"({', '.join(cfg.layer_names(comp)[:3])}, ...); use 1..{layers} stages"
            )
    if spec.steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {spec.steps}")
    dp = spec.dp_or_1
    if spec.global_batch % (dp * spec.microbatch_size):
        raise ConfigError(
            f"--global-batch {spec.global_batch} is not a multiple of dp {dp} x --microbatch-size "
            f"{spec.microbatch_size}"
        )
    for system in spec.systems:
        need = dp * _ranks_per_replica(spec, system)
        if world_size is not None and need != world_size:
            raise ConfigError(
                f"{system} with {spec.encoder_stages} encoder + {spec.llm_stages} LLM stages and dp {dp} needs "
                f"{need} processes, but {world_size} were started"
            )


def world_size_of(spec: TrainSpec) -> int:
    return max(spec.dp_or_1 * _ranks_per_replica(spec, s) for s in spec.systems)


def resolve_cost(spec: TrainSpec) -> CostModel:
    if spec.profile:
        return CostModel.load(spec.profile)
    from entrain.cli.common import default_hardware
    from entrain.core.presets import build_cost_model

    return build_cost_model(spec.model, spec.hardware or default_hardware(spec.model), freeze=spec.freeze)


def load_batches(spec: TrainSpec, cost: CostModel) -> tuple[list[list[SampleWork]], list[list[SampleWork]]]:
    """(training batches, held-out validation batches): consecutive global batches of the dataset."""
    from entrain.data.workload_io import load_workload

    num_val = spec.val_batches if spec.val_every > 0 else 0
    batches = list(
        load_workload(
            spec.dataset,
            cost,
            global_batch=spec.global_batch,
            iterations=spec.steps + num_val,
            seed=spec.seed,
            shuffle=spec.shuffle,
            image_root=spec.image_root,
        )
    )
    for batch in batches:
        for w in batch:
            if w.meta is None:
                raise ConfigError(
                    f"{spec.dataset}: sample {w.id!r} has no token metadata (a raw-work file); "
                    "training needs images and text token counts"
                )
    return batches[: spec.steps], batches[spec.steps :]


def record_source(spec: TrainSpec):
    """A LLaVA / Parquet dataset's real samples (images and conversations); None for the built-in
    generators and workload files, whose samples are rendered from their metadata."""
    from entrain.data.generators import is_builtin
    from entrain.data.workload_io import detect_format, resolve_dataset_file
    from entrain.runtime.data import RecordSource

    if is_builtin(spec.dataset):
        return None
    path = resolve_dataset_file(spec.dataset)
    return RecordSource(path, spec.image_root) if detect_format(path) == "conversation" else None


def build_layout(spec: TrainSpec, system: str, cost: CostModel, probe: Sequence[SampleWork]) -> Layout:
    layout = runtime_layout(
        cost,
        encoder_stages=spec.encoder_stages,
        llm_stages=spec.llm_stages,
        dp=spec.dp_or_1,
        microbatch_size=spec.microbatch_size,
        num_microbatches=spec.num_microbatches,
        probe=probe,
        colocated=system in COLOCATED_SYSTEMS,
    )
    comps = {k: ComponentLayout(tp=spec.tp, cp=spec.cp, pp=v.pp) for k, v in layout.components.items()}
    return Layout(
        dp=layout.dp,
        microbatch_size=layout.microbatch_size,
        num_microbatches=layout.num_microbatches,
        components=comps,
        stages=layout.stages,
    )


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
        f"loss={s.first_loss:.4f}->{s.last_loss:.4f}"
    )


_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "A40": 149.7e12, "L40S": 362e12, "A10": 125e12}


def _peak_flops(device: torch.device) -> float | None:
    env = os.environ.get("ENTRAIN_PEAK_TFLOPS")
    if env:
        return float(env) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in _PEAK_FLOPS.items() if k in name), None)


def _model_flops(model, plan_it, renderer) -> float:
    """6 * params * tokens per component (dense estimate, attention excluded)."""
    vis = sum(p.numel() for p in model.vision.parameters())
    llm = sum(p.numel() for p in model.llm.parameters())
    ids = [s for rep in plan_it.microbatches for mb in rep for s in mb.llm_ids]
    patches = sum(t * h * w for s in ids for t, h, w in renderer.sample(s).grid_thw)
    tokens = sum(renderer.sample(s).num_tokens for s in ids)
    return 6.0 * (vis * patches + llm * tokens)


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def run_systems(spec: TrainSpec, env) -> list[SystemSummary]:
    """Train each of ``spec.systems`` in turn (fresh model each) on an initialised process group."""
    check_spec(spec, env.world_size)
    cost = resolve_cost(spec)
    train_batches, val_batches = load_batches(spec, cost)
    summaries = []
    for system in spec.systems:
        out = spec.out if len(spec.systems) == 1 else os.path.join(spec.out, system)
        summaries.append(_run_one(spec, system, cost, train_batches, val_batches, env, out))
    return summaries


def _run_one(
    spec: TrainSpec, system: str, cost: CostModel, train_batches, val_batches, env, out: str
) -> SystemSummary:
    from entrain.models.config import get_model_config
    from entrain.models.vlm import build_vlm, set_trainable
    from entrain.runtime.data import SampleRenderer
    from entrain.runtime.trainer import OptimConfig, PipelineTrainer

    layout = build_layout(spec, system, cost, train_batches[0])
    plan: Plan = make_plan(system, layout, train_batches, cost)
    val_plan = make_plan(system, layout, val_batches, cost) if val_batches else None
    rank0 = env.rank == 0
    if rank0:
        os.makedirs(out, exist_ok=True)
        config = {
            "spec": asdict(spec),
            "system": system,
            "world_size": env.world_size,
            "device": str(env.device),
            "backend": env.backend,
            "layout": layout.to_json(),
            "torch": torch.__version__,
        }
        _write_json(os.path.join(out, "config.json"), config)
        _write_json(os.path.join(out, "plan.json"), plan.to_json())
    cfg = get_model_config(spec.model)
    model = build_vlm(cfg, seed=spec.seed, weights_dir=spec.weights)
    set_trainable(
        model,
        encoder="encoder" not in spec.freeze and "vit" not in spec.freeze,
        merger="encoder" not in spec.freeze,
        llm="llm" not in spec.freeze,
    )
    metas = {w.id: w.meta for batch in train_batches + val_batches for w in batch}
    renderer = SampleRenderer(cfg, metas, seed=spec.seed, device=env.device, source=record_source(spec))
    optim = OptimConfig(
        lr=spec.lr,
        weight_decay=spec.weight_decay,
        betas=spec.betas,
        warmup_steps=spec.warmup_steps,
        total_steps=spec.steps,
        max_grad_norm=spec.max_grad_norm,
    )
    autocast = torch.bfloat16 if env.device.type == "cuda" else None
    trainer = PipelineTrainer(
        layout=layout, model=model, env=env, renderer=renderer, optim=optim, autocast_dtype=autocast
    )
    peak = _peak_flops(env.device)
    bar = None
    if rank0 and spec.progress:
        from tqdm import tqdm

        bar = tqdm(total=spec.steps, desc=system, file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    losses, times, stds, tps = [], [], [], []
    metrics_path = os.path.join(out, "metrics.jsonl")
    metrics = open(metrics_path, "w") if rank0 else None  # noqa: SIM115 - closed below
    try:
        for step, it in enumerate(plan.iterations):
            res = trainer.train_step(it)
            row = {
                "step": step,
                "loss": res.loss,
                "iteration_time_ms": res.iteration_time_ms,
                "tokens_per_s": res.tokens_per_s,
                "lr": res.lr,
                "grad_norm": res.grad_norm,
                "cpu_ms": res.cpu_ms,
                "stage_times": res.records,
            }
            if peak:
                row["mfu"] = (
                    _model_flops(model, it, renderer)
                    / (res.iteration_time_ms / 1e3)
                    / (peak * env.world_size)
                )
            if val_plan is not None and (step + 1) % spec.val_every == 0:
                row["val_loss"] = statistics.fmean(trainer.evaluate(v) for v in val_plan.iterations)
            losses.append(res.loss)
            times.append(res.iteration_time_ms)
            tps.append(res.tokens_per_s)
            if rank0:
                stds.append(stage_std_ms(res.records))
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
            if bar is not None:
                bar.set_postfix(
                    loss=f"{res.loss:.3f}",
                    iter_ms=f"{res.iteration_time_ms:.0f}",
                    tok_s=f"{res.tokens_per_s:.0f}",
                )
                bar.update(1)
    finally:
        if metrics is not None:
            metrics.close()
        if bar is not None:
            bar.close()
        trainer.close()
    warm = slice(1, None) if len(times) > 1 else slice(None)
    return SystemSummary(
        system=system,
        iter_ms=statistics.median(times[warm]),
        stage_std_ms=statistics.median(stds[warm]) if stds else 0.0,
        first_loss=losses[0],
        last_loss=losses[-1],
        tokens_per_s=statistics.median(tps[warm]),
        out=out,
    )
