"""The Plans behind tests/golden/*.txt, and the command that rewrites those files.

Two kinds: hand-built assignments through each schedule generator (``<system>.txt``), and Plans of
the real path, each system's own batcher then its generator (``real-<system>.txt``, with the
assignment). tests/sim/test_golden.py only compares; regenerate, after checking the diff is
intended, with

    python -m tests.sim.golden_plans
"""

from __future__ import annotations

import pathlib
import sys

from entrain.core.ir.plan import Plan
from entrain.core.systems import generate_plan, plan_system
from tests.sim.fixtures import (
    colocated_layout,
    deferral_assignment,
    disjoint_layout,
    one_iteration,
    plain_assignment,
    raw_samples,
    toy_cost,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"
REGENERATE = "python -m tests.sim.golden_plans"

GROUPS = [["a", "b"], ["c"], ["d", "e"], ["f"], ["g", "h"]]
WORKS = {
    "a": (4, 1),
    "b": (2, 6),
    "c": (5, 1),
    "d": (3, 2),
    "e": (3, 5),
    "f": (6, 1),
    "g": (1, 1),
    "h": (1, 1),
}
HAND_BUILT = ("1f1b", "disttrain", "entrain", "entrain-1f1b", "dip", "dip-greedy")

# 12 samples, one replica, K = 4: texts of very different length, so Entrain defers
REAL_WORKS = {
    f"r{i:02d}": (float(e), float(w))
    for i, (e, w) in enumerate(
        [(6, 30), (5, 2), (4, 3), (6, 25), (3, 4), (5, 18), (4, 2), (6, 3), (2, 12), (3, 1), (5, 2), (4, 9)]
    )
}
REAL = ("1f1b", "disttrain", "entrain", "entrain-1f1b", "dip")


def hand_built_plan(system: str) -> Plan:
    cost = toy_cost(enc_layers=4, llm_layers=4, act_bytes_per_token=10.0)
    samples = raw_samples({k: (float(e), float(w)) for k, (e, w) in WORKS.items()})
    if system.startswith("dip"):
        layout = colocated_layout(2, k=5)
        asg = one_iteration(plain_assignment(GROUPS))
        options = {"dip_encoder_cap_patches": 0.4, "dip_llm_cap_tokens": 0.4}
    else:
        layout = disjoint_layout(2, 2, k=5)
        deferred = {"b": (0, 1), "e": (2, 3)} if system.startswith("entrain") else {}
        asg = one_iteration(deferral_assignment(GROUPS, deferred))
        options = {}
    return generate_plan(system, layout, asg, samples, cost, options)


def real_plan(system: str) -> Plan:
    """``system``'s batcher assigns the 12 samples, then its generator lowers the iteration."""
    cost = toy_cost(enc_layers=4, llm_layers=4, act_bytes_per_token=10.0)
    batch = list(raw_samples(REAL_WORKS).values())
    layout = colocated_layout(2, k=4, microbatch_size=3) if system.startswith("dip") else None
    layout = layout or disjoint_layout(2, 2, k=4, microbatch_size=3)
    return plan_system(system, layout, [batch], cost, {})


def grid(plan: Plan) -> str:
    """One row per rank of the lowered action list; with ``assignment``, the replicas' microbatches."""
    it = plan.iterations[0]
    lines = [f"# {plan.system}: one row per rank (lowered action list)"]
    lines += [f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in sorted(it.actions.items())]
    return "\n".join(lines) + "\n"


def assignment_text(plan: Plan) -> str:
    lines = []
    for i, rep in enumerate(plan.iterations[0].assignment.replicas):
        lines.append(f"# replica {i}: K_eff {rep.k_eff}, execution order {list(rep.execution_order)}")
        lines += [f"encoder {m}: {' '.join(mb)}" for m, mb in enumerate(rep.encoder_microbatches)]
        lines += [f"llm {m}: {' '.join(mb)}" for m, mb in enumerate(rep.llm_microbatches)]
        lines += [f"defer {d.id}: {d.from_mb} -> {d.to_mb}" for d in rep.deferrals]
    return "\n".join(lines) + "\n"


def golden_texts() -> dict[str, str]:
    """File name -> expected text of every golden file."""
    out = {f"{s}.txt": grid(hand_built_plan(s)) for s in HAND_BUILT}
    for s in REAL:
        plan = real_plan(s)
        out[f"real-{s}.txt"] = assignment_text(plan) + grid(plan)
    return out


def main() -> int:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, text in golden_texts().items():
        path = GOLDEN / name
        old = path.read_text() if path.exists() else None
        path.write_text(text)
        print(f"{'unchanged' if old == text else 'new' if old is None else 'rewritten'}: {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
