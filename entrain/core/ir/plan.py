"""The Plan IR: plain data that both executors (``entrain.sim`` and ``entrain.runtime``) run.

A ``Plan`` = a static layout (stages, their layer ranges and the pipeline rank holding each) +
one ``IterationPlan`` per iteration (the microbatch assignment, the sample ids of every
(sub-)microbatch, and one ordered action list per global rank).

Indexing conventions (every generator and both executors follow them):

* Stages are numbered per replica: encoder stages ``0..E-1`` then LLM stages ``E..E+L-1``. With
  several encoders (``StageSpec.encoder`` names each encoder stage's pipeline, ``Layout.components``
  has one entry per encoder name and ``llm``) each encoder's stages are consecutive, encoders in
  order, and each pipeline's last stage feeds stage ``E`` (``Layout.next_stage`` / ``prev_stages``).
  ``StageSpec.pp_rank`` says which pipeline rank of the replica holds a stage; a rank may hold
  several stages (DIP colocates encoder chunk r and LLM chunk r on rank r; Entrain's boundary-sharing
  layout, ``planning.boundary.boundary_sharing_config``, puts the last encoder stage and the first LLM stage on
  one rank, which runs them as one fused stage). Global rank =
  ``replica * ranks_per_replica + pp_rank``; a stage's DP group = its pp_rank across replicas.
* ``mb`` is the execution position ``0..K_eff-1`` of a microbatch in its replica (not the
  batcher's index); ``MicrobatchSpec.encoder_index`` maps it back to the assignment.
* ``sub`` indexes a sub-microbatch: ``MicrobatchSpec.encoder_subs[sub]`` on encoder stages,
  ``llm_subs[sub]`` on LLM stages. Entrain splits an encoder microbatch with deferrals into sub 0
  (non-deferred samples) and sub 1 (deferred samples, consumed by LLM microbatch ``mb + 1``), and
  cuts either into more subs where needed (its ramp; its memory split, ``Plan.options["memory_split"]``;
  deferred subs stay last); DIP cuts both into size-capped subs. ``sub=None`` in an action means the whole microbatch
  (sub 0 of a one-sub microbatch).
* Communication actions follow torch.distributed.pipelining's names: ``sSEND_Fm`` = stage s
  sends its forward output of (m, sub) to stage s+1; ``sRECV_Fm`` = stage s receives its forward
  input; ``sSEND_Bm`` / ``sRECV_Bm`` likewise for gradients (to / from s-1 and s+1). At the
  encoder -> LLM boundary the (mb, sub) of a communication action is the *encoder* message's:
  LLM stage E runs ``E RECV_F j.0`` and ``E RECV_F (j-1).1`` before ``E F j`` when j-1 deferred
  into j, and sends the gradients back per encoder message. Samples are routed by id. With several
  encoders encoder microbatch ``(mb, sub)`` is the same samples on every encoder pipeline, and one
  boundary action stands for one message per encoder: ``E RECV_F j`` receives encoder message ``j``
  from every encoder's last stage, ``E SEND_B j`` sends its gradient to each
  (``validate.messages_of``).
* A message is a set of named tensors: ``"hidden"`` and the parts ``StageSpec.parts`` of the stage
  whose forward output it is (or whose output's gradient it is) declares, in that order; a part a
  later stage needs crosses every boundary on its way (each stage sends it on).
* ``F`` = forward, ``B`` = full backward, ``I`` / ``W`` = backward for inputs / weights (split
  backward, zero-bubble style). Text form: ``2F0``, ``0F3.1``, ``4SEND_B7``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from entrain.core.ir.microbatches import IterationAssignment
from entrain.core.model.layer_specs import HIDDEN, MessagePart
from entrain.core.workload.work import SampleWork

__all__ = [
    "ActionKind",
    "Action",
    "StageSpec",
    "ComponentLayout",
    "Layout",
    "MicrobatchSpec",
    "IterationPlan",
    "Plan",
    "PLAN_SCHEMA_VERSION",
]

PLAN_SCHEMA_VERSION = 1
Component = Literal["encoder", "llm"]


class ActionKind(StrEnum):
    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - torch.distributed.pipelining's name for backward-input
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_compute(self) -> bool:
        return self in (ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W)

    @property
    def is_comm(self) -> bool:
        return not self.is_compute


_ACTION_RE = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)(?:\.(\d+))?$")


@dataclass(frozen=True, slots=True, order=True)
class Action:
    stage: int
    kind: ActionKind
    mb: int
    sub: int | None = None

    def __str__(self) -> str:
        s = f"{self.stage}{self.kind.value}{self.mb}"
        return s if self.sub is None else f"{s}.{self.sub}"

    @property
    def sub_index(self) -> int:
        return 0 if self.sub is None else self.sub

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION_RE.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. '2F0', '0B3.1', '1SEND_F4')")
        stage, kind, mb, sub = m.groups()
        return cls(int(stage), ActionKind(kind), int(mb), None if sub is None else int(sub))


@dataclass(frozen=True, slots=True)
class StageSpec:
    stage: int
    component: Component
    first_layer: int
    end_layer: int
    """Exclusive."""
    pp_rank: int
    recompute: str = "none"
    """Activation recomputation of the stage's layers (``costmodel.RECOMPUTE_MODES``)."""
    parts: tuple[MessagePart, ...] = ()
    """What the stage's forward message carries besides ``HIDDEN`` (its gradient message the same
    parts' gradients), in wire order after it (``CostModel.layout_with_parts``; a family declares them
    on its ``LayerSpec.message_parts``)."""
    encoder: str | None = None
    """On an encoder stage of a plan with several encoders: the encoder (pipeline) it belongs to, a key
    of ``Layout.components`` (``vision``, ``audio``); ``None`` in a one-encoder plan (not written)."""

    def __post_init__(self) -> None:
        if len(set(self.part_names)) != len(self.part_names):
            raise ValueError(f"stage {self.stage}: message parts {list(self.part_names)} repeat a name")
        if self.encoder is not None and (self.component != "encoder" or self.encoder in ("", "llm")):
            raise ValueError(
                f"stage {self.stage}: encoder name {self.encoder!r} on a {self.component} stage: only encoder "
                "stages name their encoder, with a name other than 'llm'"
            )

    @property
    def component_key(self) -> str:
        """The key of ``Layout.components`` holding this stage's degrees: its encoder's name, else its
        component."""
        return self.encoder if self.encoder is not None else self.component

    @property
    def part_names(self) -> tuple[str, ...]:
        """Every part of the stage's messages, in wire order: ``HIDDEN`` first."""
        return (HIDDEN, *(p.name for p in self.parts))

    def to_json(self) -> dict:
        out = {
            "stage": self.stage,
            "component": self.component,
            "layers": [self.first_layer, self.end_layer],
            "pp_rank": self.pp_rank,
        }
        if self.recompute != "none":
            out["recompute"] = self.recompute
        if self.parts:
            out["parts"] = [p.to_json() for p in self.parts]
        if self.encoder is not None:
            out["encoder"] = self.encoder
        return out

    @classmethod
    def from_json(cls, d: dict) -> StageSpec:
        first, end = d["layers"]
        return cls(
            int(d["stage"]),
            d["component"],
            int(first),
            int(end),
            int(d["pp_rank"]),
            d.get("recompute", "none"),
            tuple(MessagePart.from_json(p) for p in d.get("parts", ())),
            d.get("encoder"),
        )


