"""A tiny Qwen2.5-Omni thinker really trained on this CPU: Entrain with one pipeline per encoder tower
(a vision stage, an audio stage, the LLM stage: 3 processes) against 1F1B on the one-encoder path
(both towers in its encoder stage(s), the same 3 processes), paired per round, beside the simulator.

    python benchmarks/cpu_pipeline.py --omni [--launches 3] [--steps 5] [--order-seed 0] [--model-path DIR]

The checkpoint is written by this module (``write_checkpoint``: random weights from a
``Qwen2_5OmniThinkerConfig``, ``save_pretrained`` into a temporary folder; ``--model-path`` trains a
given thinker folder instead). Per round one ``torchrun`` launch (``entrain train --system
entrain,1f1b`` in an order drawn per round from ``--order-seed``) trains both systems on 3 gloo
processes, the built-in ``omni`` set (images capped at 224 x 224 px), global batch ``CONFIG``,
planned with the ``cpu-tiny`` preset, traced, every step planned before the first
(``ENTRAIN_PLAN_PREFETCH=ahead``, as ``cpu_paired``); the first step of each run is dropped from the timings.
Entrain's planner places one pipeline per tower (``--decision-margin 99`` keeps the ``encoder towers``
decision's default, see ``CONFIG``); 1F1B's is the one-encoder planner's (``system_setups``), as ``entrain
train`` does for such a model.

Recorded: per round the paired ratio Entrain / 1F1B of median iteration times (same launch), its
median, min and max over rounds (target: at most ``REAL_TARGET``); per system and rank the process
CPU time over wall time (median over kept steps and rounds) and each stage's measured forward +
backward ms per step (the bottleneck); the simulated ratio of round 0's two ``plan.json`` (Entrain's
priced by ``EncodersPlanCosts`` on ``run_encoders``' towers, 1F1B's by the run's cost model, as
``entrain simulate`` prices each path); and the losses: both systems train the same checkpoint on the
same global batches (the step's ``sample_ids``), so every step's loss agrees within ``LOSS_REL_TOL``
(fp32, summation order only) in every round. The pass is merged into
``benchmarks/results/cpu_pipeline_paired.{md,json}`` (JSON key ``omni``, its section after the
paired passes' tables).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cpu_paired import PREFETCH, WARMUP, cpu_over_wall, iter_ms, load_cost  # benchmarks/cpu_paired.py
from idle import cpu_idle_fraction  # benchmarks/idle.py
from provenance import source  # benchmarks/provenance.py

SYSTEMS = ("entrain", "1f1b")
NPROC = 3
CONFIG = {
    "dataset": "omni",
    "hardware": "cpu-tiny",
    "max_pixels": 224 * 224,
    "seed": 0,
    "global_batch": 8,
    "microbatch_size": 1,
    "decision_margin": 99,
}
"""``decision_margin``: ``entrain train`` makes Entrain's ``encoder towers`` decision by simulation as ``entrain
plan`` does (``sim.towers``); a margin past any simulated gain keeps every decision's default, one pipeline
per tower with the paper's microbatch count: the layout this pass measures."""
REAL_TARGET = 1.0
"""Entrain's real paired ratio to 1F1B at most this."""
SIM_TOLERANCE = 0.05
LOSS_REL_TOL = 1e-5
"""Per step, |loss_entrain - loss_1f1b| / |loss_1f1b|: the same fp32 model on the same samples, the
sums in another order (microbatches, stages)."""
STEM = "cpu_pipeline_paired"
KEY = "omni"
"""The pass's key in ``cpu_pipeline_paired.json`` and its section there."""
VOCAB = 4096
SPECIAL = dict(audio_token_id=4089, audio_start_token_id=4090, audio_end_token_id=4091, image_token_id=4092,
               video_token_id=4093, vision_start_token_id=4094, vision_end_token_id=4095)  # fmt: skip
