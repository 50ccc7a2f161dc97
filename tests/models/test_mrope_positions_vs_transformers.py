"""Packed M-RoPE position ids (``entrain.models.families.qwen2_vl.positions``) against transformers'
own ``get_rope_index`` of each sample alone, and placeholders that are not one contiguous run per image
refused with the sample and image named (transformers would read them as other images)."""

from __future__ import annotations

import pytest
import torch

from entrain.core.errors import ConfigError
from entrain.models.families.qwen2_vl.positions import model_class, mrope_position_ids
from tests.models.qwen_vl_tiny import FAMILIES, IMAGE, _configs, make_sample, mixed_samples


@pytest.fixture(scope="module", params=FAMILIES)
def hf_config(request):
    cfg, _ = _configs(request.param, text_layers=1, vision_depth=2, tied=False)
    return cfg


def _transformers_ids(hf_config, s) -> torch.Tensor:
    with torch.device("meta"):
        inner = model_class(hf_config.model_type)(hf_config)
    types = torch.zeros(1, s.input_ids.numel(), dtype=torch.int32)
    types[0, s.image_positions] = 1
    grid = torch.tensor(s.grids) if s.grids else None
    ids, _ = inner.get_rope_index(s.input_ids[None], mm_token_type_ids=types, image_grid_thw=grid)
    return ids[:, 0]


def test_packed_ids_are_transformers_per_sample(hf_config):
    samples = mixed_samples()
    ids = mrope_position_ids(hf_config, samples)
    start = 0
    for s in samples:
        n = s.input_ids.numel()
        assert torch.equal(ids[:, start : start + n], _transformers_ids(hf_config, s))
        start += n
    assert start == ids.shape[1]


def _split_image_sample():
    """Sample 1 of a pack: text, then a 2 x 3 merged-token image whose placeholders a text token cuts
    in two (3 + text + 3), then text."""
    s = make_sample([4, (1, 4, 6), 5], seed=7)
    first = int(s.image_positions[0])
    ids = torch.cat([s.input_ids[: first + 3], torch.tensor([17]), s.input_ids[first + 3 :]])
    positions = torch.tensor([*range(first, first + 3), *range(first + 4, first + 7)])
    assert int((ids == IMAGE).sum()) == 6 and torch.equal(torch.nonzero(ids == IMAGE)[:, 0], positions)
    return type(s)(ids, positions, s.grids, s.patches)


def test_an_image_cut_by_text_is_refused_not_given_positions(hf_config):
    samples = [mixed_samples()[1], _split_image_sample()]
    with pytest.raises(
        ConfigError, match=r"packed sample 1: the tokens of image 0 are not one contiguous run"
    ):
        mrope_position_ids(hf_config, samples)


def test_adjacent_images_continue_as_after_one_separating_token(hf_config):
    """Two images with no token between (transformers would take them for one): the second continues
    right after the first's largest id, where it would start after one separating text token."""
    apart = make_sample([3, (1, 4, 4), 1, (1, 2, 4), 2], seed=5)
    # the same sample without the image-end / text / image-start tokens between the images
    first_end = int(apart.image_positions[3]) + 1
    cut = [first_end, first_end + 1, first_end + 2]
    keep = torch.tensor([i for i in range(apart.input_ids.numel()) if i not in cut])
    adjacent = type(apart)(
        apart.input_ids[keep],
        torch.cat([apart.image_positions[:4], apart.image_positions[4:] - 3]),
        apart.grids,
        apart.patches,
    )
    want = _transformers_ids(hf_config, apart)
    want = torch.cat([want[:, :first_end], want[:, first_end + 3 :] - 3], dim=1)
    assert torch.equal(mrope_position_ids(hf_config, [adjacent]), want)
