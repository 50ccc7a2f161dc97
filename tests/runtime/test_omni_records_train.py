"""``data synth --dataset omni`` writes a LLaVA dataset with real WAV clips (each exactly the generator's
mel frames), images and a video with its audio track, ``data check`` passes it, and a 2-rank forked
``entrain train --model-path`` of a tiny Qwen2.5-Omni thinker trains on it (the records' audio through the metadata pass, the chat's
``<audio>`` expansion and the clips' log-mel features)."""

from __future__ import annotations

import json

from entrain.cli.main import main
from entrain.data.generators import generate_samples
from entrain.data.llava import read_metadata
from tests.models.qwen2_5_omni_tiny import save_whole

from .cli_ranks import run_ranks

SAMPLES = 8


def test_omni_synth_checks_and_trains_on_two_ranks(tmp_path, capsys):
    data = tmp_path / "omni"
    assert (
        main(["data", "synth", "--dataset", "omni", "--num-samples", str(SAMPLES), "--out", str(data)]) == 0
    )
    assert "audio clips" in capsys.readouterr().out
    metas = read_metadata(data / "data.json", use_cache=False)
    drawn = generate_samples("omni", SAMPLES, 0)
    assert [m.audio for m in metas] == [d.audio for d in drawn] and all(m.audio for m in metas)
    # a video with its audio track: its T stills drawn are the T temporal patches read from the file
    assert [len(m.images) + sum(t for t, _, _ in m.video) for m in metas] == [len(d.images) for d in drawn]
    assert any(m.video for m in metas)
    assert main(["data", "check", str(data / "data.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bad"] == 0
    folder = save_whole(tmp_path / "tiny", text_layers=2, vision_depth=2, audio_layers=1)
    _renders_the_video_with_its_track(data / "data.json", folder, drawn)
    out = tmp_path / "run"
    argv = ["train", "--model-path", str(folder), "--dataset", str(data / "data.json"), "--hardware", "cpu-tiny",
            "--global-batch", str(SAMPLES), "--microbatch-size", "2", "--steps", "1", "--out", str(out),
            "--no-progress"]  # fmt: skip
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=60)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and rows[0]["loss"] > 0


def _renders_the_video_with_its_track(path, folder, drawn) -> None:
    """The record reader that trains video records (``RecordSource`` / ``SampleRenderer``, the tiny
    thinker's family) reads the synthesised video and its PCM track: the drawn temporal patches, the
    track as the sample's clip, and as many ``<|VIDEO|>`` / ``<|AUDIO|>`` tokens as the metadata counts."""
    from entrain.core.workload.samples import audio_llm_tokens
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_source
    from entrain.runtime.data import SampleRenderer
    from entrain.runtime.record_source import RecordSource
    from tests.models.qwen2_5_omni_tiny import AUDIO, VIDEO

    source = ModelSource(model_path=str(folder))
    family = family_of_source(source)
    cfg, _ = family.runtime_config(source)
    metas = {
        m.id: m for m in read_metadata(path, vision=family.image_rule(cfg.shape, None, None), use_cache=False)
    }
    renderer = SampleRenderer(cfg, metas, source=RecordSource(str(path)))
    videos = [d for d in drawn if len(d.images) >= 2]
    for target in videos:
        meta, s = metas[target.id], renderer.sample(target.id)
        ((t, h, w),) = meta.video
        assert t == len(target.images) and s.audio_frames == target.audio
        assert int((s.input_ids == VIDEO).sum()) == t * h * w // 4 == meta.video_tokens
        assert int((s.input_ids == AUDIO).sum()) == audio_llm_tokens(target.audio[0])
        (v,) = s.video_items
        assert s.grid_thw[v] == (t, h, w)
    assert videos
