"""What docs/baselines.md ("DFLOP") says of our ``dflop``: each module chooses its own tensor
parallelism when ``--tp`` is open, a sample's predicted duration in a module is its time per stage of
that module, the ILP bounds each module's load on its own (never their sum), group ``j`` runs as
microbatch ``j // dp`` of replica ``j % dp``, and the ILP is built only up to ``ILP_MAX_BINARIES``."""

from __future__ import annotations

import numpy as np

from entrain.core.assignment.batchers import dflop
from entrain.core.assignment.batchers.dflop import (
    _objective,
    assign_dflop,
    ilp_groups,
    minmax_lpt,
    module_costs,
)
from entrain.core.costs.presets import resolve_cost_model
from entrain.core.planning.setups import ConfigRequest, system_setups
from entrain.core.systems import DFLOP
from entrain.core.workload.work import SampleWork
from entrain.data.sampling import dataset_sampler


def test_dflop_modules_choose_their_own_tensor_parallelism():
    """DFLOP's per-module layouts: with ``--tp`` open, chartqa on 16 GPUs at DP 2 gives the encoder
    TP 2 and the LLM TP 4, configured on one draw of a global batch (64 samples)."""
    req = ConfigRequest("chartqa", "qwen25vl-llama3-1b", 16, 2, None, 64, 4, seed=0)
    cost = resolve_cost_model(req.model, hardware="a40-paper")
    setup = system_setups([DFLOP], req, cost, dataset_sampler(req.dataset, 0))[DFLOP]
    enc, llm = setup.layout.components["encoder"], setup.layout.components["llm"]
    assert (enc.tp, llm.tp) == (2, 4)
    assert len(setup.profile) == req.global_batch


class _Times:
    """A fake ``stage_times``: 3 encoder stages and 2 LLM stages; forward 1 ms and backward 2 ms a
    stage per unit of the sample's encoder / LLM work."""

    encoder_stages = 3

    def __call__(self, samples):
        (s,) = samples
        per = [s.encoder] * 3 + [s.llm] * 2
        return np.array([per, [2 * p for p in per]])


def test_a_modules_duration_is_its_time_per_stage():
    """Forward + backward summed over the module's stages, over its stage count: encoder work 2 gives
    (2 + 4) ms on each of 3 stages, 18 / 3 = 6; LLM work 5 gives (5 + 10) ms on each of 2, 30 / 2 = 15."""
    got = module_costs([SampleWork("a", 2.0, 5.0)], _Times(), _Times.encoder_stages)
    assert got.tolist() == [[6.0, 15.0]]


def test_the_ilp_bounds_each_module_not_their_sum():
    """Samples (5, 0), (0, 5), (3, 3), (3, 3) in 2 groups: bounding each module, {0, 1} | {2, 3} has
    C_max 6; bounding the sum of the two modules would pick {0, 2} | {1, 3} (sums 11 and 11, not 10
    and 12), whose encoder load is 8."""
    costs = np.array([[5.0, 0.0], [0.0, 5.0], [3.0, 3.0], [3.0, 3.0]])
    got = ilp_groups(costs, 2)
    assert got is not None
    assert sorted(sorted(int(i) for i in g) for g in got) == [[0, 1], [2, 3]]
    assert _objective(costs, got) == 6.0


def test_group_j_is_microbatch_j_div_dp_of_replica_j_mod_dp(monkeypatch):
    """Above ``ILP_MAX_BINARIES`` the ILP is not built (a call fails the test) and the LPT's groups
    are used; group ``j`` is then microbatch ``j // dp`` of replica ``j % dp``."""

    def no_ilp(*_a, **_k):
        raise AssertionError("the ILP was built above ILP_MAX_BINARIES")

    monkeypatch.setattr(dflop, "ilp_groups", no_ilp)
    monkeypatch.setattr(dflop, "ILP_MAX_BINARIES", 0)
    batch = [SampleWork(f"s{i:02d}", float(1 + (7 * i) % 11), float(1 + (5 * i) % 13)) for i in range(24)]
    dp, k = 2, 3
    got = assign_dflop(batch, dp, k)
    groups = minmax_lpt(np.array([[s.encoder, s.llm] for s in batch]), dp * k)
    for j, g in enumerate(groups):
        want = tuple(batch[i].id for i in sorted(g))
        rep = got.replicas[j % dp]
        assert tuple(rep.llm_microbatches[j // dp]) == want
        assert rep.encoder_microbatches[j // dp] == rep.llm_microbatches[j // dp]


def test_the_ilp_is_built_at_or_below_the_limit(monkeypatch):
    """At ``N * m <= ILP_MAX_BINARIES`` (4 samples x 2 groups) the batcher builds the ILP."""
    calls = []
    real = dflop.ilp_groups
    monkeypatch.setattr(dflop, "ilp_groups", lambda c, m: calls.append(m) or real(c, m))
    assign_dflop([SampleWork(f"s{i}", 1.0 + i, 1.0) for i in range(4)], 2, 1)
    assert calls == [2]
