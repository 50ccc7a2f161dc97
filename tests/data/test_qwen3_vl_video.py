"""Qwen3-VL videos against transformers' own code, on a tiny synthetic video (numpy frames):

* the conversation's ids: a ``<video>`` expanded by ``video_text`` and rendered through the checkpoint
  tokenizer's chat template equal the ids ``Qwen3VLProcessor`` makes of the chat template's
  ``<|vision_start|><|video_pad|><|vision_end|>`` (timestamps per temporal patch from the sampled
  frames' indices and the fps, one ``<|vision_start|>`` ... ``<|vision_end|>`` per frame);
* the grid is the video processor's ``smart_resize`` and the pixel rows its ``patchify`` of the
  normalised frames (an odd frame count repeats the last frame);
* the M-RoPE ids of a packed batch holding images and videos equal ``Qwen3VLModel.get_rope_index`` of
  each sample alone (videos told from images by their token id).

Transformers' video processor itself needs torchvision, which this environment lacks: its resize and
normalisation are replaced here by frames already at the grid's size and the documented arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from entrain.models.families.qwen3_vl.processing import (
    VideoSettings,
    expand_videos,
    process_video,
    video_grid,
    video_text,
)

SETTINGS = {"size": {"shortest_edge": 4096, "longest_edge": 1048576}, "patch_size": 16, "merge_size": 2,
            "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
FPS, INDICES = 12.0, [0, 6, 12, 18, 24]
"""Five frames sampled from a 12-fps clip: three temporal patches, the last one the fifth frame twice."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tokenizer (small BPE + chat template) holding Qwen's vision tokens."""
    from transformers import AutoTokenizer

    from tests.models.qwen_vl_tiny import VISION_TOKENS
    from tests.models.stock import save_tokenizer

    path = save_tokenizer(tmp_path_factory.mktemp("qwen3vl_video"))
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS.values())})
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_config(folder):
    from transformers import AutoTokenizer

    from tests.models.qwen3_vl_tiny import config
    from tests.models.qwen_vl_tiny import VISION_TOKENS

    tok = AutoTokenizer.from_pretrained(folder)
    ids = {key: tok.convert_tokens_to_ids(t) for key, t in VISION_TOKENS.items()}
    return config(vocab=len(tok), ids=ids)


def _frames(n: int, height: int = 64, width: int = 96) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, (n, height, width, 3), dtype=np.uint8)


class _StubVideoProcessor:
    """Stands in for ``Qwen3VLVideoProcessor`` (torchvision) inside ``Qwen3VLProcessor``: returns
    ``process_video``'s rows and grid with the metadata, as the real one does with ``return_metadata``."""

    merge_size, temporal_patch_size = 2, 2

    def __call__(self, videos, video_metadata=None, **kwargs):
        from transformers.feature_extraction_utils import BatchFeature

        pixels, grid = process_video(list(videos[0]), VideoSettings.from_config(SETTINGS))
        return BatchFeature({"pixel_values_videos": torch.from_numpy(pixels),
                             "video_grid_thw": torch.tensor([grid]), "video_metadata": video_metadata})  # fmt: skip


