"""Small real sharded datasets for the tests: LLaVA records with real PNG/JPEG images (Pillow),
written as Parquet shards, WebDataset tar shards, or a Hugging Face ``save_to_disk`` folder (arrow
IPC stream files + ``state.json`` + ``dataset_info.json``, written with pyarrow in the layout
``datasets`` writes, as the ``datasets`` package is not installed here)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

FORMATS = ("parquet", "webdataset", "hf")


def image_bytes(i: int, fmt: str = "PNG") -> bytes:
    """A real ``fmt`` image, 28 x (28 + 14 i) px, colours varying with ``i``."""
    im = Image.new("RGB", (28 + 14 * (i % 3), 28), (40 * i % 256, 90, 200))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def records(shard: int, num: int) -> list[dict]:
    """``num`` LLaVA records of shard ``shard``: one image each (PNG, or JPEG for odd indices)."""
    out = []
    for i in range(num):
        fmt = "JPEG" if i % 2 else "PNG"
        out.append({
            "id": f"s{shard}-{i}",
            "conversations": [
                {"from": "human", "value": f"<image>\nWhat colour is picture {shard}.{i}?"},
                {"from": "gpt", "value": f"It is colour number {40 * i % 256} with some blue."},
            ],
            "image_bytes": image_bytes(shard * 10 + i, fmt),
            "ext": "jpg" if fmt == "JPEG" else "png",
        })  # fmt: skip
    return out


def _arrow_table(recs: list[dict]) -> pa.Table:
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    turn = pa.struct([("from", pa.string()), ("value", pa.string())])
    schema = pa.schema([("id", pa.string()), ("conversations", pa.list_(turn)), ("image", image)])
    rows = [
        {
            "id": r["id"],
            "conversations": r["conversations"],
            "image": {"bytes": r["image_bytes"], "path": None},
        }
        for r in recs
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def write_parquet(folder: Path, shards: list[list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, recs in enumerate(shards):
        pq.write_table(_arrow_table(recs), folder / f"train-{k:05d}.parquet", row_group_size=2)
    return folder


def write_webdataset(folder: Path, shards: list[list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, recs in enumerate(shards):
        with tarfile.open(folder / f"shard-{k:05d}.tar", "w") as tf:
            for r in recs:
                key = f"{r['id']}"
                meta = {"id": r["id"], "conversations": r["conversations"]}
                for name, data in (
                    (f"{key}.json", json.dumps(meta).encode()),
                    (f"{key}.{r['ext']}", r["image_bytes"]),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return folder


def write_hf(folder: Path, shards: list[list[dict]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data-{k:05d}-of-{len(shards):05d}.arrow" for k in range(len(shards))]
    for name, recs in zip(names, shards, strict=True):
        table = _arrow_table(recs)
        with pa.ipc.new_stream(folder / name, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=2):
                writer.write_batch(batch)
    state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "0", "_split": "train"}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"id": {"dtype": "string"}}}))
    return folder


def write(fmt: str, folder: Path, shards: list[list[dict]]) -> Path:
    return {"parquet": write_parquet, "webdataset": write_webdataset, "hf": write_hf}[fmt](folder, shards)


def dataset(fmt: str, folder: Path, sizes: tuple[int, ...] = (3, 2, 3)) -> Path:
    """A ``fmt`` dataset of ``len(sizes)`` shards with ``sizes[k]`` records in shard ``k``."""
    return write(fmt, folder, [records(k, n) for k, n in enumerate(sizes)])
