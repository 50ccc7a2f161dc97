"""Real LLaVA samples: the runtime's tensors agree with the metadata the Plans were made from."""

from __future__ import annotations

import pytest
import torch

from entrain.cli.main import main
from entrain.core.costs.presets import build_cost_model
from entrain.data.workload_io import load_workload
from entrain.models.families.composition.config import IMAGE_PAD_ID, get_model_config
from entrain.runtime.data import SampleRenderer
from entrain.runtime.record_source import RecordSource


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert main(["data", "synth", "--dataset", "cocoqa", "--num-samples", "4", "--out", str(out)]) == 0
    return out / "data.json"


def test_llava_samples_match_their_metadata(synth):
    cost = build_cost_model("tiny", "cpu-tiny")
    batch = next(load_workload(str(synth), cost, global_batch=4, iterations=1, seed=0))
    cfg = get_model_config("tiny")
    metas = {w.id: w.meta for w in batch}
    r = SampleRenderer(cfg, metas, source=RecordSource(str(synth)))
    for w in batch:
        s = r.sample(w.id)
        assert s.num_tokens == w.meta.llm_tokens and s.image_tokens == w.meta.image_tokens
        assert int((s.input_ids == cfg.token_id(IMAGE_PAD_ID)).sum()) == s.image_tokens
        assert r.patches(w.id).shape == (w.meta.vit_patches, cfg.vision.patch_dim)
        assert 0 < s.num_labels < s.num_tokens and bool((s.input_ids < cfg.llm.vocab_size).all())
    enc = r.encoder_input([w.id for w in batch])
    assert sum(enc.rows_per_sample) == sum(w.meta.image_tokens for w in batch)
    assert torch.isfinite(enc.patches).all()
