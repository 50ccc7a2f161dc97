"""A Qwen3-VL video reaches the model as transformers computes it: packed samples holding a video (its
frames' tokens apart, a timestamp before each), an image and a video in one sample, and an image alone,
through the Entrain stages (cut between the DeepStack taps and between the LLM layers that receive
their features) give transformers' ``Qwen3VLForConditionalGeneration`` loss and every gradient (float64,
one sample per forward, ``pixel_values_videos`` / ``video_grid_thw``). The tower takes a video as an
item of grid ``(t, h, w)`` (attention within each temporal patch); DeepStack adds its features at the
video tokens; the M-RoPE ids tell its tokens by the video token id."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.models.oracle import assert_equal_steps, staged_step
from tests.models.qwen3_vl_tiny import IMAGE, PATCH_VALUES, VEND, VIDEO, VSTART, Sample, save_whole
from tests.models.test_qwen3_vl_family import run_staged

REL = 1e-5
CUTS = {"whole": ([], []), "taps_apart": ([2, 4], [2, 3])}


def _sample(layout: list, seed: int) -> Sample:
    """ints: text tokens; ``("i", (1, h, w))`` an image; ``("v", (t, h, w))`` a video: per temporal patch
    a 3-token timestamp, then ``<|vision_start|>`` + its ``h * w / 4`` video tokens + ``<|vision_end|>``."""
    gen = torch.Generator().manual_seed(seed)
    ids, positions, grids, patches = [], [], [], []
    for part in layout:
        if isinstance(part, int):
            ids += torch.randint(2, 240, (part,), generator=gen).tolist()
            continue
        kind, (t, h, w) = part
        for _ in range(t if kind == "v" else 1):
            n = h * w // 4 if kind == "v" else t * h * w // 4
            ids += [*(torch.randint(2, 240, (3,), generator=gen).tolist() if kind == "v" else []), VSTART]
            positions += range(len(ids), len(ids) + n)
            ids += [VIDEO if kind == "v" else IMAGE] * n + [VEND]
        grids.append((t, h, w))
        patches.append(torch.randn(t * h * w, PATCH_VALUES, generator=gen))
    return Sample(torch.tensor(ids), torch.tensor(positions, dtype=torch.int64), tuple(grids),
                  torch.cat(patches) if patches else torch.zeros(0, PATCH_VALUES))  # fmt: skip


def _samples() -> list[Sample]:
    return [
        _sample([4, ("v", (3, 4, 4)), 5], seed=1),
        _sample([3, ("i", (1, 4, 6)), 2, ("v", (2, 2, 6)), 6], seed=2),
        _sample([("i", (1, 6, 4)), 7], seed=3),
    ]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_whole(tmp_path_factory.mktemp("qwen3_vl_video"), text_layers=4, vision_depth=5)


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float64)
    samples = _samples()
    labels = sum(s.targets.numel() for s in samples)
    loss = torch.zeros((), dtype=torch.float64)
    for s in samples:
        video = (s.input_ids == VIDEO)[s.image_positions]
        sizes = [t * h * w // 4 for t, h, w in s.grids]
        kinds = [bool(video[sum(sizes[:i])]) for i in range(len(sizes))]
        rows = torch.split(s.patches.double(), [t * h * w for t, h, w in s.grids])
        kwargs = {
            "mm_token_type_ids": ((s.input_ids == IMAGE).int() + 2 * (s.input_ids == VIDEO).int())[None]
        }
        if not all(kinds):
            kwargs |= {"pixel_values": torch.cat([r for r, v in zip(rows, kinds) if not v]),
                       "image_grid_thw": torch.tensor([g for g, v in zip(s.grids, kinds) if not v])}  # fmt: skip
        if any(kinds):
            kwargs |= {"pixel_values_videos": torch.cat([r for r, v in zip(rows, kinds) if v]),
                       "video_grid_thw": torch.tensor([g for g, v in zip(s.grids, kinds) if v])}  # fmt: skip
        logits = model(input_ids=s.input_ids[None], **kwargs).logits[0]
        loss = loss + F.cross_entropy(logits[s.label_positions], s.targets, reduction="sum") / labels
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def model(folder):
    from entrain.models.families.qwen3_vl import model as qm

    return qm.build_model(str(folder)).double()


@pytest.mark.parametrize("layout", sorted(CUTS))
def test_videos_give_transformers_loss_and_every_gradient(model, reference, layout):
    got = staged_step(model, lambda: run_staged(model, _samples(), CUTS[layout]))
    assert_equal_steps(got, reference, rel=REL, norm=False)
