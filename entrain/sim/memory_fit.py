"""The simulated memory check of a system's plan (docs/cost_model.md, "The simulated check"):
activation recomputation where a rank overflows, Entrain's eager forwards within the 1F1B peak, and
the one-line error when nothing fits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from entrain.core.costs.costmodel import RECOMPUTE_MODES, CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.plan import Layout, StageSpec
from entrain.core.planning.encoders_plan import below_requested
from entrain.core.planning.setups import DECISION_MARGIN, SystemSetup, pick
from entrain.core.systems import ENTRAIN, get_system, systems_where
from entrain.core.workload.work import SampleWork
from entrain.sim.run import run_system

__all__ = [
    "MEMORY_FITTED",
    "SPLIT_STAGES",
    "deploy",
    "fit_memory",
    "escalate",
    "fit_memory_best",
    "from_peaks",
    "below_requested_by",
    "no_fit_message",
]


MEMORY_FITTED = systems_where("memory_fitted")
"""Systems whose configuration comes from Algorithm 2 (``SystemSpec.memory_fitted``)."""

_NEXT_RECOMPUTE = {m: RECOMPUTE_MODES[i + 1] for i, m in enumerate(RECOMPUTE_MODES[:-1])}

SPLIT_STAGES = systems_where("stage_chains")
"""Systems whose generator runs stage chains (``SystemSpec.stage_chains``; ``escalate``)."""


def _kept(cost: CostModel, comp: str, layer: int, mode: str) -> float:
    return cost.kept_bytes_per_token(comp, layer, layer + 1, mode)[0]


def _layers_up(cost: CostModel, st: StageSpec, need: float) -> int | None:
    """The fewest leading layers of ``st`` to move one recompute mode up whose kept bytes saving is at
    least the fraction ``need`` of the stage's kept bytes (None: only the whole stage would do)."""
    up = _NEXT_RECOMPUTE[st.recompute]
    layers = range(st.first_layer, st.end_layer)
    total = sum(_kept(cost, st.component, i, st.recompute) for i in layers)
    saved = 0.0
    for n, i in enumerate(layers, start=1):
        saved += _kept(cost, st.component, i, st.recompute) - _kept(cost, st.component, i, up)
        if n < len(layers) and total > 0 and saved >= need * total:
            return n
    return None


def _split_rank(cost: CostModel, own: Sequence[StageSpec], over_fraction: float) -> list[StageSpec] | None:
    """A rank's stages after one per-layer step, or None where only the whole rank moving up will do:
    one stage below ``full`` -> its fewest leading layers covering ``over_fraction`` of the held bytes
    as a stage of their own one mode up; a rank split so before -> that many more layers moved up."""
    if len(own) == 1 and own[0].recompute in _NEXT_RECOMPUTE:
        st = own[0]
        n = _layers_up(cost, st, over_fraction)
        if n is None:
            return None
        mid = st.first_layer + n
        return [
            replace(st, end_layer=mid, recompute=_NEXT_RECOMPUTE[st.recompute]),
            replace(st, first_layer=mid),
        ]
    if len(own) == 2 and own[0].component == own[1].component and own[1].recompute in _NEXT_RECOMPUTE:
        up, rest = own
        if up.recompute != _NEXT_RECOMPUTE[rest.recompute]:
            return None
        n = _layers_up(cost, rest, over_fraction) or rest.end_layer - rest.first_layer
        if n >= rest.end_layer - rest.first_layer:
            return [replace(up, end_layer=rest.end_layer)]  # the whole rank one mode up
        return [replace(up, end_layer=up.end_layer + n), replace(rest, first_layer=rest.first_layer + n)]
    return None


def escalate(layout: Layout, run, cost: CostModel, split: bool) -> Layout:
    """One step of the memory check for every rank whose simulated peak overflows: every stage of the
    rank one mode up ``RECOMPUTE_MODES``; with ``split`` (a generator that runs stage chains), per layer
    where that suffices: the fewest leading layers whose kept-bytes saving covers the overflow (a share
    of the rank's held activations, from the simulated peak) move up as a stage of their own on the
    same rank, and a rank split so before moves that many more."""
    limit = cost.hardware.device_memory_bytes
    peaks = run.metrics.peak_memory_bytes_per_rank or []
    states = run.metrics.model_state_bytes_per_rank or [0.0] * len(peaks)
    stages: list[StageSpec] = []
    for r in range(layout.ranks_per_replica):
        own = layout.stages_of(r)
        peak = peaks[r] if r < len(peaks) else 0.0
        if peak <= limit:
            stages += own
            continue
        held = peak - states[r]
        parts = _split_rank(cost, own, (peak - limit) / held) if split and held > 0 else None
        if parts is None:
            parts = [replace(st, recompute=_NEXT_RECOMPUTE.get(st.recompute, st.recompute)) for st in own]
        stages += parts
    return replace(layout, stages=tuple(replace(st, stage=i) for i, st in enumerate(stages)))


