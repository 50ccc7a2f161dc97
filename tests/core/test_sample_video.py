"""A sample's videos in its metadata (``SampleMeta.video``: each video's encoder patch grid): the
planner and cost model count their encoder rows (one attention unit per temporal patch) and LLM
tokens (``t * h * w / merge**2``), a sample without video is what it was (its JSON has no ``video``
key), and the assignment sees a video sample's work as the same tokens as images would be."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.core.costs.presets import build_cost_model
from entrain.core.workload.samples import SampleMeta, video_encoder_units

grids = st.tuples(
    st.integers(1, 6), st.integers(1, 8).map(lambda x: 2 * x), st.integers(1, 8).map(lambda x: 2 * x)
)


@settings(deadline=None, max_examples=40)
@given(st.lists(grids, max_size=3), st.lists(st.integers(1, 900), max_size=2), st.integers(1, 200))
def test_video_tokens_and_units(videos, audio, text):
    bare = SampleMeta("s", ((56, 84),), text, audio=tuple(audio))
    meta = SampleMeta("s", ((56, 84),), text, audio=tuple(audio), video=tuple(videos))
    tokens = sum(t * h * w // 4 for t, h, w in videos)
    assert meta.video_tokens == tokens
    assert meta.llm_tokens == bare.llm_tokens + tokens
    frames = [h * w for t, h, w in videos for _ in range(t)]
    n = len(bare.vit_patches_per_image)
    assert meta.encoder_units == bare.encoder_units[:n] + tuple(frames) + bare.encoder_units[n:]
    assert sum(meta.encoder_units) == sum(bare.encoder_units) + sum(t * h * w for t, h, w in videos)
    back = SampleMeta.from_json(meta.to_json())
    assert back == meta and back.video == tuple(videos)
    assert ("video" in meta.to_json()) == bool(videos)


def test_a_sample_without_video_is_unchanged():
    meta = SampleMeta("a", ((448, 448),), 40, answer_tokens=5)
    assert meta.to_json() == {"id": "a", "images": [[448, 448]], "text_tokens": 40, "answer_tokens": 5}
    assert meta.video_tokens == 0 and meta.encoder_units == meta.vit_patches_per_image


def test_video_units_are_per_temporal_patch():
    assert video_encoder_units((3, 4, 6)) == (24, 24, 24)


def test_the_cost_model_prices_a_video_as_its_rows():
    """A video's work: its frames as encoder rows and its tokens on the LLM, the same as an image of
    one temporal patch with the same rows (a 1-frame-patch video of grid (1, h, w) costs an image of
    h x w patches), and more frames cost more on both components."""
    cost = build_cost_model("tiny", "cpu-tiny")
    image = SampleMeta("i", ((14 * 16, 14 * 20),), 30)  # 16 x 20 patches
    still = SampleMeta("v", (), 30, video=((1, 16, 20),))
    assert cost.sample_work(still).encoder == cost.sample_work(image).encoder
    assert cost.sample_work(still).llm == cost.sample_work(image).llm
    longer = SampleMeta("w", (), 30, video=((4, 16, 20),))
    assert cost.sample_work(longer).encoder > 3 * cost.sample_work(still).encoder
    assert cost.sample_work(longer).llm > cost.sample_work(still).llm


def test_a_videos_feature_rows_ride_with_the_image_rows():
    """The rows an ``image_tokens`` message part carries (deepstack features: one per visual token)
    count a sample's video tokens beside its image tokens."""
    from entrain.core.schedules.action_costs import PlanCosts

    costs = object.__new__(PlanCosts)
    cost = build_cost_model("tiny", "cpu-tiny")
    meta = SampleMeta("v", ((224, 280),), 30, video=((2, 16, 20),))
    costs.samples = {"v": cost.sample_work(meta)}
    assert costs._image_rows("v") == 80 + 160