def test_the_conversation_ids_are_the_processors(folder, monkeypatch):
    from transformers import AutoTokenizer, Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    from entrain.data.processing import IGNORE_INDEX, format_chat
    from entrain.data.tokenizer import load_tokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # the stand-in is not a video processor class (those need torchvision): skip that type check only
    monkeypatch.setattr(Qwen3VLProcessor, "check_argument_for_proper_class", lambda *a: None)
    proc = Qwen3VLProcessor(Qwen2VLImageProcessorPil(), tok, _StubVideoProcessor())
    frames = _frames(len(INDICES))
    chat = "<|vision_start|><|video_pad|><|vision_end|>"
    messages = [
        {"role": "user", "content": f"{chat}\nWhat happens?"},
        {"role": "assistant", "content": "A cat jumps."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    meta = VideoMetadata(total_num_frames=25, fps=FPS, frames_indices=INDICES)
    want = proc(text=[text], videos=[frames], video_metadata=[meta], do_sample_frames=False)
    grid = video_grid(len(frames), 64, 96, VideoSettings.from_config(SETTINGS))
    assert [list(grid)] == want["video_grid_thw"].tolist() == [[3, 4, 6]]

    turns = expand_videos([("user", "<video>\nWhat happens?"), ("assistant", "A cat jumps.")],
                          [video_text(grid, INDICES, FPS)])  # fmt: skip
    assert [f"<{s} seconds>" in turns[0][1] for s in ("0.2", "1.2", "2.0")] == [
        True
    ] * 3  # (0+6)/24, (24+24)/24
    ids, labels = format_chat(turns, [], load_tokenizer(str(folder)))
    assert ids == list(want["input_ids"][0])
    video_id = tok.convert_tokens_to_ids("<|video_pad|>")
    videos = [i for i, x in enumerate(ids) if x == video_id]
    assert len(videos) == 3 * 4 * 6 // 4 and all(labels[i] == IGNORE_INDEX for i in videos)
    assert [i for i, t in enumerate(want["mm_token_type_ids"][0]) if t == 2] == videos


@pytest.mark.parametrize(
    ("frames", "height", "width"),
    [(5, 64, 96), (4, 40, 300), (16, 720, 1280), (2, 20, 20), (8, 333, 517), (30, 1000, 700)],
)
def test_the_grid_is_the_video_processors_smart_resize(frames, height, width):
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    s = VideoSettings.from_config(SETTINGS)
    h, w = smart_resize(
        frames, height, width, temporal_factor=2, factor=32, min_pixels=4096, max_pixels=1048576
    )
    assert video_grid(frames, height, width, s) == (-(-frames // 2), h // 16, w // 16)


def test_the_pixel_rows_are_the_video_processors_patchify():
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    frames = _frames(5)
    pixels, grid = process_video(list(frames), VideoSettings.from_config(SETTINGS))
    video = (torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5
    want, t, h, w = Qwen3VLVideoProcessor.patchify(None, video[None], 16, 2, 2)
    assert grid == (t, h, w) == (3, 4, 6)
    assert torch.allclose(torch.from_numpy(pixels), want[0], atol=1e-6)


def test_packed_positions_with_images_and_videos_are_get_rope_index_per_sample(hf_config):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    from entrain.models.families.base import PackedSample
    from entrain.models.families.qwen3_vl.positions import _owner, mrope_position_ids

    image, video = hf_config.image_token_id, hf_config.video_token_id
    start, end = hf_config.vision_start_token_id, hf_config.vision_end_token_id

    def sample(layout):
        """ints: text tokens; ("i", grid) an image; ("v", grid) a video, one frame per temporal patch
        after a 3-token timestamp."""
        ids, types, items = [], [], []
        for part in layout:
            if isinstance(part, int):
                ids += [7] * part
                types += [0] * part
                continue
            kind, (t, h, w) = part
            items.append((len(ids), (t, h, w)))
            for _ in range(t if kind == "v" else 1):
                n = h * w // 4 * (1 if kind == "v" else t)
                stamp = [9, 9, 9] if kind == "v" else []
                ids += [*stamp, start, *[video if kind == "v" else image] * n, end]
                types += [0] * (len(stamp) + 1) + [2 if kind == "v" else 1] * n + [0]
        ids, types = torch.tensor(ids), torch.tensor(types)
        grids = tuple(g for _, g in items)
        return PackedSample(ids, torch.nonzero(types > 0).flatten(), grids), types, layout

    samples = [
        sample([4, ("i", (1, 4, 6)), 3, ("v", (3, 4, 4)), 5]),
        sample([2, ("v", (2, 2, 6)), 2, ("i", (1, 2, 2)), 6]),
        sample([8]),
    ]
    got = mrope_position_ids(hf_config, [s for s, _, _ in samples])
    want = []
    for s, types, layout in samples:
        items = [p for p in layout if not isinstance(p, int)]
        grids = [g for kind, g in items if kind == "i"]
        videos = [g for kind, g in items if kind == "v"]
        ids, _ = Qwen3VLModel.get_rope_index(
            _owner(hf_config), s.input_ids[None], mm_token_type_ids=types[None],
            image_grid_thw=torch.tensor(grids).reshape(-1, 3) if grids else None,
            video_grid_thw=torch.tensor(videos).reshape(-1, 3) if videos else None,
        )  # fmt: skip
        want.append(ids[:, 0])
    assert torch.equal(got, torch.cat(want, dim=1))
