"""Audio in datasets: ``data check`` names every bad audio file of a record (missing, empty,
truncated) and passes a record whose clips are good; a workload's
``"audio"`` mel frames per clip become ``SampleMeta.audio``, whose audio tokens count in the sample's
LLM tokens and in ``data stats`` and whose attention chunks are priced as encoder rows; metadata
without audio is written and priced as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.io import wavfile

from entrain.cli.data import compute_stats, format_stats
from entrain.cli.main import main
from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import DataError
from entrain.core.workload.samples import SampleMeta, audio_llm_tokens
from entrain.data.audio import audio_tokens
from entrain.data.check import check_dataset
from entrain.data.workload_io import read_samples


def _record(rid: str, audio) -> dict:
    n = 1 if isinstance(audio, str) else len(audio)
    return {"id": rid, "audio": audio, "conversations": [
        {"from": "human", "value": "<audio>" * n + " what is said?"}, {"from": "gpt", "value": "hello"}]}  # fmt: skip


def test_data_check_names_every_bad_audio_file(tmp_path):
    wavfile.write(tmp_path / "good.wav", 16000, np.zeros(1600, dtype=np.int16))
    data = (tmp_path / "good.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.wav").write_bytes(b"")
    records = [_record("a", ["good.wav", "cut.wav", "gone.wav"]), _record("b", "empty.wav"),
               _record("c", "good.wav")]  # fmt: skip
    path = tmp_path / "data.json"
    path.write_text(json.dumps(records))
    report = check_dataset(path)
    found = {(f.id, f.field): f.reason for f in report.findings}
    assert found[("a", "audio[1]")].startswith("cut.wav: truncated")
    assert found[("a", "audio[2]")] == "gone.wav: missing"
    assert found[("b", "audio")].startswith("empty.wav: empty")
    assert not any(f.field.startswith("audio[0]") for f in report.findings)  # the good file is fine
    assert not any("not supported" in f.reason for f in report.findings)  # audio files are read
    assert report.bad == 2  # c, whose one clip is good, passes


def test_workload_audio_counts_in_llm_tokens_and_data_stats(tmp_path):
    rows = [{"id": "a", "images": [[56, 56]], "text_tokens": 20, "audio": [50, 300]},
            {"id": "b", "images": [], "text_tokens": 30}]  # fmt: skip
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = read_samples(str(path))
    assert a.audio == (50, 300) and b.audio == ()
    assert (
        a.audio_tokens == audio_tokens(50) + audio_tokens(300) == audio_llm_tokens(50) + audio_llm_tokens(300)
    )
    assert a.llm_tokens == 20 + a.image_tokens + a.audio_tokens
    assert SampleMeta.from_json(a.to_json()) == a and "audio" not in b.to_json()
    cost = build_cost_model("tiny", "cpu-tiny")
    stats, _ = compute_stats([a, b], cost)
    assert stats["audio_tokens"]["mean"] == a.audio_tokens / 2
    assert "audio_tokens" in format_stats(stats, "t")
    plain_a = SampleMeta("a", a.images, 20)
    assert cost.sample_work(a).llm > cost.sample_work(plain_a).llm
    # the audio tower priced as vision-layer rows: one unit per 200-frame chunk, half its frames each
    assert cost.units("encoder", a) == a.vit_patches_per_image + (25, 100, 50)
    assert cost.sample_work(a).encoder > cost.sample_work(plain_a).encoder
    assert cost.units("encoder", b) == b.vit_patches_per_image  # no audio: priced as before
    plain, _ = compute_stats([b], cost)
    assert "audio_tokens" not in format_stats(plain, "t")  # the table of a dataset without audio as before
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "c", "images": [], "text_tokens": 3, "audio": [0]}) + "\n")
    with pytest.raises(DataError, match="audio"):
        read_samples(str(bad))


def test_a_workload_with_audio_is_drawn_with_its_audio(tmp_path):
    """The planner's streamed workload table has no audio column: such a file is read as SampleMeta."""
    from entrain.data.sampling import dataset_sampler

    rows = [{"id": f"s{i}", "images": [[56, 56]], "text_tokens": 10, **({"audio": [40]} if i == 1 else {})}
            for i in range(3)]  # fmt: skip
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn = dataset_sampler(str(path), 0)(20, 0)
    assert {m.id: m.audio for m in drawn}["s1"] == (40,)


def test_entrain_data_check_names_file_record_and_field_and_resamples_a_44khz_clip(tmp_path, capsys):
    """``entrain data check`` prints one line per bad clip naming the data file, the record's index and
    id, the field and the clip (missing, truncated, empty); a 44.1-kHz clip is no error: it is resampled
    to the 16 kHz transformers' ``WhisperFeatureExtractor`` requires (it refuses any other rate), and
    ``data stats`` counts the tokens of the resampled clip's frames, those the extractor's mask counts."""
    from transformers import WhisperFeatureExtractor

    from entrain.data.audio import load_clip, mel_frames
    from entrain.data.llava import read_metadata

    rng = np.random.default_rng(0)
    wavfile.write(tmp_path / "good.wav", 16000, (3000 * rng.normal(size=4000)).astype(np.int16))
    wavfile.write(tmp_path / "cd.wav", 44100, (3000 * rng.normal(size=(44100, 2))).astype(np.int16))
    data = (tmp_path / "good.wav").read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 2])
    (tmp_path / "empty.wav").write_bytes(b"")
    records = [
        _record("a", ["good.wav", "cut.wav"]),
        _record("b", "cd.wav"),
        _record("c", ["gone.wav", "empty.wav"]),
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["data", "check", str(path)]) == 1
    bad = [x for x in capsys.readouterr().out.splitlines() if x.endswith("[error]")]
    assert len(bad) == 3
    for line_no, index, rid, field, reason in [(1, 0, "a", "audio[1]", "cut.wav: truncated ("),
                                               (3, 2, "c", "audio[0]", "gone.wav: missing [error]"),
                                               (3, 2, "c", "audio[1]", "empty.wav: empty (0 bytes) [error]")]:  # fmt: skip
        assert any(
            x.startswith(f"{path}:{line_no}: record {index} id '{rid}': {field}: {reason}") for x in bad
        ), bad
    clip = load_clip(tmp_path / "cd.wav")
    assert len(clip) == 16000  # 1 s at 44.1 kHz, stereo averaged, resampled to 16 kHz
    extractor = WhisperFeatureExtractor(feature_size=128)
    with pytest.raises(ValueError, match="sampling rate"):
        extractor([np.zeros(44100, np.float32)], sampling_rate=44100)
    mask = extractor([clip], sampling_rate=16000, return_attention_mask=True, padding="max_length")[
        "attention_mask"
    ]
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(records[1]) + "\n")
    ((frames,),) = [m.audio for m in read_metadata(good, use_cache=False)]
    assert frames == int(mask[0].sum()) == mel_frames(16000) == 100
    assert main(["data", "stats", "--dataset", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["audio_tokens"]["mean"] == audio_tokens(frames)