def _modes(layout: Layout) -> str:
    """Each stage's recompute mode, with its layers where a rank holds a split component."""
    pairs = zip(layout.stages, layout.stages[1:])
    if not any(x.pp_rank == y.pp_rank and x.component == y.component for x, y in pairs):
        return "/".join(st.recompute for st in layout.stages)
    return "/".join(f"{st.recompute}[{st.first_layer}:{st.end_layer}]" for st in layout.stages)


def fit_memory(
    system: str,
    setup: SystemSetup,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict | None = None,
    *,
    trace_iterations: int = 1,
    split: bool | None = None,
    assignments=None,
):
    """Simulate ``system``'s plan on ``batches``; while a pipeline rank's peak (model state + held
    activations + recomputation transient) exceeds device memory, take one ``escalate`` step (per layer
    for ``SPLIT_STAGES`` where that suffices, else every stage of each such rank one step up
    ``RECOMPUTE_MODES``; ``split`` False: always the latter) and simulate again. Returns ``(setup, run)``: the first plan that fits, else
    the last one tried (every overflowing rank already at ``full``; ``run.metrics.fits_memory`` is
    False). Algorithm 2 prices recomputation on a mean microbatch; this check sees the real ones.
    ``assignments``: the batches' split into replicas given (``run_system``)."""
    options = dict(setup.options if options is None else options)
    base = setup.source
    while True:
        run = run_system(
            system,
            setup.layout,
            batches,
            cost,
            options,
            trace_iterations=trace_iterations,
            assignments=assignments,
        )
        if run.metrics.fits_memory is not False:
            return setup, run
        layout = escalate(setup.layout, run, cost, split=system in SPLIT_STAGES if split is None else split)
        if layout.stages == setup.layout.stages:
            return setup, run
        setup = replace(setup, layout=layout, source=f"{base}; memory check: recompute {_modes(layout)}")


def fit_memory_best(
    system: str,
    setup: SystemSetup,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict | None = None,
    *,
    trace_iterations: int = 1,
    margin: float = 0.0,
    assignments=None,
):
    """``fit_memory`` from each start below; the ``recompute`` decision (``setups.pick``) among them:
    the planner's start escalated per rank (the default, the paper's answer: recomputation) unless
    another fitting plan simulates more than ``margin`` faster (0: the fastest; ties: the earlier):

    * the planner's recomputation per stage;
    * where the planner chose any, none at all: Algorithm 2 prices memory on a mean microbatch and
      picks one mode per stage, so its choice can exceed what the real microbatches need (a rank whose
      simulated peak has room still pays its recomputation); ``fit_memory`` then escalates only the
      ranks whose simulated peak overflows;
    * for Entrain, each start whose plan needed recomputation again with eager forwards within the
      plain 1F1B peak (``eager_budget_factor`` 1.0: fewer activations in flight, so less recomputation);
    * for ``SPLIT_STAGES``, each of these escalated per rank and, where it escalated at all, per layer
      (``escalate``): per layer is not always faster (many small steps can end above a whole rank's
      single step, and a split rank runs one more call per microbatch);
    * for Entrain's systems, where the planner's start needed recomputation and some replica got
      fewer microbatches than requested (``K_eff``, the paper's rule: one sample dwarfing the rest
      leaves a few large microbatches), the planner's start with the requested count
      (``REQUESTED``: ``ScheduleOptions.microbatch_count``): smaller microbatches hold fewer
      activations, so they can fit with less recomputation (mixture/Qwen3VL-8B: 96.2 -> 67.7 s);
    * for Entrain's systems, where the planner's start or the requested count's needed recomputation
      and runs the deferral pairs in the per-replica predicted best order (``pair_order`` ``"auto"``),
      that start with Algorithm 3's order (``PAPER_PAIRS``).

    The chosen setup carries the decision (``SystemSetup.decisions``). ``assignments``: the batches'
    split into replicas given (``fit_memory``; the judge's sub-cluster)."""
    options = dict(setup.options if options is None else options)
    found = _recompute_candidates(system, setup, batches, cost, options, trace_iterations, assignments)
    ms = {n: r.metrics.iteration_time_ms if r.metrics.fits_memory is not False else float("inf")
          for n, (_, r) in found.items()}  # fmt: skip
    d = pick("recompute", next(iter(found)), ms, margin)
    if d.candidates[d.chosen] == float("inf"):  # nothing fits: the last one tried, as before
        d = replace(d, chosen=min(found, key=lambda n: found[n][1].metrics.iteration_time_ms))
    got, run = found[d.chosen]
    return replace(got, decisions=(*got.decisions, d)), run


