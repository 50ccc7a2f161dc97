"""The Qwen2.5-Omni thinker as Entrain stages equals transformers'
``Qwen2_5OmniThinkerForConditionalGeneration`` (float64): loss, grad norm and every gradient of one
packed batch holding text, an image, audio clips, videos, a video with its audio track and a mixture
in one sample, for several cut sets of the vision tower (the audio tower on the first encoder stage,
its features a message part riding to the first LLM stage) and of the LLM; the time-aligned M-RoPE
ids equal transformers' own ``get_rope_index``; export loads back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from entrain.models.batch import LLMBatch
from entrain.models.families.qwen2_5_omni import model as om
from entrain.models.families.qwen2_5_omni.positions import mrope_position_ids
from tests.models.oracle import assert_equal_steps, staged_step
from tests.models.qwen2_5_omni_tiny import MEL, make_sample, mixed_samples, save_whole

REL = 1e-5
ENCODER_LAYERS, LLM_LAYERS = (
    5,
    7,
)  # patch_embed (+ audio tower) + 3 blocks + merger; embed + 3 layers + norm + lm_head + loss
CUTS = {
    "audio_rides_two_stages": ([1, 3], [2, 4]),
    "every_layer": (list(range(1, ENCODER_LAYERS)), list(range(1, LLM_LAYERS))),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_whole(tmp_path_factory.mktemp("qwen2_5_omni") / "tiny")


def _hf_inputs(s) -> dict:
    """transformers' arguments of one sample: images and videos apart, audio clips padded with a mask."""
    kw: dict = {"attention_mask": torch.ones((1, s.input_ids.numel()), dtype=torch.int64)}
    images, videos, grids, offset = [], [], list(s.grids), 0
    for g in s.visual_grids:
        n = g[0] * g[1] * g[2]
        (images if g in grids and not grids.remove(g) else videos).append(s.patches[offset : offset + n])
        offset += n
    if s.grids:
        kw.update(pixel_values=torch.cat(images).double(), image_grid_thw=torch.tensor(s.grids))
    if s.video_grids:
        kw.update(pixel_values_videos=torch.cat(videos).double(), video_grid_thw=torch.tensor(s.video_grids),
                  video_second_per_grid=torch.tensor(s.second_per_grids))  # fmt: skip
    if s.audio_lengths:
        longest, offset = max(s.audio_lengths), 0
        feats = torch.zeros((len(s.audio_lengths), MEL, longest), dtype=torch.float64)
        mask = torch.zeros((len(s.audio_lengths), longest), dtype=torch.int64)
        for i, n in enumerate(s.audio_lengths):
            feats[i, :, :n], mask[i, :n] = s.mel[:, offset : offset + n], 1
            offset += n
        kw.update(input_features=feats, feature_attention_mask=mask, use_audio_in_video=s.use_audio_in_video)
    return kw


@pytest.fixture(scope="module")
def reference(folder):
    """Transformers' loss and gradients of the mixed samples, one sample per forward (float64)."""
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    model = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(folder, dtype=torch.float64)
    samples = mixed_samples()
    labels = sum(s.targets.numel() for s in samples)
    loss = torch.zeros((), dtype=torch.float64)
    for s in samples:
        model.model.rope_deltas = None
        logits = model(input_ids=s.input_ids.unsqueeze(0), **_hf_inputs(s)).logits[0]
        loss = loss + F.cross_entropy(logits[s.label_positions], s.targets, reduction="sum") / labels
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def packed_batch(hf, samples) -> LLMBatch:
    starts = torch.tensor([0, *torch.cumsum(torch.tensor([s.input_ids.numel() for s in samples]), 0)[:-1]])
    return LLMBatch(
        input_ids=torch.cat([s.input_ids for s in samples]),
        position_ids=mrope_position_ids(hf, samples),
        seq_lens=tuple(s.input_ids.numel() for s in samples),
        image_positions=torch.cat([s.visual_positions + o for s, o in zip(samples, starts)]),
        label_positions=torch.cat([s.label_positions + o for s, o in zip(samples, starts)]),
        targets=torch.cat([s.targets for s in samples]),
        loss_scale=1.0 / sum(s.targets.numel() for s in samples),
    )


