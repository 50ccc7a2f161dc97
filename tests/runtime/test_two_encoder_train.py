"""A Qwen2.5-Omni thinker trained on a plan with two encoder pipelines (docs/design.md, "N encoders"):
Entrain's plan (``planning.encoders_plan``) puts the vision tower and the audio tower in pipelines of
their own, side by side, feeding the first LLM stage, which receives one message per encoder per
microbatch, merges them as the thinker does (visual features at the image placeholders, audio features
at the audio ones) and sends each gradient back to its own pipeline. Forked gloo ranks train one step
of the mixed batch (images with clips, clips alone, images alone, text alone) on two layouts of four
ranks (vision 1 + audio 1 + LLM 2; vision 1 + audio 2 + LLM 1: the audio tower cut between stages), and
in the same launch DistTrain-like's plan (``planning.encoders_baselines``: one group per tower) and
DIP-like's on two replicas of two colocated ranks (a chunk of both towers and of the LLM on each rank);
the loss, the gradient norm and every gradient before and after clipping equal transformers'
``Qwen2_5OmniThinkerForConditionalGeneration`` in fp64, every sample alone (the oracle of
tests/runtime/test_qwen2_5_omni_train.py), at rel 1e-5."""

from __future__ import annotations

from dataclasses import replace

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.ir.p2p_check import check_plan
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.validate import validate_plan
from entrain.core.planning.encoders import (
    Encoder,
    audio_tower_specs,
    audio_units,
    price_encoder,
    search_encoders,
    vision_units,
)
from entrain.core.planning.encoders_baselines import generate_config_plan, plan_encoders_system
from entrain.core.systems import DIP, DISTTRAIN, ENTRAIN
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .cases import MAX_GRAD_NORM
from .families import FamilyModel, assert_ranks_match, train_cases
from .harness import run_workers
from .test_qwen2_5_omni_train import AUDIO, omni_model, oracle

MICROBATCH_SIZE = 2
LAYOUTS = {"vision1+audio1+llm2": (1, 1, 2), "vision1+audio2+llm1": (1, 2, 1)}
"""GPUs of the vision pipeline, the audio pipeline and the LLM (one stage each)."""
RECOMPUTED = "vision1+audio2+llm1-recomputed"
DISTTRAIN_CASE = "disttrain-vision1+audio1+llm2"
DIP_DP2 = "dip-dp2"
"""DIP-like's colocated plan on 2 replicas of 2 ranks, each rank a chunk of both towers and of the LLM."""


def encoders(fm: FamilyModel) -> tuple[Encoder, Encoder]:
    """The thinker's towers as the planner's encoders, priced on ``cpu-tiny``."""
    audio = price_encoder(fm.cfg.shape, audio_tower_specs(fm.cfg.shape.audio), "cpu-tiny")
    vision = build_cost_model(fm.cfg.shape, "cpu-tiny")
    return Encoder("vision", vision, vision_units), Encoder("audio", audio, audio_units)


def two_encoder_plan(fm: FamilyModel, allocation: tuple[int, int, int], system: str = ENTRAIN):
    """``system``'s two-encoder plan of the batch (Entrain's or DistTrain-like's) with one stage per GPU of
    ``allocation``."""
    samples = [fm.metas[i] for i in sorted(fm.metas)]
    parallel = ParallelConfig(gpus=sum(allocation), dp=1, tp=1, cp=1, global_batch=len(samples),
                              microbatch_size=MICROBATCH_SIZE)  # fmt: skip
    configs = search_encoders(samples, encoders(fm), parallel, allocation=allocation)
    cfg = next(c for c in configs if (*(e.pp for e in c.encoders), c.llm.pp) == allocation)
    return generate_config_plan(system, [samples], encoders(fm), cfg)


