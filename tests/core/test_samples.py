import pytest
from hypothesis import given
from hypothesis import strategies as st

from entrain.core.workload.samples import (
    SampleMeta,
    VisionTokenConfig,
    image_llm_tokens,
    image_vit_patches,
    smart_resize,
)

# (W, H) -> LLM image tokens, measured with the real Qwen2-VL processor rule
WORKED = [
    ((640, 480), 391),
    ((640, 427), 345),
    ((500, 375), 234),
    ((640, 640), 529),
    ((612, 612), 484),
    ((800, 557), 580),
    ((800, 1796), 1856),
    ((184, 326), 84),
    ((768, 576), 567),
    ((900, 500), 576),
    ((1200, 900), 1376),
    ((2048, 2048), 5329),
]


@pytest.mark.parametrize(("wh", "tokens"), WORKED)
def test_worked_values(wh, tokens):
    w, h = wh
    assert image_llm_tokens(h, w) == tokens
    assert image_vit_patches(h, w) == 4 * tokens


def test_resized_sides():
    assert smart_resize(480, 640) == (476, 644)
    assert smart_resize(557, 800) == (560, 812)


def test_min_and_max_pixels():
    assert image_llm_tokens(10, 10) == 4  # min_pixels = 56*56 -> 2x2 merged tokens
    cfg = VisionTokenConfig(min_pixels=256 * 784, max_pixels=1280 * 784)
    assert 256 <= image_llm_tokens(480, 640, cfg) <= 1280
    assert image_llm_tokens(4000, 4000, cfg) <= 1280


def test_aspect_ratio_rejected():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(28, 28 * 201)


@given(st.integers(1, 5000), st.integers(1, 5000))
def test_resize_invariants(h, w):
    if max(h, w) / min(h, w) > 200:
        return
    cfg = VisionTokenConfig()
    hb, wb = smart_resize(h, w, cfg)
    assert hb % 28 == 0 and wb % 28 == 0
    assert cfg.min_pixels <= hb * wb <= cfg.max_pixels


def test_sample_counts_and_json():
    s = SampleMeta("a", ((480, 640), (576, 768)), 100)
    assert s.image_tokens == 391 + 567
    assert s.vit_patches == 4 * (391 + 567)
    assert s.llm_tokens == 100 + 391 + 567
    assert s.to_json() == {"id": "a", "images": [[480, 640], [576, 768]], "text_tokens": 100}
    text_only = SampleMeta("b", (), 50)
    assert text_only.vit_patches == 0 and text_only.llm_tokens == 50