"""The thinker's multimodal token ids, at the top of the tiny vocabulary."""
SIZE = {
    "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=VOCAB, bos_token_id=0, eos_token_id=1,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}),
    "vision": dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                   fullatt_block_indexes=[1], window_size=56),
    "audio": dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, d_model=64,
                  output_dim=128, n_window=50, max_source_positions=64),
}  # fmt: skip
"""The tiny thinker: as the ``tiny`` preset's LLM (2 layers, hidden 128), a 2-block vision tower and a
2-layer audio tower (100-frame attention chunks, as the real tower's ``n_window`` halved)."""


def write_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A random ``Qwen2_5OmniThinkerForConditionalGeneration`` of ``SIZE`` saved to ``folder``."""
    import torch
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    cfg = Qwen2_5OmniThinkerConfig(
        text_config=SIZE["text"], vision_config=SIZE["vision"], audio_config=SIZE["audio"],
        tie_word_embeddings=False, **SPECIAL,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(cfg)
    model.save_pretrained(folder)
    return folder


def _launch(ckpt: Path, out: str, order: list[str], steps: int) -> None:
    cmd = [sys.executable, "-m", "entrain", "train", "--model-path", str(ckpt), "--system", ",".join(order),
           "--steps", str(steps), "--out", out, "--no-progress", "--nproc", str(NPROC), "--trace"]  # fmt: skip
    for key, value in CONFIG.items():
        cmd += ["--" + key.replace("_", "-"), str(value)]
    # every step planned before the first, as the paired passes (cpu_paired.PREFETCH)
    env = {**os.environ, "ENTRAIN_PLAN_PREFETCH": PREFETCH}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)


def _rows(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def measured(run: str) -> dict:
    """One system's run: its median iteration ms and busiest rank's CPU / wall (``cpu_paired``), per
    rank CPU / wall and per stage forward + backward ms (medians over the kept steps), and every
    step's loss and samples."""
    rows = _rows(run)
    kept = rows[WARMUP:]
    ranks = len(kept[0]["cpu_ms"])
    stages = sorted({r["stage"] for r in kept[0]["stage_times"]})
    return {
        "iter_ms": iter_ms(run),
        "busiest_cpu_over_wall": cpu_over_wall(run),
        "cpu_ms_per_rank": [statistics.median(r["cpu_ms"][k] for r in kept) for k in range(ranks)],
        "cpu_over_wall_per_rank": [
            statistics.median(r["cpu_ms"][k] / r["iteration_time_ms"] for r in kept) for k in range(ranks)
        ],
        "stage_ms": [
            statistics.median(
                sum(t["fwd_ms"] + t["bwd_ms"] for t in r["stage_times"] if t["stage"] == s) for r in kept
            )
            for s in stages
        ],
        "losses": [r["loss"] for r in rows],
        "sample_ids": [sorted(r["sample_ids"]) for r in rows],
    }


def loss_check(runs: dict[str, dict], tol: float = LOSS_REL_TOL) -> dict:
    """Entrain's per-step losses against 1F1B's in one round: the same samples every step, and the
    largest relative difference; ``exact`` when both hold (within ``tol``)."""
    a, b = runs["entrain"], runs["1f1b"]
    same = a["sample_ids"] == b["sample_ids"]
    rel = [abs(x - y) / abs(y) for x, y in zip(a["losses"], b["losses"], strict=True)]
    worst = max(rel)
    return {"same_samples": same, "max_rel_diff": worst, "tol": tol, "exact": same and worst <= tol}


def plan_summary(run: str) -> dict:
    """The plan that ran: its stages (tower or component, layer range, pipeline rank), recomputation
    and microbatch count, and the run's setup line."""
    with open(os.path.join(run, "plan.json")) as f:
        layout = json.load(f)["layout"]
    with open(os.path.join(run, "config.json")) as f:
        setup = json.load(f)["setup"]
    stages = " ".join(
        f"{s.get('encoder') or s['component']}[{s['layers'][0]},{s['layers'][1]})@{s['pp_rank']}"
        + (f" {s['recompute']}" if s.get("recompute") else "")
        for s in layout["stages"]
    )
    return {"stages": stages, "num_microbatches": layout["num_microbatches"], "setup": setup}


