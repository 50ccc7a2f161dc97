"""LLaVA records with video files: ``"video": [...]`` and ``<video>`` placeholders (with
``"use_audio_in_video": true``, each video's audio track too) reach a family that reads video (a tiny
Qwen2.5-Omni thinker) as transformers' processor makes them:

* the metadata pass counts each video's patch grid (frames sampled at 2 fps, ``smart_resize``) and
  its track's mel frames among the clips (in token order);
* each ``<video>`` becomes ``<|vision_bos|>`` + the processor's own replacement of its ``<|VIDEO|>``
  (``Qwen2_5OmniProcessor.replace_video_token``, or ``replace_video_with_audio_token``: video and
  audio tokens interleaved per 2-s chunk) + ``<|vision_eos|>``;
* the encoder input holds transformers' ``Qwen2VLVideoProcessor``'s pixel rows and grids of the
  videos (tests/data/hf_video_processor.py, in a child process), between the image's, in placeholder
  order, and the processor's log-mel features of the clip and the track in token order;
* a 2-rank 1F1B step equals transformers' fp64 thinker fed those inputs (``pixel_values_videos``,
  ``video_grid_thw``, ``video_second_per_grid``, ``use_audio_in_video``): loss, gradient norm and every
  gradient before and after clipping; and ``entrain train --model-path`` on the records reports
  that loss.

A family that reads no video refuses the record, naming file, record and field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import wavfile

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import DataError
from entrain.data.llava import read_metadata
from entrain.models.families.base import ModelSource
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.registry import family_of_source
from entrain.runtime.data import SampleRenderer
from entrain.runtime.record_source import RecordSource
from tests.data.video_files import write_video
from tests.models.qwen2_5_omni_tiny import AUDIO, MEL, VEND, VIDEO, VSTART, save_whole

from .families import RecordModel, assert_ranks_match, image_and_video_inputs, train_step, transformers_step

FRAME = (308, 336)
"""Frames at a size the video processor keeps (multiples of 28 within its pixel limits), so its
resize is the identity and the torchvision stand-in serves (tests/data/hf_video_processor.py)."""


def _records(root: Path) -> Path:
    rng = np.random.default_rng(0)
    write_video(root / "a.mp4", frames=8, fps=4, size=FRAME)  # 4 frames sampled: 2 temporal patches
    write_video(root / "b.mp4", frames=16, fps=4, size=FRAME, audio_seconds=4.0, seed=1)  # 2 chunks
    wave = 0.3 * np.sin(np.arange(8000) * 0.07) + 0.05 * rng.normal(size=8000)
    wavfile.write(root / "t.wav", 16_000, (wave * 32767).astype(np.int16))
    Image.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)).save(root / "p.png")
    records = [
        {"id": "r0", "image": "p.png", "video": "a.mp4", "conversations": [
            {"from": "human", "value": "<video>\nWhat moves across <image>?"},
            {"from": "gpt", "value": "A green bar."}]},
        {"id": "r1", "audio": "t.wav", "video": ["b.mp4"], "use_audio_in_video": True, "conversations": [
            {"from": "human", "value": "<audio> and then <video>\nWhat do you hear and see?"},
            {"from": "gpt", "value": "A tone, then a bar with a lower tone."}]},
    ]  # fmt: skip
    path = root / "d.json"
    path.write_text(json.dumps(records))
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("record_video")
    path = _records(root)
    folder = save_whole(root / "tiny", text_layers=2, vision_depth=2, audio_layers=1)
    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    metas = read_metadata(path, vision=family.image_rule(cfg.shape, None, None), use_cache=False)
    return root, path, cfg, {m.id: m for m in metas}


def _hf_videos(root: Path, names: list[str]) -> dict:
    """transformers' video processor's output per video (a child process: its torchvision stand-in
    stays out of this one)."""
    out = root / "hf_videos.npz"
    script = Path(__file__).parents[1] / "data" / "hf_video_processor.py"
    done = subprocess.run([sys.executable, str(script), str(out), *[str(root / n) for n in names]],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data = np.load(out)
    return {n: (data[f"pixels{i}"], tuple(int(x) for x in data[f"grid{i}"][0])) for i, n in enumerate(names)}


def _omni_processor():
    """A ``Qwen2_5OmniProcessor`` holding only what its video and audio token replacement and its audio
    path read (a whole one also wants a video processor, which needs torchvision)."""
    from types import SimpleNamespace

    from transformers import Qwen2_5OmniProcessor, WhisperFeatureExtractor

    proc = object.__new__(Qwen2_5OmniProcessor)
    proc.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    proc.feature_extractor = WhisperFeatureExtractor(feature_size=MEL)
    proc.video_token, proc.audio_token = "<|VIDEO|>", "<|AUDIO|>"
    proc.audio_bos_token, proc.audio_eos_token = "<|audio_bos|>", "<|audio_eos|>"
    return proc


def _runs(ids: list[int], start: int, end: int) -> list[list[int]]:
    """The tokens between each ``start`` and the next ``end``."""
    out, begin = [], None
    for i, t in enumerate(ids):
        if t == start:
            begin = i
        elif t == end and begin is not None:
            out.append(ids[begin + 1 : i])
            begin = None
    return out


def test_record_video_renders_as_the_processor(dataset):
    from entrain.core.workload.samples import audio_llm_tokens
    from entrain.data.audio import load_clip
    from entrain.data.video import audio_track
    from tests.models.qwen2_5_omni_tiny import AEND, ASTART, IMAGE

    root, path, cfg, metas = dataset
    hf = _hf_videos(root, ["a.mp4", "b.mp4"])
    track = audio_track(root / "b.mp4")
    clips = [load_clip(root / "t.wav"), track]
    assert metas["r0"].video == (hf["a.mp4"][1],) and metas["r1"].video == (hf["b.mp4"][1],)
    assert metas["r1"].audio == (50, -(-len(track) // 160))  # the clip, then the track (token order)
    proc = _omni_processor()
    feats = proc.feature_extractor(clips, sampling_rate=16_000, return_attention_mask=True, padding="max_length",
                                   return_tensors="pt")  # fmt: skip
    audio_in = {"feature_attention_mask": feats["attention_mask"],
                "num_audio_tokens": [audio_llm_tokens(int(n)) for n in feats["attention_mask"].sum(1)]}  # fmt: skip
    renderer = SampleRenderer(cfg, metas, source=RecordSource(str(path)))
    kwargs = {"load_audio_from_video": True, "position_id_per_seconds": 25, "seconds_per_chunk": 2.0}
    for sid, name, with_audio in (("r0", "a.mp4", False), ("r1", "b.mp4", True)):
        s = renderer.sample(sid)
        ids = s.input_ids.tolist()
        grid = hf[name][1]
        videos = {"video_grid_thw": torch.tensor([grid]), "video_second_per_grid": [1.0]}
        want = proc.replace_video_token(videos, 0, audio_in, [1 if with_audio else None], **kwargs)
        names = {"<|VIDEO|>": VIDEO, "<|AUDIO|>": AUDIO, "<|audio_bos|>": ASTART, "<|audio_eos|>": AEND}
        want_ids = [names[t] for t in _split_tokens(want)]
        (run,) = [r for r in _runs(ids, VSTART, VEND) if VIDEO in r]
        assert run == want_ids, sid
        assert (ASTART in run) == with_audio and (run.count(AUDIO) > 0) == with_audio
        kinds = [k for k in run if k in (VIDEO, AUDIO)]
        if with_audio:  # two chunks: video, audio, video, audio
            assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == [VIDEO, AUDIO] * 2
        enc = renderer.encoder_input([sid])
        rows = [t * h * w for t, h, w in s.grid_thw]
        parts = torch.split(enc.patches, rows)
        (v,) = s.video_items
        np.testing.assert_array_equal(parts[v].numpy(), hf[name][0])
        assert tuple(enc.grid_thw[v].tolist()) == grid
        if sid == "r0":  # the video's placeholder comes before the image's
            assert v == 0 and s.grid_thw[1] == (1, 4, 6) and int((s.input_ids == IMAGE).sum()) == 6
    mel = renderer.encoder_input(["r1"]).audio
    mask = feats["attention_mask"]
    want_mel = torch.cat([f[:, : int(m.sum())].T for f, m in zip(feats["input_features"], mask)])
    assert mel["audio_lengths"].tolist() == mask.sum(1).tolist()
    torch.testing.assert_close(mel["audio_mel"], want_mel, rtol=1e-5, atol=1e-5)


def _split_tokens(text: str) -> list[str]:
    import re

    return re.findall(r"<\|[^|]+\|>", text)


def test_a_family_without_video_refuses_the_record(dataset):
    root, path, _, metas = dataset
    path = root / "video_only.json"
    path.write_text(json.dumps(json.loads((root / "d.json").read_text())[:1]))
    cfg = get_model_config("tiny")
    with pytest.raises(DataError) as e:  # when the run starts, not at the record's first step
        SampleRenderer(cfg, {"r0": metas["r0"]}, source=RecordSource(str(path)))
    msg = str(e.value)
    assert str(path) in msg and "'r0'" in msg and "video" in msg and "reads no video" in msg


def oracle(fm: RecordModel):
    """transformers' thinker in fp64, every sample alone with its images, videos (``pixel_values_videos``,
    ``video_grid_thw``, ``video_second_per_grid``) and audio (``use_audio_in_video`` where a video
    carries its track): ``loss = sum(token CE) / label tokens``."""
    from .test_qwen2_5_omni_train import MAX_GRAD_NORM, _audio_inputs

    model = fm.build(torch.float64).to(torch.float64)
    renderer = fm.renderer(torch.float64)

    def inputs(sid: str, s) -> dict:
        kw = {"attention_mask": torch.ones((1, s.num_tokens), dtype=torch.int64)}
        kw.update(image_and_video_inputs(renderer, sid))
        if s.video_items:
            kw["video_second_per_grid"] = torch.tensor(s.second_per_grids)
        if s.audio_frames:
            kw.update(_audio_inputs(renderer.audio_features(sid), s.audio_frames))
            kw["use_audio_in_video"] = bool(fm.path and renderer.source.records[sid].audio_in_video)
        model.model.rope_deltas = None
        return kw

    return transformers_step(model, renderer, sorted(fm.metas), inputs, max_grad_norm=MAX_GRAD_NORM)


def test_records_with_video_train_as_transformers(dataset, tmp_path):
    """A 2-rank 1F1B step on the records: loss, gradient norm and every gradient (the vision and audio
    towers' included) before and after clipping equal transformers' thinker (fp64)."""
    from .harness import run_workers

    _, path, cfg, metas = dataset
    fm = RecordModel("qwen2_5_omni", family_of_source(ModelSource(model_path=cfg.folder)), cfg,
                      build_cost_model(cfg.shape, "cpu-tiny"), metas)  # fmt: skip
    fm.path = str(path)
    plan = fm.plan("1f1b", 1, 1, 1, 2)
    results = run_workers(train_step, 2, tmp_path, fm, plan)
    rest, _, _ = assert_ranks_match("video records", results, oracle(fm), tol=1e-5)
    assert any(".visual.blocks." in n for n in rest.grads) and any(
        ".audio_tower.layers." in n for n in rest.grads
    )


def test_entrain_train_on_video_records(dataset, tmp_path):
    """``entrain train --model-path`` (2 forked ranks) on the records: step 0's loss is transformers'."""
    from entrain.models.families.base import ModelSource as Source

    from .cli_ranks import run_ranks

    _, path, cfg, metas = dataset
    out = tmp_path / "run"
    argv = ["train", "--model-path", cfg.folder, "--dataset", str(path), "--hardware", "cpu-tiny",
            "--global-batch", "2", "--microbatch-size", "1", "--steps", "1", "--out", str(out), "--no-progress"]  # fmt: skip
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    fm = RecordModel("qwen2_5_omni", family_of_source(Source(model_path=cfg.folder)), cfg, None, metas)
    fm.path = str(path)
    assert rows[0]["loss"] == pytest.approx(oracle(fm).loss, rel=1e-5)