def dip_dp2_plan(fm: FamilyModel):
    """DIP-like's two-encoder plan of the batch on 4 GPUs in 2 replicas (``plan_encoders_system``: 2
    colocated ranks each, its 4-sample profile the batch's first four)."""
    samples = [fm.metas[i] for i in sorted(fm.metas)]
    parallel = ParallelConfig(
        gpus=4, dp=2, tp=1, cp=1, global_batch=len(samples), microbatch_size=MICROBATCH_SIZE
    )
    return plan_encoders_system(DIP, samples, [samples], encoders(fm), parallel)


@pytest.fixture(scope="module")
def fm(tmp_path_factory) -> FamilyModel:
    return omni_model(tmp_path_factory.mktemp("qwen2_5_omni"))


@pytest.fixture(scope="module")
def plans(fm):
    out = {}
    for name, allocation in LAYOUTS.items():
        plan = two_encoder_plan(fm, allocation)
        validate_plan(plan)
        check_plan(plan)
        out[name] = plan
    return out


@pytest.fixture(scope="module")
def baselines(fm):
    """DistTrain-like's plan on the first layout and DIP-like's on two replicas, each valid and passing
    the NCCL checker."""
    out = {
        DISTTRAIN_CASE: two_encoder_plan(fm, LAYOUTS["vision1+audio1+llm2"], DISTTRAIN),
        DIP_DP2: dip_dp2_plan(fm),
    }
    for plan in out.values():
        validate_plan(plan)
        check_plan(plan)
    return out


def recomputed(plan, modes: dict[int, str]):
    """``plan`` with the stages of ``modes`` recomputed (``StageSpec.recompute``)."""
    stages = tuple(replace(st, recompute=modes.get(st.stage, st.recompute)) for st in plan.layout.stages)
    return replace(plan, layout=replace(plan.layout, stages=stages))


def test_two_encoder_pipelines_train_as_transformers(fm, plans, baselines, tmp_path):
    """Both layouts, and the second with its vision stage and first audio stage recomputed in full, its
    last audio stage's and its LLM stage's attention recomputed (the family's recompute modules of an
    audio pipeline's stage); DistTrain-like's plan (one group per tower, ``entrain train --system
    disttrain``'s), and DIP-like's on two replicas, each replica's ranks against the oracle on their own
    (the gradients all-reduced over the replicas)."""
    cases = [(name, plan, False) for name, plan in plans.items()]
    modes = {0: "full", 1: "full", 2: "selective", 3: "selective"}
    cases.append((RECOMPUTED, recomputed(plans["vision1+audio2+llm1"], modes), False))
    cases += [(name, plan, False) for name, plan in baselines.items()]
    results = run_workers(train_cases, 4, tmp_path, fm, cases)
    ref = oracle(fm, False)
    assert ref.grad_norm > MAX_GRAD_NORM, "clipping would not be exercised"
    for name, plan, _ in cases:
        lay = plan.layout
        for replica in range(lay.dp):
            ranks = [results[lay.global_rank(replica, p)][name] for p in range(lay.ranks_per_replica)]
            _, before, _ = assert_ranks_match(f"{name} replica {replica}", ranks, ref, tol=1e-5)
            assert any(".audio_tower.layers." in n for n in before), name
            assert any(".visual.blocks." in n for n in before), name


def test_the_baselines_run_what_they_claim(baselines):
    """DistTrain-like: one group per tower, 1F1B without deferral. DIP-like: 2 replicas of 2 ranks, each
    rank a chunk of the vision tower, of the audio tower and of the LLM, and some encoder microbatch cut
    into several subs under the caps."""
    dist = baselines[DISTTRAIN_CASE]
    assert dist.system == DISTTRAIN and [len(g) for g in dist.layout.encoder_groups] == [1, 1]
    assert all(mb.encoder_subs == mb.llm_subs for rep in dist.iterations[0].microbatches for mb in rep)
    dip = baselines[DIP_DP2]
    lay = dip.layout
    assert dip.system == DIP and (lay.dp, lay.ranks_per_replica, lay.world_size) == (2, 2, 4)
    for r in range(2):
        assert [s.encoder or s.component for s in lay.stages_of(r)] == ["vision", "audio", "llm"]
    assert any(len(mb.encoder_subs) > 1 for rep in dip.iterations[0].microbatches for mb in rep)


