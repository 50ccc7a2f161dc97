"""Orders of Entrain's deferral pairs within a replica's iteration (Algorithm 3 runs each pair as its OL
microbatch, then its UL partner, back to back; an odd ``K_eff``'s median last, alone). Every order here
keeps that: it moves whole pairs, never a pair's two microbatches apart, and leaves the median last.

* ``aligned_pairs`` / ``pair_ranks``: an expert-parallel group's replicas run their heavy pairs at one
  reference replica's slots (their sparse layers wait for the group's slowest);
* ``heaviest_pairs_first``: by predicted LLM time, heaviest first (``ScheduleOptions.expert_balance``);
* ``ordered_pairs``: by predicted time over every stage, ascending or descending
  (``ScheduleOptions.pair_order`` ``"auto"``'s candidates, ``PAIR_ORDER_CANDIDATES``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from entrain.core.ir.microbatches import ReplicaAssignment

__all__ = [
    "PAIR_ORDER_CANDIDATES",
    "pair_ranks",
    "aligned_pairs",
    "heaviest_pairs_first",
    "ordered_pairs",
]

PAIR_ORDER_CANDIDATES = ("light first", "heavy first")
"""``ordered_pairs``' orders beside Algorithm 3's (``"paper"``): the pairs by predicted time over every
stage ascending (the lightest fills the pipeline) or descending (the lightest drains it)."""


def _pairs(rep: ReplicaAssignment) -> list[tuple[int, ...]] | None:
    """``rep``'s deferral pairs in execution order (consecutive OL, UL); None where its deferrals are not
    Algorithm 3's pairs."""
    order = rep.execution_order
    pairs = [order[i : i + 2] for i in range(0, len(order) - len(order) % 2, 2)]
    if any((d.from_mb, d.to_mb) not in pairs for d in rep.deferrals):
        return None
    return pairs


def _placed(rep: ReplicaAssignment, pairs: Sequence[tuple[int, ...]]) -> ReplicaAssignment:
    """``rep`` running ``pairs`` in that order, its median (odd ``K_eff``) still last."""
    new = tuple(m for pair in pairs for m in pair) + rep.execution_order[len(pairs) * 2 :]
    return rep if new == rep.execution_order else replace(rep, execution_order=new)


def _ranked(weight: Sequence[float], heaviest_first: bool) -> list[int]:
    """Pair indices by ``weight``, heaviest or lightest first (ties: the earlier pair)."""
    sign = -1.0 if heaviest_first else 1.0
    return sorted(range(len(weight)), key=lambda i: (sign * weight[i], i))


def pair_ranks(rep: ReplicaAssignment, llm_ms: Callable[[Sequence[str]], float]) -> list[int] | None:
    """The slots of ``rep``'s deferral pairs, heaviest pair first (``llm_ms`` of its two LLM microbatches;
    ties: the earlier slot); None where ``_pairs`` is."""
    pairs = _pairs(rep)
    if pairs is None:
        return None
    return _ranked(
        [llm_ms(rep.llm_microbatches[ol]) + llm_ms(rep.llm_microbatches[ul]) for ol, ul in pairs], True
    )


def aligned_pairs(
    rep: ReplicaAssignment, slots: Sequence[int], llm_ms: Callable[[Sequence[str]], float]
) -> ReplicaAssignment:
    """``rep`` with its ``i``-th heaviest deferral pair run in slot ``slots[i]`` (a reference replica's
    ``pair_ranks``), an odd ``K_eff``'s median still last; ``rep`` itself where its pairs are not
    Algorithm 3's or their number differs."""
    pairs, mine = _pairs(rep), pair_ranks(rep, llm_ms)
    if pairs is None or mine is None or len(mine) != len(slots):
        return rep
    placed: list[tuple[int, ...]] = list(pairs)
    for slot, j in zip(slots, mine):
        placed[slot] = pairs[j]
    return _placed(rep, placed)


def heaviest_pairs_first(
    rep: ReplicaAssignment, llm_ms: Callable[[Sequence[str]], float]
) -> ReplicaAssignment:
    """``rep`` running its deferral pairs (``execution_order``'s consecutive OL, UL) by the pair's
    ``llm_ms`` of its two LLM microbatches descending (ties: the earlier pair), an odd ``K_eff``'s
    median still last (``ScheduleOptions.expert_balance``)."""
    pairs, ranked = _pairs(rep), pair_ranks(rep, llm_ms)
    if pairs is None or ranked is None:
        return rep  # not Algorithm 3's pairs: kept as they are
    return _placed(rep, [pairs[i] for i in ranked])


def ordered_pairs(
    rep: ReplicaAssignment, order: str, microbatch_ms: Callable[[ReplicaAssignment, int], float]
) -> ReplicaAssignment | None:
    """``rep`` running its deferral pairs by ``microbatch_ms`` (a microbatch's predicted time over every
    stage: its encoder microbatch on the encoder's, its LLM microbatch on the LLM's) of the pair's two
    microbatches, ascending for ``"light first"``, descending for ``"heavy first"`` (ties: the earlier
    pair), its median still last; None where its pairs are not Algorithm 3's or fewer than two (one
    order only)."""
    if order not in PAIR_ORDER_CANDIDATES:
        raise ValueError(f"pair order {order!r}; choose from {', '.join(PAIR_ORDER_CANDIDATES)}")
    pairs = _pairs(rep)
    if pairs is None or len(pairs) < 2:
        return None
    weight = [microbatch_ms(rep, ol) + microbatch_ms(rep, ul) for ol, ul in pairs]
    return _placed(rep, [pairs[i] for i in _ranked(weight, order == "heavy first")])
