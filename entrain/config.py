"""One run's configuration (docs/architecture.md): built once from the command line's flags and handed to
every part that needs it. Each part is small, typed and owned by the component that reads it:

* ``DataConfig``: what samples a run sees (dataset, seed, order, bad records, validation);
* ``ModelConfig``: the model and what its costs come from (``cost_model()`` is the one resolver);
* ``ParallelConfig`` (``entrain.core.ir.parallel``): degrees, stages, batch sizes and their rules;
* ``ScheduleConfig``: the systems and Entrain's extensions, or the plan file to run;
* ``OptimConfig``: AdamW and the learning-rate schedule;
* ``RunDirConfig``: the run folder, its length, checkpoints and waits.

A field's name is its flag's (``--global-batch`` -> ``global_batch``; metadata ``flag`` where it is
not), so ``RunConfig.from_args`` reads the flags without a list of them; a new flag becomes a new field
of the part that owns it. Every field's metadata says whether it is part of the resume fingerprint
(``fingerprint_keys``): ``FP``, ``FP_WHEN_SET`` (left out at its default, so runs from before the flag
stay resumable) or ``not_fp(why)``; ``tests/cli/test_flag_definitions.py`` checks that each has one.
Imports ``entrain.core`` only (no torch)."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields

from entrain.core.costs.costmodel import CostModel
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import FP, ParallelConfig
from entrain.core.planning.replan_settings import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    REPLAN_MODES,
    RESTART_MS,
    ReplanSettings,
)
from entrain.core.planning.setups import ENTRAIN_LAYOUTS, ConfigRequest
from entrain.core.systems import SYSTEMS, parse_systems

__all__ = [
    "DataConfig",
    "ModelConfig",
    "ParallelConfig",
    "ScheduleConfig",
    "OptimConfig",
    "RunDirConfig",
    "RunConfig",
    "ENTRAIN_LAYOUTS",
    "parse_ramp",
    "FP",
    "FP_WHEN_SET",
    "not_fp",
    "fingerprint_keys",
    "fingerprint_fields",
]

BAD_SAMPLE_POLICIES = ("error", "skip")

FP_WHEN_SET = {"fingerprint": "when-set"}
"""In the resume fingerprint when set (not None / False): runs from before the flag stay resumable."""


def not_fp(why: str, flag: str | None = None) -> dict:
    """Metadata of a field left out of the resume fingerprint, with the reason (and its flag's name
    where it is not the field's)."""
    return {"fingerprint": False, "why": why, **({"flag": flag} if flag else {})}


def _fp(default=MISSING, meta: dict = FP, **options):
    return field(default=default, metadata=meta, **options)


SCHEDULE_ONLY = (
    "the schedule orders the same work: loss and gradients do not depend on it (docs/design.md §3), "
    "so a resumed run may change it"
)
REPLAN_ONLY = "when to re-plan, not what is trained (a re-plan resumes the same run on a new plan)"
RECORD_ONLY = "what the run writes or how long it waits, not what it trains"


def _pick(cls, args: argparse.Namespace, **given):
    """``cls`` from the same-named attributes of ``args`` (those present), then ``given``."""
    kwargs = {f.name: getattr(args, f.name) for f in fields(cls) if f.init and hasattr(args, f.name)}
    return cls(**{**kwargs, **given})


def parse_ramp(text: int | str) -> int | str:
    """``--ramp-microbatches``: ``auto`` or a piece count >= 0."""
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except (TypeError, ValueError):
        n = -1
    if n < 0:
        raise ConfigError(f"--ramp-microbatches: expected a count >= 0 or 'auto', got {text!r}")
    return n


def _comma_list(text: str | tuple | None) -> tuple[str, ...]:
    if isinstance(text, tuple):
        return text
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    dataset: str = _fp()
    image_root: str | None = _fp(None)
    seed: int = _fp(0)
    shuffle: bool = _fp(False)
    on_bad_sample: str = _fp("error")
    confine_images: bool = _fp(False, FP_WHEN_SET)
    """An image path resolving outside the dataset root is a bad record (else a warning)."""
    val_every: int = _fp(0)
    """Validation loss every N steps (0: never)."""
    val_batches: int = _fp(1)
    min_pixels: int | None = _fp(None, FP_WHEN_SET)
    max_pixels: int | None = _fp(None, FP_WHEN_SET)
    """The image processor's limits (``--min-pixels`` / ``--max-pixels``)."""

    def __post_init__(self) -> None:
        if self.on_bad_sample not in BAD_SAMPLE_POLICIES:
            raise ConfigError(
                f"--on-bad-sample {self.on_bad_sample!r}; choose from {', '.join(BAD_SAMPLE_POLICIES)}"
            )
        if self.val_every < 0 or self.val_batches < 1:
            raise ConfigError(
                f"--val-every must be >= 0 and --val-batches >= 1, got {self.val_every} and {self.val_batches}"
            )

    def vision(self, model: ModelConfig | None = None):
        """The image rule of ``model``'s family within the image processor's limits
        (``ModelConfig.image_rule``); without a model, Qwen's (``entrain.core.workload.samples.pixel_limits``)."""
        if model is not None:
            return model.image_rule(self.min_pixels, self.max_pixels)
        from entrain.core.workload.samples import pixel_limits

        return pixel_limits(self.min_pixels, self.max_pixels)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str = field(metadata={**FP, "flag": "model"})
    """``--model``: a model preset."""
    hardware: str | None = _fp(None)
    """Cost-model preset to plan with (default: ``entrain.core.costs.presets.default_hardware``)."""
    profile: str | None = _fp(None)
    """A measured profile (``entrain profile``) replacing the preset."""
    attention: str | None = _fp(None)
    freeze: tuple[str, ...] = _fp(())
    weights: str | None = _fp(None)
    vision_model: str | None = _fp(None, FP_WHEN_SET)
    """A stock Qwen2-VL / Qwen2.5-VL folder (with ``llm_model``, replaces ``name``)."""
    llm_model: str | None = _fp(None, FP_WHEN_SET)
    tokenizer: str | None = _fp(None, FP_WHEN_SET)
    """The stock LLM's tokenizer folder (default: ``llm_model``'s own)."""
    precision: str | None = _fp(None, FP_WHEN_SET)
    """``fp32`` or ``bf16`` (None: bf16 on CUDA, fp32 on CPU; ``preflight.resolve_precision``)."""
    model_path: str | None = _fp(None, FP_WHEN_SET)
    """One whole checkpoint folder of a model family (``--model-path``; replaces ``name``)."""

    def __post_init__(self) -> None:
        if self.model_path and (self.vision_model or self.llm_model):
            raise ConfigError(
                "--model-path is a whole checkpoint: pass it without --vision-model / --llm-model"
            )

    def source(self):
        """The ``entrain.models.families.base.ModelSource`` of these flags."""
        from entrain.models.families.base import ModelSource

        return ModelSource(
            preset=self.name,
            vision_model=self.vision_model,
            llm_model=self.llm_model,
            model_path=self.model_path,
            tokenizer=self.tokenizer,
        )

    def family(self):
        """The model family (``entrain.models.families.registry.family_of_source``)."""
        from entrain.models.families.registry import family_of_source

        return family_of_source(self.source())

    def arch(self):
        """The model's shapes (``ModelFamily.shape``): the preset's, or the checkpoints' config.json."""
        return self.family().shape(self.source())

    def image_rule(self, min_pixels: int | None, max_pixels: int | None):
        """The family's ``ImageTokenRule`` within ``--min-pixels`` / ``--max-pixels``
        (``ModelFamily.image_rule``)."""
        return self.family().image_rule(self.arch(), min_pixels, max_pixels)

    def label(self) -> str:
        """The name plans, profiles and reports carry: the preset's, or a stock model's ``hf:VISION+LLM``."""
        return self.arch().name if self.source().is_stock else self.name

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelConfig:
        """The model part of a command's parsed flags: ``--model``, its checkpoint folders and the cost
        model's flags (``--hardware``, ``--profile``, ``--attention``, ``--freeze``), those it has."""
        return _pick(cls, args, name=args.model, freeze=_comma_list(getattr(args, "freeze", ())))

    def cost_model(self, freeze: tuple[str, ...] | None = None) -> CostModel:
        """The cost model of every command (``entrain.core.costs.presets.resolve_cost_model``, the one
        resolver; this is its one adapter). ``freeze``: the parts priced frozen; None: the run's own,
        none with a measured profile, which timed the run's own trainable parts (``entrain plan`` passes
        its ``--freeze``, which a profile refuses)."""
        from entrain.core.costs.presets import resolve_cost_model

        return resolve_cost_model(
            self.arch(),
            hardware=self.hardware,
            profile=self.profile,
            attention=self.attention,
            freeze=(() if self.profile else self.freeze) if freeze is None else freeze,
        )

    def hardware_label(self) -> str:
        """What the costs come from, for reports: the hardware preset (``default_hardware`` of the
        model when none is given), or ``profile:FILE``."""
        from entrain.core.costs.presets import default_hardware

        return (
            f"profile:{self.profile}" if self.profile else self.hardware or default_hardware(self.arch().name)
        )


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    systems: tuple[str, ...] = field(
        metadata=not_fp("fingerprint() records the one system each run folder trains", flag="system")
    )
    entrain_layout: str = _fp("auto", not_fp(SCHEDULE_ONLY))
    """Entrain extension: ``shared`` (boundary sharing), ``disjoint`` (the paper's) or ``auto``."""
    ramp_microbatches: int | str = _fp("auto", not_fp(SCHEDULE_ONLY))
    """Entrain extension: fill/drain ramp, ``auto`` or a piece count (0 = the paper's schedule)."""
    split_weight_grads: bool | str = _fp("auto", not_fp(SCHEDULE_ONLY))
    """Entrain extension: backwards as input- then weight-gradient halves: True, False (the paper's) or
    ``auto`` (where it simulates faster by more than the decision margin)."""
    assignment: str = _fp("auto", not_fp(SCHEDULE_ONLY))
    """Entrain extension: per-iteration assignment, ``paper`` (Algorithm 3), ``two-resource`` or ``auto``."""
    plan: str | None = _fp(
        None,
        not_fp("a re-plan resumes on a new plan file; the batch sizes and layout it sets are fingerprinted"),
    )
    """A plan file (``entrain plan --out``) to run exactly, instead of planning."""
    decision_margin_pct: float | None = _fp(None, not_fp(SCHEDULE_ONLY))
    """``--decision-margin PCT``: an automatic choice departs from the paper's default only when a
    candidate simulates more than this percentage faster (None: ``setups.DECISION_MARGIN``)."""
    replan: str = _fp("off", not_fp(REPLAN_ONLY))
    """``auto``: re-plan Entrain's split when the data drifts (``entrain.sim.drift``); ``off``."""
    replan_window: int = _fp(DEFAULT_WINDOW, not_fp(REPLAN_ONLY))
    replan_threshold: float = _fp(DEFAULT_THRESHOLD, not_fp(REPLAN_ONLY))
    replan_restart_s: float = _fp(RESTART_MS / 1000, not_fp(REPLAN_ONLY))
    replan_degrees: bool = _fp(False, not_fp(REPLAN_ONLY))
    """``--replan-degrees``: a re-plan may also change DP, TP and the microbatch size
    (``ReplanSettings.degrees``)."""

    def __post_init__(self) -> None:
        for name in self.systems:
            if name not in SYSTEMS:
                parse_systems(name)  # raises the one message
        if self.entrain_layout not in ENTRAIN_LAYOUTS:
            raise ConfigError(
                f"--entrain-layout {self.entrain_layout!r}; choose from {', '.join(ENTRAIN_LAYOUTS)}"
            )
        parse_ramp(self.ramp_microbatches)
        pct = self.decision_margin_pct
        if pct is not None and not 0.0 <= pct < 100.0:
            raise ConfigError(f"--decision-margin: expected a percentage in [0, 100), got {pct:g}")
        if self.replan not in REPLAN_MODES:
            raise ConfigError(f"--replan {self.replan!r}; choose from {', '.join(REPLAN_MODES)}")

    def replan_settings(self) -> ReplanSettings:
        return ReplanSettings(
            self.replan_window,
            self.replan_threshold,
            self.replan_restart_s * 1000,
            degrees=self.replan_degrees,
        )


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = _fp(1e-3)
    betas: tuple[float, float] = _fp((0.9, 0.95))
    weight_decay: float = _fp(0.01)
    warmup_steps: int = _fp(2)
    """Linear warm-up from lr / warmup_steps to lr over this many steps."""
    total_steps: int = _fp(
        100, not_fp("--steps may grow on resume: the schedule follows the new total", "steps")
    )
    """Cosine decay from lr to ``min_lr_ratio * lr`` between the end of warm-up and this step."""
    min_lr_ratio: float = _fp(0.1, not_fp("no flag sets it: every run has the default"))
    max_grad_norm: float | None = _fp(1.0)
    """Global-norm clipping over all stages and replicas; None disables it."""

    def __post_init__(self) -> None:
        if self.lr < 0 or self.warmup_steps < 0 or self.total_steps < 1:
            raise ConfigError(
                f"--lr must be >= 0, --warmup-steps >= 0 and --steps >= 1, got {self.lr}, {self.warmup_steps} "
                f"and {self.total_steps}"
            )
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ConfigError(f"--betas must lie in [0, 1), got {b1},{b2}")

    @staticmethod
    def parse_betas(text: str | tuple) -> tuple[float, float]:
        if isinstance(text, tuple):
            return text
        try:
            b1, b2 = (float(x) for x in text.split(","))
        except ValueError:
            raise ConfigError(f"--betas must be two comma-separated numbers, got {text!r}") from None
        return b1, b2


@dataclass(frozen=True, kw_only=True)
class RunDirConfig:
    out: str = _fp(meta=not_fp("the run folder holds the checkpoints and their fingerprint"))
    steps: int = _fp(meta=not_fp("--steps may grow on resume"))
    checkpoint_every: int = _fp(0, not_fp(RECORD_ONLY))
    """Save a checkpoint every this many steps (0: only at the end)."""
    keep_checkpoints: int = _fp(3, not_fp(RECORD_ONLY))
    resume: bool = _fp(False, not_fp("how the run starts: --resume itself is what reads the fingerprint"))
    overwrite: bool = _fp(False, not_fp("replaces the run in --out: nothing is resumed"))
    """``--overwrite``: the only way to reuse a folder that holds a run without ``--resume``."""
    timeout_s: float = _fp(300.0, not_fp(RECORD_ONLY))
    """Longest wait of any collective or point-to-point transfer."""
    progress: bool = _fp(True, not_fp(RECORD_ONLY, "no_progress"))
    tensorboard: bool = _fp(False, not_fp(RECORD_ONLY))
    trace: bool = _fp(False, not_fp(RECORD_ONLY))
    device: str = _fp(
        "auto", not_fp("checkpoints are device-independent: a run may resume on another device")
    )
    """``--device``: ``auto``, ``cuda`` or ``cpu`` (``entrain.runtime.distributed.choose_device``)."""
    deterministic: bool = _fp(False, FP_WHEN_SET)
    """``--deterministic``: torch's deterministic algorithms (bitwise-equal resume on GPU)."""
    flags: dict = field(
        default_factory=dict, compare=False, metadata=not_fp("the record of the flags themselves")
    )
    """The command-line flags of the run (``entrain train``): config.json records them, so
    ``entrain train --config RUN/config.json`` starts the same run."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"--steps must be at least 1, got {self.steps}")
        if self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise ConfigError(
                f"--checkpoint-every must be >= 0 and --keep-checkpoints >= 1, got {self.checkpoint_every} and "
                f"{self.keep_checkpoints}"
            )
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout-s must be positive, got {self.timeout_s}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    data: DataConfig
    model: ModelConfig
    parallel: ParallelConfig
    schedule: ScheduleConfig
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunDirConfig

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunConfig:
        """The configuration named by a command's parsed flags (``train``'s, or a subset: parts whose
        flags a command lacks keep their defaults)."""
        steps = getattr(args, "steps", 1)
        optim = {"total_steps": steps}
        if hasattr(args, "betas"):
            optim["betas"] = OptimConfig.parse_betas(args.betas)
        if hasattr(args, "max_grad_norm"):
            optim["max_grad_norm"] = args.max_grad_norm or None
        schedule = {"systems": tuple(parse_systems(getattr(args, "system", None) or args.systems))}
        if hasattr(args, "ramp_microbatches"):
            schedule["ramp_microbatches"] = parse_ramp(args.ramp_microbatches)
        if isinstance(getattr(args, "split_weight_grads", None), str):
            schedule["split_weight_grads"] = {"on": True, "off": False}.get(args.split_weight_grads, "auto")
        run = {"out": getattr(args, "out", ""), "steps": steps}
        if hasattr(args, "no_progress"):
            run["progress"] = not args.no_progress
        return cls(
            data=_pick(DataConfig, args),
            model=ModelConfig.from_args(args),
            parallel=_pick(ParallelConfig, args),
            schedule=_pick(ScheduleConfig, args, **schedule),
            optim=_pick(OptimConfig, args, **optim),
            run=_pick(RunDirConfig, args, **run),
        )

    def flag_value(self, name: str):
        """A part's field by its flag's name (``flag_value("tp")`` is ``parallel.tp``), for code that walks
        flag names (the resume fingerprint); everything else names the part. ``--model`` is ``model.name``."""
        if name == "model":
            return self.model.name
        for part in (self.data, self.parallel, self.schedule, self.optim, self.run, self.model):
            if name in {f.name for f in fields(part)}:
                return getattr(part, name)
        raise AttributeError(f"RunConfig has no field {name!r}")

    @staticmethod
    def parts() -> tuple[type, ...]:
        return DataConfig, ModelConfig, ParallelConfig, ScheduleConfig, OptimConfig, RunDirConfig

    def config_request(self, gpus: int | None = None) -> ConfigRequest:
        """What ``entrain.core.planning.setups`` needs to choose each system's configuration on ``gpus`` GPUs
        (default ``parallel.gpus``)."""
        par, sched = self.parallel, self.schedule
        return ConfigRequest(
            self.data.dataset,
            self.model.name,
            gpus if gpus is not None else par.gpus,
            par.dp,
            par.tp,
            par.global_batch,
            par.microbatch_size,
            self.data.seed,
            entrain_layout=sched.entrain_layout,
            entrain_ramp=sched.ramp_microbatches,
            entrain_split=sched.split_weight_grads,
            entrain_assignment=sched.assignment,
            decision_margin=None if sched.decision_margin_pct is None else sched.decision_margin_pct / 100.0,
            ep=par.ep,
        )

    def to_json(self) -> dict:
        """Every part's fields, one flat object named by flag (as ``config.json``'s ``spec``)."""
        out: dict = {}
        for part in (self.data, self.model, self.parallel, self.schedule, self.optim, self.run):
            out.update(asdict(part))
        out["model"] = out.pop("name")
        out.pop("flags", None)  # config.json records them next to the spec
        return out


def fingerprint_fields() -> dict[str, dict]:
    """``{flag name: metadata}`` of every field of every ``RunConfig`` part (``metadata["flag"]`` where
    the flag's name is not the field's), for the resume fingerprint and its test."""
    out: dict[str, dict] = {}
    for part in RunConfig.parts():
        for f in fields(part):
            out.setdefault(f.metadata.get("flag", f.name), dict(f.metadata))
    return out


def fingerprint_keys(when_set: bool | None = None) -> tuple[str, ...]:
    """The flag names whose values make the resume fingerprint (``entrain.runtime.checkpointer.fingerprint``),
    from the fields' metadata; ``when_set`` True / False: only those left out at their default / the others."""
    keys = []
    for name, meta in fingerprint_fields().items():
        kind = meta.get("fingerprint")
        if kind and (when_set is None or (kind == "when-set") == when_set):
            keys.append(name)
    return tuple(keys)
