"""Expert parallelism (``--ep``), on forked gloo ranks in float64.

* One sparse MoE block of transformers' Qwen3-VL-MoE, its experts sharded over 2 or 4 ranks
  (``expert_parallel.ShardedExperts``), gives the outputs and every gradient (the gathered global
  expert weights, the router, the input) of the whole block on one process at rel 1e-5; each rank
  routes its own tokens (one routes none), which reach the experts of every rank through the
  all-to-alls. Planted: no combine all-to-all, expert gradients all-reduced over the EP group.
* The trainer at ``--ep 2`` (1F1B, 2 replicas, full recomputation; ``dip``, 4 replicas so each expert has 2 holders)
  equals transformers' single-process step of the tiny checkpoint: loss with its auxiliary term,
  gradient norm and every gradient before and after clipping.
* A step whose replicas split microbatches differently is refused on every rank in one line.
* A checkpoint saved at ``--ep 2`` loads bitwise at ``--ep 1`` and ``--ep 2``.
"""

from __future__ import annotations

import pytest
import torch

from entrain.core.errors import ConfigError
from entrain.runtime import expert_parallel as ep_mod
from entrain.runtime.expert_parallel import apply_ep, build_ep_groups, check_ep

from . import test_qwen3_vl_moe_train as moe_train
from .harness import run_workers

fm, oracle = moe_train.fm, moe_train.oracle
"""The tiny Qwen3-VL-MoE checkpoint and transformers' fp64 step of its batch (module fixtures)."""

TOKENS = (5, 3, 0, 7)
"""Tokens of each rank (one rank routes none: its all-to-alls send nothing)."""


def _block(seed: int = 0):
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock

    from tests.models.qwen3_vl_moe_tiny import config

    text = config(experts=4, top_k=2).text_config
    text._experts_implementation = "eager"
    torch.manual_seed(seed)
    block = Qwen3VLMoeTextSparseMoeBlock(text).double()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return block


