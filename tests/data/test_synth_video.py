"""``data synth --dataset video`` writes each video sample as a real clip (T frames of the drawn size
at 2 fps, H.264 MP4) with one ``<video>`` in its question: ``data check`` passes it, the metadata pass
reads T/2 temporal patches of the drawn frame size, as many LLM tokens as the generator's T/2 stills
(frames within the video pixel limits; fewer above them), and the text tokens the generator drew."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("skimage")

from entrain.cli.main import main  # noqa: E402
from entrain.data.generators import generate_samples  # noqa: E402
from entrain.data.llava import read_metadata  # noqa: E402
from entrain.data.video import probe_video  # noqa: E402

SAMPLES = 3


def test_video_synth_writes_real_clips(tmp_path, capsys):
    out = tmp_path / "video"
    assert main(["data", "synth", "--dataset", "video", "--num-samples", str(SAMPLES), "--out", str(out),
                 "--seed", "5"]) == 0  # fmt: skip
    assert f"{SAMPLES} videos in" in capsys.readouterr().out
    drawn = generate_samples("video", SAMPLES, 5)
    records = json.loads((out / "data.json").read_text())
    metas = read_metadata(out / "data.json", use_cache=False)
    for record, meta, target in zip(records, metas, drawn):
        assert "image" not in record and record["conversations"][0]["value"].startswith("<video>\n")
        info = probe_video(out / record["video"])
        assert (info.frames, info.fps, (info.height, info.width)) == (
            2 * len(target.images),
            2.0,
            target.images[0],
        )
        ((t, h, w),) = meta.video
        assert t == len(target.images) and meta.images == ()
        per_patch = target.image_tokens // t
        if per_patch <= 768:  # within the video processor's per-frame limit: the stills' tokens
            assert meta.video_tokens == target.image_tokens
        else:  # a frame above it: the video processor scales it down
            assert meta.video_tokens < target.image_tokens and h * w // 4 <= 768
        assert meta.text_tokens == target.text_tokens
    assert main(["data", "check", str(out / "data.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bad"] == 0


def test_omni_synth_writes_videos_with_their_audio_track(tmp_path, capsys):
    """``data synth --dataset omni``: a video-with-audio sample (T stills of one size and its track's
    clip) is a real MOV of 2T frames at 2 fps with a 16-kHz PCM track of exactly the drawn mel frames,
    its record ``"use_audio_in_video": true``; ``data check`` passes it and the metadata pass reads its
    grid, its track's mel frames (the drawn clip) and the drawn text tokens."""
    from entrain.data.video import track_frames

    out = tmp_path / "omni"
    argv = ["data", "synth", "--dataset", "omni", "--num-samples", "4", "--out", str(out), "--seed", "24"]
    assert main(argv) == 0
    assert "1 videos in" in capsys.readouterr().out
    drawn = generate_samples("omni", 4, 24)
    records = json.loads((out / "data.json").read_text())
    metas = read_metadata(out / "data.json", use_cache=False)
    (k,) = [i for i, d in enumerate(drawn) if len(d.images) >= 2]
    record, meta, target = records[k], metas[k], drawn[k]
    assert record["video"].endswith(".mov") and record["use_audio_in_video"] is True
    assert "audio" not in record and record["conversations"][0]["value"].startswith("<video>\n")
    info = probe_video(out / record["video"])
    assert (info.frames, info.fps, (info.height, info.width), info.has_audio) == (
        2 * len(target.images), 2.0, target.images[0], True,
    )  # fmt: skip
    assert track_frames(str(out / record["video"])) == target.audio[0] == 100 * len(target.images)
    ((t, _, _),) = meta.video
    assert t == len(target.images) and meta.images == () and meta.audio == target.audio
    assert meta.video_tokens == target.image_tokens and meta.text_tokens == target.text_tokens
    assert [m.audio for m in metas] == [d.audio for d in drawn]
    assert main(["data", "check", str(out / "data.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bad"] == 0
