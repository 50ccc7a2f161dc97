"""Peak memory and wall time of scanning large LLaVA datasets.

Generates a LLaVA JSONL of N records whose images are 16 small PNGs shared by every record, and
WebDataset tar shards of the same kind of records (each sample its own small PNG), then runs the
CLI on them under ``/usr/bin/time -v``:

- ``entrain data check FILE --no-processor --json``: the streaming scan (every record parsed, every
  image decoded; per record only its id is kept, for the duplicate check);
- ``entrain data stats --dataset FILE --num-samples N --json``: the metadata pass that ``plan``,
  ``assign`` and ``simulate`` use, with an empty cache (cold) and again from the cache (warm);
- the same on a folder of tar shards (scanned in parallel processes).

Usage: ``python benchmarks/sharded_datasets.py [--records 1000000] [--small 100000] [--work DIR]``
(``--from benchmarks/results/sharded_datasets.json`` re-renders the report without measuring).
Writes ``benchmarks/results/sharded_datasets.md``. Timings are of this shared 2-core machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from PIL import Image
from provenance import source, stamped  # benchmarks/provenance.py (scripts run from this folder)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "sharded_datasets.md"
NUM_IMAGES = 16


def _record(i: int, image: str | None) -> dict:
    rec = {
        "id": f"r{i}",
        "conversations": [
            {"from": "human", "value": f"<image>\nWhat is shown in picture number {i}?"},
            {
                "from": "gpt",
                "value": f"A small coloured square, number {i % NUM_IMAGES}, on a plain background.",
            },
        ],
    }
    if image is not None:
        rec["image"] = image
    return rec


def _png(k: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (28 + 14 * (k % 4), 28 + 14 * (k // 4 % 4)), (16 * k % 256, 80, 160)).save(buf, "PNG")
    return buf.getvalue()


def write_jsonl(folder: Path, num_records: int) -> Path:
    """``folder/llava_N.jsonl`` (written line by line) and ``folder/img/{0..15}.png``."""
    (folder / "img").mkdir(parents=True, exist_ok=True)
    for k in range(NUM_IMAGES):
        (folder / "img" / f"{k}.png").write_bytes(_png(k))
    path = folder / f"llava_{num_records}.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(num_records):
            f.write(json.dumps(_record(i, f"img/{i % NUM_IMAGES}.png")) + "\n")
    return path


def write_tars(folder: Path, num_records: int, num_shards: int) -> Path:
    """``num_shards`` WebDataset tar shards of ``num_records`` samples in all, each with its PNG."""
    folder.mkdir(parents=True, exist_ok=True)
    images = [_png(k) for k in range(NUM_IMAGES)]
    per_shard = -(-num_records // num_shards)
    for s in range(num_shards):
        with tarfile.open(folder / f"shard-{s:05d}.tar", "w") as tf:
            for i in range(s * per_shard, min(num_records, (s + 1) * per_shard)):
                rec = _record(i, None)
                for name, data in (
                    (f"{i:08d}.json", json.dumps(rec).encode()),
                    (f"{i:08d}.png", images[i % NUM_IMAGES]),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return folder


def measure(argv: list[str]) -> dict:
    """Wall seconds and peak RSS (MiB) of ``python -m entrain ARGV`` under ``/usr/bin/time -v``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "entrain", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode not in (0, 1):  # data check exits 1 on findings
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", done.stderr).group(1)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    seconds = sum(float(x) * 60**i for i, x in enumerate(reversed(wall.split(":"))))
    return {"argv": argv, "wall_s": seconds, "peak_rss_mib": rss_kb / 1024}


def _cases(
    jsonl: dict[int, Path], tars: Path, num_tar_records: int
) -> list[tuple[str, int, Path, list[str]]]:
    out = []
    for n, path in sorted(jsonl.items()):
        out.append(("check (stream)", n, path, ["data", "check", str(path), "--no-processor", "--json"]))
        stats = ["data", "stats", "--dataset", str(path), "--num-samples", str(n), "--json"]
        out += [("stats, cold cache", n, path, stats), ("stats, warm cache", n, path, stats)]
    stats = ["data", "stats", "--dataset", str(tars), "--num-samples", str(num_tar_records), "--json"]
    out.append(
        ("tar shards: check", num_tar_records, tars, ["data", "check", str(tars), "--no-processor", "--json"])
    )
    out += [
        ("tar shards: stats, cold", num_tar_records, tars, stats),
        ("tar shards: stats, warm", num_tar_records, tars, stats),
    ]
    return out