def _inputs(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(1, TOKENS[rank], 64, dtype=torch.float64, generator=g)


def _holder(block):
    class Holder(torch.nn.Module):  # what apply_ep walks: a layer with ``mlp.experts``
        def __init__(self):
            super().__init__()
            self.mlp = block

    return Holder()


def _reference(world: int):
    block = _block()
    outs = []
    for r in range(world):
        x = _inputs(r).requires_grad_(True)
        y = block(x)
        if y.numel():
            (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        outs.append((y.detach(), x.grad))
    return outs, {n: p.grad for n, p in block.named_parameters()}


def _ep_rank(env, ep: int, bug: str | None):
    import torch.distributed as dist

    world = dist.get_world_size()
    groups = build_ep_groups([list(range(world))], env.rank, ep)
    block = _block()
    holder = _holder(block)
    made = apply_ep(holder, groups, "cpu")
    assert len(made) == 2 and made[0].to_local().shape[0] == 4 // ep
    if bug == "no-combine":  # outputs stay where they were computed (sized as the combine's)
        calls, real = [], ep_mod._all_to_all

        def no_combine(x, send, recv, group):
            calls.append(1)
            if len(calls) % 2:
                return real(x, send, recv, group)
            rows = sum(recv)
            return x[:rows] if rows <= len(x) else torch.cat([x, x.new_zeros((rows - len(x), *x.shape[1:]))])

        ep_mod._all_to_all = no_combine
    x = _inputs(env.rank).requires_grad_(True)
    y = block(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    grads = {}
    for n, p in block.named_parameters():
        g = p.grad
        if hasattr(g, "full_tensor"):
            if groups.replicas is not None:  # the ranks holding the same experts
                dist.all_reduce(g.to_local(), group=groups.replicas)
            if bug == "reduce-over-ep":
                dist.all_reduce(g.to_local(), group=groups.group)
            g = g.full_tensor()
        else:  # replicated (the router): data parallel sums over every rank
            dist.all_reduce(g)
        grads[n] = g
    return y.detach(), x.grad, grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check(results, ref_outs, ref_grads) -> None:
    for r, (y, xg, grads) in enumerate(results):
        ry, rxg = ref_outs[r]
        if ry.numel():
            assert _rel(y, ry) < 1e-5, f"rank {r} output"
            assert _rel(xg, rxg) < 1e-5, f"rank {r} input gradient"
        for n, g in grads.items():
            assert _rel(g, ref_grads[n]) < 1e-5, f"rank {r} {n}"


@pytest.mark.parametrize("ep,world", [(2, 2), (4, 4), (2, 4)])
def test_sharded_experts_match_whole_block(tmp_path, ep, world):
    outs, grads = _reference(world)
    results = run_workers(_ep_rank, world, tmp_path, ep, None)
    _check(results, outs, grads)


@pytest.mark.parametrize("bug", ["no-combine", "reduce-over-ep"])
def test_planted_bugs_fail(tmp_path, bug):
    outs, grads = _reference(2)
    results = run_workers(_ep_rank, 2, tmp_path, 2, bug)
    with pytest.raises(AssertionError):
        _check(results, outs, grads)


def test_refusals():
    check_ep(1, 3, num_experts=None)
    check_ep(2, 4, num_experts=8)
    for kwargs, words in [
        (dict(num_experts=None), "has none"),
        (dict(num_experts=8, tp=2), "--tp"),
        (dict(num_experts=8, fsdp=True), "--fsdp"),
        (dict(num_experts=6), "divide"),
        (dict(num_experts=8, cross_replica=True), "moves encoder work across replicas"),
    ]:
        with pytest.raises(ConfigError, match=words):
            check_ep(4, 4, **kwargs)
    with pytest.raises(ConfigError, match="divide"):
        check_ep(2, 3, num_experts=8)


def _train_ep(env, fm, plan, ep: int):
    from entrain.runtime.parallelize import StageParallelism
    from entrain.runtime.recompute import recomputed_modules
    from entrain.runtime.trainer import OptimConfig, PipelineTrainer

    from .cases import MAX_GRAD_NORM
    from .harness import train_step_before_clip

    trainer = PipelineTrainer(layout=plan.layout, model=fm.build(), env=env, renderer=fm.renderer(),
                              optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM), parallel=StageParallelism(ep=ep))  # fmt: skip
    experts = [p for _, p in trainer.named_params if ep_mod.is_expert_param(p)]
    llm = any(s.component == "llm" for s in plan.layout.stages_of(trainer.pp_rank))
    assert len(experts) == (2 * 3 if ep > 1 and llm else 0), len(experts)
    stages = {s.stage: s for s in plan.layout.stages}
    recomputed = sum(len(recomputed_modules(m, stages[i].recompute)) for i, m in trainer.modules.items())
    assert (recomputed > 0) == any(s.recompute == "full" for s in stages.values()), recomputed
    result, before = train_step_before_clip(trainer, plan.iterations[0])
    return before, trainer.named_grads(), result.loss, result.grad_norm


def _assert_oracle(results, oracle, name: str) -> None:
    from .families import assert_ranks_match

    assert_ranks_match(name, results, oracle, tol=1e-5)


def test_trainer_ep2_matches_transformers(fm, oracle, tmp_path):
    """1F1B over an encoder stage and an LLM stage, 2 replicas, ``--ep 2``, full recomputation (the
    backward runs each sparse layer's all-to-alls again): each LLM rank holds 2 of the 4 experts of its
    3 sparse layers; loss (auxiliary term included), gradient norm and every gradient before and after
    clipping equal transformers' single-process fp64 step."""
    from dataclasses import replace

    plan = fm.plan("1f1b", 1, 1, 2, 2)
    stages = tuple(replace(s, recompute="full") for s in plan.layout.stages)
    plan = replace(plan, layout=replace(plan.layout, stages=stages))
    assert plan.layout.world_size == 4
    results = run_workers(_train_ep, 4, tmp_path, fm, plan, 2)
    _assert_oracle(results, oracle, "ep2")


def _check_actions(env, lists):
    import torch.distributed as dist

    from entrain.core.ir.plan import Action, ActionKind

    groups = build_ep_groups([list(range(dist.get_world_size()))], env.rank, 2)
    out = []
    for per_rank in lists:
        actions = [Action(stage=1, kind=ActionKind.F, mb=mb, sub=sub) for mb, sub in per_rank[env.rank]]
        try:
            ep_mod.check_same_actions(actions, groups, torch.device("cpu"))
            out.append("ok")
        except ConfigError as e:
            out.append(str(e))
    return out


def test_replicas_with_other_microbatch_splits_are_refused_on_every_rank(tmp_path):
    same = [[(0, 0), (0, 1)], [(0, 0), (0, 1)]]
    fewer = [[(0, 0), (0, 1)], [(0, None)]]
    as_many_other_subs = [[(0, 0), (0, 1)], [(0, 0), (1, 0)]]
    results = run_workers(_check_actions, 2, tmp_path, [same, fewer, as_many_other_subs])
    for r in results:
        assert r[0] == "ok"
        for refused in r[1:]:
            assert "all-to-alls would not pair up" in refused and "\n" not in refused


def _full(state: dict) -> dict:
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in state.items()
    }


def _save_at_one_ep_load_at_another(env, fm, plan, folder):
    from entrain.runtime import checkpoint as ck
    from entrain.runtime.parallelize import StageParallelism
    from entrain.runtime.trainer import OptimConfig, PipelineTrainer

    def trainer(ep):
        return PipelineTrainer(layout=plan.layout, model=fm.build(), env=env, renderer=fm.renderer(),
                               optim=OptimConfig(), parallel=StageParallelism(ep=ep))  # fmt: skip

    saving = trainer(2)
    saving.train_step(plan.iterations[0])
    saved = _full(saving.checkpoint_state())
    ck.save_state(folder, saving.checkpoint_state())
    out = {}
    for ep in (1, 2):
        loading = trainer(ep)
        loading.load_checkpoint(folder, 1, load=ck.load_state)
        got = _full(loading.checkpoint_state())
        out[ep] = sorted(k for k in saved if not torch.equal(got[k], saved[k])) + sorted(
            set(saved) ^ set(got)
        )
    experts = sum(1 for k in saved if ".experts." in k)
    return out, experts


def test_checkpoint_saved_at_ep2_resumes_bitwise_at_ep1_and_ep2(fm, tmp_path):
    """A checkpoint written at ``--ep 2`` (each rank its half of the experts' weights and AdamW state)
    holds the global tensors: runs at ``--ep 1`` and ``--ep 2`` load every parameter and AdamW tensor
    bitwise."""
    plan = fm.plan("1f1b", 1, 1, 2, 2)
    results = run_workers(_save_at_one_ep_load_at_another, 4, tmp_path, fm, plan, str(tmp_path / "ckpt"))
    assert sum(r[1] for r in results) > 0, "no expert tensors were saved"
    for r, (differ, _) in enumerate(results):
        assert differ == {1: [], 2: []}, (r, differ)


def test_trainer_dp4_ep2_matches_transformers(fm, oracle, tmp_path):
    """``dip`` puts the encoder and the LLM stage on one rank: 4 replicas, ``--ep 2``, so each expert
    lives on 2 ranks (two EP groups) and its gradient is all-reduced over those two."""
    plan = fm.plan("dip", 1, 1, 4, 2)  # with 1 microbatch, one replica splits its LLM microbatch
    assert plan.layout.world_size == 4 and plan.layout.dp == 4
    results = run_workers(_train_ep, 4, tmp_path, fm, plan, 2)
    _assert_oracle(results, oracle, "dp4-ep2")
