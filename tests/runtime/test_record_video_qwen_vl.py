"""LLaVA records with video files on whole Qwen2-VL and Qwen2.5-VL checkpoints (the ``qwen2_vl`` family):
each ``<video>`` becomes ``<|vision_start|>`` + its ``t*h*w/4`` ``<|video_pad|>`` + ``<|vision_end|>``
(the processor's expansion), the video's patch rows ride among the image's in placeholder order, and
its seconds per temporal patch are Qwen2.5-VL's processor's ``temporal_patch_size / sampled fps`` (a
25-fps video whose 4 of 10 frames are kept: 0.2 s). A 2-rank 1F1B step equals transformers' own
``...ForConditionalGeneration`` in fp64 fed ``pixel_values_videos``, ``video_grid_thw``,
``second_per_grid_ts`` and ``mm_token_type_ids`` (2 for video tokens), which computes the M-RoPE ids
itself: loss, gradient norm and every gradient before and after clipping."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from entrain.core.costs.presets import build_cost_model
from entrain.data.llava import read_metadata
from entrain.models.families.base import ModelSource
from entrain.models.families.registry import family_of_source
from entrain.runtime.data import SampleRenderer
from tests.data.video_files import write_video
from tests.models.qwen_vl_tiny import save_whole

from .families import (
    SEED,
    RecordModel,
    assert_ranks_match,
    image_and_video_inputs,
    train_step,
    transformers_step,
)

MAX_GRAD_NORM = 1.0


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_qwen_vl")
    write_video(root / "a.mp4", frames=8, fps=4, size=(308, 336))
    write_video(root / "b.mp4", frames=10, fps=25, size=(280, 364), seed=1)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 84, 3), dtype=np.uint8)).save(
        root / "p.png"
    )
    data = [
        {"id": "r0", "image": "p.png", "video": "a.mp4", "conversations": [
            {"from": "human", "value": "<image> and <video>\nWhat moves?"}, {"from": "gpt", "value": "A bar."}]},
        {"id": "r1", "video": ["b.mp4"], "conversations": [
            {"from": "human", "value": "<video>\nHow fast?"}, {"from": "gpt", "value": "Quick, a short clip."}]},
    ]  # fmt: skip
    path = root / "d.json"
    path.write_text(json.dumps(data))
    return root, path


def _model(records, family_name: str) -> RecordModel:
    root, path = records
    folder = save_whole(root / family_name, family_name, text_layers=2, vision_depth=2)
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    metas = read_metadata(path, vision=family.image_rule(cfg.shape, None, None), use_cache=False)
    fm = RecordModel(
        family_name, family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), {m.id: m for m in metas}
    )
    fm.path = str(path)
    return fm


def oracle(fm: RecordModel):
    hf = fm.build(torch.float64).to(torch.float64)
    hf = getattr(hf, "hf", hf)
    renderer = fm.renderer(torch.float64)

    def inputs(sid: str, s) -> dict:  # every sample here holds a video
        types = torch.zeros(1, s.num_tokens, dtype=torch.int32)
        types[0, s.image_positions] = 1
        types[0, s.input_ids == fm.cfg.hf.video_token_id] = 2
        kw = {"mm_token_type_ids": types, **image_and_video_inputs(renderer, sid)}
        if fm.cfg.hf.model_type == "qwen2_5_vl":
            kw["second_per_grid_ts"] = torch.tensor(s.second_per_grids)
        hf.model.rope_deltas = None
        return kw

    return transformers_step(hf, renderer, sorted(fm.metas), inputs, max_grad_norm=MAX_GRAD_NORM)


@pytest.mark.parametrize("family_name", ["qwen2_vl", "qwen2_5_vl"])
def test_video_records_train_as_transformers(records, tmp_path, family_name):
    from .harness import run_workers

    fm = _model(records, family_name)
    renderer = fm.renderer()
    r0, r1 = renderer.sample("r0"), renderer.sample("r1")
    assert r0.video_items == (1,) and r1.video_items == (0,)  # the image's placeholder comes first in r0
    assert r1.second_per_grids == pytest.approx((0.2,)) and r0.second_per_grids == pytest.approx((1.0,))
    video = fm.cfg.hf.video_token_id
    assert int((r1.input_ids == video).sum()) == fm.metas["r1"].video_tokens == 2 * 20 * 26 // 4
    plan = fm.plan("1f1b", 1, 1, 1, 2)
    results = run_workers(train_step, 2, tmp_path, fm, plan, False, MAX_GRAD_NORM)
    rest, _, _ = assert_ranks_match(family_name, results, oracle(fm), tol=1e-5)
    assert any(".blocks." in n for n in rest.grads), sorted(rest.grads)[:5]


def test_seeded_samples_with_video_render(records):
    """A workload's sample with a video grid (no record) renders its video tokens after its images,
    their rows among the seeded patches, its text filling the rest: the planner's LLM tokens."""
    from entrain.core.workload.samples import SampleMeta

    fm = _model(records, "qwen2_5_vl")
    meta = SampleMeta("s", ((56, 84),), 40, fm.metas["r0"].vision, video=((2, 20, 26),))
    renderer = SampleRenderer(fm.cfg, {"s": meta}, seed=SEED)
    s = renderer.sample("s")
    assert s.num_tokens == meta.llm_tokens and s.video_items == (1,) and s.grid_thw[1] == (2, 20, 26)
    assert int((s.input_ids == fm.cfg.hf.video_token_id).sum()) == meta.video_tokens == 260
    assert renderer.patches("s").shape[0] == sum(t * h * w for t, h, w in s.grid_thw)
    assert renderer.llm_batch(["s"], 1.0).position_ids.shape == (3, s.num_tokens)


