"""Parallelism inside stages: ``--tp`` (DTensor tensor parallelism) and ``--fsdp`` (FSDP2) give the
gradients, loss and gradient norm of the TP 1 and plain-DP runs of the same batch, on one forked group
of 4 processes. ``--tp 4`` on the tiny model's 2 KV heads replicates each KV head on 2 ranks
(``composition.tp.replicate_kv_heads``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm, fuse_parts
from entrain.runtime.data import SampleRenderer
from entrain.runtime.parallelize import StageParallelism
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import MAX_GRAD_NORM, SEED, batch_metas, plan_for, works
from .harness import relative_errors, run_workers

# (name, system, encoder stages, llm stages, dp, K, tp, fsdp): 4 processes each
CASES = [
    ("1f1b-1+1-dp2", "1f1b", 1, 1, 2, 2, 1, False),
    ("1f1b-1+1-tp2", "1f1b", 1, 1, 1, 4, 2, False),
    ("dip-2+2-dp2", "dip", 2, 2, 2, 2, 1, False),
    ("dip-2+2-dp2-fsdp", "dip", 2, 2, 2, 2, 1, True),
    ("dip-1+1-dp2-tp2-fsdp", "dip", 1, 1, 2, 2, 2, True),
    ("dip-1+1-tp4-kv-replicated", "dip", 1, 1, 1, 4, 4, False),
]
SAME_AS = {
    "1f1b-1+1-tp2": "1f1b-1+1-dp2",
    "dip-2+2-dp2-fsdp": "dip-2+2-dp2",
    "dip-1+1-dp2-tp2-fsdp": "1f1b-1+1-dp2",
    "dip-1+1-tp4-kv-replicated": "1f1b-1+1-dp2",
    "dip-2+2-dp2": "1f1b-1+1-dp2",
}
"""Case -> the TP 1, plain-DP run it must equal (gradients, loss, gradient norm: relative 1e-5). Any
Plan of one global batch gives the same gradients (the loss is divided by the batch's label count);
the plain runs equal the single-process reference (tests/runtime/test_exact_gradients.py)."""


def _with_tp(plan, tp: int):
    comps = {k: replace(v, tp=tp) for k, v in plan.layout.components.items()}
    return replace(plan, layout=replace(plan.layout, components=comps))


def _train(env, cases):
    cfg = get_model_config("tiny")
    metas = {m.id: m for m in batch_metas()}
    out = {}
    for name, plan, parallel in cases:
        model = build_vlm(cfg, seed=SEED)
        renderer = SampleRenderer(cfg, dict(metas), seed=SEED)
        trainer = PipelineTrainer(
            layout=plan.layout,
            model=model,
            env=env,
            renderer=renderer,
            optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM),
            parallel=parallel,
        )
        result = trainer.train_step(plan.iterations[0])
        out[name] = (trainer.named_grads(), result.loss, result.grad_norm)
    return out


def _whole(results, name: str) -> dict[str, torch.Tensor]:
    grads = {}
    for rank_result in results:
        grads.update(fuse_parts(rank_result[name][0]))
    return grads


def test_tp_and_fsdp_gradients_match_tp1_and_plain_dp(tmp_path):
    batch = works(batch_metas())
    cases = []
    for name, system, enc, llm, dp, k, tp, fsdp in CASES:
        plan = _with_tp(plan_for(system, enc, llm, dp, k, batch), tp)
        assert plan.layout.world_size * tp == 4, name
        cases.append((name, plan, StageParallelism(tp=tp, fsdp=fsdp)))
    results = run_workers(_train, 4, tmp_path, cases, timeout_s=240)
    for name, plain in SAME_AS.items():
        ours, theirs = _whole(results, name), _whole(results, plain)
        assert len(theirs) > 40 and ours.keys() == theirs.keys(), name
        errors = relative_errors(ours, theirs)
        worst = max(errors, key=errors.get)
        assert errors[worst] < 1e-5, f"{name} vs {plain}: {worst} relative error {errors[worst]:.3g}"
        loss, grad_norm = results[0][name][1], results[0][name][2]
        assert loss == pytest.approx(results[0][plain][1], rel=1e-5), (name, plain)
        assert grad_norm == pytest.approx(results[0][plain][2], rel=1e-5), (name, plain)
        assert grad_norm > MAX_GRAD_NORM, f"{name}: clipping was not exercised"
        assert all(r[name][1] == loss for r in results), f"{name}: ranks disagree on the loss"


def test_degrees_the_model_cannot_split_are_refused_before_any_process_group():
    from argparse import Namespace

    from entrain.config import RunConfig
    from entrain.core.errors import ConfigError
    from entrain.runtime.preflight import check_spec

    def run_config(**flags):
        return RunConfig.from_args(Namespace(**flags))

    base = dict(
        dataset="skewed",
        model="tiny",
        system="1f1b",
        encoder_stages=1,
        llm_stages=1,
        dp=None,
        global_batch=4,
        microbatch_size=1,
        steps=1,
        seed=0,
        out="unused",
    )
    check_spec(run_config(**base, tp=2), world_size=4)
    with pytest.raises(ConfigError, match="--tp 3 must divide .*LLM attention heads 4"):
        check_spec(run_config(**base, tp=3))
    with pytest.raises(ConfigError, match="--fsdp .* needs --dp 2 or more"):
        check_spec(run_config(**base, fsdp=True))
    with pytest.raises(ConfigError, match="needs 4 processes"):
        check_spec(run_config(**base, tp=2), world_size=2)


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_onevision"])
def test_every_family_takes_the_degrees_its_model_splits_and_refuses_the_rest(family, tmp_path):
    """Qwen2-VL's tower (fc1/fc2 MLP) and LLaVA-OneVision have TP plans: ``--tp 2`` passes the check,
    a degree that does not divide the heads is a one-line ConfigError naming the dimension."""
    from entrain.core.errors import ConfigError
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import get_family

    from .families import family_flags

    flags = family_flags(family, tmp_path / "model")
    shape = get_family(family).shape(
        ModelSource(preset=flags.get("model"), model_path=flags.get("model_path"))
    )
    get_family(family).check_tp(shape, 2)
    with pytest.raises(ConfigError, match=r"^--tp 3 must divide .*vision heads \d+, .*LLM attention heads 4"):
        get_family(family).check_tp(shape, 3)


@pytest.mark.parametrize("family", ["composition", "qwen2_vl", "llava_onevision"])
def test_every_owned_parameter_is_in_its_stage_module_tree(family, tmp_path):
    """FSDP shards and reduces the parameters of a stage's module tree: a parameter a stage owns but
    reaches another way (LLaVA-OneVision's ``image_newline`` once was) would train unreduced."""
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import build_stage, get_family

    from .families import family_flags

    flags = {"model": "tiny"} if family == "composition" else family_flags(family, tmp_path / "model")
    fam = get_family(family)
    cfg, _ = fam.runtime_config(ModelSource(preset=flags.get("model"), model_path=flags.get("model_path")))
    model = fam.build_model(cfg, seed=SEED)
    for comp in ("encoder", "llm"):
        n = len(fam.layer_names(cfg.shape, comp))
        for first, end in ((0, 1), (1, n - 1), (n - 1, n)):
            stage = build_stage(model, comp, first, end)
            tree = {id(p) for p in stage.parameters()}
            outside = [name for name, p in stage.owned_parameters() if id(p) not in tree]
            assert not outside, (comp, first, end, outside)


@pytest.mark.parametrize(
    "tp,kv_heads,ok", [(2, 4, True), (4, 2, True), (8, 1, True), (4, 3, False), (4, 6, False)]
)
def test_kv_heads_are_sharded_or_replicated_else_refused_naming_the_field(tp, kv_heads, ok):
    """KV heads a multiple of ``--tp``: sharded; a divisor of it: replicated (GQA/MQA); else a one-line
    ConfigError naming ``num_key_value_heads`` (every family's check goes through ``check_tp_dims``)."""
    from entrain.core.errors import ConfigError
    from entrain.models.families.composition.tp import check_tp_dims

    if ok:
        check_tp_dims(tp, {"LLM attention heads": 8}, kv_heads)
        return
    with pytest.raises(ConfigError, match=rf"^--tp {tp} must divide .*num_key_value_heads\) {kv_heads}\b"):
        check_tp_dims(tp, {"LLM attention heads": 8}, kv_heads)


def _train_tp2(env, fm, plan, folder):
    """One step at TP 2: gradients before and after clipping, loss, norm, whole parameters after the
    step; the step's checkpoint is saved to ``folder`` (``torch.distributed.checkpoint``)."""
    from torch.distributed.tensor import DTensor

    from entrain.runtime import checkpoint as ck

    from .harness import train_step_before_clip

    trainer = PipelineTrainer(layout=plan.layout, model=fm.build(), env=env, renderer=fm.renderer(),
                              optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM), parallel=StageParallelism(tp=2))  # fmt: skip
    result, before = train_step_before_clip(trainer, plan.iterations[0])
    after = trainer.named_grads()
    ck.save_state(folder, trainer.checkpoint_state())
    params = {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in trainer.named_params
    }
    return before, after, result.loss, result.grad_norm, params


@pytest.mark.parametrize("family", ["qwen2_vl", "llava_onevision"])
def test_tp2_with_one_kv_head_trains_as_transformers_and_saves_whole_parameters(family, tmp_path):
    """A whole Qwen2-VL checkpoint and LLaVA-OneVision with 1 KV head (MQA) and 4 query heads at
    ``--tp 2`` (``dip`` 1+1, 2 processes): each rank keeps the replicated KV head; the step's
    gradients (before and after clipping), grad norm and loss are the single-process transformers
    oracle's (fp64), and the checkpoint it saves holds the whole, unsharded parameters of the run
    (the composition: ``--tp 4`` on 2 KV heads above)."""
    from entrain.runtime import checkpoint as ck

    from .families import family_model, oracle_step, without_zero_gradients
    from .harness import assert_matches_reference

    fm = family_model(family, tmp_path / "model", kv_heads=1, num_samples=4)
    assert fm.cfg.shape.llm.num_key_value_heads == 1
    fm.family.check_tp(fm.cfg.shape, 2)
    plan = _with_tp(fm.plan("dip", 1, 1, 1, 2), 2)
    folder = tmp_path / "checkpoint"
    results = run_workers(_train_tp2, 2, tmp_path / "w", fm, plan, folder)
    fuse = fm.family.fuse_parts
    before, after = (fuse({k: v for r in results for k, v in r[i].items()}) for i in (0, 1))
    ref = oracle_step(fm, max_grad_norm=MAX_GRAD_NORM)
    assert "model.language_model.layers.0.self_attn.k_proj.weight" in ref.grads, sorted(ref.grads)[:5]
    _, _, loss, grad_norm, _ = results[0]
    ref_rest, before, after = without_zero_gradients(ref, before, after)
    assert_matches_reference(
        f"{family} tp2 kv1",
        before=before,
        after=after,
        loss=loss,
        grad_norm=grad_norm,
        ref=ref_rest,
        tol=1e-5,
    )
    params = fuse({k: v for r in results for k, v in r[4].items()})
    saved = fuse(
        {
            k[len(ck.MODEL_PREFIX) :]: v
            for k, v in ck.read_tensors(folder).items()
            if k.startswith(ck.MODEL_PREFIX)
        }
    )
    assert saved.keys() == params.keys() == set(ref.grads)
    for name, p in params.items():
        assert torch.equal(saved[name], p), name
