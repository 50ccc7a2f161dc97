"""The point-to-point groups of a process: one per channel (``entrain.core.ir.p2p``) and TP rank, built
in a number of world-wide calls that does not grow with the world.

``torch.distributed.new_group`` is a collective of the whole world: every process calls it for every
group, its own or not, and under NCCL with a bound device each call is a world-wide
``ncclCommSplit`` (the processes outside the group split off with no colour). One group per channel
and TP rank made that ``len(layout_channels) * tp`` world-wide splits at start, about 1,800 at 1,024
GPUs. Channels whose processes do not overlap can come out of one split instead
(``torch.distributed.split_group``, a list of disjoint rank lists): ``channel_rounds`` colours the
channels greedily, in the global channel order, so that no plan rank is in two channels of a round,
and every TP copy of a round's channels shares its split. A plan rank with ``n`` channels (two per
neighbouring plan rank) needs at most ``2n - 1`` rounds, whatever the world size (``group_calls``).

``split_group`` is NCCL's (it needs the default group bound to a device); gloo, the CPU backend of
tests and small runs, keeps one ``new_group`` per channel and TP rank. (``new_group``'s
``use_local_synchronization`` would let members alone build a group, but its name counts the groups
each process made so far, which differ between members that have different channels.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from entrain.core.ir.p2p import layout_channels
from entrain.core.ir.plan import Layout

__all__ = ["channel_rounds", "build_channel_groups", "group_calls"]

Channel = tuple[int, int]


def channel_rounds(channels: Sequence[Channel]) -> list[list[Channel]]:
    """``channels`` in rounds where no plan rank is on two channels of one round: each channel, in
    sorted order, goes to the first round neither of its ranks is busy in (the same on every process)."""
    rounds: list[list[Channel]] = []
    busy: list[set[int]] = []
    for src, dst in sorted(channels):
        i = next((i for i, used in enumerate(busy) if src not in used and dst not in used), len(rounds))
        if i == len(rounds):
            rounds.append([])
            busy.append(set())
        rounds[i].append((src, dst))
        busy[i].update((src, dst))
    return rounds


def _processes(channel: Channel, tp: int, tp_rank: int) -> list[int]:
    return [channel[0] * tp + tp_rank, channel[1] * tp + tp_rank]


def build_channel_groups(
    layout: Layout,
    tp: int,
    plan_rank: int,
    tp_rank: int,
    *,
    new_group: Callable[..., object],
    split: Callable[..., object] | None = None,
    cross_replica: bool = False,
    **kwargs,
) -> dict[Channel, object]:
    """This process's group of each channel it is on (its TP rank's copy). With ``split``
    (``torch.distributed.split_group``): one split of the world per round of ``channel_rounds``;
    without: one world-wide ``new_group`` per channel and TP rank. Every process makes the same calls
    in the same order; ``cross_replica``: with the channels between replicas
    (``entrain.core.ir.p2p.layout_channels``); ``kwargs``: the groups' timeout."""
    out: dict[Channel, object] = {}
    if split is not None:
        for rnd in channel_rounds(layout_channels(layout, cross_replica)):
            subgroups = [_processes(ch, tp, t) for ch in rnd for t in range(tp)]
            group = split(split_ranks=subgroups, **kwargs)
            out.update((ch, group) for ch in rnd if plan_rank in ch)
        return out
    for channel in layout_channels(layout, cross_replica):
        for t in range(tp):
            group = new_group(_processes(channel, tp, t), **kwargs)
            if t == tp_rank and plan_rank in channel:
                out[channel] = group
    return out


def group_calls(layout: Layout, tp: int) -> dict[str, int]:
    """World-wide group creations each process makes for ``layout``'s channels: ``new_group`` (one
    per channel and TP rank) and ``split`` (one per round), and ``most_channels``, the most channels
    one plan rank is on."""
    channels = layout_channels(layout)
    per_rank: dict[int, int] = {}
    for ch in channels:
        for r in ch:
            per_rank[r] = per_rank.get(r, 0) + 1
    return {
        "new_group": len(channels) * tp,
        "split": len(channel_rounds(channels)),
        "most_channels": max(per_rank.values(), default=0),
    }
