"""A Qwen2.5-Omni thinker through the runtime, against transformers' own
``Qwen2_5OmniThinkerForConditionalGeneration``: forked gloo ranks train one step of the skewed image
batch (two samples packed per microbatch) with audio clips: samples with an image and a clip, with an
image and two clips, audio only, and images only, on two pipeline layouts (``entrain`` 2 + 2,
``1f1b --freeze vit`` 1 + 3; the audio tower in the first encoder stage beside the vision tower, its
features the ``audio`` message part cut per sample by its audio tokens at the encoder -> LLM
boundary); the loss, the gradient norm and every gradient before and after clipping equal the
single-process fp64 oracle (transformers' class, every sample alone, its audio clips padded with a
feature mask, positions by its own ``get_rope_index``) at rel 1e-5. Video reaches the stages in the
in-process oracle only (tests/models/test_qwen2_5_omni_family.py): sample metadata carries no video."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from entrain.core.costs.presets import build_cost_model
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source
from tests.models.qwen2_5_omni_tiny import save_whole

from .cases import MAX_GRAD_NORM, text_only_metas
from .families import FamilyModel, assert_ranks_match, train_cases, transformers_step
from .harness import ReferenceStep, run_workers
from .test_qwen3_vl_train import with_cuts

AUDIO = {"s0": (50,), "s3": (37, 20), "s5": (64, 18), "s7": (30,)}
"""Mel frames per clip of the samples with audio (s3 is otherwise text-only: audio alone)."""

# (name, system, (encoder cuts), (llm cuts), encoder frozen): [patch_embed (+ audio), blocks.0-2, merger];
# [embed, layers.0-2, norm, lm_head, loss]
CASES = [
    ("entrain-2+2", "entrain", (1,), (2,), False),
    (
        "1f1b-1+3-frozen-vit",
        "1f1b",
        (),
        (2, 4),
        True,
    ),  # a frozen first encoder stage without the merger trains nothing
]
NUM_MICROBATCHES = 4


@pytest.fixture(scope="module")
def fm(tmp_path_factory) -> FamilyModel:
    return omni_model(tmp_path_factory.mktemp("qwen2_5_omni"))


def omni_model(where) -> FamilyModel:
    """The tiny thinker saved under folder ``where`` and the batch with ``AUDIO``'s clips."""
    folder = save_whole(where / "tiny")
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    rule = family.image_rule(cfg.shape, None, None)
    metas = {m.id: replace(m, vision=rule, audio=AUDIO.get(m.id, ())) for m in text_only_metas()}
    return FamilyModel("qwen2_5_omni", family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), metas)


def oracle(fm: FamilyModel, frozen: bool) -> ReferenceStep:
    """Transformers' thinker in fp64, every sample alone: ``loss = sum(token CE) / label tokens``."""
    model = fm.build(torch.float64, frozen_encoder=frozen).to(torch.float64)
    renderer = fm.renderer(torch.float64)

    def inputs(sid: str, s) -> dict:
        kw = {"attention_mask": torch.ones((1, s.num_tokens), dtype=torch.int64)}
        if s.grid_thw:
            kw.update(pixel_values=renderer.patches(sid), image_grid_thw=torch.tensor(s.grid_thw))
        if s.audio_frames:
            kw.update(_audio_inputs(renderer.audio_features(sid), s.audio_frames))
        model.model.rope_deltas = None
        return kw

    return transformers_step(model, renderer, sorted(fm.metas), inputs, max_grad_norm=MAX_GRAD_NORM)


def _audio_inputs(mel: torch.Tensor, frames) -> dict:
    """transformers' audio arguments: the clips' ``[frames, mel]`` rows as ``[clips, mel, longest]``
    features with their frame mask."""
    feats = torch.zeros((len(frames), mel.shape[1], max(frames)), dtype=mel.dtype)
    mask = torch.zeros((len(frames), max(frames)), dtype=torch.int64)
    start = 0
    for i, n in enumerate(frames):
        feats[i, :, :n], mask[i, :n] = mel[start : start + n].t(), 1
        start += n
    return {"input_features": feats, "feature_attention_mask": mask}


def test_pipeline_gradients_match_transformers(fm, tmp_path):
    cases = []
    for name, system, enc_cuts, llm_cuts, frozen in CASES:
        plan = fm.plan(system, len(enc_cuts) + 1, len(llm_cuts) + 1, 1, NUM_MICROBATCHES)
        plan = with_cuts(plan, fm.cost, {"encoder": enc_cuts, "llm": llm_cuts})
        assert plan.layout.world_size == 4, name
        cases.append((name, plan, frozen))
    results = run_workers(train_cases, 4, tmp_path, fm, cases)
    for name, *_, frozen in CASES:
        ref = oracle(fm, frozen)
        assert ref.grad_norm > MAX_GRAD_NORM, f"{name}: clipping would not be exercised"
        assert_ranks_match(name, [r[name] for r in results], ref, tol=1e-5)
        frozen_away = {n for n, _ in fm.build().named_parameters()} - set(ref.grads)
        assert any(".visual.blocks." in n for n in frozen_away) == frozen, name
        assert any(".audio_tower.layers." in n for n in ref.grads) != frozen, name
    # the audio clips of two samples share an encoder message (rows cut per sample at the boundary)
    mbs = [sub for mb in cases[0][1].iterations[0].microbatches[0] for sub in mb.encoder_subs]
    assert any(sum(sid in AUDIO for sid in sub) >= 2 for sub in mbs), mbs


def test_the_planned_boundary_message_carries_the_audio_rows(fm):
    """The cost model's ``audio`` part: one row of the LLM width per audio token of the message's samples."""
    from entrain.core.schedules.action_costs import PlanCosts

    from .cases import works

    plan = with_cuts(fm.plan("entrain", 2, 2, 1, NUM_MICROBATCHES), fm.cost, {"encoder": (1,), "llm": (2,)})
    samples = {w.id: w for w in works(list(fm.metas.values()), fm.cost)}
    costs = PlanCosts(plan.layout, fm.cost, samples)
    ids = tuple(sorted(fm.metas))
    width = fm.cfg.shape.audio.output_dim
    for stage in (0, 1):  # every encoder stage's message carries it
        assert plan.layout.stages[stage].part_names == ("hidden", "audio")
        audio = sum(fm.metas[i].audio_tokens for i in ids)
        assert costs.part_bytes(stage, ids) == {"audio": audio * width * 2}
    assert audio > 0 and plan.layout.stages[2].part_names == ("hidden",)