@dataclass(frozen=True, slots=True)
class ComponentLayout:
    """Parallel degrees of one component within a replica."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    """Expert parallelism of a component with experts: each stage's mixture-of-experts layers sharded
    over ``ep`` of its ``dp`` replicas (``--ep``; written only when > 1)."""

    def to_json(self) -> dict:
        return {"tp": self.tp, "cp": self.cp, "pp": self.pp, **({"ep": self.ep} if self.ep > 1 else {})}

    @classmethod
    def from_json(cls, d: dict) -> ComponentLayout:
        return cls(int(d["tp"]), int(d["cp"]), int(d["pp"]), int(d.get("ep", 1)))


@dataclass(frozen=True, slots=True)
class Layout:
    """The static configuration: DP, batch sizes, per-component degrees, stages and placement."""

    dp: int
    microbatch_size: int
    num_microbatches: int
    """K = global_batch / (dp * microbatch_size): the user's microbatch count per replica."""
    components: dict[str, ComponentLayout]
    stages: tuple[StageSpec, ...]
    _ranks_per_replica: int = field(init=False, repr=False, compare=False)
    _num_encoder_stages: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if [s.stage for s in self.stages] != list(range(len(self.stages))):
            raise ValueError("stages must be numbered 0..n-1 in order")
        # derived once: the p2p program and the memory model ask for them per action
        object.__setattr__(self, "_ranks_per_replica", 1 + max((s.pp_rank for s in self.stages), default=-1))
        object.__setattr__(
            self, "_num_encoder_stages", sum(1 for s in self.stages if s.component == "encoder")
        )
        for name, par in self.components.items():
            if par.ep < 1 or self.dp % par.ep:
                raise ValueError(
                    f"{name}: ep {par.ep} must divide dp {self.dp} (experts shard over replicas)"
                )
        self._check_encoder_groups()

    def _check_encoder_groups(self) -> None:
        enc = [s for s in self.stages if s.component == "encoder"]
        named = [s for s in enc if s.encoder is not None]
        if not named:
            return
        if len(named) != len(enc):
            raise ValueError("encoder stages: either every one names its encoder or none does")
        if any(s.component == "encoder" for s in self.stages[len(enc) :]):
            raise ValueError("stages with several encoders: every encoder stage comes before the LLM's")
        names = [s.encoder for s in enc]
        order = list(dict.fromkeys(names))
        if names != [n for n in order for _ in range(names.count(n))]:
            raise ValueError(f"encoder stages {names}: each encoder's stages must be consecutive")
        missing = [n for n in order if n not in self.components]
        if missing:
            raise ValueError(f"encoders {missing} have stages but no entry in the layout's components")

    @property
    def global_batch(self) -> int:
        return self.dp * self.microbatch_size * self.num_microbatches

    @property
    def ranks_per_replica(self) -> int:
        return self._ranks_per_replica

    @property
    def world_size(self) -> int:
        return self.dp * self.ranks_per_replica

    @property
    def num_encoder_stages(self) -> int:
        return self._num_encoder_stages

    @property
    def encoder_groups(self) -> tuple[tuple[int, ...], ...]:
        """The encoder pipelines, each its stages in order: one group of every encoder stage in a
        one-encoder plan (none without encoder stages), one per named encoder otherwise."""
        enc = [s for s in self.stages if s.component == "encoder"]
        if not enc:
            return ()
        groups: dict[str | None, list[int]] = {}
        for s in enc:
            groups.setdefault(s.encoder, []).append(s.stage)
        return tuple(tuple(g) for g in groups.values())

    @property
    def encoder_names(self) -> tuple[str, ...]:
        """The named encoders in stage order; empty in a one-encoder plan."""
        return tuple(dict.fromkeys(s.encoder for s in self.stages if s.encoder is not None))

    @property
    def multi_encoder(self) -> bool:
        """Whether the plan has several encoder pipelines (named encoder stages; the layout's checks put
        a named encoder stage first)."""
        return bool(self.stages) and self.stages[0].encoder is not None

    def next_stage(self, stage: int) -> int | None:
        """The stage ``stage``'s forward output goes to: the next stage of its pipeline, the first LLM
        stage after an encoder pipeline's last, ``None`` after the last stage."""
        e = self.num_encoder_stages
        if stage < e and self.multi_encoder:
            group = next(g for g in self.encoder_groups if stage in g)
            if stage != group[-1]:
                return stage + 1
            return e if e < len(self.stages) else None
        return stage + 1 if stage + 1 < len(self.stages) else None

    def prev_stages(self, stage: int) -> tuple[int, ...]:
        """The stages whose forward outputs ``stage`` consumes: the previous stage of its pipeline; at
        the first LLM stage, the last stage of every encoder pipeline; none at a pipeline's first."""
        e = self.num_encoder_stages
        if self.multi_encoder:
            if stage == e:
                return tuple(g[-1] for g in self.encoder_groups)
            if stage < e and any(stage == g[0] for g in self.encoder_groups):
                return ()
        return (stage - 1,) if stage > 0 else ()

    def stages_of(self, pp_rank: int) -> tuple[StageSpec, ...]:
        return tuple(s for s in self.stages if s.pp_rank == pp_rank)

    @property
    def can_move_encoder_work(self) -> bool:
        """Whether encoder work may move across data-parallel replicas on this layout: several
        replicas, both components, and the last encoder stage and the first LLM stage on different
        pipeline ranks (the point-to-point program sends moved features between those ranks; a rank
        holding both takes its replica's features locally). Not with expert parallelism: its replicas
        must run the same programs (their all-to-alls pair up). Not with several encoders."""
        e = self.num_encoder_stages - 1
        return (
            not self.multi_encoder
            and self.dp > 1
            and 0 <= e < len(self.stages) - 1
            and self.stages[e].pp_rank != self.stages[e + 1].pp_rank
            and all(c.ep == 1 for c in self.components.values())
        )

    def global_rank(self, replica: int, pp_rank: int) -> int:
        return replica * self.ranks_per_replica + pp_rank

    def replica_of(self, rank: int) -> tuple[int, int]:
        """(replica, pp_rank) of a global rank."""
        return divmod(rank, self.ranks_per_replica)

    def to_json(self) -> dict:
        return {
            "dp": self.dp,
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "components": {k: v.to_json() for k, v in self.components.items()},
            "stages": [s.to_json() for s in self.stages],
        }

    @classmethod
    def from_json(cls, d: dict) -> Layout:
        return cls(
            dp=int(d["dp"]),
            microbatch_size=int(d["microbatch_size"]),
            num_microbatches=int(d["num_microbatches"]),
            components={k: ComponentLayout.from_json(v) for k, v in d["components"].items()},
            stages=tuple(StageSpec.from_json(s) for s in d["stages"]),
        )


