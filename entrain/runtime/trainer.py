"""The training loop around the executor: loss normalisation, DP gradient reduction (bucketed,
started during the pipeline: ``grad_buckets``), global-norm
clipping, AdamW with linear warm-up then cosine decay, validation, per-step metrics.

One ``PipelineTrainer`` per rank. Every rank builds the whole model from the same seed (so its stage
weights equal a single-process reference) and keeps the stage chunks the Plan places on it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from entrain.config import OptimConfig
from entrain.core.ir.plan import Action, ActionKind, IterationPlan, Layout
from entrain.models.families.registry import build_stage, family_of
from entrain.runtime import grad_buckets
from entrain.runtime.comm import Transport
from entrain.runtime.data import SampleRenderer
from entrain.runtime.distributed import DistEnv, check_runtime_layout
from entrain.runtime.executor import ComputeRecord, Executor
from entrain.runtime.expert_parallel import (
    apply_ep,
    build_ep_groups,
    check_ep,
    check_same_actions,
    is_expert_param,
)
from entrain.runtime.expert_tokens import drop_routing, step_expert_tokens
from entrain.runtime.grad_buckets import GradBuckets
from entrain.runtime.health import PeerWatch
from entrain.runtime.parallelize import (
    StageParallelism,
    apply_fsdp,
    apply_tp,
    build_groups,
    copies,
    finish_fsdp_backward,
    local,
    placement,
    process_rank,
)
from entrain.runtime.recompute import apply_recompute
from entrain.runtime.step_errors import CollectiveError

__all__ = ["OptimConfig", "StepResult", "PipelineTrainer", "lr_factor", "reset_peak_memory"]


def _then(handler: Callable[[Action], None], after: Callable[[Action], None]) -> Callable[[Action], None]:
    def run(a: Action) -> None:
        handler(a)
        after(a)

    return run


def reset_peak_memory(device: torch.device) -> None:
    """Open a step's peak-memory window on a GPU: the ``peak_device_bytes`` a step reports
    (``PipelineTrainer.memory_of``) is then its own, never an earlier step's or an earlier system's
    of the same process."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def lr_factor(step: int, cfg: OptimConfig) -> float:
    """Multiplier of ``cfg.lr`` at 0-based ``step``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class StepResult:
    loss: float
    iteration_time_ms: float
    grad_norm: float
    lr: float
    llm_tokens: int
    cpu_ms: list[float] = field(default_factory=list)
    """Per rank, process CPU time of the step (next to the wall-clock ``iteration_time_ms``)."""
    memory: list[dict] = field(default_factory=list)
    """Rank 0 only: per rank, ``memory_of`` (model-state bytes held, peak memory)."""
    records: list[dict] = field(default_factory=list)
    """Rank 0 only: per (rank, stage, mb, sub) forward / backward ms measured on the ranks."""
    expert_tokens: list[dict] = field(default_factory=list)
    """Rank 0 only: per sparse layer of every rank's stages, the tokens routed to each expert this step
    (``entrain.runtime.expert_tokens``; empty for a model without experts)."""

    @property
    def tokens_per_s(self) -> float:
        return self.llm_tokens / max(self.iteration_time_ms, 1e-9) * 1e3


def upstream(layout: Layout, stage: int) -> set[int]:
    """The stages whose forward outputs reach ``stage``'s input (``Layout.prev_stages``, transitively)."""
    out, todo = set(), list(layout.prev_stages(stage))
    while todo:
        s = todo.pop()
        if s not in out:
            out.add(s)
            todo.extend(layout.prev_stages(s))
    return out


