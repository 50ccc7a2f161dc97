"""Hand-made cost models, layouts and assignments for the schedule and simulator tests (no planner
or batcher needed)."""

from __future__ import annotations

from entrain.core.costs.costmodel import ComponentCost, CostModel, HardwareSpec, LayerCost, Quadratic
from entrain.core.ir.microbatches import Deferral, IterationAssignment, ReplicaAssignment
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.workload.work import SampleWork

KEY = "tp1cp1"


def toy_cost(
    *,
    enc_layers: int = 4,
    llm_layers: int = 4,
    fwd_ms_per_token: float = 1.0,
    bwd_ms_per_token: float = 2.0,
    call_ms: float = 0.0,
    act_bytes_per_token: float = 10.0,
    out_bytes_per_token: float = 0.0,
    param_bytes: float = 0.0,
    latency_ms: float = 0.0,
) -> CostModel:
    """Linear per-layer costs: every layer ``fwd_ms_per_token * x + call_ms`` forward, likewise backward."""

    def layers(prefix: str, n: int) -> tuple[LayerCost, ...]:
        return tuple(
            LayerCost(
                f"{prefix}{i}",
                "block",
                {KEY: Quadratic(0.0, fwd_ms_per_token, call_ms)},
                {KEY: Quadratic(0.0, bwd_ms_per_token, call_ms)},
                activation_bytes_per_token=act_bytes_per_token,
                output_bytes_per_token=out_bytes_per_token,
                param_bytes=param_bytes,
            )
            for i in range(n)
        )

    hw = HardwareSpec(
        "toy",
        p2p_latency_ms=latency_ms,
        p2p_bandwidth_bytes_per_ms=1e6,
        allreduce_bandwidth_bytes_per_ms=1e6,
        allreduce_latency_ms=0.0,
    )
    return CostModel(
        "toy",
        hw,
        ComponentCost("encoder", layers("e", enc_layers)),
        ComponentCost("llm", layers("l", llm_layers)),
    )


def split(n_layers: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(n_layers, parts)
    out, first = [], 0
    for i in range(parts):
        end = first + base + (1 if i < extra else 0)
        out.append((first, end))
        first = end
    return out


def disjoint_layout(
    enc_pp: int,
    llm_pp: int,
    *,
    dp: int = 1,
    k: int = 4,
    enc_layers: int = 4,
    llm_layers: int = 4,
    microbatch_size: int = 1,
) -> Layout:
    stages = []
    for i, (a, b) in enumerate(split(enc_layers, enc_pp)):
        stages.append(StageSpec(i, "encoder", a, b, i))
    for j, (a, b) in enumerate(split(llm_layers, llm_pp)):
        stages.append(StageSpec(enc_pp + j, "llm", a, b, enc_pp + j))
    return Layout(
        dp,
        microbatch_size,
        k,
        {"encoder": ComponentLayout(pp=enc_pp), "llm": ComponentLayout(pp=llm_pp)},
        tuple(stages),
    )


def colocated_layout(
    pp: int, *, dp: int = 1, k: int = 4, enc_layers: int = 4, llm_layers: int = 4, microbatch_size: int = 1
) -> Layout:
    stages = [StageSpec(i, "encoder", a, b, i) for i, (a, b) in enumerate(split(enc_layers, pp))]
    stages += [StageSpec(pp + j, "llm", a, b, j) for j, (a, b) in enumerate(split(llm_layers, pp))]
    return Layout(
        dp,
        microbatch_size,
        k,
        {"encoder": ComponentLayout(pp=pp), "llm": ComponentLayout(pp=pp)},
        tuple(stages),
    )


def raw_samples(works: dict[str, tuple[float, float]]) -> dict[str, SampleWork]:
    return {sid: SampleWork(sid, enc, llm) for sid, (enc, llm) in works.items()}


def plain_assignment(groups: list[list[str]], order: list[int] | None = None) -> ReplicaAssignment:
    mbs = tuple(tuple(g) for g in groups)
    return ReplicaAssignment(len(mbs), mbs, mbs, tuple(order or range(len(mbs))))


def deferral_assignment(groups: list[list[str]], deferred: dict[str, tuple[int, int]]) -> ReplicaAssignment:
    """``deferred``: sample id -> (from, to) encoder microbatch indices (execution order = index order)."""
    enc = tuple(tuple(g) for g in groups)
    llm = [[s for s in g if s not in deferred] for g in groups]
    for sid, (_, to) in sorted(deferred.items()):
        llm[to].append(sid)
    return ReplicaAssignment(
        len(enc),
        enc,
        tuple(tuple(g) for g in llm),
        tuple(range(len(enc))),
        tuple(Deferral(s, f, t) for s, (f, t) in sorted(deferred.items())),
    )


def one_iteration(*replicas: ReplicaAssignment) -> list[IterationAssignment]:
    return [IterationAssignment(tuple(replicas))]


def draw_grouped_work(draw, st, max_mbs: int, max_per_mb: int, min_mbs: int = 1):
    """Hypothesis helper: random microbatch groups of sample ids, per-sample (encoder, llm) work and
    deferrals (the last sample of every other microbatch, to the next one, when drawn)."""
    k = draw(st.integers(min_mbs, max_mbs))
    per_mb = [draw(st.integers(1, max_per_mb)) for _ in range(k)]
    ids = [f"s{i}" for i in range(sum(per_mb))]
    works = {s: (draw(st.floats(0.5, 20.0)), draw(st.floats(0.5, 20.0))) for s in ids}
    groups, i = [], 0
    for n in per_mb:
        groups.append(ids[i : i + n])
        i += n
    deferred = {}
    for j in range(0, k - 1, 2):
        if len(groups[j]) > 1 and draw(st.booleans()):
            deferred[groups[j][-1]] = (j, j + 1)
    return groups, works, deferred
