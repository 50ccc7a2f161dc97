"""Plots of simulated runs (matplotlib, Agg backend; imported lazily by the CLI).

* ``gantt``: one iteration of replica 0, one row per pipeline rank, forward / backward boxes
  coloured by modality (like paper Fig. 12).
* ``fwd_time``: per-microbatch encoder and LLM forward time of each system, one line per replica
  of the first iteration (like paper Fig. 15).
* ``memory``: activation memory over the first iteration per pipeline rank for each system, and
  the peak per rank (like paper Fig. 13).
"""

from __future__ import annotations

from collections.abc import Sequence

from entrain.core.ir.plan import ActionKind
from entrain.sim.metrics import per_microbatch_fwd_ms
from entrain.sim.run import SystemRun

__all__ = ["gantt", "gantt_bars", "span_bars", "fwd_time", "memory", "write_all"]

_COLORS = {
    ("encoder", "F"): "#4C72B0",
    ("encoder", "B"): "#A6BDDB",
    ("llm", "F"): "#DD8452",
    ("llm", "B"): "#F5C7A3",
}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt_bars(ax, bars: Sequence[tuple[int, str, str, float, float]], num_ranks: int, title: str) -> None:
    """Draw ``(pipeline rank, component, kind F/B/I/W, start ms, end ms)`` boxes on ``ax`` (seconds)."""
    plt = pyplot()
    for r, comp, kind, start_ms, end_ms in bars:
        ax.barh(
            r,
            (end_ms - start_ms) / 1e3,
            left=start_ms / 1e3,
            height=0.8,
            color=_COLORS[(comp, "F" if kind == "F" else "B")],
            edgecolor="black",
            linewidth=0.2,
        )
    ax.set_yticks(range(num_ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(num_ranks)])
    ax.set_ylim(num_ranks - 0.5, -0.5)
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    ax.legend(handles, [f"{c} {k}" for c, k in _COLORS], loc="upper right", fontsize=8)


def span_bars(layout, spans) -> list[tuple[int, str, str, float, float]]:
    """``gantt_bars`` input of simulated spans (compute actions)."""
    return [
        (
            layout.replica_of(s.rank)[1],
            layout.stages[s.action.stage].component,
            ActionKind(s.action.kind).value,
            s.start_ms,
            s.end_ms,
        )
        for s in spans
    ]


def gantt(run: SystemRun, path: str) -> None:
    plt = pyplot()
    layout = run.layout
    it = run.iterations[0]
    p = layout.ranks_per_replica
    fig, ax = plt.subplots(figsize=(14, 0.45 * p + 1.5))
    title = f"{run.system}: iteration 0, replica 0 ({it.iteration_time_ms / 1e3:.2f} s with all-reduce)"
    gantt_bars(ax, span_bars(layout, it.replicas[0].spans), p, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fwd_time(runs: Sequence[SystemRun], path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(runs), figsize=(3.6 * len(runs), 5.5), squeeze=False, sharey="row")
    for col, run in enumerate(runs):
        for rep in run.iterations[0].replicas:
            enc, llm = per_microbatch_fwd_ms(run.layout, rep)
            axes[0][col].plot(enc, marker=".", linewidth=0.8)
            axes[1][col].plot(llm, marker=".", linewidth=0.8)
        axes[0][col].set_title(run.system)
        axes[1][col].set_xlabel("microbatch (execution order)")
    axes[0][0].set_ylabel("encoder fwd (ms)")
    axes[1][0].set_ylabel("LLM fwd (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory(runs: Sequence[SystemRun], path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(3.6 * (len(runs) + 1), 3.8), squeeze=False)
    for col, run in enumerate(runs):
        rep = run.iterations[0].replicas[0]
        for g, steps in sorted(rep.memory.items()):
            xs = [t / 1e3 for t, _ in steps]
            ys = [b / 1e9 for _, b in steps]
            axes[0][col].step(
                xs, ys, where="post", linewidth=0.8, label=f"rank {run.layout.replica_of(g)[1]}"
            )
        axes[0][col].set_title(run.system)
        axes[0][col].set_xlabel("time (s)")
    axes[0][0].set_ylabel("activation memory (GB)")
    axes[0][0].legend(fontsize=6)
    ax = axes[0][-1]
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        peaks = run.metrics.peak_activation_bytes_per_rank
        ax.bar([r + i * width for r in range(len(peaks))], [b / 1e9 for b in peaks], width, label=run.system)
    ax.set_xlabel("pipeline rank")
    ax.set_title("peak per rank (GB)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(runs: Sequence[SystemRun], out_dir: str) -> list[str]:
    """``gantt_<system>.png`` per system, ``fwd_time.png`` and ``memory.png`` under ``out_dir``."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for run in runs:
        path = os.path.join(out_dir, f"gantt_{run.system}.png")
        gantt(run, path)
        paths.append(path)
    for name, fn in (("fwd_time.png", fwd_time), ("memory.png", memory)):
        path = os.path.join(out_dir, name)
        fn(runs, path)
        paths.append(path)
    return paths