class PipelineTrainer:
    def __init__(
        self,
        *,
        layout: Layout,
        model: torch.nn.Module,
        env: DistEnv,
        renderer: SampleRenderer,
        optim: OptimConfig,
        autocast_dtype: torch.dtype | None = None,
        timeout_s: float | None = None,
        watch: PeerWatch | None = None,
        parallel: StageParallelism | None = None,
        cross_replica: bool = False,
    ):
        self.parallel = parallel = parallel or StageParallelism()
        self.place = placement(env.rank, parallel.tp)
        check_runtime_layout(layout, env.world_size // parallel.tp, tp=parallel.tp)
        self.layout, self.env, self.renderer, self.optim_cfg = layout, env, renderer, optim
        self.replica, self.pp_rank = layout.replica_of(self.place.plan_rank)
        self.family = family_of(model)
        """The model's family (stage modules, TP plan, recompute blocks, checkpoint names)."""
        all_stages = {
            s.stage: build_stage(model, s.component_key, s.first_layer, s.end_layer) for s in layout.stages
        }
        self.modules = {s.stage: all_stages[s.stage] for s in layout.stages_of(self.pp_rank)}
        for m in self.modules.values():
            m.move_to(env.device)
        trains = {s: any(p.requires_grad for _, p in m.owned_parameters()) for s, m in all_stages.items()}
        input_grad = {s: any(trains[u] for u in upstream(layout, s)) for s in all_stages}
        self.groups = build_groups(layout, parallel.tp, env.rank, timeout_s, cross_replica)
        self.ep_groups = self._ep_groups(parallel, model, timeout_s, cross_replica)
        self.fsdp_roots = self._parallelize(
            parallel, {s.stage: s.recompute for s in layout.stages_of(self.pp_rank)}
        )
        self.named_params = [(n, p) for m in self.modules.values() for n, p in m.owned_parameters()]
        self.params = [p for _, p in self.named_params if p.requires_grad]
        self.dp_group = None if parallel.fsdp else self.groups.dp
        self.transport = Transport(
            env.device,
            timeout_s,
            peer_rank=lambda r: process_rank(r, self.place.tp_rank, parallel.tp),
            channel_group=lambda src, dst: self.groups.channels[(src, dst)],
            me=self.place.plan_rank,
            prepost_gradients=env.backend == "gloo",
        )
        self.watch = watch or PeerWatch(
            env.rank, env.world_size, timeout_s if timeout_s is not None else 300.0
        )
        """Where this rank is in the run's collectives (names the peers a failed collective waited for)."""
        autocast = None
        if autocast_dtype is not None:

            def autocast() -> torch.autocast:
                return torch.autocast(env.device.type, dtype=autocast_dtype)

        self.executor = Executor(
            layout=layout,
            rank=self.place.plan_rank,
            process_rank=lambda r: process_rank(r, self.place.tp_rank, parallel.tp),
            modules=self.modules,
            transport=self.transport,
            renderer=renderer,
            input_grad=input_grad,
            autocast=autocast,
            cross_replica=cross_replica,
        )
        self.optimizer = self._optimizer(parallel, optim)
        self.grad_buckets = self._grad_buckets(parallel)
        self.step_index = 0
        self.last_stage_rank = layout.stages[-1].pp_rank
        self.fault_hook: Callable[[int, int], None] | None = None
        """Called as ``hook(rank, step)`` mid-step, before the pipeline actions (fault injection)."""

    def _optimizer(self, parallel: StageParallelism, optim: OptimConfig) -> torch.optim.AdamW | None:
        """AdamW over the trainable parameters (None without any); the per-tensor loop where DTensor
        and plain parameters mix (TP, FSDP, expert parallelism)."""
        if not self.params:
            return None
        dtensors = parallel.tp > 1 or parallel.fsdp or parallel.ep > 1
        foreach = False if dtensors else None
        return torch.optim.AdamW(
            self.params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay, foreach=foreach
        )

    def _ep_groups(
        self, parallel: StageParallelism, model: torch.nn.Module, timeout_s: float | None, cross_replica: bool
    ):
        """Expert parallelism's groups (``expert_parallel``), or None at ``--ep 1``."""
        if parallel.ep == 1:
            return None
        text = getattr(model.config, "text_config", model.config)
        check_ep(
            parallel.ep, self.layout.dp, num_experts=getattr(text, "num_experts", None), tp=parallel.tp,
            fsdp=parallel.fsdp, cross_replica=cross_replica,
        )  # fmt: skip
        stage_ranks = [
            [process_rank(self.layout.global_rank(r, pp), t, parallel.tp) for r in range(self.layout.dp)]
            for pp in range(self.layout.ranks_per_replica)
            for t in range(parallel.tp)
        ]
        return build_ep_groups(stage_ranks, self.env.rank, parallel.ep, timeout_s)

    def _parallelize(self, parallel: StageParallelism, recompute: dict[int, str]) -> list:
        """Pipeline stages are cut (the Plan); then, in order: TP, recomputation (the Plan's per
        stage), FSDP. Returns the FSDP roots (one per stage) to reduce gradients at the end of a
        backward pass."""
        from torch.distributed.device_mesh import DeviceMesh

        kind = self.env.device.type
        tp_mesh = dp_mesh = None
        if parallel.tp > 1 and parallel.fsdp:  # one 2-D mesh: FSDP needs the TP mesh as its sibling
            ranks = [
                [
                    process_rank(self.layout.global_rank(r, self.pp_rank), t, parallel.tp)
                    for t in range(parallel.tp)
                ]
                for r in range(self.layout.dp)
            ]
            mesh = DeviceMesh.from_group(
                [self.groups.dp, self.groups.tp], kind, mesh=ranks, mesh_dim_names=("dp", "tp")
            )
            tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
        elif parallel.tp > 1:
            tp_mesh = DeviceMesh.from_group(self.groups.tp, kind)
        elif parallel.fsdp:
            dp_mesh = DeviceMesh.from_group(self.groups.dp, kind)
        if tp_mesh is not None:
            for m in self.modules.values():
                apply_tp(m, tp_mesh)
        if self.ep_groups is not None:
            for m in self.modules.values():
                apply_ep(m, self.ep_groups, kind)
        for stage, mode in recompute.items():
            apply_recompute(self.modules[stage], mode)
        if dp_mesh is None:
            return []
        return [apply_fsdp(m, dp_mesh) for m in self.modules.values()]

    def _grad_buckets(self, parallel: StageParallelism) -> GradBuckets | None:
        """The bucketed DP all-reduce (``grad_buckets``), told of every action the executor finishes;
        None without DP replicas or under FSDP (which reduce-scatters its own gradients)."""
        if self.dp_group is None or not self.params:
            return None
        stage_params = {
            s: [p for _, p in m.owned_parameters() if p.requires_grad] for s, m in self.modules.items()
        }
        replicas = self.ep_groups.replicas if self.ep_groups is not None else None
        buckets = GradBuckets(
            stage_params,
            self.dp_group,
            group_of=None
            if self.ep_groups is None
            else lambda p: replicas if is_expert_param(p) else self.dp_group,
            bucket_bytes=grad_buckets.BUCKET_BYTES,
            hooks=parallel.tp == 1,
            run=self._collective,
        )
        handlers = self.executor._handlers  # the executor's dispatch table: each action, then the buckets
        for kind, handler in list(handlers.items()):
            handlers[kind] = _then(handler, buckets.after_action)
        return buckets

    # --- checkpoint state ---------------------------------------------------------------------------
    def checkpoint_state(self, *, with_empty_optimizer: bool = False) -> dict[str, torch.Tensor]:
        """The live tensors of this rank's stages for ``torch.distributed.checkpoint``: parameters as
        ``model/NAME`` and AdamW state as ``optim/NAME/KEY`` (plain tensors or DTensors).
        ``with_empty_optimizer``: first give every trainable parameter a zero AdamW state to load into."""
        from entrain.runtime.checkpoint import MODEL_PREFIX, OPTIM_PREFIX

        state: dict[str, torch.Tensor] = {
            f"{MODEL_PREFIX}{part}": t
            for n, p in self.named_params
            for part, t in self.family.checkpoint_parts(n, p.detach())
        }
        if self.optimizer is None:
            return state
        for n, p in self.named_params:
            if not p.requires_grad:
                continue
            slot = self.optimizer.state[p]
            if with_empty_optimizer and not slot:
                slot.update(
                    step=torch.zeros((), dtype=torch.float32),
                    exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                    exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format),
                )
            for key, value in slot.items():
                for part, t in self.family.checkpoint_parts(n, value):
                    state[f"{OPTIM_PREFIX}{part}/{key}"] = t
        return state

    def load_checkpoint(self, folder, step_index: int, *, load) -> None:
        """Fill parameters and AdamW state from checkpoint ``folder`` (``load(folder, state)`` is the
        collective reader), resharded to this rank's stages; set the step counter (LR schedule)."""
        from entrain.core.errors import ConfigError
        from entrain.runtime.checkpoint import MODEL_PREFIX, saved_keys

        saved = saved_keys(folder)
        state = self.checkpoint_state(with_empty_optimizer=True)
        missing = sorted(
            k[len(MODEL_PREFIX) :] for k in state if k.startswith(MODEL_PREFIX) and k not in saved
        )
        if missing:
            raise ConfigError(
                f"checkpoint {folder} lacks parameters of this rank's stages ({', '.join(missing[:3])}, ...): "
                "it was written for another model"
            )
        fresh = [
            p
            for n, p in self.named_params
            if p.requires_grad and f"optim/{self.family.checkpoint_parts(n, p)[0][0]}/exp_avg" not in saved
        ]
        load(folder, {k: v for k, v in state.items() if k in saved})
        for p in fresh:  # never stepped when the checkpoint was written: no AdamW state yet
            self.optimizer.state.pop(p, None)
        self.step_index = step_index

    # --- helpers ------------------------------------------------------------------------------------
    def _replica_ids(self, it: IterationPlan) -> list[str]:
        return [s for mb in it.microbatches[self.replica] for s in mb.llm_ids]

    def _collective(self, what: str, fn: Callable[[], object]):
        """Run a collective; a failure (dead or stalled peer) becomes a CollectiveError naming the
        peers that never reached it (from the ``PeerWatch`` board)."""
        self.watch.mark(f"step {self.step_index}: {what}")
        try:
            return fn()
        except Exception as e:
            raise CollectiveError(self.env.rank, self.step_index, what, e, self.watch.behind()) from e

    def _forward_inputs(self, it: IterationPlan, actions) -> list[tuple[str, tuple[str, ...]]]:
        """The packs this rank's forwards ask the renderer for, in order (as the executor asks:
        each encoder pipeline's first stage's inputs, every LLM stage's batch)."""
        first_llm = self.layout.num_encoder_stages
        out = []
        for a in actions:
            if a.kind is not ActionKind.F or (a.stage < first_llm and self.layout.prev_stages(a.stage)):
                continue
            mb = it.microbatches[self.replica][a.mb]
            subs = mb.encoder_subs if a.stage < first_llm else mb.llm_subs
            kind = self.executor.input_kind(a.stage) if a.stage < first_llm else "llm"
            out.append((kind, tuple(subs[a.sub_index])))
        return out

    def _global_labels(self, it: IterationPlan) -> int:
        """Label tokens of the global batch: each replica's last stage counts its samples; all-reduced."""
        counts = self.pp_rank == self.last_stage_rank and self.place.tp_rank == 0  # once per TP group
        mine = self.renderer.num_labels(self._replica_ids(it)) if counts else 0
        t = torch.tensor([float(mine)], dtype=torch.float64, device=self.env.device)
        self._collective("all-reduce of the label count", lambda: dist.all_reduce(t))
        return int(t.item())

    def _clip(self) -> float:
        """Global grad norm over all stages and replicas: each process adds its local gradient parts,
        each divided by how many processes hold the same part (DP replicas, TP ranks of a replicated
        tensor; a DTensor shard under TP or FSDP is held by fewer)."""
        holders = self.layout.dp * self.parallel.tp
        sq = sum(
            (
                local(p.grad).double().pow(2).sum() / copies(p.grad, holders)
                for p in self.params
                if p.grad is not None
            ),
            torch.zeros((), dtype=torch.float64, device=self.env.device),
        )
        t = sq.reshape(1).to(torch.float64)
        self._collective("all-reduce of the gradient norm", lambda: dist.all_reduce(t))
        norm = math.sqrt(t.item())
        max_norm = self.optim_cfg.max_grad_norm
        if max_norm is not None:
            coef = min(1.0, max_norm / (norm + 1e-6))
            if coef < 1.0:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(coef)
        return norm

    def memory_of(self) -> dict:
        """This process's memory: ``params_bytes``, ``grads_bytes``, ``optimizer_bytes`` (the local
        parts: shards under TP / FSDP), ``peak_rss_bytes`` (the process's peak resident set since it
        started) and, on a GPU, ``peak_device_bytes`` (torch's peak allocation during this step:
        ``reset_peak_memory`` at its start)."""
        import resource

        def nbytes(ts) -> int:
            return sum(local(t).numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))

        params = [p for _, p in self.named_params]
        slots = self.optimizer.state.values() if self.optimizer is not None else []
        out = {
            "rank": self.env.rank,
            "params_bytes": nbytes(params),
            "grads_bytes": nbytes(p.grad for p in params if p.grad is not None),
            "optimizer_bytes": nbytes(v for slot in slots for v in slot.values()),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        if self.env.device.type == "cuda":
            out["peak_device_bytes"] = torch.cuda.max_memory_allocated(self.env.device)
        return out

    def _gather_records(self, records: list[ComputeRecord]) -> tuple[list[dict], list[dict], list[dict]]:
        merged: dict[tuple[int, int, int], dict] = {}
        for r in records:
            row = merged.setdefault(
                (r.stage, r.mb, r.sub),
                {
                    "rank": self.env.rank,
                    "stage": r.stage,
                    "mb": r.mb,
                    "sub": r.sub,
                    "fwd_ms": 0.0,
                    "bwd_ms": 0.0,
                    "fwd_cpu_ms": 0.0,
                    "bwd_cpu_ms": 0.0,
                },
            )
            row["fwd_ms" if r.kind == "F" else "bwd_ms"] += r.ms
            row["fwd_cpu_ms" if r.kind == "F" else "bwd_cpu_ms"] += r.cpu_ms
        out: list | None = [None] * self.env.world_size if self.env.rank == 0 else None
        routed = step_expert_tokens(self.modules, self.env.rank, self.place.tp_rank, self.ep_groups)
        mine = (list(merged.values()), self.memory_of(), routed)
        self._collective("gather of the stage times", lambda: dist.gather_object(mine, out, dst=0))
        if out is None:
            return [], [], []
        return (
            [row for rows, _, _ in out for row in rows],
            [m for _, m, _ in out],
            [e for *_, es in out for e in es],
        )

    def _llm_tokens(self, it: IterationPlan) -> int:
        ids = [s for rep in it.microbatches for mb in rep for s in mb.llm_ids]
        return sum(self.renderer.sample(s).num_tokens for s in ids)

    # --- public -------------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def forward_backward(self, it: IterationPlan) -> float:
        """Run this rank's actions; gradients summed over DP replicas. Returns the global mean loss."""
        self.zero_grad()
        scale = 1.0 / max(1, self._global_labels(it))
        if self.fault_hook is not None:
            self.fault_hook(self.env.rank, self.step_index)
        actions = it.actions.get(self.place.plan_rank, ())
        drop_routing(self.modules)  # the step's expert_tokens count its own forwards only
        if self.ep_groups is not None:  # each sparse layer's all-to-alls pair up across the EP group
            llm = {s.stage for s in self.layout.stages if s.component == "llm"}
            check_same_actions(actions, self.ep_groups, self.env.device, llm)
        if self.grad_buckets is not None:  # DP buckets start as their stages' last backwards end
            self.grad_buckets.start(actions)
        if self.env.device.type == "cuda":  # the next forward's inputs are copied while one computes
            self.renderer.expect_forwards(self._forward_inputs(it, actions))
        out = self.executor.run(it, actions, loss_scale=scale)
        self._actions_end_us = time.time() * 1e6  # the traced end of step starts here
        self._collective("wait for the pipeline sends", self.transport.wait_all)
        for root in self.fsdp_roots:
            self._collective(
                f"FSDP gradient reduce-scatter with ranks {self.groups.dp_ranks}",
                lambda r=root: finish_fsdp_backward(r),
            )
        if self.grad_buckets is not None:
            self.grad_buckets.wait(f"data-parallel gradient all-reduce with ranks {self.groups.dp_ranks}")
        self._last_records = out.records
        loss = torch.as_tensor(out.loss_sum, dtype=torch.float64, device=self.env.device).reshape(1)
        if self.place.tp_rank != 0:  # counted once per TP group
            loss = torch.zeros_like(loss)
        self._collective("all-reduce of the loss", lambda: dist.all_reduce(loss))
        return float(loss.item())

    def train_step(self, it: IterationPlan, *, gather_records: bool = True) -> StepResult:
        self._collective("barrier at the start of the step", dist.barrier)
        reset_peak_memory(self.env.device)
        t0, cpu0 = time.perf_counter(), time.process_time()
        loss = self.forward_backward(it)
        norm = self._clip()
        lr = self.optim_cfg.lr * lr_factor(self.step_index, self.optim_cfg)
        if self.optimizer is not None:
            for g in self.optimizer.param_groups:
                g["lr"] = lr
            self.optimizer.step()
        if self.env.device.type == "cuda":
            torch.cuda.synchronize()
        if self.executor.tracer is not None:
            self.executor.tracer.step_end(self._actions_end_us, time.time() * 1e6)
        elapsed = torch.tensor(
            [(time.perf_counter() - t0) * 1e3], dtype=torch.float64, device=self.env.device
        )
        cpu = torch.zeros(self.env.world_size, dtype=torch.float64, device=self.env.device)
        cpu[self.env.rank] = (time.process_time() - cpu0) * 1e3
        self._collective(
            "all-reduce of the step times",
            lambda: (dist.all_reduce(elapsed, op=dist.ReduceOp.MAX), dist.all_reduce(cpu)),
        )
        self.step_index += 1
        records, memory, routed = self._gather_records(self._last_records) if gather_records else ([], [], [])
        return StepResult(
            loss,
            float(elapsed.item()),
            norm,
            lr,
            self._llm_tokens(it),
            cpu.tolist(),
            records=records,
            memory=memory,
            expert_tokens=routed,
        )

    def evaluate(self, it: IterationPlan) -> float:
        """Forward-only global mean loss of ``it``'s samples (held-out batch)."""
        scale = 1.0 / max(1, self._global_labels(it))
        out = self.executor.run(
            it, it.actions.get(self.place.plan_rank, ()), loss_scale=scale, forward_only=True
        )
        self._collective("wait for the validation sends", self.transport.wait_all)
        loss = torch.as_tensor(out.loss_sum, dtype=torch.float64, device=self.env.device).reshape(1)
        if self.place.tp_rank != 0:
            loss = torch.zeros_like(loss)
        self._collective("all-reduce of the validation loss", lambda: dist.all_reduce(loss))
        return float(loss.item())

    def named_grads(self) -> dict[str, torch.Tensor]:
        """Whole gradients by parameter name (DTensor shards gathered: collective under TP / FSDP)."""
        from torch.distributed.tensor import DTensor

        out = {}
        for n, p in self.named_params:
            if p.grad is not None:
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                out[n] = g.detach().clone()
        return out

    def close(self) -> None:
        self.transport.wait_all()
