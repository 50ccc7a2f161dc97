"""The runtime's data path over a real LLaVA dataset: each image is processed once, only where its
pixels are used, optionally ahead of time on a background thread, with the same tensors as the whole
record through ``entrain.data.processing.encode_sample``."""

from __future__ import annotations

import pytest
import torch

from entrain.cli.main import main
from entrain.core.costs.presets import build_cost_model
from entrain.data.workload_io import load_workload
from entrain.models.families.composition.config import get_model_config
from entrain.runtime.data import SampleRenderer
from entrain.runtime.record_source import RecordSource


@pytest.fixture(scope="module")
def batch_and_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert main(["data", "synth", "--dataset", "chartqa", "--num-samples", "4", "--out", str(out)]) == 0
    path = str(out / "data.json")
    cost = build_cost_model("tiny", "cpu-tiny")
    return next(load_workload(path, cost, global_batch=4, iterations=1, seed=0)), path


class CountingSource(RecordSource):
    def __init__(self, path: str):
        super().__init__(path)
        self.pixel_calls: list[str] = []

    def pixels(self, sample_id, vision):
        self.pixel_calls.append(sample_id)
        return super().pixels(sample_id, vision)


def _renderer(batch, path) -> tuple[SampleRenderer, CountingSource]:
    src = CountingSource(path)
    return SampleRenderer(get_model_config("tiny"), {w.id: w.meta for w in batch}, source=src), src


def test_tensors_equal_the_whole_record_encoding(batch_and_path):
    batch, path = batch_and_path
    r, src = _renderer(batch, path)
    cfg = r.cfg
    for w in batch:
        enc = src.encode(w.id, w.meta.vision)
        s = r.sample(w.id)
        assert s.input_ids.tolist() == [cfg.token_id(int(i)) for i in enc.input_ids]
        assert s.grid_thw == tuple(tuple(int(v) for v in g) for g in enc.image_grid_thw)
        labels = torch.as_tensor(enc.labels)
        assert s.label_positions.tolist() == torch.nonzero(labels[1:] != -100).flatten().tolist()
        assert torch.equal(r.patches(w.id), torch.as_tensor(enc.pixel_values))


def test_ids_never_process_images_and_pixels_once_per_use(batch_and_path):
    batch, path = batch_and_path
    r, src = _renderer(batch, path)
    ids = [w.id for w in batch]
    r.llm_batch(ids, 1.0)
    r.grid_thw(ids)
    assert src.pixel_calls == []  # an LLM-only rank, or a later encoder stage: ids and grids only
    r.encoder_input(ids)
    assert sorted(src.pixel_calls) == sorted(i for i in ids if r.metas[i].images)


def test_prefetched_pixels_are_identical_and_consumed(batch_and_path):
    batch, path = batch_and_path
    ids = [w.id for w in batch]
    plain, _ = _renderer(batch, path)
    expected = plain.encoder_input(ids)
    r, src = _renderer(batch, path)
    try:
        r.prefetch(ids)
        got = r.encoder_input(ids)
        assert len(src.pixel_calls) == len([i for i in ids if r.metas[i].images])
        assert torch.equal(got.patches, expected.patches) and torch.equal(got.grid_thw, expected.grid_thw)
        assert r._pending == {}  # consumed: the next use processes again (no unbounded cache)
        r.prefetch(ids[:1])
        r.prefetch(ids[1:2])
        r.prefetch(ids[2:3])  # ids[0] was never asked for: dropped
        assert set(r._pending) <= {ids[1], ids[2]}
    finally:
        r.close()


def test_generated_samples_ignore_prefetch():
    cost = build_cost_model("tiny", "cpu-tiny")
    batch = next(load_workload("cocoqa", cost, global_batch=2, iterations=1, seed=0))
    r = SampleRenderer(get_model_config("tiny"), {w.id: w.meta for w in batch})
    r.prefetch([w.id for w in batch])
    assert r._pool is None and r._pending == {}
    r.close()


def test_a_rendered_answer_has_the_metadatas_length():
    """Generated samples whose metadata counts answer tokens are rendered with exactly that many label
    positions (what the cost model prices ``lm_head`` and the loss on); without the count, 20 % of the
    text."""
    from entrain.core.workload.samples import SampleMeta

    cfg = get_model_config("tiny")
    metas = {
        "a": SampleMeta("a", ((224, 224),), 300, answer_tokens=250),
        "b": SampleMeta("b", ((224, 224),), 300),
    }
    renderer = SampleRenderer(cfg, metas, seed=0)
    assert len(renderer.sample("a").label_positions) == 250 == metas["a"].label_tokens
    assert len(renderer.sample("b").label_positions) == 60
