"""Message parts and forbidden cuts a family declares on its ``LayerSpec``s, through the cost model, the
planner and the simulator: the cost model prices each part's bytes, the Plan's stages carry the parts,
the simulator charges exactly their bytes (forward and gradient message), and the partition never ends
a stage where the family forbids it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from entrain.core.costs.costmodel import CostModel
from entrain.core.costs.presets import build_cost_model, get_arch
from entrain.core.errors import ConfigError
from entrain.core.ir.parallel import ParallelConfig
from entrain.core.ir.plan import ComponentLayout, Layout, StageSpec
from entrain.core.model.layer_specs import MessagePart
from entrain.core.planning.config_search import evaluate_config
from entrain.core.planning.partition import min_max_partition
from entrain.core.systems import plan_system
from entrain.core.workload.samples import SampleMeta
from entrain.sim.executor import simulate_plan

ENC_PART = MessagePart("deep", 64, 2, rows_per_token=0.25)
"""One row per merged image token: a quarter of the encoder's patch rows."""
LLM_PART = MessagePart("deep", 64, 2, rows="image_tokens")


@dataclass(frozen=True)
class Declaring:
    """The tiny preset's shape with what a family may declare: ``parts`` on the encoder's last layer and
    the LLM's embedding, ``no_cut``: LLM layers no stage may end after."""

    parts: bool = True
    no_cut: tuple[int, ...] = ()
    name: str = "tiny"

    def layer_specs(self, label_fraction=None):
        specs = get_arch("tiny").layer_specs(label_fraction)
        if self.parts:
            specs["encoder"][-1] = replace(specs["encoder"][-1], message_parts=(ENC_PART,))
            specs["llm"][0] = replace(specs["llm"][0], message_parts=(LLM_PART,))
        for i in self.no_cut:
            specs["llm"][i] = replace(specs["llm"][i], no_cut_after=True)
        return specs


def _cost(**kw) -> CostModel:
    return build_cost_model(Declaring(**kw), "cpu-tiny")


def test_the_cost_model_prices_each_part_and_keeps_it_in_its_file():
    cost, plain = _cost(), build_cost_model("tiny", "cpu-tiny")
    n_enc = cost.encoder.num_layers
    assert cost.boundary_parts("encoder", n_enc) == (ENC_PART,) and cost.boundary_parts("llm", 1) == (
        LLM_PART,
    )
    assert cost.boundary_parts("llm", 2) == () and plain.boundary_parts("encoder", n_enc) == ()
    assert cost.part_bytes("encoder", n_enc, 400, 100) == {"deep": 400 * 0.25 * 64 * 2}
    assert cost.part_bytes("llm", 1, 300, 100) == {"deep": 100 * 64 * 2}
    for comp, end in (("encoder", n_enc), ("llm", 1)):
        extra = sum(cost.part_bytes(comp, end, 400, 100).values())
        assert cost.boundary_bytes(comp, end, 400, 100) == plain.boundary_bytes(comp, end, 400, 100) + extra
    assert CostModel.from_json(cost.to_json()) == cost
    assert "message_parts" not in str(plain.to_json())  # a family without parts: the same cost file


def _one_sample_plan(cost: CostModel):
    """``1f1b`` on encoder | LLM, one sample: its encoder message and its gradient on the critical path."""
    stages = (
        StageSpec(0, "encoder", 0, cost.encoder.num_layers, 0),
        StageSpec(1, "llm", 0, cost.llm.num_layers, 1),
    )
    layout = Layout(1, 1, 1, {"encoder": ComponentLayout(), "llm": ComponentLayout()}, stages)
    sample = cost.sample_work(SampleMeta("s", ((224, 448),), 64))
    return plan_system("1f1b", layout, [[sample]], cost), sample


def test_the_simulator_charges_exactly_the_bytes_of_the_extra_part():
    cost, plain = _cost(), build_cost_model("tiny", "cpu-tiny")
    with_part, sample = _one_sample_plan(cost)
    without, _ = _one_sample_plan(plain)
    assert with_part.layout.stages[0].parts == (ENC_PART,) and without.layout.stages[0].parts == ()
    tokens = sum(sample.meta.vit_patches_per_image)
    extra_bytes = tokens * 0.25 * 64 * 2
    extra_ms = 2 * extra_bytes / cost.hardware.p2p_bandwidth_bytes_per_ms  # the message and its gradient
    slower = simulate_plan(with_part, cost)[0].iteration_time_ms
    plain_ms = simulate_plan(without, plain)[0].iteration_time_ms
    assert extra_ms > 0 and slower - plain_ms == pytest.approx(extra_ms, rel=1e-9)


def test_the_partition_never_cuts_where_it_is_forbidden():
    assert min_max_partition([1, 1, 1, 1], 2).ranges == ((0, 2), (2, 4))
    assert min_max_partition([1, 1, 1, 1], 2, forbidden_cuts={2}).ranges == ((0, 1), (1, 4))
    with pytest.raises(ConfigError, match="forbids"):
        min_max_partition([1, 1, 1], 3, forbidden_cuts={1})


def test_the_planner_honours_a_familys_forbidden_cuts():
    metas = [SampleMeta(f"s{i}", ((224, 224),), 64 + 16 * i) for i in range(4)]
    parallel = ParallelConfig(dp=1, global_batch=4, microbatch_size=1)
    free = evaluate_config(metas, _cost(parts=False), parallel, encoder=(1, 1, 1), llm=(1, 1, 2))
    cut = free.llm.layer_ranges[0][1]
    cost = _cost(parts=False, no_cut=(cut - 1,))
    assert cost.forbidden_cuts("llm") == {cut} and cost.forbidden_cuts("encoder") == frozenset()
    held = evaluate_config(metas, cost, parallel, encoder=(1, 1, 1), llm=(1, 1, 2))
    assert held.llm.layer_ranges[0][1] != cut