def test_entrain_train_takes_the_checkpoints_video_processor(records, tmp_path):
    """A Qwen2.5-VL folder whose ``preprocessor_config.json`` bounds frames to fewer pixels (transformers'
    video processor reads that file where the folder has no video processor config): ``entrain train``'s
    screening counts the videos' grids under it, the renderer processes them under it, and the
    2-rank run's step-0 loss is transformers' on those inputs."""
    from entrain.data.check import screen_dataset
    from entrain.data.video import VideoSettings, file_grid

    from .cli_ranks import run_ranks

    root, path = records
    folder = save_whole(tmp_path / "ckpt", "qwen2_5_vl", text_layers=2, vision_depth=2)
    config = {"min_pixels": 3136, "max_pixels": 64 * 28 * 28, "patch_size": 14, "temporal_patch_size": 2,
              "merge_size": 2}  # fmt: skip
    (folder / "preprocessor_config.json").write_text(json.dumps(config))
    family = family_of_source(ModelSource(model_path=str(folder)))
    settings = family.video_settings_for(str(folder))
    assert (settings.min_pixels, settings.max_pixels) == (3136, 64 * 28 * 28)
    small = file_grid(root / "a.mp4", settings)[0]
    assert small != file_grid(root / "a.mp4", VideoSettings())[0] and small[1] * small[2] // 4 <= 64
    out = tmp_path / "run"
    argv = ["train", "--model-path", str(folder), "--dataset", str(path), "--hardware", "cpu-tiny",
            "--global-batch", "2", "--microbatch-size", "1", "--steps", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    metas = screen_dataset(path, vision=family.image_rule(cfg.shape, None, None), video=settings).samples
    assert metas[0].video == (small,)
    fm = RecordModel("qwen2_5_vl", family, cfg, None, {m.id: m for m in metas})
    fm.path = str(path)
    assert rows[0]["loss"] == pytest.approx(oracle(fm).loss, rel=1e-5)


@pytest.fixture(scope="module")
def qwen3_records(tmp_path_factory):
    """Videos at sizes Qwen3-VL's processor keeps (multiples of 32, frames x H x W within its limits):
    8 frames at 4 fps (4 kept: 0, 2, 5, 7) and 7 at 2 fps (all 7 kept: 4 temporal patches, the last
    frame repeated)."""
    root = tmp_path_factory.mktemp("video_qwen3_vl")
    write_video(root / "a.mp4", frames=8, fps=4, size=(224, 192))
    write_video(root / "b.mp4", frames=7, fps=2, size=(256, 160), seed=1)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(
        root / "p.png"
    )
    data = [
        {"id": "r0", "image": "p.png", "video": "a.mp4", "conversations": [
            {"from": "human", "value": "<video> then <image>\nWhat moves?"}, {"from": "gpt", "value": "A bar."}]},
        {"id": "r1", "video": "b.mp4", "conversations": [
            {"from": "human", "value": "<video>\nHow long?"}, {"from": "gpt", "value": "About three seconds."}]},
    ]  # fmt: skip
    path = root / "d.json"
    path.write_text(json.dumps(data))
    return root, path


def test_qwen3_vl_video_records_train_as_transformers(qwen3_records, tmp_path):
    """A Qwen3-VL checkpoint: the metadata (train's screening, under the checkpoint's video processor)
    counts every token the rendered text holds; each video's frames, grid and pixel rows are
    transformers' ``Qwen3VLVideoProcessor``'s (tests/data/hf_video_processor.py); its text is a
    timestamp and ``<|vision_start|>`` + video tokens + ``<|vision_end|>`` per temporal patch
    (``qwen3_vl.processing.video_text``, checked against ``Qwen3VLProcessor`` in
    tests/data/test_qwen3_vl_video.py) at the processor's kept frames; a 2-rank step equals
    transformers' fp64 ``Qwen3VLForConditionalGeneration`` (its own M-RoPE ids)."""
    import subprocess
    import sys
    from pathlib import Path

    from entrain.data.check import screen_dataset
    from entrain.models.families.qwen3_vl.processing import frame_timestamps
    from tests.models.qwen3_vl_tiny import save_whole as save_qwen3

    from .harness import run_workers

    root, path = qwen3_records
    folder = save_qwen3(tmp_path / "ckpt", text_layers=3, vision_depth=4)
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    settings = family.video_settings_for(str(folder))
    metas = screen_dataset(path, vision=family.image_rule(cfg.shape, None, None), video=settings).samples
    fm = RecordModel(
        "qwen3_vl", family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), {m.id: m for m in metas}
    )
    fm.path = str(path)
    out = tmp_path / "hf.npz"
    script = Path(__file__).parents[1] / "data" / "hf_video_processor.py"
    done = subprocess.run([sys.executable, str(script), str(out), "--qwen3", str(root / "a.mp4"), str(root / "b.mp4")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    hf = np.load(out)
    renderer = fm.renderer()
    video = cfg.hf.video_token_id
    for i, sid in enumerate(("r0", "r1")):
        s = renderer.sample(sid)
        assert s.num_tokens == fm.metas[sid].llm_tokens, sid  # the metadata counted the timestamps
        (v,) = s.video_items
        grid = tuple(int(x) for x in hf[f"grid{i}"][0])
        assert s.grid_thw[v] == grid == fm.metas[sid].video[0]
        parts = torch.split(renderer.patches(sid), [t * h * w for t, h, w in s.grid_thw])
        np.testing.assert_array_equal(parts[v].numpy(), hf[f"pixels{i}"])
        fps = (4.0, 2.0)[i]
        stamps = frame_timestamps(hf[f"indices{i}"].tolist(), fps)
        runs = (s.input_ids == video).int().diff().eq(1).sum()
        assert len(stamps) == grid[0] == int(runs)  # one run of video tokens per temporal patch
    assert renderer.sample("r0").video_items == (0,) and renderer.sample("r1").grid_thw[0][0] == 4
    plan = fm.plan("1f1b", 1, 1, 1, 2)
    results = run_workers(train_step, 2, tmp_path, fm, plan, False, MAX_GRAD_NORM)
    rest, _, _ = assert_ranks_match("qwen3_vl", results, oracle(fm), tol=1e-5)
    assert any(".blocks." in n for n in rest.grads)