@dataclass(frozen=True, slots=True)
class MicrobatchSpec:
    """Sample ids of one executed microbatch (position ``mb``) of one replica."""

    mb: int
    encoder_index: int
    """Index into the replica's ``ReplicaAssignment.encoder_microbatches``."""
    encoder_subs: tuple[tuple[str, ...], ...]
    llm_subs: tuple[tuple[str, ...], ...]

    @property
    def encoder_ids(self) -> tuple[str, ...]:
        return tuple(s for sub in self.encoder_subs for s in sub)

    @property
    def llm_ids(self) -> tuple[str, ...]:
        return tuple(s for sub in self.llm_subs for s in sub)

    def to_json(self) -> dict:
        return {
            "mb": self.mb,
            "encoder_index": self.encoder_index,
            "encoder_subs": [list(s) for s in self.encoder_subs],
            "llm_subs": [list(s) for s in self.llm_subs],
        }

    @classmethod
    def from_json(cls, d: dict) -> MicrobatchSpec:
        return cls(
            int(d["mb"]),
            int(d["encoder_index"]),
            tuple(tuple(s) for s in d["encoder_subs"]),
            tuple(tuple(s) for s in d["llm_subs"]),
        )


@dataclass(frozen=True, slots=True)
class IterationPlan:
    assignment: IterationAssignment
    microbatches: tuple[tuple[MicrobatchSpec, ...], ...]
    """Per replica, in execution order (``microbatches[r][mb].mb == mb``)."""
    actions: dict[int, tuple[Action, ...]]
    """Per global rank, the ordered action list."""

    def to_json(self) -> dict:
        return {
            "assignment": self.assignment.to_json(),
            "microbatches": [[m.to_json() for m in rep] for rep in self.microbatches],
            "actions": {str(r): " ".join(str(a) for a in acts) for r, acts in sorted(self.actions.items())},
        }

    @classmethod
    def from_json(cls, d: dict) -> IterationPlan:
        return cls(
            assignment=IterationAssignment.from_json(d["assignment"]),
            microbatches=tuple(tuple(MicrobatchSpec.from_json(m) for m in rep) for rep in d["microbatches"]),
            actions={
                int(r): tuple(Action.parse(a) for a in text.split()) for r, text in d["actions"].items()
            },
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """What a schedule generator returns and an executor runs."""

    system: str
    layout: Layout
    iterations: tuple[IterationPlan, ...]
    samples: dict[str, SampleWork] = field(default_factory=dict)
    """Every planned sample's work (and token metadata when known), by id."""
    options: dict = field(default_factory=dict)
    """Generator options executors may read (e.g. ``eager_budget_bytes`` per rank)."""

    def to_json(self) -> dict:
        return {
            "schema_version": PLAN_SCHEMA_VERSION,
            "system": self.system,
            "layout": self.layout.to_json(),
            "options": self.options,
            "samples": [_sample_to_json(w) for w in self.samples.values()],
            "iterations": [it.to_json() for it in self.iterations],
        }

    @classmethod
    def from_json(cls, d: dict) -> Plan:
        if d.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise ValueError(
                f"plan schema_version {d.get('schema_version')!r}, expected {PLAN_SCHEMA_VERSION}"
            )
        samples = {s["id"]: _sample_from_json(s) for s in d.get("samples", [])}
        return cls(
            system=d["system"],
            layout=Layout.from_json(d["layout"]),
            iterations=tuple(IterationPlan.from_json(it) for it in d["iterations"]),
            samples=samples,
            options=dict(d.get("options", {})),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def loads(cls, text: str) -> Plan:
        return cls.from_json(json.loads(text))


def _sample_to_json(w: SampleWork) -> dict:
    from entrain.core.workload.samples import DEFAULT_VISION

    d = {"id": w.id, "encoder": w.encoder, "llm": w.llm}
    if w.encoders:
        d["encoders"] = list(w.encoders)
    if w.meta is not None:
        d["meta"] = w.meta.to_json()
        if w.meta.vision != DEFAULT_VISION:  # --min-pixels / --max-pixels: what its tokens are counted under
            d["meta"]["vision"] = dataclasses.asdict(w.meta.vision)
    return d


def _sample_from_json(d: dict) -> SampleWork:
    from entrain.core.workload.samples import DEFAULT_VISION, SampleMeta, VisionTokenConfig

    meta = None
    if "meta" in d:
        m = d["meta"]
        vision = VisionTokenConfig(**m["vision"]) if "vision" in m else DEFAULT_VISION
        meta = SampleMeta.from_json(m, vision)
    encoders = tuple(float(x) for x in d.get("encoders", ()))
    return SampleWork(d["id"], float(d["encoder"]), float(d["llm"]), meta, encoders)
