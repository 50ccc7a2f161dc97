"""Each system's own configuration (docs/design.md §2), chosen the way its method would choose it
(``SystemSpec.config`` in ``entrain.core.systems``). ``simulate``, ``bench`` and ``train`` (without
``--plan``) all configure systems here; the profiling samples come from the caller's ``Sampler``.

* ``entrain``, ``entrain-1f1b``, ``1f1b``: Algorithm 1 (``b_min``) then Algorithm 2 on the
  ``b_min`` reference batch (``planning.entry.plan``).
* ``disttrain``: Algorithm 2 on one profiled sample (``planning.baselines.disttrain_profile_sample``).
* ``encoder-rebalance``: DistTrain's (above).
* ``dflop``: Algorithm 2 on a draw of a global batch (DFLOP's data-aware parallelism optimizer picks
  each module's layout from the input distribution; ``batching.dflop`` lists the differences).
* ``disttrain-paper``: the paper's Table 1 DistTrain config (``planning.baselines.paper_table1_config``).
* ``dip``, ``dip-greedy``: the colocated layout over all ``gpus / (dp * tp)`` ranks of a replica
  (dp: ``--dp``, else Entrain's planner's choice when it ran, else 4)
  ``planning.baselines.dip_layout`` from a 4-sample profile (one microbatch), whose mean per-sample ViT
  patches and LLM tokens, doubled, cap the sub-microbatches.

Configs are computed once per (system kind, dataset, cost model) and shared by systems that use
the same one.

Entrain extensions (ours, not the paper's; ``ConfigRequest.entrain_layout`` and
``ConfigRequest.entrain_ramp`` and ``ConfigRequest.entrain_split``, all ``"auto"`` by default;
``"disjoint"``, ``0`` and off give the paper's Entrain):

Every ``"auto"`` is a decision by simulation (``DECISIONS``, ``entrain_variant``; docs/planner.md,
"Decisions by simulation"): the candidates are simulated on the planner's draws (the caller's
``CandidateJudge``) and the paper's default is left only for a candidate more than the decision margin
(``DECISION_MARGIN``, ``ConfigRequest.decision_margin``) faster; each is recorded in
``SystemSetup.decisions``.

* ``entrain_layout``: ``"shared"`` = the boundary-sharing layout (``planning.boundary.boundary_sharing_config``)
  over the ranks of Algorithm 2's configuration (same TP, CP, DP and GPU count); ``"auto"`` = that
  layout when it fits memory and simulates more than the margin faster than the disjoint one
  on the planner's draws (without a judge, the disjoint layout). Not by
  Eq. 2: its time is never higher for the shared layout (the disjoint split is one of the partitions
  it considers), and a 0.2 % Eq. 2 lead was a 5 % simulated loss on the paper's headline case.
  Applies to ``entrain`` and ``entrain-1f1b``; ``1f1b`` keeps the disjoint layout (a baseline).
* ``entrain_ramp``: ``ScheduleOptions.ramp_microbatches`` for ``entrain`` and ``entrain-1f1b``.
* ``entrain_split``: ``ScheduleOptions.split_weight_grads`` for ``entrain`` and ``entrain-1f1b``
  (``True``, ``False`` or ``"auto"``: split only where it simulates more than the margin faster than
  whole backwards; a split backward costs its own extra where the cost model says so,
  ``LayerCost.split_extra_fraction``; without a judge, split).
* ``entrain_assignment``: ``ScheduleOptions.assignment`` for ``entrain`` and ``entrain-1f1b``
  (``"auto"`` by default: ``"paper"``, ``"two-resource"`` or ``"auto"`` (per replica and iteration,
  whichever has the lower predicted makespan), decided by simulation, then the DP re-split
  (``ScheduleOptions.dp_resplit``); ``"paper"`` gives the paper's Entrain).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from entrain.core.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.parallel import ParallelConfig
from entrain.core.plan import Layout
from entrain.core.plan_file import check_stage_ranges, load_plan_dict
from entrain.core.planning.baselines import dip_layout, disttrain_profile_sample, paper_table1_config
from entrain.core.planning.bmin import EQ2_TOLERANCE, BMinConfig
from entrain.core.planning.boundary import boundary_sharing_config
from entrain.core.planning.config_search import evaluate_config, search_candidates, search_config
from entrain.core.planning.entry import PlanResult, plan
from entrain.core.planning.profile import MacroscopicProfiler, Sampler, draw_seed
from entrain.core.schedules.common import BACKWARD_ORDERS, ScheduleOptions, has_fused_rank
from entrain.core.systems import (
    CONFIG_DFLOP,
    CONFIG_DIP,
    CONFIG_DISTTRAIN,
    CONFIG_DISTTRAIN_PAPER,
    CONFIG_ENTRAIN,
    DISTTRAIN,
    get_system,
)
from entrain.core.work import SampleWork

__all__ = [
    "SystemSetup",
    "ConfigRequest",
    "system_setups",
    "config_kind",
    "entrain_variant",
    "ENTRAIN_LAYOUTS",
    "LAYOUT_MARGIN",
    "DECISION_MARGIN",
    "DECISIONS",
    "Decision",
    "CandidateJudge",
    "departs",
    "pick",
    "decide",
    "tied_configs",
    "entrain_setup",
    "fixed_stage_setup",
    "setup_to_json",
    "read_plan_file",
    "PLAN_FILE_KEYS",
]


@dataclass(frozen=True)
class ConfigRequest:
    dataset: str
    model: str
    gpus: int
    dp: int | None
    tp: int
    global_batch: int
    microbatch_size: int
    seed: int = 0
    extra_sizes: tuple[int, ...] = ()
    """Extra Algorithm 1 batch sizes to report trials for (``bench paper``: 1, 4, 16, 64, 256)."""
    entrain_layout: str = "auto"
    """``"disjoint"`` (paper), ``"shared"`` (boundary sharing) or ``"auto"`` (shared if it simulates
    more than ``LAYOUT_MARGIN`` faster)."""
    entrain_ramp: int | str = "auto"
    """Entrain's ``ramp_microbatches`` (0 = paper's schedule)."""
    entrain_split: bool | str = "auto"
    """Entrain's ``split_weight_grads``: True, False (the paper's schedule) or ``"auto"`` (decided by
    simulation, ``DECISIONS``)."""
    entrain_assignment: str = "auto"
    """Entrain's ``ScheduleOptions.assignment`` (``"paper"`` = Algorithm 3)."""
    decision_margin: float | None = None
    """Fraction by which a candidate must simulate faster than the paper's default for an automatic
    choice to depart from it (None: ``DECISION_MARGIN``; ``--decision-margin PCT``)."""

    @property
    def margin(self) -> float:
        return DECISION_MARGIN if self.decision_margin is None else self.decision_margin

    @property
    def parallel(self) -> ParallelConfig:
        """The request's GPUs, DP, TP (CP 1) and batch sizes, as the planning functions take them."""
        return ParallelConfig(
            gpus=self.gpus,
            dp=self.dp,
            tp=self.tp,
            global_batch=self.global_batch,
            microbatch_size=self.microbatch_size,
        )


