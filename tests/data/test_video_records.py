"""Videos of LLaVA records (``entrain.data.video``), on small real .mp4 files written with PyAV:

* frame sampling, grid and pixel rows equal transformers' ``Qwen2VLVideoProcessor`` (its
  ``sample_frames`` at 2 fps over frames read by its own PyAV ``load_video``, then the processor) on
  videos of different lengths and frame rates (tests/data/hf_video_processor.py, a child process);
* a video with its audio track becomes the tokens ``Qwen2_5OmniProcessor.replace_video_with_audio_token``
  writes (video and audio interleaved per chunk), for any grid, track length and seconds per patch;
* ``data check`` names every bad video of a record (missing, truncated, no frames, undecodable, a
  track asked of a silent video, a track cut short or corrupt: an error where the record feeds it, a
  warning where not) with file, record and field, and passes good ones;
* the metadata pass gives each video's grid and ``data stats`` reports ``video_tokens`` (JSON, checked
  against its schema, and a table row), which a dataset without video lacks in its table."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrain.cli.data import format_stats
from entrain.cli.main import main
from entrain.data.check import check_dataset
from entrain.data.llava import read_metadata
from entrain.data.video import file_grid, load_video, probe_video, sample_indices
from entrain.data.video_records import video_text

from .video_files import write_bad_track, write_frameless, write_truncated, write_video

VIDEOS = {  # name: (frames, fps, (H, W)): sizes the processor keeps (multiples of 28 within its limits)
    "a.mp4": (8, 4, (308, 336)),  # 4 frames kept
    "b.mp4": (10, 25, (336, 308)),  # 0.4 s: min_frames 4 of 10, at 0, 2, 5, 7
    "c.mp4": (13, 6, (280, 364)),  # 13 / 6 * 2 = 4.3 -> 4
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    for i, (name, (frames, fps, size)) in enumerate(VIDEOS.items()):
        write_video(root / name, frames=frames, fps=fps, size=size, seed=i)
    return root


def test_sampling_grid_and_pixels_match_transformers(videos):
    out = videos / "hf.npz"
    script = Path(__file__).parent / "hf_video_processor.py"
    names = list(VIDEOS)
    done = subprocess.run([sys.executable, str(script), str(out), *[str(videos / n) for n in names]],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    hf = np.load(out)
    for i, name in enumerate(names):
        info = probe_video(videos / name)
        assert (info.frames, info.fps) == VIDEOS[name][:2]
        assert sample_indices(info.frames, info.fps) == hf[f"indices{i}"].tolist(), name
        pixels, grid = load_video(videos / name)
        assert grid == tuple(hf[f"grid{i}"][0]) == file_grid(videos / name)[0], name
        np.testing.assert_array_equal(pixels, hf[f"pixels{i}"])
    assert hf["indices1"].tolist() == [0, 2, 5, 7]


def _omni_processor():
    from types import SimpleNamespace

    from transformers import Qwen2_5OmniProcessor

    proc = object.__new__(Qwen2_5OmniProcessor)
    proc.video_processor = SimpleNamespace(merge_size=2, temporal_patch_size=2)
    proc.video_token, proc.audio_token = "<|VIDEO|>", "<|AUDIO|>"
    proc.audio_bos_token, proc.audio_eos_token = "<|audio_bos|>", "<|audio_eos|>"
    return proc


class _OmniNames:
    special_tokens = {"<|VIDEO|>": 0, "<|AUDIO|>": 1}


@settings(deadline=None, max_examples=40)
@given(
    st.integers(1, 12), st.integers(1, 4), st.integers(1, 4), st.integers(0, 400),
    st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([(25, 2.0), (25, 1.0), (10, 2.0)]),
)  # fmt: skip
def test_a_video_with_its_track_interleaves_as_the_processor(t, h, w, audio, spg, chunking):
    import torch

    grid = (t, 2 * h, 2 * w)
    per_second, seconds = chunking
    want = _omni_processor().replace_video_with_audio_token(
        {"video_grid_thw": torch.tensor([grid]), "video_second_per_grid": [spg]}, 0, {"num_audio_tokens": [audio]},
        0, position_id_per_seconds=per_second, seconds_per_chunk=seconds,
    )  # fmt: skip
    got = video_text(_OmniNames(), grid, audio_tokens=audio, second_per_grid=spg,
                     position_id_per_seconds=per_second, seconds_per_chunk=seconds)  # fmt: skip
    assert got == "<|vision_bos|>" + want + "<|vision_eos|>"


def _record(rid: str, videos, question: str | None = None, **extra) -> dict:
    n = len(videos) if isinstance(videos, list) else 1
    ask = question or "<video>" * n + "\nWhat happens?"
    return {"id": rid, "video": videos, **extra,
            "conversations": [{"from": "human", "value": ask}, {"from": "gpt", "value": "A bar moves."}]}  # fmt: skip


def test_data_check_names_every_bad_video(videos, tmp_path, capsys):
    for name in VIDEOS:
        (tmp_path / name).write_bytes((videos / name).read_bytes())
    write_truncated(tmp_path / "cut.mp4")
    write_frameless(tmp_path / "empty.avi")
    (tmp_path / "noise.mp4").write_bytes(
        np.random.default_rng(0).integers(0, 255, 4000, dtype=np.uint8).tobytes()
    )
    records = [
        _record("good", ["a.mp4", "b.mp4"]),
        _record("bad", ["a.mp4", "gone.mp4", "cut.mp4", "empty.avi", "noise.mp4"]),
        _record("silent", "c.mp4", use_audio_in_video=True),
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(records))
    report = check_dataset(path)
    assert (report.records, report.bad) == (3, 2)
    found = {(f.id, f.field): f.reason for f in report.errors}
    assert found[("bad", "video[1]")] == "gone.mp4: missing"
    assert found[("bad", "video[2]")].startswith("cut.mp4: truncated")
    assert found[("bad", "video[3]")].startswith("empty.avi: no frames")
    assert found[("bad", "video[4]")].startswith("noise.mp4: undecodable")
    assert found[("silent", "video")].startswith("c.mp4: no audio track")
    assert set(found) == {("bad", f"video[{i}]") for i in range(1, 5)} | {("silent", "video")}
    assert main(["data", "check", str(path)]) == 1
    out = capsys.readouterr().out
    for i, name in enumerate(["gone.mp4", "cut.mp4", "empty.avi", "noise.mp4"], start=1):
        line = next(x for x in out.splitlines() if f"video[{i}]" in x)
        assert str(path) in line and "id 'bad'" in line and name in line


def test_data_check_names_a_videos_cut_or_corrupt_audio_track(tmp_path, capsys):
    """``data check`` decodes each video's audio track in the pass that decodes its frames: a track cut
    short (FFmpeg decodes what is left without an error) or corrupt is an error naming the file, the
    record and the field where the record feeds it (``use_audio_in_video``), a warning where it does
    not; a record whose video and track are whole passes."""
    write_bad_track(tmp_path / "cut.mp4", "cut")
    write_bad_track(tmp_path / "corrupt.mp4", "corrupt")
    write_video(tmp_path / "good.mp4", audio_seconds=1.0)
    records = [_record("cut", "cut.mp4", use_audio_in_video=True),
               _record("corrupt", ["good.mp4", "corrupt.mp4"], use_audio_in_video=True),
               _record("unused", "cut.mp4"), _record("good", "good.mp4", use_audio_in_video=True)]  # fmt: skip
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["data", "check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    found = [x for x in out if x.endswith(("[error]", "[warning]"))]
    assert len(found) == 3, out
    cut, corrupt, unused = found
    assert cut.startswith(f"{path}:1: record 0 id 'cut': video: cut.mp4: truncated audio track (")
    assert cut.endswith(" s its stream declares) [error]")
    assert corrupt.startswith(f"{path}:2: record 1 id 'corrupt': video[1]: corrupt.mp4: bad audio track (")
    assert corrupt.endswith("[error]")
    assert unused.startswith(
        f"{path}:3: record 2 id 'unused': video[0]: {tmp_path / 'cut.mp4'}: truncated audio track"
    )
    assert unused.endswith(
        "the record does not use its audio track (no use_audio_in_video), so it trains without it [warning]"
    )
    assert out[-2].startswith("4 record(s): 2 bad")


def test_metadata_and_stats_count_the_videos(videos, capsys):
    path = videos / "d.json"
    path.write_text(json.dumps([_record("v0", "a.mp4"), _record("v1", ["b.mp4", "c.mp4"])]))
    metas = {m.id: m for m in read_metadata(path, use_cache=False)}
    assert metas["v0"].video == (file_grid(videos / "a.mp4")[0],)
    assert metas["v1"].video == tuple(file_grid(videos / n)[0] for n in ("b.mp4", "c.mp4"))
    tokens = [metas[i].video_tokens for i in ("v0", "v1")]
    assert tokens[0] == 2 * 11 * 12 and tokens[1] == 2 * 12 * 11 + 2 * 10 * 13
    assert main(["data", "check", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bad"] == 0
    assert main(["data", "stats", "--dataset", str(path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    schema = json.loads(resources.files("entrain").joinpath("schemas/data_stats.json").read_text())
    jsonschema.validate(stats, schema)
    assert stats["video_tokens"]["mean"] == sum(tokens) / 2 and stats["image_tokens"]["mean"] == 0
    assert "video_tokens" in format_stats(stats, "t")
    plain = {**stats, "video_tokens": {"mean": 0.0, "p5": 0.0, "p50": 0.0, "p95": 0.0}}
    assert "video_tokens" not in format_stats(plain, "t")


def test_a_workload_video_reaches_the_planner(tmp_path, capsys):
    """A workload JSONL's ``"video"`` (patch grids) is read as ``SampleMeta.video`` (never the streamed
    table, which has no video column), priced by the cost model as its rows and tokens, and reported by
    ``data stats``; a malformed grid is named with file, line and field."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.core.errors import DataError
    from entrain.data.workload_io import read_samples
    from entrain.data.workload_table import read_workload_table

    path = tmp_path / "w.jsonl"
    rows = [{"id": "v", "images": [], "text_tokens": 30, "video": [[4, 16, 20]]},
            {"id": "i", "images": [[224, 280]], "text_tokens": 30}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metas = read_workload_table(str(path))
    assert isinstance(metas, list) and metas[0].video == ((4, 16, 20),) and metas[1].video == ()
    assert [m.video for m in read_samples(str(path))] == [((4, 16, 20),), ()]
    cost = build_cost_model("tiny", "cpu-tiny")
    video, image = (cost.sample_work(m) for m in metas)
    assert video.llm > image.llm and video.encoder > 3 * image.encoder  # 4 frames of the image's rows
    assert main(["data", "stats", "--dataset", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["video_tokens"]["mean"] == 4 * 16 * 20 / 4 / 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "b", "images": [], "text_tokens": 3, "video": [[4, 16]]}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1.*'video'"):
        read_samples(str(bad))


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_resized_frames_match_the_processor_with_torchvision(tmp_path, kind):
    """Frames the processor resizes (48 x 64, far below the pixel limits): the rows equal transformers'
    processor with the real torchvision, which this environment lacks (skipped here; the other tests
    use frames the processor keeps as they are)."""
    pytest.importorskip("torchvision")
    from entrain.data.video import QWEN3_SETTINGS, VideoSettings

    write_video(tmp_path / "small.mp4", frames=9, fps=3, size=(48, 64))
    out = tmp_path / "hf.npz"
    script = Path(__file__).parent / "hf_video_processor.py"
    done = subprocess.run([sys.executable, str(script), str(out), f"--{kind}", str(tmp_path / "small.mp4")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    hf = np.load(out)
    pixels, grid = load_video(tmp_path / "small.mp4", QWEN3_SETTINGS if kind == "qwen3" else VideoSettings())
    assert grid == tuple(hf["grid0"][0])
    np.testing.assert_allclose(pixels, hf["pixels0"], rtol=0, atol=1e-5)
