"""One training run on this rank: data -> Plans -> model -> steps -> run folder, for each system.

Every rank computes the same Plans locally (they are deterministic functions of the dataset order,
seed and config: computed a step or two ahead by a background process, ``entrain.runtime.plan_prefetch``);
rank 0 writes ``plan.json`` at the end. One system's run is a ``SystemRun``, whose components are listed
at its top: the batches (``entrain.runtime.run_data``), the model, its sample renderer and the pipeline
trainer, the step Plans, the checkpoints (``entrain.runtime.checkpointer``: saved every
``checkpoint_every`` steps and at the end; with ``resume`` or on a torchrun restart the run continues
from the newest complete one, bitwise the uninterrupted run) and the records
(``entrain.runtime.run_metrics``: ``config.json``, ``metrics.jsonl`` with each step's ``plan_hash``,
epoch and sample ids, the trace, TensorBoard, the progress bar). The checks before any of it are
``entrain.runtime.preflight``'s. Shutdown waits on every pending send, runs a barrier, then destroys
the process group (docs/design.md §6.7).
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from entrain.config import RunConfig
from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import trainable_parts
from entrain.core.errors import ConfigError
from entrain.core.ir.plan import IterationPlan, Layout, Plan
from entrain.core.planning.bmin import below_b_min_warning
from entrain.core.planning.setups import SystemSetup
from entrain.runtime.accounting import plan_hash
from entrain.runtime.checkpointer import Checkpointer, agree
from entrain.runtime.planning import (
    EncodersMemoryFit,
    EncodersProfile,
    EncodersStepPlanner,
    EncodersTowers,
    JudgeFactory,
    MemoryCheck,
    make_plan,
    run_encoders,
    run_setups,
)
from entrain.runtime.preflight import check_spec, resolve_precision
from entrain.runtime.replan import step_monitor
from entrain.runtime.run_data import RunData, load_data, record_source
from entrain.runtime.run_folder import METRICS, history, system_out, write_json
from entrain.runtime.run_metrics import RunMetrics, SystemSummary, model_flops, peak_flops

if TYPE_CHECKING:
    from entrain.runtime.data import SampleRenderer
    from entrain.runtime.distributed import DistEnv
    from entrain.runtime.health import PeerWatch
    from entrain.runtime.plan_prefetch import StepPlans
    from entrain.runtime.replan import ReplanRequested, StepMonitor
    from entrain.runtime.trainer import PipelineTrainer, StepResult

__all__ = ["RunInputs", "SystemRun", "run_systems"]


@dataclass
class RunInputs:
    """What every system of the run shares on this rank."""

    spec: RunConfig
    env: DistEnv
    cost: CostModel
    data: RunData
    watch: PeerWatch
    model_cfg: object
    """The model config (``model_source.model_config``; a family's config class)."""
    tokenizer: object = None
    monitor_factory: object = None
    """``--replan auto``'s drift monitor factory (``entrain.runtime.replan``)."""


def run_systems(
    spec: RunConfig,
    env,
    memory_check: MemoryCheck | None = None,
    judge_factory: JudgeFactory | None = None,
    monitor_factory=None,
    encoders_profile: EncodersProfile | None = None,
    encoders_fit: EncodersMemoryFit | None = None,
    encoders_towers: EncodersTowers | None = None,
) -> list[SystemSummary]:
    """Train each of ``spec.schedule.systems`` in turn (fresh model each) on an initialised process group;
    ``memory_check``, ``judge_factory``, ``encoders_profile``, ``encoders_fit``, ``encoders_towers``: see
    ``entrain.runtime.planning.run_setups``;
    ``monitor_factory``: ``--replan auto``'s drift monitor (``entrain.runtime.replan``)."""
    from entrain.runtime.health import PeerWatch
    from entrain.runtime.model_source import model_config

    check_spec(spec, env.world_size)
    cost = spec.model.cost_model()
    if env.rank == 0:
        os.makedirs(spec.run.out, exist_ok=True)
    model_cfg, tokenizer = model_config(spec)
    data = load_data(spec, cost, owner=env.rank == 0, tokenizer=tokenizer)
    gpus = env.world_size // spec.parallel.tp
    setups = run_setups(
        spec,
        cost,
        data.train,
        gpus,
        memory_check,
        judge_factory,
        encoders_profile,
        encoders_fit,
        encoders_towers,
    )
    for system, setup in setups.items():
        if setup.layout.world_size * spec.parallel.tp != env.world_size:
            need = setup.layout.world_size * spec.parallel.tp
            raise ConfigError(
                f"{system}: the planned layout ({setup.source}) runs on {need} processes, but "
                f"{env.world_size} were started; start {need} (--nproc) or fix the stages "
                "with --encoder-stages / --llm-stages"
            )
        _warn_below_b_min(spec, setup, env)
    watch = PeerWatch(env.rank, env.world_size, spec.run.timeout_s)  # one sequence of points for all systems
    if env.world_size > 1:  # checkpoints need one run folder that every node sees
        from entrain.runtime.checkpoint import check_shared_folder

        check_shared_folder(spec.run.out, env.rank, agree(env, watch, "run folder: shared by every rank"))
    inputs = RunInputs(spec, env, cost, data, watch, model_cfg, tokenizer, monitor_factory)
    return [_run_one(inputs, s, setups[s]) for s in setups]


def _warn_below_b_min(spec: RunConfig, setup, env) -> None:
    """Rank 0 warns when the per-replica batch is below the planner's ``b_min`` (Algorithm 1)."""
    warning = below_b_min_warning(spec.parallel.global_batch, setup.layout.dp, setup.b_min)
    if env.rank == 0 and warning:
        print(warning, file=sys.stderr, flush=True)


def _pixel_ids(executor, it: IterationPlan) -> list[str]:
    """Samples whose pixels ``executor``'s rank processes in ``it``: its replica's encoder samples, in
    order, when it holds the first stage of an encoder pipeline that reads images; none otherwise
    (LLM-only ranks need ids only, an audio pipeline's clips)."""
    firsts = [g[0] for g in executor.layout.encoder_groups]
    if not any(s in executor.modules and executor.input_kind(s) != "audio" for s in firsts):
        return []
    return [s for mb in it.microbatches[executor.replica] for s in mb.encoder_ids]


def _step_plans(spec: RunConfig, system: str, layout: Layout, batches, cost: CostModel, options):
    """Each training step's Plan, computed ahead by a background process while earlier steps train
    (``entrain.runtime.plan_prefetch``; ``ENTRAIN_PLAN_PREFETCH=thread`` or ``0``: a thread, in line)."""
    from entrain.runtime.plan_prefetch import StepPlanner, StepPlans, prefetch_mode

    planner = StepPlanner(system, layout, cost, options, list(batches[0]))
    return StepPlans(planner, batches[: spec.run.steps], mode=prefetch_mode())


def _encoders_plans(spec: RunConfig, system: str, setup: SystemSetup, data) -> tuple[StepPlans, Plan | None]:
    """The step Plans and the validation Plan of a setup with one pipeline per encoder tower
    (``entrain.runtime.planning.encoders_setup``): each batch assigned on its searched configuration."""
    from entrain.runtime.plan_prefetch import StepPlans, prefetch_mode

    planner = EncodersStepPlanner(run_encoders(spec), setup.config, system, setup.layout)
    val = planner.plan(data.val) if data.val else None
    return StepPlans(planner, data.train[: spec.run.steps], mode=prefetch_mode()), val


def _own_stages(layout: Layout, rank: int) -> list[tuple[str, int, int]]:
    _, pp_rank = layout.replica_of(rank)
    return [(s.component_key, s.first_layer, s.end_layer) for s in layout.stages_of(pp_rank)]


def _run_one(inputs: RunInputs, system: str, setup: SystemSetup) -> SystemSummary:
    """Train ``system`` on this rank: its Plans, the run folder, the model (restored from a checkpoint
    when resuming), the step loop, then the summary."""
    spec, env, data, cost = inputs.spec, inputs.env, inputs.data, inputs.cost
    out = system_out(spec, system)
    if setup.layout.multi_encoder:  # one pipeline per encoder tower
        plans, val_plan = _encoders_plans(spec, system, setup, data)
    else:
        setup = replace(setup, layout=cost.layout_with_parts(setup.layout))  # the family's message parts
        plans = _step_plans(spec, system, setup.layout, data.train, cost, setup.options)
        val_plan = make_plan(system, setup.layout, data.val, cost, setup.options) if data.val else None
    layout = setup.layout
    rank0 = env.rank == 0
    if rank0:
        os.makedirs(out, exist_ok=True)
    checkpointer = Checkpointer(spec, system, layout, env, out, data, inputs.watch)
    ckpt = checkpointer.start_state()
    start = ckpt.step if ckpt is not None else 0
    plans.backfill(start)
    kept = history(os.path.join(out, METRICS), start) if rank0 else []
    run = _build_run(inputs, system, setup, plans, val_plan, checkpointer)
    run.metrics.open_trace(run.trainer, start)
    checkpointer.restore(run.trainer, ckpt)
    run.metrics.open_progress(start, kept)
    run.drift = step_monitor(inputs.monitor_factory, spec, system, setup, cost, data.train, out, start)
    ok = False
    try:
        replanned = run.train_steps(start)
        if rank0:  # every step's Plan (a resumed run's earlier ones were planned in the background)
            write_json(os.path.join(out, "plan.json"), plans.whole().to_json())
        ok = True
    finally:
        run.close(ok)
    if replanned is not None:
        raise replanned
    return run.metrics.summary(run.drift)


def _build_model(spec: RunConfig, layout: Layout, env, cfg):
    """This rank's stages of the model (``--weights`` or a seeded init), with ``--freeze`` applied."""
    from entrain.models.families.registry import family_of

    family = family_of(cfg)
    model = family.build_model(
        cfg,
        seed=spec.data.seed,
        weights_dir=spec.model.weights,
        stages=_own_stages(layout, env.rank // spec.parallel.tp),
    )
    model.entrain_family = family.name
    parts = trainable_parts(spec.model.freeze)
    family.set_trainable(model, encoder="vit" in parts, merger="merger" in parts, llm="llm" in parts)
    return model


def _build_run(
    inputs: RunInputs,
    system: str,
    setup: SystemSetup,
    plans: StepPlans,
    val_plan: Plan | None,
    checkpointer: Checkpointer,
) -> SystemRun:
    """The model, its sample renderer and the pipeline trainer of this rank, with the run's Plans,
    checkpoints and records."""
    from entrain.core.systems import moves_across_replicas
    from entrain.runtime.data import SampleRenderer
    from entrain.runtime.parallelize import StageParallelism
    from entrain.runtime.trainer import PipelineTrainer

    spec, env, data, layout = inputs.spec, inputs.env, inputs.data, setup.layout
    cfg, tokenizer = inputs.model_cfg, inputs.tokenizer
    model = _build_model(spec, layout, env, cfg)
    metas = {w.id: w.meta for batch in data.train + data.val for w in batch}
    renderer = SampleRenderer(
        cfg, metas, seed=spec.data.seed, device=env.device, source=record_source(spec, data, tokenizer)
    )
    autocast = torch.bfloat16 if resolve_precision(spec, env.device) == "bf16" else None
    trainer = PipelineTrainer(
        layout=layout,
        model=model,
        env=env,
        renderer=renderer,
        optim=spec.optim,
        autocast_dtype=autocast,
        timeout_s=spec.run.timeout_s,
        watch=inputs.watch,
        parallel=StageParallelism(tp=spec.parallel.tp, fsdp=spec.parallel.fsdp, ep=spec.parallel.ep_or_1),
        cross_replica=moves_across_replicas(system, setup.options),
    )
    metrics = RunMetrics(spec, system, env, checkpointer.out, data, setup)
    return SystemRun(
        spec, system, setup, env, data, model, renderer, trainer, plans, val_plan, checkpointer, metrics
    )


@dataclass
class SystemRun:
    """One system's training on this rank. Its components:"""

    spec: RunConfig
    system: str
    setup: SystemSetup
    """The layout and schedule options the run trains with (``entrain.runtime.planning.run_setups``)."""
    env: DistEnv
    data: RunData
    """The training and validation batches (``entrain.runtime.run_data``)."""
    model: torch.nn.Module
    """This rank's stages of the model."""
    renderer: SampleRenderer
    """The samples' tensors, processed a step ahead (``entrain.runtime.data``)."""
    trainer: PipelineTrainer
    """Runs one step's Plan on this rank (``entrain.runtime.trainer``, its executor)."""
    plans: StepPlans
    """Each step's Plan, planned ahead in the background (``entrain.runtime.plan_prefetch``)."""
    val_plan: Plan | None
    """The held-out validation batches' Plan (None: no validation)."""
    checkpointer: Checkpointer
    """Where the run starts, and the saves (``entrain.runtime.checkpointer``)."""
    metrics: RunMetrics
    """The records rank 0 writes and the summary's series (``entrain.runtime.run_metrics``)."""
    drift: StepMonitor | None = None
    """``--replan auto``'s drift monitor (``entrain.runtime.replan``)."""

    @property
    def layout(self) -> Layout:
        return self.setup.layout

    @property
    def out(self) -> str:
        return self.checkpointer.out

    def train_steps(self, start: int) -> ReplanRequested | None:
        """Steps ``start`` to ``--steps``, each with the next step's pixels processed while it runs;
        returns the ``ReplanRequested`` to raise after a re-plan's checkpoint (None: all steps ran)."""
        spec, plans = self.spec, self.plans
        peak = peak_flops(self.env.device)
        if start < spec.run.steps:
            self.renderer.prefetch(_pixel_ids(self.trainer.executor, plans.get(start)))
        for step in range(start, spec.run.steps):
            it = plans.get(step)
            if step + 1 < spec.run.steps:  # the next step's pixels are processed while this one runs
                self.renderer.prefetch(_pixel_ids(self.trainer.executor, plans.get(step + 1)))
            assignment_wait_ms = plans.take_wait_ms()
            self.metrics.set_step(step)
            res = self.trainer.train_step(it)
            row = self.step_row(step, it, res, assignment_wait_ms, peak)
            self.metrics.record(step, row, res)
            done = step + 1
            if (
                done == spec.run.steps
                or "replan" in row
                or (spec.run.checkpoint_every > 0 and done % spec.run.checkpoint_every == 0)
            ):
                self.checkpointer.save(self.trainer, done)
            if "replan" in row and done < spec.run.steps:  # continue on the new layout (runtime.replan)
                return self.drift.hand_over(step, owner=self.env.rank == 0)
            self.metrics.show(res)
        return None

    def step_row(
        self, step: int, it: IterationPlan, res: StepResult, assignment_wait_ms: float, peak: float | None
    ) -> dict:
        """The step's ``metrics.jsonl`` row: the step's result, its Plan and samples, MFU (on a known
        GPU), the validation loss when due and the drift monitor's re-plan when it decided one."""
        spec, data = self.spec, self.data
        row = {
            "step": step,
            "loss": res.loss,
            "iteration_time_ms": res.iteration_time_ms,
            "tokens_per_s": res.tokens_per_s,
            "lr": res.lr,
            "grad_norm": res.grad_norm,
            "cpu_ms": res.cpu_ms,
            "assignment_wait_ms": assignment_wait_ms,
            "plan_hash": plan_hash(it),
            "epoch": data.position(step, spec.parallel.global_batch).epoch,
            "sample_ids": [w.id for w in data.train[step]],
            "stage_times": res.records,
            "memory_per_rank": res.memory,
        }
        if res.expert_tokens:  # a model with experts (entrain.runtime.expert_tokens)
            row["expert_tokens"] = res.expert_tokens
        if peak:
            flops = model_flops(self.model, it, self.renderer)
            row["mfu"] = flops / (res.iteration_time_ms / 1e3) / (peak * self.env.world_size)
        if self.val_plan is not None and (step + 1) % spec.data.val_every == 0:
            row["val_loss"] = statistics.fmean(self.trainer.evaluate(v) for v in self.val_plan.iterations)
        if self.drift is not None and (record := self.drift.observe(step, data.train[step])) is not None:
            row["replan"] = record
        return row

    def close(self, ok: bool) -> None:
        """Stop the planner and the renderer, close the records (rank 0 writes the trace), and, after a
        clean run only, the trainer: after a failure the pending sends may never complete."""
        self.plans.close()
        self.renderer.close()
        self.metrics.close()
        if ok:
            self.trainer.close()