@dataclass
class SystemSetup:
    layout: Layout
    options: dict
    """Schedule options (``ScheduleOptions`` fields) this configuration fixes."""
    source: str
    """How the config was chosen, for reports."""
    b_min: int | None = None
    b_min_result: object | None = None
    """``planning.bmin.BMinResult`` of Entrain's planner (trial table), when it ran."""
    profile: object | None = None
    """The profile the config was searched on (``SampleStats`` or samples)."""
    config: object | None = None
    """Algorithm 2's ``StaticConfig`` (Entrain's planner), when it ran."""
    batch_profile: object | None = None
    """Entrain's planner: a draw of the global batch's size (``SampleStats``), on which the
    boundary-sharing layout is also partitioned (a ``layout`` candidate, ``_entrain_layout``)."""
    decisions: tuple[Decision, ...] = ()
    """The automatic choices made for this setup, each with its candidates' simulated times."""


def config_kind(system: str) -> str:
    return get_system(system).config


def _setup(kind: str, req: ConfigRequest, cost: CostModel, sampler: Sampler) -> SystemSetup:
    if kind == CONFIG_ENTRAIN:
        res = plan(sampler, cost, req.parallel, BMinConfig(seed=req.seed, extra_sizes=tuple(req.extra_sizes)))
        return entrain_setup(res, sampler, cost, req.seed)
    if kind == CONFIG_DISTTRAIN:
        one = disttrain_profile_sample(sampler, cost, seed=req.seed)
        cfg = search_config([one], cost, req.parallel)
        return SystemSetup(cfg.to_layout(), {}, "Algorithm 2 on one sample", profile=[one])
    if kind == CONFIG_DFLOP:
        profile = sampler(req.global_batch, draw_seed(req.seed, req.global_batch, 0xDF1))
        cfg = search_config(profile, cost, req.parallel)
        return SystemSetup(cfg.to_layout(), {}, "Algorithm 2 on a global-batch draw (DFLOP)", profile=profile)
    if kind == CONFIG_DISTTRAIN_PAPER:
        one = disttrain_profile_sample(sampler, cost, seed=req.seed)
        cfg = paper_table1_config(
            req.dataset, req.model, [one], cost, system=DISTTRAIN, global_batch=req.global_batch,
            microbatch_size=req.microbatch_size,
        )  # fmt: skip
        return SystemSetup(cfg.to_layout(), {}, "paper Table 1")
    profile = sampler(4, draw_seed(req.seed, 4, 0xD1B))
    dp = req.dp or max(1, min(4, req.gpus // (2 * req.tp)))  # 4, or fewer replicas on a few GPUs
    pp = req.gpus // (dp * req.tp)
    if pp < 1:
        raise ConfigError(f"dip: --gpus {req.gpus} cannot hold dp {dp} x tp {req.tp}")
    layout = dip_layout(profile, cost, replace(req.parallel, dp=dp), pp=pp)
    return SystemSetup(
        layout, _dip_caps(profile, cost, req.tp), "colocated, 4-sample profile", profile=profile
    )


def entrain_setup(res: PlanResult, sampler: Sampler, cost: CostModel, seed: int) -> SystemSetup:
    """Entrain's setup from the planner's result (Algorithm 1 + 2), before the extensions."""
    profiler = MacroscopicProfiler(sampler, cost, seed=seed)
    profile = profiler.draw(res.b_min.b_min, 0)[1]
    batch = (
        profiler.draw(res.config.global_batch, 0)[1] if res.config.global_batch > res.b_min.b_min else None
    )
    source = f"Algorithm 1+2 (b_min={res.b_min.b_min})"
    return SystemSetup(
        res.config.to_layout(), {}, source, res.b_min.b_min, res.b_min, profile, config=res.config,
        batch_profile=batch,
    )  # fmt: skip


def fixed_stage_setup(
    system: str,
    req: ConfigRequest,
    cost: CostModel,
    profile,
    encoder_stages: int,
    llm_stages: int,
    judge: CandidateJudge | None = None,
) -> SystemSetup:
    """``system``'s setup with the stage counts fixed (``train --encoder-stages/--llm-stages``): the
    layers split by Algorithm 2's partitioner (``planning.config_search.evaluate_config``) over ``profile``, on
    ``req.dp`` replicas; Entrain's extensions as ``req`` asks (``entrain_variant``, ``judge``)."""
    tp = req.tp  # the GPU count is the layout's (req.gpus may be unset)
    parallel = ParallelConfig(
        dp=req.dp or 1, tp=tp, global_batch=req.global_batch, microbatch_size=req.microbatch_size
    )
    source = f"stages fixed by flags ({encoder_stages} encoder + {llm_stages} LLM), Algorithm 2's partition"
    spec = get_system(system)
    if spec.colocated:
        if encoder_stages != llm_stages:
            raise ConfigError(
                f"{system}: colocated layouts need equal stage counts, got {encoder_stages} + {llm_stages}"
            )
        layout = dip_layout(profile, cost, parallel, pp=encoder_stages)
        return SystemSetup(layout, _dip_caps(profile, cost, tp), source, profile=profile)
    cfg = evaluate_config(profile, cost, parallel, encoder=(tp, 1, encoder_stages), llm=(tp, 1, llm_stages))
    setup = SystemSetup(cfg.to_layout(), {}, source, profile=profile, config=cfg)
    if spec.extensions:
        return entrain_variant(setup, req, cost, judge, ties=False)
    return setup


PLAN_FILE_KEYS = ("system", "layout", "schedule_options", "microbatch_size", "global_batch")
"""What ``entrain plan --out`` adds to the ``--json`` object so ``entrain train --plan`` can run it."""


def setup_to_json(system: str, setup: SystemSetup) -> dict:
    """The plan-file keys (``PLAN_FILE_KEYS``) of ``system``'s setup, plus how it was chosen."""
    layout = setup.layout
    return {
        "system": system,
        "layout": layout.to_json(),
        "schedule_options": dict(setup.options),
        "microbatch_size": layout.microbatch_size,
        "global_batch": layout.global_batch,
        "source": setup.source,
    }


def read_plan_file(
    path: str, *, expect_model: str | None = None, layer_counts: dict[str, int] | None = None
) -> tuple[str, SystemSetup]:
    """``(system, setup)`` of a plan file (``entrain plan --out``), checked completely
    (``entrain.core.plan_file``: every field's name and type, each component's stages covering its
    ``layer_counts`` exactly once in order, valid pipeline ranks); ``ConfigError`` naming the file
    and the field otherwise, or when it is for another model than ``expect_model``."""
    d = load_plan_dict(path)
    by_content = bool(d.get("checkpoint_fingerprint"))  # train's apply_plan matched the folders' content
    if expect_model is not None and d["model"] != expect_model and not by_content:
        raise ConfigError(
            f"--plan {path} is for model {d['model']!r} but this run's model is {expect_model!r}"
        )
    check_stage_ranges(d["layout"], path, layer_counts)
    get_system(d["system"])
    layout = Layout.from_json(d["layout"])
    if (layout.microbatch_size, layout.global_batch) != (d["microbatch_size"], d["global_batch"]):
        raise ConfigError(
            f"--plan {path}: field 'layout' (microbatch size {layout.microbatch_size}, global batch "
            f"{layout.global_batch}) disagrees with 'microbatch_size' {d['microbatch_size']} / "
            f"'global_batch' {d['global_batch']}"
        )
    source = f"plan file {path}" + (f" ({d['source']})" if d.get("source") else "")
    return d["system"], SystemSetup(layout, dict(d["schedule_options"]), source, b_min=d.get("b_min"))


def _dip_caps(profile, cost: CostModel, tp: int) -> dict:
    metas = [p.meta if isinstance(p, SampleWork) else p for p in profile]
    if any(m is None for m in metas):
        return {}  # raw-work profile: the generator derives caps from linear-equivalent tokens
    n = max(1, len(metas))
    return {
        "dip_encoder_cap_patches": 2.0 * sum(m.vit_patches for m in metas) / n,
        "dip_llm_cap_tokens": 2.0 * sum(m.llm_tokens for m in metas) / n,
    }


ENTRAIN_LAYOUTS = ("auto", "shared", "disjoint")

DECISION_MARGIN = 0.0033
"""An automatic choice departs from the paper's default only when a candidate simulates more than this
fraction faster on the planner's draws (``CandidateJudge``; ``ConfigRequest.decision_margin``, flag
``--decision-margin PCT``). Derived from the simulator's measured error on such decisions, paired
(the same candidates compared on the same batches, so the errors both share cancel): the layout's
shared/disjoint ratio simulated on the judge's two draws differs from the same ratio on the run's own
batches by 0.3 % (median; 22 cheaper cases of benchmarks/regression.py; 1.3 % at most, 2.6 % where
neither fits); over every decision (``benchmarks/decision_error.py``: 26 candidate/default ratios
on 6 cases, judge's draws vs two other draws, |difference| / sqrt 2) one estimate errs by 0.33 %
(median; 1.3 % at the 90th percentile). The margin is that median: a departure is taken when its
simulated win is larger than the typical error of the estimate. At 0.5 % (above both medians) the
per-iteration assignment of LLaVA-150k + 3B (a40-paper) was kept at the paper's although the draws put
the two-resource one 0.48 % ahead (0.11-0.15 % on two other draws), and Entrain ran 0.77 % slower
than before the decisions, past the regression guard's 0.5 %. The paired sim-vs-real ratios measured on CPU
(benchmarks/results/sim_vs_real_*.md: Entrain / 1F1B simulated 0.827 vs real 0.974 on chartqa,
0.992 vs 1.106 on text-heavy) err by 10-15 %, dominated by per-action overheads the preset cost
model does not price; runs that plan with such a profile should pass
``--decision-margin`` of that size (docs/planner.md, "Decisions by simulation")."""

LAYOUT_MARGIN = DECISION_MARGIN
"""The layout decision's margin (``DECISION_MARGIN``; kept for its callers). Eq. 2 alone is not enough
to choose a layout: on the paper's headline case (SynthChartNet + Llama3-1B, seed 3) it put the
shared layout 0.2 % ahead (17161 vs 17198 ms) while the simulator puts it 5 % behind; at 1 %
LLaVA-150k + 1B (a40-paper) keeps the disjoint layout (draws: shared 0.97 % faster) and is 1.3 %
slower than with the shared one."""

CandidateJudge = Callable[[dict[str, "SystemSetup"]], dict[str, float]]
"""``{name: Entrain's setup} -> {name: simulated iteration ms}`` on the planner's draws (``inf`` for a
setup that does not fit device memory): the simulator, passed in by a layer that may import it
(``entrain.sim.choose.candidate_judge``); core does not simulate."""


@dataclass(frozen=True)
class Decision:
    """One automatic choice: each candidate's simulated iteration ms (on the planner's draws, or for
    ``recompute`` on the memory check's batches), the paper's ``default`` and the one ``chosen``."""

    name: str
    chosen: str
    candidates: dict[str, float]
    margin: float
    default: str

    def to_json(self) -> dict:
        finite = {k: (v if v != float("inf") else None) for k, v in self.candidates.items()}
        return {"name": self.name, "chosen": self.chosen, "candidates": finite, "margin": self.margin,
                "default": self.default}  # fmt: skip


def departs(default_ms: float, candidate_ms: float, margin: float = DECISION_MARGIN) -> bool:
    """Take the candidate instead of the paper's default only when it is faster by more than ``margin``."""
    return candidate_ms < default_ms * (1.0 - margin)


def pick(name: str, default: str, ms: dict[str, float], margin: float) -> Decision:
    """The ``Decision`` on simulated times ``ms``: the fastest other candidate where it ``departs``
    from ``default`` (ties: the earlier one), else ``default``."""
    others = [n for n in ms if n != default]
    best = min(others, key=ms.__getitem__, default=None)
    chosen = best if best is not None and departs(ms[default], ms[best], margin) else default
    return Decision(name, chosen, dict(ms), margin, default)


def decide(
    name: str, default: str, candidates: dict[str, SystemSetup], judge: CandidateJudge, margin: float
) -> tuple[SystemSetup, Decision]:
    """Simulate ``candidates`` (``judge``) and ``pick``; the chosen setup carries the decision."""
    d = pick(name, default, judge(candidates), margin)
    chosen = candidates[d.chosen]
    return replace(chosen, decisions=(*chosen.decisions, d)), d


def entrain_variant(
    setup: SystemSetup,
    req: ConfigRequest,
    cost: CostModel,
    judge: CandidateJudge | None = None,
    *,
    ties: bool = True,
) -> SystemSetup:
    """Entrain's setup with the extensions ``req`` asks for (layout, ramp, split weight gradients,
    assignment). With ``judge`` every automatic choice is decided by simulation (``DECISIONS``, in
    that order, each on the choices before it; ``ties`` False: Algorithm 2's configuration stays, as
    when flags fix the stage counts); without one, the paper's disjoint layout and the other
    ``"auto"`` options as given (decided per iteration by the cost model's prediction)."""
    if req.entrain_layout not in ENTRAIN_LAYOUTS:
        raise ConfigError(f"entrain layout {req.entrain_layout!r}; choose from {', '.join(ENTRAIN_LAYOUTS)}")
    current = replace(setup, options=_extension_options(setup.options, req))
    if not extended(req):  # the paper's Entrain (``--paper-entrain``): nothing to decide
        return current
    if judge is not None and ties:
        current = _decide_config(current, req, cost, judge)
    current = _entrain_layout(current, req, cost, judge)
    if judge is not None:
        current = _decide_options(current, req, judge)
    return replace(current, source=current.source + _notes(current.options))


DECISIONS = (
    "config", "layout", "assignment", "dp_split", "ramp", "split", "backward_order", "sub_microbatches",
    "encoder_rebalance", "recompute",
)  # fmt: skip
"""Every automatic choice, in the order it is made (``recompute``: by the memory check,
``entrain.sim.memory_fit.deploy``); docs/planner.md, "Decisions by simulation"."""

_OPTION_DEFAULTS = ScheduleOptions().to_json()


def _with_options(setup: SystemSetup, **delta) -> SystemSetup:
    """``setup`` with schedule options ``delta``; an option at ``ScheduleOptions``' default is left out
    (so equal plans have equal options)."""
    options = {**setup.options, **delta}
    options = {k: v for k, v in options.items() if k not in delta or v != _OPTION_DEFAULTS[k]}
    return replace(setup, options=options)


def _decide_options(setup: SystemSetup, req: ConfigRequest, judge: CandidateJudge) -> SystemSetup:
    """The schedule-option decisions: assignment (paper / two-resource / per-iteration auto), the DP
    re-split (only under a non-paper assignment), the ramp (0 / per-replica auto), the split backward
    (off / on, where ``entrain_split`` is ``"auto"``), its order (slot / per-b where a rank holds several
    stages; elsewhere both are one plan, simulated once), the memory split into sub-microbatches
    (off: recomputation alone; on) and the encoder's cross-replica rebalancing (off / on)."""
    m = req.margin
    if req.entrain_assignment == "auto":
        names = ("paper", "two-resource", "auto")
        setup = decide(
            "assignment", "paper", {n: _with_options(setup, assignment=n) for n in names}, judge, m
        )[0]
    cands = {"paper": setup}  # the paper's assignment keeps the paper's DP split
    if setup.options.get("assignment", "paper") != "paper":
        cands = {
            "paper": _with_options(setup, dp_resplit=False),
            "two-resource": _with_options(setup, dp_resplit=True),
        }
    setup = decide("dp_split", "paper", cands, judge, m)[0]
    if req.entrain_ramp == "auto":
        ramps = {
            "0": _with_options(setup, ramp_microbatches=0),
            "auto": _with_options(setup, ramp_microbatches="auto"),
        }
        setup = decide("ramp", "0", ramps, judge, m)[0]
    if req.entrain_split == "auto":
        splits = {s: _with_options(setup, split_weight_grads=s == "on") for s in ("off", "on")}
        setup = decide("split", "off", splits, judge, m)[0]
    differ = setup.options.get("split_weight_grads") and has_fused_rank(setup.layout)
    orders = {o: _with_options(setup, backward_order=o) for o in (BACKWARD_ORDERS if differ else ("slot",))}
    setup = decide("backward_order", "slot", orders, judge, m)[0]
    cuts = {"off": _with_options(setup, memory_split=False), "on": _with_options(setup, memory_split=True)}
    chosen, d = decide("sub_microbatches", "off", cuts, judge, m)
    if d.chosen == "off" and d.candidates["on"] == d.candidates["off"]:
        chosen = _inert_split(cuts["on"], d)
    return _decide_rebalance(chosen, judge, m)


def _decide_rebalance(setup: SystemSetup, judge: CandidateJudge, margin: float) -> SystemSetup:
    """The ``encoder_rebalance`` decision: each position's encoder work balanced across the DP
    replicas by all-to-all (``schedules.rebalance``, what the ``encoder-rebalance`` baseline does for
    DistTrain) or not; with one replica there is nothing to move and ``off`` alone is listed (the
    judge has simulated that plan already)."""
    names = ("off", "on") if setup.layout.dp > 1 else ("off",)
    cands = {n: _with_options(setup, encoder_rebalance=n == "on") for n in names}
    return decide("encoder_rebalance", "off", cands, judge, margin)[0]


def _inert_split(on: SystemSetup, d: Decision) -> SystemSetup:
    """The memory split where it cut nothing on the draws: both candidates are then one plan, so the
    draws cannot tell them apart, and the split stays on, to act only on a run's batch that would
    overflow a rank (where the alternative is recomputation escalated over the whole run). Measured:
    with it off, multi-image + 3B (a40-paper) ran 1.1 % slower than with it on."""
    taken = Decision(d.name, "on", d.candidates, d.margin, d.default)
    return replace(on, decisions=(*on.decisions, taken))


def _extension_options(base: dict, req: ConfigRequest) -> dict:
    options = dict(base)
    if req.entrain_ramp:
        options["ramp_microbatches"] = req.entrain_ramp
    if req.entrain_split:
        options["split_weight_grads"] = True
    if req.entrain_assignment != "paper":
        options["assignment"] = req.entrain_assignment
    return options


def _notes(options: dict) -> str:
    """The source note of Entrain's extension options."""
    notes = ""
    if options.get("ramp_microbatches"):
        notes += f"; ramp_microbatches={options['ramp_microbatches']}"
    if options.get("split_weight_grads"):
        notes += "; split weight grads"
    if options.get("backward_order", "slot") != "slot":
        notes += f" ({options['backward_order']} backward order)"
    if options.get("assignment", "paper") != "paper":
        notes += f"; assignment={options['assignment']}"
    if options.get("dp_resplit") is False:
        notes += "; paper DP split"
    if options.get("memory_split") is False:
        notes += "; no memory split"
    if options.get("encoder_rebalance"):
        notes += "; encoder rebalanced across replicas"
    return notes


MAX_TIED_CONFIGS = 2
"""At most this many of Algorithm 2's other configurations tied with its choice are simulated (the
next-best by Eq. 2; each costs one simulation on the planner's draws)."""


def _config_name(cfg) -> str:
    e, m = cfg.encoder, cfg.llm
    return f"dp{cfg.dp} encoder tp{e.tp} cp{e.cp} pp{e.pp} / llm tp{m.tp} cp{m.cp} pp{m.pp}"


def tied_configs(setup: SystemSetup, req: ConfigRequest, cost: CostModel) -> list:
    """Algorithm 2's configurations on the setup's profile (same DP, TP and CP) that fit and whose
    Eq. 2 time is within ``EQ2_TOLERANCE`` of its choice's (the choice first; ``MAX_TIED_CONFIGS``
    others at most)."""
    cfg = setup.config
    if cfg is None or setup.profile is None:
        return []
    cp = cfg.encoder.cp if cfg.encoder.cp == cfg.llm.cp else None
    tp = cfg.encoder.tp if cfg.encoder.tp == cfg.llm.tp else None
    parallel = replace(req.parallel, gpus=cfg.dp * cfg.gpus_per_replica, dp=cfg.dp, tp=tp, cp=cp)
    cands = search_candidates(setup.profile, cost, parallel)
    limit = cfg.predicted_iteration_time_ms * (1.0 + EQ2_TOLERANCE)
    ties = [
        c
        for c in cands
        if c.memory_ok and c.predicted_iteration_time_ms <= limit and _stages(c) != _stages(cfg)
    ]
    return [cfg, *ties[:MAX_TIED_CONFIGS]]


def _stages(cfg) -> tuple:
    return tuple((c.tp, c.cp, tuple(c.layer_ranges)) for c in (cfg.encoder, cfg.llm))


def _decide_config(
    setup: SystemSetup, req: ConfigRequest, cost: CostModel, judge: CandidateJudge
) -> SystemSetup:
    """Among Algorithm 2's choice and the configurations tied with it (``tied_configs``), the one
    that simulates fastest by more than the margin; the default is Algorithm 2's."""
    configs = tied_configs(setup, req, cost)
    if not configs:
        return setup
    cands = {_config_name(c): replace(setup, layout=c.to_layout(), config=c) for c in configs}
    return decide("config", _config_name(configs[0]), cands, judge, req.margin)[0]


def _entrain_layout(
    setup: SystemSetup, req: ConfigRequest, cost: CostModel, judge: CandidateJudge | None
) -> SystemSetup:
    """The layout ``req.entrain_layout`` asks for: ``"shared"`` always the boundary-sharing layout;
    ``"auto"`` that layout only when it fits (Algorithm 2's memory model) and ``judge`` simulates it
    more than the margin faster than the disjoint one (the ``layout`` decision; its partition on the
    profile and, ``SHARED_BATCH``, on the batch-sized draw are both candidates)."""
    layout, source = setup.layout, setup.source
    enc, llm = layout.components["encoder"], layout.components["llm"]
    possible = (enc.tp, enc.cp) == (llm.tp, llm.cp) and setup.profile is not None
    if req.entrain_layout == "shared" and not possible:
        raise ConfigError("boundary sharing needs the same TP and CP for the encoder and the LLM")
    if req.entrain_layout == "disjoint" or not possible or judge is None and req.entrain_layout == "auto":
        return setup
    parallel = replace(req.parallel, dp=layout.dp, tp=enc.tp, cp=enc.cp)
    shared = boundary_sharing_config(setup.profile, cost, parallel, ranks=layout.ranks_per_replica)
    cfg = setup.config
    eq2 = (
        f"Eq. 2 {shared.predicted_iteration_time_ms:.0f} vs {cfg.predicted_iteration_time_ms:.0f} ms"
        if cfg
        else ""
    )
    if req.entrain_layout == "shared":
        return replace(setup, layout=shared.layout, source=f"{source}; boundary sharing ({eq2 or 'forced'})")
    cands = {"disjoint": setup}
    if shared.memory_ok:
        cands["shared"] = replace(setup, layout=shared.layout)
    if setup.batch_profile is not None:  # the same partition on the batch-sized draw (b_min's may skew it)
        wide = boundary_sharing_config(setup.batch_profile, cost, parallel, ranks=layout.ranks_per_replica)
        if wide.memory_ok and wide.layout != shared.layout:
            cands[SHARED_BATCH] = replace(setup, layout=wide.layout)
    got, d = decide("layout", "disjoint", cands, judge, req.margin)
    ms = d.candidates
    if (
        d.chosen == SHARED_BATCH
        and "shared" in ms
        and not departs(ms["shared"], ms[SHARED_BATCH], req.margin)
    ):
        # the batch draw's partition departs from b_min's only past the margin
        d = replace(d, chosen="shared")
        got = replace(cands["shared"], decisions=(*cands["shared"].decisions, d))
    best = min((n for n in ms if n != "disjoint"), key=ms.__getitem__, default=None)
    if best is None:
        return got
    shown = best if d.chosen == "disjoint" else d.chosen
    sim = f"simulated {ms[shown]:.0f} vs {ms['disjoint']:.0f} ms disjoint"
    if d.chosen != "disjoint":
        on = ", partitioned on the batch-sized draw" if d.chosen == SHARED_BATCH else ""
        return replace(got, source=f"{source}; boundary sharing{on} ({sim}; {eq2})")
    return replace(got, source=f"{source}; disjoint layout kept (boundary sharing {sim})")


SHARED_BATCH = "shared-batch"
"""The ``layout`` candidate partitioned on the global batch's draw (``SystemSetup.batch_profile``)."""


def extended(req: ConfigRequest) -> bool:
    """Whether ``req`` asks for any of Entrain's extensions (False: ``--paper-entrain``)."""
    return bool(
        req.entrain_layout != "disjoint"
        or req.entrain_ramp
        or req.entrain_split
        or req.entrain_assignment != "paper"
    )


def system_setups(
    systems: Sequence[str],
    req: ConfigRequest,
    cost: CostModel,
    sampler: Sampler,
    judge: CandidateJudge | None = None,
) -> dict[str, SystemSetup]:
    """Each system's setup; ``sampler`` = the dataset's profiling sampler
    (``entrain.data.sampling.dataset_sampler``, the one ``plan`` uses); ``judge`` simulates Entrain's
    layout candidates (``entrain_variant``)."""
    by_kind: dict[str, SystemSetup] = {}
    kinds = sorted({config_kind(n) for n in systems}, key=lambda k: k != CONFIG_ENTRAIN)
    for kind in kinds:
        if kind == CONFIG_DIP and req.dp is None and CONFIG_ENTRAIN in by_kind:
            # DIP keeps the DP degree Entrain's planner chose (DIP fixes DP/TP/PP up front).
            by_kind[kind] = _setup(kind, replace(req, dp=by_kind[CONFIG_ENTRAIN].layout.dp), cost, sampler)
        else:
            by_kind[kind] = _setup(kind, req, cost, sampler)
    out = {name: by_kind[config_kind(name)] for name in systems}
    extensible = [n for n in out if get_system(n).extensions]
    if extensible and extended(req):
        variant = entrain_variant(by_kind[CONFIG_ENTRAIN], req, cost, judge)
        out.update({n: variant for n in extensible})
    return out
