"""A system's setup and what it is chosen from: the request (``ConfigRequest``), the setup chosen
(``SystemSetup``) with the automatic choices made for it (``Decision``: candidates simulated on the
planner's draws, the paper's default left only past ``DECISION_MARGIN``; ``departs``, ``pick``,
``decide``) and its plan-file form (``setup_to_json``, ``read_plan_file``). ``entrain.core.planning.setups``
chooses each system's setup, ``entrain.core.planning.extensions`` Entrain's extensions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import Layout
from entrain.core.planning.encoders_baselines import CONFIG_SYSTEMS
from entrain.core.planning.encoders_plan import encoders_config, encoders_layout
from entrain.core.planning.plan_file import check_stage_ranges, load_plan_dict
from entrain.core.systems import get_system


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
    ep: int | None = None
    """Expert parallelism of the LLM's mixture-of-experts layers (``--ep``; None: searched on a model
    with experts, 1 on a dense one)."""

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
            ep=self.ep,
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
    (``entrain.core.planning.plan_file``: every field's name and type, each component's stages covering its
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
    options = dict(d["schedule_options"])
    config = None
    if layout.multi_encoder:  # one pipeline per encoder: its plans come from the configuration
        if d["system"] not in CONFIG_SYSTEMS:
            raise ConfigError(
                f"--plan {path}: system {d['system']!r} with one pipeline per encoder: train runs such a plan "
                f"for {', '.join(CONFIG_SYSTEMS)} only"
            )
        config = encoders_config(layout, options.get("microbatch_count", "paper"))
        if encoders_layout(config) != layout:
            raise ConfigError(
                f"--plan {path}: layout.stages: with one pipeline per encoder every stage is on its own pipeline "
                "rank, each encoder's then the llm's in order; write the plan again with `entrain plan ... --out FILE`"
            )
    return d["system"], SystemSetup(
        layout, options, source, b_min=d.get("b_min"), config=config, decisions=_file_decisions(d)
    )


def _file_decisions(d: dict) -> tuple[Decision, ...]:
    """The plan's ``decisions`` (``train --plan`` records them in ``config.json`` as the decisions its layout
    was made by; it runs on none of them, so an entry of other types is left out, not refused)."""
    out = []
    for x in d.get("decisions") or ():
        try:
            ms = {str(k): float("inf") if v is None else float(v) for k, v in x["candidates"].items()}
            default = str(x.get("default", x["chosen"]))
            out.append(Decision(str(x["name"]), str(x["chosen"]), ms, float(x["margin"]), default))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return tuple(out)


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
(``entrain.sim.choose.candidate_judge``); core does not simulate. A judge may carry ``deployed``, the
same on the memory check a command deploys with, which ``planning.extensions`` asks on close calls
(``CLOSE_CALLS``)."""


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
