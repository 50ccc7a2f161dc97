"""DIP fixes its degrees up front, its DP included: ``--dp`` where given, else its own default
(``planning.baselines.dip_dp``), whichever systems run beside it, on one encoder and on several."""

from __future__ import annotations

from dataclasses import replace

from entrain.core.costs.presets import resolve_cost_model
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.planning.baselines import dip_dp
from entrain.core.planning.encoders_baselines import dip_encoders_parallel
from entrain.core.planning.setups import ConfigRequest, system_setups
from entrain.data.sampling import dataset_sampler

REQ = ConfigRequest("synthchartnet", "qwen25vl-llama3-1b", 32, None, 2, 64, 4, seed=0)
"""No ``--dp``: Entrain's planner chooses 8 replicas here, DIP keeps its own 4."""


def _setups(systems: list[str], req: ConfigRequest = REQ):
    cost = resolve_cost_model(req.model, hardware="a40-paper")
    return system_setups(systems, req, cost, dataset_sampler(req.dataset, req.seed))


def test_dip_keeps_its_own_dp_whichever_systems_run_beside_it():
    alone = _setups(["dip"])["dip"]
    beside = _setups(["entrain", "dip"])
    assert beside["entrain"].layout.dp != alone.layout.dp  # the case tells the two rules apart
    assert alone.layout.dp == beside["dip"].layout.dp == dip_dp(32, 2) == 4
    assert alone.layout == beside["dip"].layout


def test_a_given_dp_is_dips_and_a_few_gpus_hold_fewer_replicas():
    assert _setups(["dip"], replace(REQ, dp=2))["dip"].layout.dp == 2
    assert [dip_dp(gpus, 2) for gpus in (2, 4, 8, 12, 16, 64)] == [1, 1, 2, 3, 4, 4]
    assert dip_dp(64, 2, cp=4) == 4 and dip_dp(16, 2, cp=2) == 2


def test_several_encoders_dip_takes_the_same_default():
    for gpus, tp in ((8, 1), (16, 2), (64, 2)):
        par, pp = dip_encoders_parallel(ParallelConfig(gpus=gpus, tp=tp, global_batch=64, microbatch_size=4))
        assert par.dp == dip_dp(gpus, tp) and pp == gpus // (par.dp * tp)