def _recompute_candidates(
    system: str,
    setup: SystemSetup,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict,
    trace_iterations: int,
    assignments=None,
) -> dict[str, tuple]:
    """``{name: (setup, run)}`` of ``fit_memory_best``'s starts, the planner's per rank first."""
    starts = {"planner": setup}
    bare = from_peaks(setup)
    if bare is not None:
        starts["from peaks"] = bare
    eager = options.get("eager_budget_factor", 1.25)
    found: dict[str, tuple] = {}

    def chains(name: str, start: SystemSetup, opts: dict, note: str = "") -> SystemSetup:
        """The start escalated per rank, then (where that escalated) per layer; the per-rank result."""
        whole = fit_memory(
            system, start, batches, cost, opts, trace_iterations=trace_iterations, split=False,
            assignments=assignments,
        )  # fmt: skip
        found[name + note] = _noted(whole, note)
        if system in SPLIT_STAGES and whole[0].layout != start.layout:
            split = fit_memory(
                system, start, batches, cost, opts, trace_iterations=trace_iterations, split=True,
                assignments=assignments,
            )  # fmt: skip
            found[f"{name} per layer{note}"] = _noted(split, note)
        return whole[0]

    queue = [(name, start, options) for name, start in starts.items()]
    for name, start, opts in queue:
        first = chains(name, start, opts)
        recomputes = any(st.recompute != "none" for st in first.layout.stages)
        if system == ENTRAIN and eager > 1.0 and recomputes:
            tight = {**opts, "eager_budget_factor": 1.0}
            chains(name, replace(start, options=tight), tight, ", eager 1.0")
        if name in ("planner", REQUESTED) and recomputes and opts.get("pair_order") == "auto":
            paper = {**opts, "pair_order": "paper"}
            source = f"{start.source}; the paper's pair order (memory)"
            paired = PAPER_PAIRS if name == "planner" else f"{name}, {PAPER_PAIRS}"
            queue.append((paired, replace(start, options=paper, source=source), paper))
        if name == "planner" and recomputes and below_requested_by(system, found[name][1]):
            more = {**opts, "microbatch_count": "requested"}
            source = f"{start.source}; the requested microbatch count (memory)"
            queue.append((REQUESTED, replace(start, options=more, source=source), more))
        if (
            name != TWO_RESOURCE
            and start is queue[-1][1]
            and get_system(system).extensions
            and options.get("assignment", "paper") == "paper"
            and all(run.metrics.fits_memory is False for _, run in found.values())
        ):  # nothing fits: the two-resource assignment at the requested count, once
            more = {**options, "assignment": "two-resource", "microbatch_count": "requested"}
            source = f"{setup.source}; the two-resource assignment at the requested microbatch count (memory)"
            queue.append((TWO_RESOURCE, replace(setup, options=more, source=source), more))
    return found


PAPER_PAIRS = "paper pair order"
"""``fit_memory_best``'s start with ``ScheduleOptions.pair_order`` ``"paper"`` where the planner's runs
``"auto"`` and recomputes: the predicted makespan that picks each replica's order does not see memory,
and an order chosen on it can hold more and need more recomputation on the run's batches than
Algorithm 3's (mixture + 1B, a40-paper, at the requested count: 61420 ms with ``auto``, 60624 ms with
the paper's order, which the planner's draws had put behind)."""

REQUESTED = "requested microbatches"
"""``fit_memory_best``'s start with ``ScheduleOptions.microbatch_count`` ``"requested"``."""

TWO_RESOURCE = "two-resource, requested microbatches"
"""``fit_memory_best``'s last start for Entrain's systems, only where no other start fits and the setup
runs the paper's assignment: ``ScheduleOptions.assignment`` ``"two-resource"`` at the requested count.
Algorithm 3's bins balance encoder work alone, so every sample without encoder work goes to the bin
that is lightest when the first of them arrives and stays lightest (its load does not grow): on
mixture / Qwen3VL-30B-A3B (DP 1, 127 text-only samples of 512) one LLM microbatch held 77 samples and
222,771 LLM tokens at the requested 128 microbatches (237,525 at ``K_eff`` 29), the two-resource
assignment's largest 24,626, and no start of the paper's assignment fitted 48 GB (74.6 GB on an LLM
rank). Fitting plans are unchanged: the start is tried only where none fits."""


