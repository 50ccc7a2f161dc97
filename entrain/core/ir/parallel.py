"""How a run is parallelised, and the rules a parallel configuration must satisfy: the one place
that checks batch divisibility, derives K (microbatches per replica) and the stage-count ranges.
The planner, the batchers, the CLI and the runtime all ask these functions, so a rule and its
message are written once."""

from __future__ import annotations

from dataclasses import dataclass, field

from entrain.core.errors import ConfigError

__all__ = [
    "ParallelConfig",
    "num_microbatches",
    "microbatch_size_for",
    "check_stage_count",
    "check_degree",
    "FP",
]

FP = {"fingerprint": True}
"""Field metadata (``entrain.config``): part of the resume fingerprint."""


def num_microbatches(global_batch: int, dp: int, microbatch_size: int) -> int:
    """K = B / (dp x U); ``ConfigError`` naming the next batch that works when it is not whole."""
    check_degree("--dp", dp)
    unit = dp * microbatch_size
    if microbatch_size < 1 or global_batch < 1 or global_batch % unit:
        up = max(unit, -(-global_batch // max(unit, 1)) * unit) if microbatch_size >= 1 else global_batch
        raise ConfigError(
            f"--global-batch {global_batch} is not divisible by dp {dp} x --microbatch-size {microbatch_size} "
            f"= {unit}: every replica runs whole microbatches; use --global-batch {up} (or a smaller "
            f"--microbatch-size)"
        )
    return global_batch // unit


def microbatch_size_for(global_batch: int, dp: int, num_microbatches: int) -> int:
    """U = B / (dp x K) for batchers told K; ``ConfigError`` when it is not whole."""
    check_degree("--dp", dp)
    if num_microbatches < 1 or global_batch % (dp * num_microbatches):
        raise ConfigError(
            f"global batch {global_batch} is not divisible by dp * num_microbatches = {dp} * {num_microbatches}"
        )
    return global_batch // (dp * num_microbatches)


def check_degree(flag: str, value: int | None) -> None:
    """A parallel degree (``None`` = chosen later) must be a positive whole number."""
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ConfigError(f"{flag} must be >= 1, got {value}")


def check_stage_count(
    component: str, stages: int, layer_names: list[str] | tuple[str, ...], model: str
) -> None:
    """1 <= stages <= the component's layer count."""
    layers = len(layer_names)
    if not 1 <= stages <= layers:
        raise ConfigError(
            f"--{component}-stages {stages}: the {model} {component} has {layers} layers "
            f"({', '.join(layer_names[:3])}, ...); use 1..{layers} stages"
        )


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Degrees and batch sizes of a run. ``dp`` None: chosen by the planner (or from the process
    count); ``encoder_stages``/``llm_stages`` None: chosen by the planner; ``tp``/``cp`` None (the
    planning functions only, never a run): searched by Algorithm 2 per component."""

    gpus: int | None = field(
        default=None,
        metadata={"fingerprint": False, "why": "the planning commands' only: train runs its processes"},
    )
    dp: int | None = field(default=None, metadata=FP)
    tp: int | None = field(default=1, metadata=FP)
    cp: int | None = field(default=1, metadata=FP)
    fsdp: bool = field(default=False, metadata=FP)
    """FSDP2 over each stage's data-parallel group instead of the flat gradient all-reduce."""
    ep: int | None = field(default=None, metadata={"fingerprint": "when-set"})
    """Expert parallelism: each MoE layer's experts sharded over this many ranks of a stage's
    data-parallel group (None: 1, no sharding; a checkpoint resumes at another degree)."""
    encoder_stages: int | None = field(default=None, metadata=FP)
    llm_stages: int | None = field(default=None, metadata=FP)
    global_batch: int = field(metadata=FP)
    microbatch_size: int = field(metadata=FP)

    def __post_init__(self) -> None:
        for flag, value in (("--gpus", self.gpus), ("--dp", self.dp), ("--encoder-stages", self.encoder_stages),
                            ("--llm-stages", self.llm_stages), ("--ep", self.ep)):  # fmt: skip
            check_degree(flag, value)
        if self.microbatch_size < 1 or self.global_batch < 1:
            raise ConfigError(
                f"--global-batch and --microbatch-size must be >= 1, got {self.global_batch} and "
                f"{self.microbatch_size}"
            )
        num_microbatches(self.global_batch, self.dp or 1, self.microbatch_size)

    @property
    def dp_or_1(self) -> int:
        return self.dp or 1

    @property
    def ep_or_1(self) -> int:
        return self.ep or 1

    @property
    def num_microbatches(self) -> int:
        """K per replica (dp None counts as 1)."""
        return num_microbatches(self.global_batch, self.dp or 1, self.microbatch_size)
