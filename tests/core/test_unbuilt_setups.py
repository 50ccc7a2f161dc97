"""A baseline whose configuration cannot be built (DIP's colocated ranks, ``gpus / (dp * tp)``, outnumbering
a component's layers) is left out of a comparison and named with the reason (``system_setups``'s
``unbuilt``), not the end of the run; asked for alone (``plan``, ``train``) it is still the error."""

from __future__ import annotations

import pytest

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import ConfigError
from entrain.core.planning.setups import ConfigRequest, system_setups
from entrain.data.sampling import dataset_sampler

# the tiny model's encoder has 4 layers: DIP's 8 colocated ranks (8 GPUs, DP 1, TP 1) cannot hold it
REQ = ConfigRequest("chartqa", "tiny", 8, 1, 1, 16, 2, seed=0)


@pytest.fixture(scope="module")
def cost():
    return build_cost_model("tiny", "a40-paper")


def test_a_baseline_with_more_stages_than_layers_is_reported_not_raised(cost):
    unbuilt: dict[str, str] = {}
    got = system_setups(
        ["dip", "dip-greedy", "disttrain"], REQ, cost, dataset_sampler("chartqa", 0), unbuilt=unbuilt
    )
    assert set(got) == {"disttrain"}
    assert set(unbuilt) == {"dip", "dip-greedy"}
    assert "cannot be built" in unbuilt["dip"] and "cannot split 4 layers into 8 stages" in unbuilt["dip"]


def test_asked_for_alone_it_is_still_the_error(cost):
    with pytest.raises(ConfigError, match="cannot split 4 layers into 8 stages"):
        system_setups(["dip"], REQ, cost, dataset_sampler("chartqa", 0))