def _size_mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def report(rows: list[dict], baseline: dict) -> str:
    lines = [
        "# Scanning large LLaVA datasets: peak memory and wall time",
        "",
        "`python benchmarks/sharded_datasets.py` on this shared 2-core machine. "
        f"Records are LLaVA conversations of about 230 bytes of JSON; the JSONL's images are {NUM_IMAGES} "
        "small PNGs shared by every record, the tar shards hold one PNG per sample. Peak RSS is "
        "`Maximum resident set size` of `/usr/bin/time -v`; the command is `python -m entrain` with the "
        "arguments shown (`WORK`: the `--work` folder the records were written to).",
        "",
        f"Baseline (the interpreter and imports, a 10-record file): {baseline['peak_rss_mib']:.0f} MiB, "
        f"`{' '.join(baseline['argv'])}`.",
        "",
        "| case | records | data MiB | wall s | peak RSS MiB | bytes / record over baseline | arguments |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        per = (r["peak_rss_mib"] - baseline["peak_rss_mib"]) * 2**20 / r["records"]
        lines.append(
            f"| {r['case']} | {r['records']:,} | {r['data_mib']:.0f} | {r['wall_s']:.0f} | {r['peak_rss_mib']:.0f} "
            f"| {per:.0f} | `{' '.join(r['argv'])}` |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100_000, help="a second, smaller JSONL (memory slope)")
    ap.add_argument("--tar-records", type=int, default=100_000)
    ap.add_argument("--tar-shards", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/entrain-sharded-bench"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--from", dest="from_json", type=Path, default=None,
                    help="re-render the report from a previous run's .json (no measuring)")  # fmt: skip
    args = ap.parse_args()
    if args.from_json is not None:
        done = json.loads(args.from_json.read_text())
        args.out.write_text(stamped(report(done["rows"], done["baseline"]) + _notes(), source(done)))
        return
    shutil.rmtree(args.work, ignore_errors=True)
    jsonl = {n: write_jsonl(args.work / f"jsonl_{n}", n) for n in sorted({args.small, args.records})}
    tiny = write_jsonl(args.work / "jsonl_10", 10)
    tars = write_tars(args.work / "tars", args.tar_records, args.tar_shards)
    baseline = measure(["data", "check", str(tiny), "--no-processor", "--json"])
    rows = []
    for case, n, path, argv in _cases(jsonl, tars, args.tar_records):
        row = {"case": case, "records": n, "data_mib": _size_mib(path), **measure(argv)}
        print(f"{case:26s} {n:>9,} {row['wall_s']:7.0f} s {row['peak_rss_mib']:7.0f} MiB", flush=True)
        rows.append(row)
    baseline, rows = _shown(baseline, args.work), [_shown(r, args.work) for r in rows]
    src = source()
    args.out.write_text(stamped(report(rows, baseline) + _notes(), src))
    args.out.with_suffix(".json").write_text(
        json.dumps({"source": src, "baseline": baseline, "rows": rows}, indent=1) + "\n"
    )


def _shown(row: dict, work: Path) -> dict:
    """``row`` with the ``--work`` folder written ``WORK`` in its arguments: the report names no folder of
    the machine that measured it."""
    return {**row, "argv": [a.replace(str(work), "WORK") for a in row["argv"]]}


def _notes() -> str:
    return """
## Reading the table

- **Lines are never held.** The JSONL is read one line at a time and each line's JSON object is
  dropped once its record is normalised. The 1M-record file is 216 MiB of JSON, and the streaming
  check holds about 130 bytes per record. That is the id of each record's first occurrence (a
  string and an int in a dict), which `data check` needs to report duplicate ids. Nothing else
  grows with the file.
- **The metadata pass keeps the metadata.** `data stats`, `plan`, `assign` and `simulate` need a
  `SampleMeta` per record: the id, the image sizes, and the text and answer tokens. That is about
  350 bytes per record, plus the statistics' arrays. The warm run loads the same list from
  `.entrain_cache/` (one JSON line per record, read line by line). It is about 50 bytes per record
  larger, because the image-size tuples read back from the cache are not shared between records.
  Planning at scale keeps the planner's side of this compact.
- **Tar shards** are scanned in worker processes, one per CPU (2 here), in shard order. Peak RSS is
  that of the largest single process, as `/usr/bin/time -v` reports it. The parent holds the
  metadata list. Each worker holds one shard's results and the image bytes of one sample at a time,
  and keeps no index of tar members. `data check` on shards costs more per record (about 340 bytes)
  than on the JSONL. Each worker hands back its shard's results in one list: per record its id,
  findings and metadata, without the record itself, since `data check` keeps none. The parent
  holds a few such lists at a time, so that cost grows with the shard size (12,500 records here),
  not with the dataset. (The `tar shards: check` row was measured again, alone, after that change
  (daa5728). Before it, the workers handed the records back too: 184 MiB, 380 s.)
- **Wall times** are of this machine while other engineers' test runs shared its 2 cores (and this
  session's own test suite ran alongside the 1M rows). They show the order of magnitude, not the
  speed of the readers. `data check` decodes every image fully. A file shared by many records is
  decoded once per scan (keyed by path, size and mtime), which is why the JSONL's 16 shared images
  cost little.
"""


if __name__ == "__main__":
    main()