def test_the_plans_mix_images_and_clips_in_a_microbatch(fm, plans):
    """Each plan has two pipelines (the audio one cut where asked), and some encoder microbatch carries
    both an image and an audio clip: both pipelines' messages meet at the first LLM stage."""
    for name, plan in plans.items():
        lay = plan.layout
        assert lay.encoder_names == ("vision", "audio"), name
        assert tuple(len(g) for g in lay.encoder_groups) == LAYOUTS[name][:2], name
        subs = [sub for mb in plan.iterations[0].microbatches[0] for sub in mb.encoder_subs]
        mixed = [sub for sub in subs if any(i in AUDIO for i in sub) and any(fm.metas[i].images for i in sub)]
        assert mixed, (name, subs)


def test_each_pipeline_sizes_its_boundary_message_by_its_tower(fm, plans):
    """The receiver's rows from the plan (``MessageShapes``): the vision pipeline's last message one row
    per image feature row, the audio pipeline's one per audio token; an inner audio message (rows per
    attention chunk) is read from its header."""
    from entrain.runtime.message_shapes import MessageShapes

    layout = plans["vision1+audio2+llm1"].layout
    renderer = fm.renderer()
    shapes = MessageShapes(layout, renderer, {n: rule for n, (_, rule) in fm.family.encoder_parts.items()})
    ids = sorted(fm.metas)
    (vision,), (inner, audio) = layout.encoder_groups
    samples = [renderer.sample(i) for i in ids]
    assert shapes.rows(vision, "hidden", ids) == sum(s.image_tokens for s in samples) > 0
    assert shapes.rows(audio, "hidden", ids) == sum(s.audio_tokens for s in samples) > 0
    assert shapes.rows(inner, "hidden", ids) is None


def test_each_pipeline_renders_only_its_towers_inputs(fm, plans):
    """A vision pipeline's first stage renders the samples' images only, an audio pipeline's their
    clips only (``SampleRenderer.encoder_input``'s kind, ``Executor.input_kind``): no rank processes
    the other tower's media."""
    from types import SimpleNamespace

    import torch

    from entrain.runtime.executor import Executor

    layout = plans["vision1+audio1+llm2"].layout
    renderer = fm.renderer()
    transport = SimpleNamespace(device=torch.device("cpu"))
    ex = Executor(layout=layout, rank=0, modules={}, transport=transport, renderer=renderer, input_grad={})
    (vision,), (audio,) = layout.encoder_groups
    assert (ex.input_kind(vision), ex.input_kind(audio)) == ("images", "audio")
    ids = sorted(AUDIO)
    images, clips = renderer.encoder_input(ids, "images"), renderer.encoder_input(ids, "audio")
    assert images.patches.shape[0] > 0 and images.audio == {}
    assert clips.patches.shape[0] == 0 and clips.audio["audio_lengths"].tolist() == [
        f for i in ids for f in AUDIO[i]
    ]


def _evaluate(env, fm: FamilyModel, plan) -> float:
    trainer = PipelineTrainer(layout=plan.layout, model=fm.build(), env=env, renderer=fm.renderer(),
                              optim=OptimConfig(max_grad_norm=MAX_GRAD_NORM))  # fmt: skip
    return trainer.evaluate(plan.iterations[0])


def test_a_forward_only_step_gives_the_loss(fm, plans, tmp_path):
    """Validation (``PipelineTrainer.evaluate``): the forward-only program of the audio-cut layout
    gives transformers' loss."""
    losses = run_workers(_evaluate, 4, tmp_path, fm, plans["vision1+audio2+llm1"])
    ref = oracle(fm, False)
    assert losses == [losses[0]] * 4
    assert abs(losses[0] - ref.loss) <= 1e-5 * abs(ref.loss)
