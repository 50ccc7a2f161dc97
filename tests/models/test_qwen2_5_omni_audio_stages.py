"""The thinker's audio tower as the stages of an audio encoder pipeline
(``qwen2_5_omni.model.OmniAudioStage``, layers ``[conv, layers..., proj]``): cut anywhere, the
stages in turn compute exactly what transformers' ``Qwen2_5OmniAudioEncoder`` does on clips spanning
several attention chunks, own every tower parameter once, and give an empty message without a clip;
a ``vision`` stage is the vision tower without the audio tower."""

from __future__ import annotations

import pytest
import torch

from entrain.models.families.qwen2_5_omni.model import build_model, build_stage
from tests.models.qwen2_5_omni_tiny import MEL, save_whole

LENGTHS = (37, 8, 20, 9)
"""Mel frames per clip (the tiny tower's chunks are 8 frames: whole chunks, tails, one short clip)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(str(save_whole(tmp_path_factory.mktemp("omni") / "tiny"))).to(torch.float64)


def _run(model, cuts, mel, lengths):
    h = {"audio_mel": mel}
    for first, end in zip(cuts, cuts[1:]):
        h = {"hidden": build_stage(model, "audio", first, end)(h, lengths)}
    return h["hidden"]


@pytest.mark.parametrize("cuts", [(0, 4), (0, 1, 4), (0, 2, 4), (0, 3, 4), (0, 1, 2, 3, 4)])
def test_audio_stages_compute_the_tower(model, cuts):
    lengths = torch.tensor(LENGTHS)
    mel = torch.randn((sum(LENGTHS), MEL), dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    want = model.model.audio_tower(mel.t(), feature_lens=lengths).last_hidden_state
    got = _run(model, cuts, mel, lengths)
    assert got.shape == want.shape
    assert torch.equal(got, want)


def test_audio_stages_own_the_tower_once(model):
    cuts = (0, 1, 3, 4)
    names = [
        n for a, b in zip(cuts, cuts[1:]) for n, _ in build_stage(model, "audio", a, b).owned_parameters()
    ]
    tower = ["model.audio_tower." + n for n, _ in model.model.audio_tower.named_parameters()]
    assert sorted(names) == sorted(tower)


def test_no_clip_is_an_empty_message(model):
    out = build_stage(model, "audio", 0, 4)(
        {"audio_mel": torch.zeros((0, MEL))}, torch.zeros(0, dtype=torch.int64)
    )
    assert out.shape == (0, model.model.audio_tower.proj.out_features)


def test_a_vision_stage_leaves_the_audio_tower_out(model):
    stage = build_stage(model, "vision", 0, 1)
    assert stage.audio_tower is None
    assert not any(".audio_tower." in n for n, _ in stage.owned_parameters())


def test_an_audio_stage_recomputes_its_encoder_layers(model):
    """``recompute_modules`` of an audio pipeline's stage: its encoder layers (full), their attention
    (selective); the convolutions and the projection keep their activations."""
    from entrain.models.families.qwen2_5_omni.family import QWEN2_5_OMNI_FAMILY as family

    layers = model.model.audio_tower.layers
    assert family.recompute_modules(build_stage(model, "audio", 0, 2), "full") == [layers[0]]
    assert family.recompute_modules(build_stage(model, "audio", 1, 4), "selective") == [
        layers[0].self_attn,
        layers[1].self_attn,
    ]
    assert family.fsdp_units(build_stage(model, "audio", 2, 4)) == [layers[1]]
