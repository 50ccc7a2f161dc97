"""``data check`` decodes an image file once per scan however many records share it (LLaVA data
reuses images; the 1M-record benchmark shares 16), and still reports its problems on every record
that uses it, under that record's own field."""

from __future__ import annotations

import json

from PIL import Image

from entrain.data import check
from entrain.data.check import check_dataset


def _rec(i: int, images: list[str]) -> dict:
    q = "<image>" * len(images) + "\nWhat is it?"
    return {
        "id": f"r{i}",
        "images": images,
        "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": "A square."}],
    }


def test_a_shared_image_is_checked_once_and_reported_on_each_record(tmp_path, monkeypatch):
    Image.new("RGB", (64, 48), "red").save(tmp_path / "good.png")
    (tmp_path / "bad.png").write_bytes((tmp_path / "good.png").read_bytes()[:40])  # truncated
    rows = [
        _rec(0, ["good.png", "bad.png"]),
        _rec(1, ["bad.png"]),
        _rec(2, ["good.png"]),
        _rec(3, ["good.png"]),
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []
    real = check._check_image
    monkeypatch.setattr(check, "_check_image", lambda src, *a: calls.append(src) or real(src, *a))
    report = check_dataset(data, processor=False)
    assert sorted(calls) == [str(tmp_path / "bad.png"), str(tmp_path / "good.png")]
    assert [(f.index, f.field) for f in report.errors] == [(0, "images[1]"), (1, "images[0]")]
    assert report.bad == 2 and report.records == 4
    (tmp_path / "good.png").write_bytes((tmp_path / "bad.png").read_bytes())  # a new scan sees the new file
    assert [(f.index, f.field) for f in check_dataset(data, processor=False).errors][-1] == (3, "images[0]")