def simulated(run: str) -> dict:
    """The run's Plans simulated (kept steps): the median iteration ms (``ms``) and per rank the median
    busy ms (``busy_ms_per_rank``, compute only, beside the measured CPU ms). A plan with one pipeline per
    tower priced by ``EncodersPlanCosts`` on the run's towers (``runtime.planning.run_encoders``, what
    ``train`` planned with), a one-encoder plan by the run's cost model."""
    from types import SimpleNamespace

    from entrain.cli.plot_trace import run_model_config
    from entrain.core.ir.plan import Plan
    from entrain.core.schedules.encoder_costs import EncodersPlanCosts
    from entrain.runtime.planning import run_encoders
    from entrain.sim.executor import simulate_plan

    with open(os.path.join(run, "plan.json")) as f:
        plan = Plan.from_json(json.load(f))
    if plan.layout.multi_encoder:
        with open(os.path.join(run, "config.json")) as f:
            model = run_model_config(json.load(f)["spec"])
        encoders = run_encoders(SimpleNamespace(model=model))
        runs = simulate_plan(plan, None, costs=EncodersPlanCosts(plan.layout, encoders, plan.samples))
    else:
        runs = simulate_plan(plan, load_cost(run), trace_iterations=0)
    kept = runs[WARMUP:]
    busy = [{k: v for rep in r.replicas for k, v in rep.busy_ms.items()} for r in kept]
    return {
        "ms": statistics.median(r.iteration_time_ms for r in kept),
        "busy_ms_per_rank": [
            statistics.median(b.get(k, 0.0) for b in busy) for k in range(plan.layout.world_size)
        ],
    }


def summarize(per_round: list[dict], sim_ms: dict) -> dict:
    """The paired per-round ratios Entrain / 1F1B (``per_round``: round -> system -> ``measured``), their
    median and spread, the same per round for the busiest rank's CPU ms (a view less sensitive to other
    jobs on the machine), and the simulated ratio (``sim_ms``: system -> ms) with its error against the
    real median."""
    ratios = [r["entrain"]["iter_ms"] / r["1f1b"]["iter_ms"] for r in per_round]
    real = statistics.median(ratios)
    cpu = [max(r["entrain"]["cpu_ms_per_rank"]) / max(r["1f1b"]["cpu_ms_per_rank"]) for r in per_round]
    sim = sim_ms["entrain"] / sim_ms["1f1b"]
    return {
        "ratios": ratios,
        "real_ratio": real,
        "spread": [min(ratios), max(ratios)],
        "real_met": real <= REAL_TARGET,
        "busiest_cpu_ratios": cpu,
        "busiest_cpu_ratio": statistics.median(cpu),
        "median_ms": {s: statistics.median(r[s]["iter_ms"] for r in per_round) for s in SYSTEMS},
        "sim_ms": sim_ms,
        "sim_ratio": sim,
        "sim_rel_error": sim / real - 1,
        "sim_met": abs(sim / real - 1) <= SIM_TOLERANCE,
    }


