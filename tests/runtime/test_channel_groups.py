"""Channel groups at scale, with a fake backend (no processes): under NCCL a process makes one
world-wide split per round of disjoint channels, a number bounded by the channels of one plan rank
(not the world size: 4 at 1,024 and at 4,096 GPUs, against 1,920 and 7,680 world-wide
``new_group`` calls for a 4 + 12 stage pipeline), and each channel's group is the split
subgroup of its two processes (its TP rank's copy); gloo keeps one world-wide ``new_group`` per
channel and TP rank."""

from __future__ import annotations

import pytest

from entrain.core.ir.p2p import layout_channels
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.runtime.channel_groups import build_channel_groups, channel_rounds, group_calls


def _disjoint(enc_pp: int, llm_pp: int, dp: int) -> Layout:
    stages = [StageSpec(i, "encoder", i, i + 1, i) for i in range(enc_pp)]
    stages += [StageSpec(enc_pp + j, "llm", j, j + 1, enc_pp + j) for j in range(llm_pp)]
    comps = {"encoder": ComponentLayout(pp=enc_pp), "llm": ComponentLayout(pp=llm_pp)}
    return Layout(dp, 1, 1, comps, tuple(stages))


def _colocated(pp: int, dp: int) -> Layout:
    """Rank r holds encoder stage r and LLM stage r (DIP): a ring of channels."""
    stages = [StageSpec(i, "encoder", i, i + 1, i) for i in range(pp)]
    stages += [StageSpec(pp + j, "llm", j, j + 1, j) for j in range(pp)]
    comps = {"encoder": ComponentLayout(pp=pp), "llm": ComponentLayout(pp=pp)}
    return Layout(dp, 1, 1, comps, tuple(stages))


@pytest.mark.parametrize(
    ("layout", "tp"),
    [
        (_disjoint(4, 12, 64), 1),  # 1,024 GPUs
        (_disjoint(4, 12, 32), 2),  # 1,024 GPUs with TP 2
        (_colocated(8, 128), 1),  # 1,024 GPUs, DIP
        (_disjoint(4, 12, 256), 1),  # 4,096 GPUs
        (_disjoint(8, 24, 64), 2),  # 4,096 GPUs with TP 2
        (_colocated(16, 256), 1),  # 4,096 GPUs, DIP
    ],
)
def test_nccl_splits_per_process_are_bounded_by_one_ranks_channels(layout, tp):
    calls = group_calls(layout, tp)
    assert calls["most_channels"] <= 4  # two per neighbouring plan rank, a chain or ring
    assert calls["split"] <= 2 * calls["most_channels"] - 1
    assert calls["new_group"] >= layout.world_size  # the world-wide way grows with the world


def test_the_split_count_does_not_grow_with_the_world():
    small, large = group_calls(_disjoint(4, 12, 1), 1), group_calls(_disjoint(4, 12, 256), 1)
    assert small["split"] == large["split"] and large["new_group"] == 256 * small["new_group"]


def test_rounds_hold_each_channel_once_and_no_rank_twice():
    for layout in (_disjoint(2, 3, 3), _colocated(4, 2), _disjoint(1, 1, 2)):
        rounds = channel_rounds(layout_channels(layout))
        assert sorted(ch for rnd in rounds for ch in rnd) == layout_channels(layout)
        for rnd in rounds:
            ranks = [r for ch in rnd for r in ch]
            assert len(ranks) == len(set(ranks))


class _FakeWorld:
    """Records every process's group-creating calls; a split gives each process its subgroup."""

    def __init__(self):
        self.calls: dict[int, list] = {}

    def split(self, process: int):
        def call(split_ranks, **kwargs):
            self.calls.setdefault(process, []).append(("split", split_ranks, kwargs))
            flat = [r for sub in split_ranks for r in sub]
            assert len(flat) == len(set(flat)), "split_group needs disjoint subgroups"
            return next((tuple(sub) for sub in split_ranks if process in sub), None)

        return call

    def new_group(self, process: int):
        def call(ranks, **kwargs):
            self.calls.setdefault(process, []).append(("new_group", ranks, kwargs))
            return tuple(ranks)

        return call


@pytest.mark.parametrize("nccl", [True, False])
@pytest.mark.parametrize(("layout", "tp"), [(_disjoint(1, 2, 2), 2), (_colocated(3, 2), 1)])
def test_every_process_gets_the_group_of_its_channels_from_the_same_calls(layout, tp, nccl):
    world = _FakeWorld()
    for process in range(layout.world_size * tp):
        plan_rank, tp_rank = divmod(process, tp)
        groups = build_channel_groups(
            layout,
            tp,
            plan_rank,
            tp_rank,
            new_group=world.new_group(process),
            split=world.split(process) if nccl else None,
            timeout=7,
        )
        mine = [ch for ch in layout_channels(layout) if plan_rank in ch]
        assert sorted(groups) == mine
        for (src, dst), group in groups.items():
            assert group == (src * tp + tp_rank, dst * tp + tp_rank)
    first = world.calls[0]
    assert all(calls == first for calls in world.calls.values())  # collective: the same calls everywhere
    assert all(kwargs == {"timeout": 7} for *_, kwargs in first)
    want = group_calls(layout, tp)["split" if nccl else "new_group"]
    assert len(first) == want and {c[0] for c in first} == {"split" if nccl else "new_group"}