def run_staged(model, samples, cuts) -> torch.Tensor:
    """The loss of the stage modules chained in one process (autograd through every boundary)."""
    grid = torch.tensor([g for s in samples for g in s.visual_grids], dtype=torch.int64)
    x = {om.HIDDEN: torch.cat([s.patches for s in samples]).double(),
         om.AUDIO_MEL: torch.cat([s.mel for s in samples], dim=1).t().double(),
         om.AUDIO_LENGTHS: torch.tensor([n for s in samples for n in s.audio_lengths], dtype=torch.int64)}  # fmt: skip
    batch = packed_batch(model.config, samples)
    for component, n, cs in (("encoder", ENCODER_LAYERS, cuts[0]), ("llm", LLM_LAYERS, cuts[1])):
        bounds = [0, *cs, n]
        for a, b in zip(bounds, bounds[1:]):
            stage = om.build_stage(model, component, a, b)
            x = stage(x, grid if component == "encoder" else batch)
            if component == "encoder":  # the audio features ride with every encoder message
                assert isinstance(x, dict) and set(x) == {om.HIDDEN, om.AUDIO}, (a, b)
    return x


@pytest.fixture(scope="module")
def model(folder):
    return om.build_model(str(folder)).double()


@pytest.mark.parametrize("layout", sorted(CUTS))
def test_loss_grad_norm_and_every_gradient_equal_transformers(model, reference, layout):
    got = staged_step(model, lambda: run_staged(model, mixed_samples(), CUTS[layout]))
    assert any(n.startswith(om.AUDIO_PREFIX) for n in got[1]) and any(
        n.startswith(om.VISION_PREFIX) for n in got[1]
    )
    assert_equal_steps(got, reference, rel=REL)


def _want(model, s) -> torch.Tensor:
    kw = _hf_inputs(s)
    return model.model.get_rope_index(
        s.input_ids.unsqueeze(0), kw.get("image_grid_thw"), kw.get("video_grid_thw"), kw["attention_mask"],
        s.use_audio_in_video, torch.tensor(s.audio_lengths) if s.audio_lengths else None,
        kw.get("video_second_per_grid"),
    )[0][:, 0]  # fmt: skip


EXTRA = [
    [("video+audio", (6, 4, 4), 0.5, 300)],  # several chunks of video and audio interleaved
    [("image", (1, 4, 4)), ("video", (4, 8, 4), 1.5), ("image", (1, 4, 8))],
    [("audio", 50), ("audio", 7)],
]


def test_position_ids_are_transformers_get_rope_index_per_sample(model):
    samples = mixed_samples() + [make_sample(10 + i, parts) for i, parts in enumerate(EXTRA)]
    packed, start = mrope_position_ids(model.config, samples), 0
    for s in samples:
        n = s.input_ids.numel()
        assert torch.equal(packed[:, start : start + n], _want(model, s)), s.input_ids
        start += n
    assert samples[-3].use_audio_in_video


def test_placeholder_counts_must_match_the_inputs(model):
    from entrain.core.errors import ConfigError
    from entrain.models.families.qwen2_5_omni.positions import sample_position_ids

    s = make_sample(3, [("audio", 37)])
    with pytest.raises(ConfigError, match="audio tokens"):
        sample_position_ids(model.config, s.input_ids, audio_lengths=(60,))


def test_export_loads_in_transformers_with_every_tensor(model, folder, tmp_path):
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from entrain.models.families.qwen2_5_omni.export import export_folder

    params = {n: p.detach().float() for n, p in model.named_parameters()}
    export_folder(str(folder), params, str(tmp_path / "out"))
    back = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(tmp_path / "out")
    for n, p in back.named_parameters():
        assert torch.equal(p, params[n]), n


def test_a_whole_qwen2_5_omni_folder_trains_its_thinker(tmp_path):
    """A published-layout folder (``qwen2_5_omni``: thinker, talker, token2wav) builds its thinker with
    every tensor read from ``thinker.*``; the family claims it."""
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_source
    from tests.models.qwen2_5_omni_tiny import save_whole_omni, whole_omni

    sizes = dict(text_layers=1, vision_depth=1, audio_layers=1)
    folder = save_whole_omni(tmp_path / "whole", **sizes)
    assert family_of_source(ModelSource(model_path=str(folder))).name == "qwen2_5_omni"
    thinker = om.build_model(str(folder))
    want = dict(whole_omni(**sizes).thinker.named_parameters())
    got = dict(thinker.named_parameters())
    assert set(got) == set(want)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_the_shape_counts_every_parameter_of_the_thinker(model, folder):
    """The cost model's parameters (the audio tower's on the first encoder layer) are the thinker's."""
    from entrain.models.families.qwen2_5_omni.spec import shape_of_folder

    shape = shape_of_folder(str(folder))
    assert shape.num_params() == sum(p.numel() for p in model.parameters())
    audio = sum(p.numel() for n, p in model.named_parameters() if n.startswith(om.AUDIO_PREFIX))
    assert shape.audio.num_params() == audio
    assert shape.layer_specs()["encoder"][0].param_count > audio