def run(ckpt: Path, rounds: int, steps: int, seed: int) -> dict:
    rng = random.Random(seed)
    per_round, orders, losses, load = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="entrain-omni-") as tmp:
        for i in range(rounds):
            order = rng.sample(SYSTEMS, len(SYSTEMS))
            out = os.path.join(tmp, f"round{i}")
            load.append(os.getloadavg()[0])
            _launch(ckpt, out, order, steps)
            got = {s: measured(os.path.join(out, s)) for s in SYSTEMS}
            per_round.append(got)
            orders.append(order)
            losses.append(loss_check(got))
            print(f"cpu_omni: round {i} {order}: " + ", ".join(f"{s} {got[s]['iter_ms']:.0f} ms" for s in SYSTEMS)
                  + f"; losses max rel diff {losses[-1]['max_rel_diff']:.2e}", file=sys.stderr, flush=True)  # fmt: skip
        first = os.path.join(tmp, "round0")
        sims = {s: simulated(os.path.join(first, s)) for s in SYSTEMS}
        plans = {s: plan_summary(os.path.join(first, s)) for s in SYSTEMS}
    return {
        "config": {
            **CONFIG,
            "nproc": NPROC,
            "cores": os.cpu_count(),
            "checkpoint": "benchmarks/cpu_omni.py write_checkpoint()",
        },
        "rounds": rounds,
        "steps": steps,
        "orders": orders,
        "per_round": per_round,
        "loss_checks": losses,
        "load_before_round": load,
        "plans": plans,
        "sim_busy_ms_per_rank": {s: sims[s]["busy_ms_per_rank"] for s in SYSTEMS},
        "summary": summarize(per_round, {s: sims[s]["ms"] for s in SYSTEMS}),
    }


def _median_list(values: list[list[float]]) -> list[float]:
    return [statistics.median(v[k] for v in values) for k in range(len(values[0]))]