def below_requested_by(system: str, run) -> bool:
    """Whether ``system`` reads ``microbatch_count`` (Entrain's) and some replica of ``run``'s plan has
    fewer encoder microbatches than the requested count allows it (``encoders_plan.below_requested``)."""
    return get_system(system).extensions and below_requested(run.plan)


def from_peaks(setup: SystemSetup) -> SystemSetup | None:
    """``setup`` without the planner's recomputation (every stage ``none``), for ``fit_memory`` to add
    it where the simulated peaks need it; None where the planner chose none."""
    if all(st.recompute == "none" for st in setup.layout.stages):
        return None
    bare = tuple(replace(st, recompute="none") for st in setup.layout.stages)
    source = f"{setup.source}; recompute from the simulated peaks"
    return replace(setup, layout=replace(setup.layout, stages=bare), source=source)


def _noted(found: tuple, note: str) -> tuple:
    if not note:
        return found
    got, run = found
    return replace(got, source=f"{got.source}; eager_budget_factor 1.0 (memory)"), run


def deploy(
    system: str,
    setup: SystemSetup,
    batches: Sequence[Sequence[SampleWork]],
    cost: CostModel,
    options: dict | None = None,
    margin: float | None = None,
):
    """``(setup, run)`` a command hands on (``plan``'s file, ``simulate``'s result): an Algorithm 2
    system's after the simulated memory check (``fit_memory_best``; ``margin``, by default
    ``DECISION_MARGIN``, applies to Entrain's; a baseline takes its fastest plan), Entrain's refused with
    ``no_fit_message`` when even that does not fit; any other system's as planned, simulated."""
    options = dict(setup.options if options is None else options)
    if system not in MEMORY_FITTED:
        return setup, run_system(system, setup.layout, batches, cost, options)
    if not get_system(system).extensions:
        margin = 0.0
    elif margin is None:
        margin = DECISION_MARGIN
    setup, run = fit_memory_best(system, setup, batches, cost, options, margin=margin)
    if system == ENTRAIN and run.metrics.fits_memory is False:
        raise ConfigError(no_fit_message(run, batches, cost))
    return setup, run


PIXELS_PER_VIT_PATCH = 14 * 14


def no_fit_message(run, batches: Sequence[Sequence[SampleWork]], cost: CostModel) -> str:
    """One line for a plan that does not fit even with recomputation on every overflowing rank: the
    fullest rank, the largest sample of the component it holds, and what would make it fit."""
    layout, m = run.layout, run.metrics
    limit = cost.hardware.device_memory_bytes
    peaks = m.peak_memory_bytes_per_rank or [0.0]
    r = max(range(len(peaks)), key=peaks.__getitem__)
    state = (m.model_state_bytes_per_rank or [0.0] * len(peaks))[r]
    comps = {st.component for st in layout.stages_of(r)}
    comp = "encoder" if "encoder" in comps else "llm"
    need = (peaks[r] - state) / max(limit - state, 1.0) if limit > state else float("inf")
    metas = [s.meta for b in batches for s in b if s.meta is not None]
    modes = "/".join(sorted({st.recompute for st in layout.stages_of(r)}))
    head = (
        f"no plan fits in device memory ({limit / 1e9:.1f} GB): pipeline rank {r} ({comp}, recompute {modes}) "
        f"needs {peaks[r] / 1e9:.1f} GB"
    )
    cut = (
        "; encoder microbatches already cut into sub-microbatches"
        if "memory_split" in run.plan.options
        else ""
    )
    if not metas:
        return f"{head}; use more GPUs per replica (--gpus, --tp) or a smaller --microbatch-size{cut}"
    if comp == "encoder":
        big = max(metas, key=lambda x: (x.vit_patches, x.id))
        size = f"{big.vit_patches} ViT patches in {len(big.images)} image(s)"
        patches = max(big.vit_patches_per_image)
        fix = f", --max-pixels {int(patches * PIXELS_PER_VIT_PATCH / max(need, 1.0)) // 784 * 784} or lower"
    else:
        big = max(metas, key=lambda x: (x.llm_tokens, x.id))
        size, fix = f"{big.llm_tokens} LLM tokens", ""
    more = "" if need == float("inf") else f" (about {need:.1f}x the activation room)"
    return (
        f"{head}; the largest sample is {big.id!r} ({size}); to fit: more GPUs per replica{more} "
        f"(--gpus, --tp), a smaller --microbatch-size{fix}{cut}"
    )
