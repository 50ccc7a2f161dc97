"""Fit the ``a40-paper`` cost preset's per-component efficiency factors.

Targets (paper Tables 2, 5-11, b = 256, 16 GPUs per replica): ProportionalAllocation of the
encoder share of b = 256 draws must give the paper's (encoder, LLM) GPU split for every dataset,
stably (all k = 59 validation draws of Algorithm 1). At TP = CP = 1 a sample's work scales exactly
with 1 / efficiency per component, so only ``s = eff_encoder / eff_llm`` matters for the splits:
``P(s) = E / (E + s * L)``. Per model we scan ``log s`` and keep the value that matches the most
datasets' b = 256 splits, then maximises the smallest margin (in standard deviations of the b = 256
share) to a rounding boundary. The absolute level (one factor common to both components and both
models) is then set so that paper Eq. 2 times of Table 1's Entrain configs match the Entrain bars
of Fig. 11 in the geometric mean.

Run: ``python benchmarks/fit_a40_paper.py`` (about a minute); writes
``benchmarks/results/a40_paper_fit.md``. Copy the printed factors into
``entrain/core/presets.py`` (``A40_PAPER_EFFICIENCY``).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from entrain.core.architectures import get_arch
from entrain.core.planner import (
    PAPER_TABLE1,
    MacroscopicProfiler,
    SampleStats,
    evaluate_config,
    pool_sampler,
    proportional_allocation,
)
from entrain.core.presets import A40_FLOPS_EFFICIENCY, _a40_device, cost_model_for, layer_specs
from entrain.data.generators import generate_samples

GPUS_PER_REPLICA = 16
B = 256
NUM_DRAWS = 59
POOL = 1 << 15
MODELS = ("qwen25vl-llama3-1b", "qwen25vl-llama3-3b")
DATASETS = ("synthchartnet", "llava150k", "chartqa", "cocoqa")
PAPER_SPLIT_256 = {  # (encoder GPUs, LLM GPUs) at b = 256, Tables 2, 5-11
    ("synthchartnet", "qwen25vl-llama3-1b"): (10, 6),
    ("llava150k", "qwen25vl-llama3-1b"): (9, 7),
    ("chartqa", "qwen25vl-llama3-1b"): (10, 6),
    ("cocoqa", "qwen25vl-llama3-1b"): (10, 6),
    ("synthchartnet", "qwen25vl-llama3-3b"): (8, 8),
    ("llava150k", "qwen25vl-llama3-3b"): (7, 9),
    ("chartqa", "qwen25vl-llama3-3b"): (8, 8),
    ("cocoqa", "qwen25vl-llama3-3b"): (8, 8),
}
FIG11_ENTRAIN_S = {  # Entrain iteration time (s), read off paper Fig. 11
    ("synthchartnet", "qwen25vl-llama3-1b"): 14.2,
    ("chartqa", "qwen25vl-llama3-1b"): 12.3,
    ("cocoqa", "qwen25vl-llama3-1b"): 7.9,
    ("llava150k", "qwen25vl-llama3-1b"): 8.1,
    ("synthchartnet", "qwen25vl-llama3-3b"): 19.0,
    ("chartqa", "qwen25vl-llama3-3b"): 17.9,
    ("cocoqa", "qwen25vl-llama3-3b"): 9.0,
    ("llava150k", "qwen25vl-llama3-3b"): 10.9,
}
SYNTH_3B_TRUE_RATIO = 1.27
SIZES = (1, 4, 16, 64, 256)
PAPER_TRIALS = {  # paper Tables 2, 5-11 at b = 1, 4, 16, 64, 256 (splits seen; ok = stable)
    ("synthchartnet", "qwen25vl-llama3-3b"): (
        "10:6..6:10 x",
        "9:7, 8:8, 7:9 x",
        "9:7, 8:8, 7:9 x",
        "8:8 ok",
        "8:8 ok",
    ),
    ("synthchartnet", "qwen25vl-llama3-1b"): (
        "11:5, 10:6, 9:7 x",
        "11:5, 10:6, 9:7 x",
        "11:5, 10:6 x",
        "10:6 ok",
        "10:6 ok",
    ),
    ("llava150k", "qwen25vl-llama3-1b"): (
        "10:6, 9:7, 8:8 x",
        "10:6, 9:7, 8:8 x",
        "9:7, 8:8 x",
        "9:7 ok",
        "9:7 ok",
    ),
    ("chartqa", "qwen25vl-llama3-1b"): ("10:6, 9:7 x", "10:6, 9:7 x", "10:6 ok", "10:6 ok", "10:6 ok"),
    ("cocoqa", "qwen25vl-llama3-1b"): ("10:6, 9:7 x", "10:6, 9:7 x", "10:6 ok", "10:6 ok", "10:6 ok"),
    ("llava150k", "qwen25vl-llama3-3b"): (
        "7:9, 6:10, 5:11 x",
        "7:9, 6:10 x",
        "7:9, 6:10 x",
        "7:9, 6:10 x",
        "7:9 ok",
    ),
    ("chartqa", "qwen25vl-llama3-3b"): ("8:8, 7:9 x", "8:8 ok", "8:8 ok", "8:8 ok", "8:8 ok"),
    ("cocoqa", "qwen25vl-llama3-3b"): ("8:8, 7:9 x", "8:8 ok", "8:8 ok", "8:8 ok", "8:8 ok"),
}


def cost(model: str, enc_eff: float, llm_eff: float):
    arch = get_arch(model)
    counts = {c: len(v) for c, v in layer_specs(arch).items()}
    return cost_model_for(
        arch, _a40_device("a40-paper", model, enc_eff, llm_eff, counts), hardware_name="a40-paper"
    )


def draws(model: str, dataset: str):
    """Per draw: total encoder and LLM work (efficiency 1) of b = 256 i.i.d. samples."""
    base = cost(model, 1.0, 1.0)
    sampler = pool_sampler(generate_samples(dataset, POOL, 0))
    prof = MacroscopicProfiler(sampler, base, seed=0)
    enc, llm = [], []
    for t in range(NUM_DRAWS + 1):
        e, m = prof.draw(B, t)[1].work(base)
        enc.append(e.sum())
        llm.append(m.sum())
    pool_stats = SampleStats.of(generate_samples(dataset, 4096, 1))
    pe, pm = pool_stats.work(base)
    return np.array(enc), np.array(llm), pe, pm


def split_margin(enc, llm, s, target):
    """(matches in every draw, smallest margin to a rounding boundary in std units of 16 * P)."""
    p = enc / (enc + s * llm) * GPUS_PER_REPLICA
    e = target[0]
    lo, hi = e - 0.5, e + 0.5
    ok = all(proportional_allocation(GPUS_PER_REPLICA, x / GPUS_PER_REPLICA) == target for x in p)
    sd = max(p.std(), 1e-9)
    return ok, min(p.mean() - lo, hi - p.mean()) / sd


def fit_model(model: str, data: dict) -> tuple[float, list[str]]:
    grid = np.exp(np.linspace(math.log(0.05), math.log(20.0), 4001))
    best = None
    for s in grid:
        res = [split_margin(data[d][0], data[d][1], s, PAPER_SPLIT_256[(d, model)]) for d in DATASETS]
        n_ok = sum(ok for ok, _ in res)
        margin = min(m for ok, m in res if ok) if n_ok else -1e9
        key = (n_ok, margin)
        if best is None or key > best[0]:
            best = (key, s)
    return best[1], []


def main() -> None:
    lines = ["# a40-paper cost preset fit", "", "Generated by `benchmarks/fit_a40_paper.py`.", ""]
    data = {m: {d: draws(m, d) for d in DATASETS} for m in MODELS}
    ratios = {m: fit_model(m, data[m])[0] for m in MODELS}  # s = eff_enc / eff_llm
    # absolute level: encoder efficiency e, llm = e / s; Eq. 2 time scales with 1 / e
    # fixed point: per-call constants do not scale with the efficiency, so iterate
    enc_eff_fit = A40_FLOPS_EFFICIENCY
    profiles = {d: pool_sampler(generate_samples(d, POOL, 0))(B, 12345) for d in DATASETS}
    for _ in range(4):
        logs = []
        for (d, m), secs in FIG11_ENTRAIN_S.items():
            c = cost(m, enc_eff_fit, enc_eff_fit / ratios[m])
            e_pp, l_pp = PAPER_TABLE1[(d, m)]["entrain"]
            cfg = evaluate_config(
                profiles[d],
                c,
                dp=4,
                encoder=(2, 1, e_pp),
                llm=(2, 1, l_pp),
                global_batch=512,
                microbatch_size=4,
            )
            logs.append(math.log(cfg.predicted_iteration_time_ms / (secs * 1e3)))
        enc_eff_fit *= math.exp(float(np.mean(logs)))  # predicted / paper > 1 -> faster device
    llm_eff_fit = {m: enc_eff_fit / ratios[m] for m in MODELS}
    print(
        f"A40_PAPER_EFFICIENCY encoder={enc_eff_fit:.4f} llm={ {m: round(float(v), 4) for m, v in llm_eff_fit.items()} }"
    )

    lines += [
        "## Fitted factors (fraction of the A40 bf16 peak, 149.7 TFLOP/s)",
        "",
        f"- encoder: **{enc_eff_fit:.4f}**",
    ]
    lines += [
        f"- llm ({m}): **{llm_eff_fit[m]:.4f}** (eff_encoder / eff_llm = {ratios[m]:.3f})" for m in MODELS
    ]
    lines += [
        "",
        "## b = 256 GPU splits (16 GPUs per replica, 60 seeded draws each)",
        "",
        "| model | dataset | paper split | fitted split(s) seen | mean 16*P | sd 16*P | match |",
        "|---|---|---|---|---|---|---|",
    ]
    residuals = []
    for m in MODELS:
        for d in DATASETS:
            enc, llm, pe, pm = data[m][d]
            p = enc / (enc + ratios[m] * llm)
            seen = sorted({proportional_allocation(16, x) for x in p}, key=lambda a: -a[0])
            target = PAPER_SPLIT_256[(d, m)]
            ok = seen == [target]
            residuals.append((m, d, ok))
            lines.append(
                f"| {m} | {d} | {target[0]}:{target[1]} | {', '.join(f'{a}:{b}' for a, b in seen)} | "
                f"{16 * p.mean():.2f} | {16 * p.std():.3f} | {'yes' if ok else 'NO'} |"
            )
    # 1.27:1 check for SynthChartNet-3B
    enc, llm, pe, pm = data["qwen25vl-llama3-3b"]["synthchartnet"]
    s3 = ratios["qwen25vl-llama3-3b"]
    lines += [
        "",
        "## SynthChartNet + Llama-3.2-3B encoder:LLM ratio (paper: true mean 1.27:1)",
        "",
        f"- ratio of sums (what ProportionalAllocation uses): {enc.sum() / (s3 * llm.sum()):.3f}:1",
        f"- mean of per-sample ratios: {float(np.mean(pe / (s3 * pm))):.3f}:1",
        f"- median of per-sample ratios: {float(np.median(pe / (s3 * pm))):.3f}:1",
        "",
        "With nearest-GPU rounding a 1.27:1 ratio of sums would give 9:7 on 16 GPUs, not Table 2's 8:8; "
        "the fit therefore targets the split and reports the ratio (see docs/cost_model.md).",
        "",
    ]
    # b_min and Table 1 with the fitted preset
    lines += [
        "## Algorithm 1 + 2 with the fitted preset (64 GPUs, DP 4, TP 2, B 512, U 4)",
        "",
        "| model | dataset | b_min | split at b_min | paper Entrain E.PP/L.PP | ours | match | Eq. 2 s | Fig. 11 s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    from entrain.core.planner import plan

    trial_rows = []

    for m in MODELS:
        c = cost(m, enc_eff_fit, llm_eff_fit[m])
        for d in DATASETS:
            sampler = pool_sampler(generate_samples(d, POOL, 0))
            r = plan(sampler, c, gpus=64, dp=4, tp=2, global_batch=512, microbatch_size=4, extra_sizes=SIZES)
            trial_rows.append((m, d, r.b_min))
            paper = PAPER_TABLE1[(d, m)]["entrain"]
            ours = (r.config.encoder.pp, r.config.llm.pp)
            lines.append(
                f"| {m} | {d} | {r.b_min.b_min} | {r.b_min.allocation[0]}:{r.b_min.allocation[1]} | "
                f"{paper[0]}/{paper[1]} | {ours[0]}/{ours[1]} | {'yes' if ours == paper else 'no'} | "
                f"{r.config.predicted_iteration_time_ms / 1e3:.2f} | {FIG11_ENTRAIN_S[(d, m)]} |"
            )
            print(m, d, r.b_min.b_min, r.b_min.allocation, paper, ours)
    lines += [
        "",
        "## Trial tables at the paper's sizes (ours vs paper Tables 2, 5-11)",
        "",
        "Cells: splits seen over k + 1 = 60 draws, `ok` = stable. Paper in brackets.",
        "",
        "| model | dataset | " + " | ".join(f"b={b}" for b in SIZES) + " |",
        "|---|---|" + "---|" * len(SIZES),
    ]
    for m, d, bres in trial_rows:
        cells = []
        for b in SIZES:
            t = bres.trial(b)
            seen = ", ".join(f"{e}:{g}" for e, g in t.allocations_seen)
            cells.append(f"{seen} {'ok' if t.stable else 'x'} [{PAPER_TRIALS[(d, m)][SIZES.index(b)]}]")
        lines.append(f"| {m} | {d} | " + " | ".join(cells) + " |")
    out = pathlib.Path(__file__).parent / "results" / "a40_paper_fit.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
