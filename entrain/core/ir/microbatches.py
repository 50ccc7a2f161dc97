"""Per-iteration microbatch assignment: the data every batcher (Entrain's and the baselines') returns.

Indices: encoder microbatches are numbered ``0..K_eff-1`` in the order the batcher built them;
``execution_order`` lists those indices in the order they run; ``llm_microbatches[i]`` is the LLM
microbatch executed together with encoder microbatch ``i`` (its own non-deferred samples plus the
samples deferred *to* ``i``). A deferral moves one sample's LLM work from encoder microbatch
``from_mb`` to ``to_mb``, which runs immediately after ``from_mb``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Deferral", "ReplicaAssignment", "IterationAssignment"]


@dataclass(frozen=True, slots=True)
class Deferral:
    id: str
    from_mb: int
    to_mb: int

    def to_json(self) -> dict:
        return {"id": self.id, "from": self.from_mb, "to": self.to_mb}

    @classmethod
    def from_json(cls, d: dict) -> Deferral:
        return cls(d["id"], int(d["from"]), int(d["to"]))


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """One DP replica's microbatches for one iteration."""

    k_eff: int
    encoder_microbatches: tuple[tuple[str, ...], ...]
    llm_microbatches: tuple[tuple[str, ...], ...]
    execution_order: tuple[int, ...]
    deferrals: tuple[Deferral, ...] = ()
    encoder_work: tuple[float, ...] = ()
    """Per encoder microbatch (same indexing), sum of its samples' encoder work."""
    llm_work: tuple[float, ...] = ()
    """Per LLM microbatch (same indexing), sum of its samples' LLM work."""

    def __post_init__(self) -> None:
        k = len(self.encoder_microbatches)
        if self.k_eff != k or len(self.llm_microbatches) != k:
            raise ValueError(
                f"k_eff={self.k_eff} but {k} encoder and {len(self.llm_microbatches)} LLM microbatches"
            )
        if sorted(self.execution_order) != list(range(k)):
            raise ValueError(f"execution_order {self.execution_order} is not a permutation of 0..{k - 1}")

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(s for mb in self.encoder_microbatches for s in mb)

    def deferred_from(self, mb: int) -> tuple[str, ...]:
        return tuple(d.id for d in self.deferrals if d.from_mb == mb)

    def deferred_to(self, mb: int) -> tuple[str, ...]:
        return tuple(d.id for d in self.deferrals if d.to_mb == mb)

    def to_json(self) -> dict:
        return {
            "k_eff": self.k_eff,
            "encoder_microbatches": [list(mb) for mb in self.encoder_microbatches],
            "llm_microbatches": [list(mb) for mb in self.llm_microbatches],
            "execution_order": list(self.execution_order),
            "deferrals": [d.to_json() for d in self.deferrals],
            "encoder_work": list(self.encoder_work),
            "llm_work": list(self.llm_work),
        }

    @classmethod
    def from_json(cls, d: dict) -> ReplicaAssignment:
        return cls(
            k_eff=int(d["k_eff"]),
            encoder_microbatches=tuple(tuple(mb) for mb in d["encoder_microbatches"]),
            llm_microbatches=tuple(tuple(mb) for mb in d["llm_microbatches"]),
            execution_order=tuple(int(i) for i in d["execution_order"]),
            deferrals=tuple(Deferral.from_json(x) for x in d.get("deferrals", [])),
            encoder_work=tuple(float(x) for x in d.get("encoder_work", [])),
            llm_work=tuple(float(x) for x in d.get("llm_work", [])),
        )


@dataclass(frozen=True, slots=True)
class IterationAssignment:
    """All replicas' assignments for one iteration (global batch)."""

    replicas: tuple[ReplicaAssignment, ...]

    def to_json(self) -> dict:
        return {"replicas": [r.to_json() for r in self.replicas]}

    @classmethod
    def from_json(cls, d: dict) -> IterationAssignment:
        return cls(tuple(ReplicaAssignment.from_json(r) for r in d["replicas"]))
