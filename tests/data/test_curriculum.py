"""The ``curriculum`` dataset: per-iteration batches in three equal phases; sample draws the whole mix."""

from __future__ import annotations

from entrain.cli.common import resolve_cost_model
from entrain.cli.main import build_parser
from entrain.data.generators import CURRICULUM_PHASES, batch_source, generate_samples
from entrain.data.workload_io import load_workload


def test_iterations_fall_in_three_equal_phases():
    assert [batch_source("curriculum", i, 9) for i in range(9)] == [
        p for p in CURRICULUM_PHASES for _ in range(3)
    ]
    assert [batch_source("curriculum", i, 4) for i in range(4)] == ["chartqa", "chartqa", "docvqa", "video"]
    assert batch_source("chartqa", 5, 9) == "chartqa"


def test_each_iteration_draws_its_phase_s_samples():
    cost = resolve_cost_model(build_parser().parse_args(["simulate", "--model", "tiny"]))
    batches = list(load_workload("curriculum", cost, global_batch=4, iterations=6, seed=3))
    for i, batch in enumerate(batches):
        phase = CURRICULUM_PHASES[i // 2]
        want = generate_samples(phase, 4, 3, start=4 * i)
        assert [w.meta for w in batch] == want


def test_a_sample_draw_is_the_whole_mix():
    samples = generate_samples("curriculum", 600, seed=0)
    frames = [len(s.images) for s in samples]
    assert max(frames) >= 2  # video samples (several temporal patches)
    big = sum(s.vit_patches > 8000 for s in samples)  # scanned pages and long videos
    small = sum(len(s.images) == 1 and s.vit_patches < 5000 for s in samples)  # charts (and small pages)
    assert big > 60 and small > 150