def report(res: dict) -> str:
    """The pass's section of ``cpu_pipeline_paired.md``."""
    src, s = res["source"], res["summary"]
    cfg = res["config"]
    lines = [
        "",
        "## Qwen2.5-Omni thinker: Entrain with one pipeline per encoder tower / 1F1B on the one-encoder path",
        "",
        f"Source: commit {src['commit']}, `{src['command']}`",
        "",
        f"Generated by `python benchmarks/cpu_pipeline.py --omni` (module `benchmarks/cpu_omni.py`): a tiny "
        f"Qwen2.5-Omni thinker (random weights, `write_checkpoint`), {cfg['nproc']} gloo processes, `{cfg['dataset']}` "
        f"(images at most {cfg['max_pixels']} px), global batch {cfg['global_batch']}, microbatch size "
        f"{cfg['microbatch_size']}, planned with {cfg['hardware']}; {res['rounds']} rounds x {res['steps']} steps "
        f"(first {WARMUP} dropped), one launch a round training both systems (order drawn). Real ratio = median over "
        "rounds of Entrain's median iteration ms / 1F1B's of the same launch (min-max in brackets); sim ratio = "
        "round 0's two Plans simulated as `entrain simulate` prices each path; error = sim / real - 1. Busiest-rank "
        "CPU ratio = median over rounds of the ratio of the two systems' busiest rank's CPU ms a step (medians over "
        "kept steps): the work on the bottleneck rank, less sensitive than wall time to other jobs on the machine.",
        "",
        "| Entrain ms | 1F1B ms | real ratio (min-max) | <= 1.0 | sim Entrain ms | sim 1F1B ms | sim ratio | "
        "error | busiest-rank CPU ratio (min-max) | losses equal (max rel diff, tol) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks = res["loss_checks"]
    exact = all(c["exact"] for c in checks)
    worst = max(c["max_rel_diff"] for c in checks)
    lines.append(
        f"| {s['median_ms']['entrain']:.0f} | {s['median_ms']['1f1b']:.0f} | {s['real_ratio']:.3f} "
        f"({s['spread'][0]:.3f}-{s['spread'][1]:.3f}) | {'yes' if s['real_met'] else '**no**'} | "
        f"{s['sim_ms']['entrain']:.0f} | {s['sim_ms']['1f1b']:.0f} | {s['sim_ratio']:.3f} | {s['sim_rel_error']:+.1%} | "
        f"{s['busiest_cpu_ratio']:.3f} ({min(s['busiest_cpu_ratios']):.3f}-{max(s['busiest_cpu_ratios']):.3f}) | "
        f"{'yes' if exact else '**no**'} ({worst:.1e}, {checks[0]['tol']:.0e}) |"
    )
    lines += ["", "Per-round ratios (launch order): "
              + ", ".join(f"{x:.3f} ({' then '.join(o)})" for x, o in zip(s["ratios"], res["orders"])), ""]  # fmt: skip
    lines += [
        "| system | plan (round 0) | per-rank CPU / wall | per-rank CPU ms a step | sim busy ms per rank (round 0) | "
        "per-stage fwd + bwd ms a step |",
        "|---|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        runs = [r[system] for r in res["per_round"]]
        cw = " / ".join(f"{x:.2f}" for x in _median_list([r["cpu_over_wall_per_rank"] for r in runs]))
        cpu = " / ".join(f"{x:.0f}" for x in _median_list([r["cpu_ms_per_rank"] for r in runs]))
        busy = " / ".join(f"{x:.0f}" for x in res["sim_busy_ms_per_rank"][system])
        st = " / ".join(f"{x:.0f}" for x in _median_list([r["stage_ms"] for r in runs]))
        p = res["plans"][system]
        lines.append(
            f"| {system} | {p['stages']}; K {p['num_microbatches']}; {p['setup']} | {cw} | {cpu} | {busy} | {st} |"
        )
    idle = res["idle"]
    lines += [
        "",
        "CPU / wall: each rank's process CPU time over the iteration's wall time (medians over kept steps, then "
        "rounds); on an idle machine the bottleneck rank is near 1.0 and the others wait. Sim busy ms: the simulator's "
        "compute time of each rank, beside its CPU ms. Per-stage ms: wall time inside each stage's forward and "
        "backward actions (stretched by other jobs where CPU / wall is low). Losses: every step's "
        "loss of both systems (warm-up step included) in every round, on the same samples "
        f"({'same' if all(c['same_samples'] for c in checks) else '**not the same**'} in every round).",
        "",
        (
            f"Idle check skipped; the CPUs were {idle['idle_fraction']:.0%} idle at the end of the pass"
            if idle["skipped"]
            else f"Idle check before the pass: {'passed' if idle['passed'] else 'NOT passed'} "
            f"({idle['idle_fraction']:.0%} idle)"
        )
        + "; 1-minute load average before each round: "
        + ", ".join(f"{x:.1f}" for x in res["load_before_round"])
        + f" ({cfg['cores']} cores).",
    ]
    if res.get("note"):
        lines += ["", f"Note: {res['note']}"]
    return "\n".join(lines) + "\n"


def record(out: Path, res: dict) -> str:
    """``res`` as the ``omni`` key of ``cpu_pipeline_paired.json`` in ``out`` and its section of the
    ``.md`` (``sections``, which ``cpu_paired`` renders after its own tables); the ``.md``'s text."""
    from cpu_paired import report as paired_report

    path = out / f"{STEM}.json"
    recorded = json.loads(path.read_text()) if path.exists() else {"results": {}, "idle": {}}
    recorded[KEY] = res
    recorded.setdefault("sections", {})[KEY] = report(res)
    path.write_text(json.dumps(recorded, indent=1))
    text = paired_report(recorded["results"], recorded["idle"], recorded.get("sources", []))
    text += "".join(recorded["sections"].values())
    (out / f"{STEM}.md").write_text(text)
    return text


def main_omni(args, idle: tuple[bool, float]) -> int:
    with tempfile.TemporaryDirectory(prefix="entrain-omni-ckpt-") as tmp:
        ckpt = Path(args.model_path) if args.model_path else write_checkpoint(Path(tmp) / "thinker")
        res = run(ckpt, args.launches, args.steps, args.order_seed)
    if args.model_path:
        res["config"]["checkpoint"] = "--model-path (given)"
    res["source"] = source()
    if args.skip_idle_check:  # record the machine's load all the same
        idle = (False, cpu_idle_fraction())
    res["idle"] = {"passed": idle[0], "idle_fraction": idle[1], "skipped": bool(args.skip_idle_check)}
    res["note"] = args.note
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record(out, res)
    print(report(res))
    return 0
