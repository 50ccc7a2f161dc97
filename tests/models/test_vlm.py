"""Models from Hugging Face configs: stage split, packing, vocabulary remap, presets."""

from __future__ import annotations

import pytest
import torch

from entrain.core.costs.presets import build_cost_model
from entrain.core.errors import ConfigError
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.composition.config import (
    IMAGE_PAD_ID,
    TINY_VOCAB_SIZE,
    get_model_config,
    tiny_token_id,
)
from entrain.models.families.composition.model import build_stage, build_vlm, set_trainable
from entrain.runtime.data import SampleRenderer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    cfg = get_model_config("tiny")
    metas = {
        "a": SampleMeta("a", ((56, 84),), 30),
        "b": SampleMeta("b", ((112, 56), (56, 56)), 45),
        "c": SampleMeta("c", (), 20),
        "d": SampleMeta("d", ((168, 112),), 17),
    }
    return cfg, build_vlm(cfg, seed=0), SampleRenderer(cfg, metas, seed=0)


def test_layer_names_match_cost_model():
    for name in ("tiny", "qwen25vl-llama3-1b", "qwen25vl-llama3-3b"):
        cfg = get_model_config(name)
        cost = build_cost_model(name, "cpu-tiny" if name == "tiny" else "a40-paper")
        assert cfg.encoder_layer_names == cost.encoder.layer_names
        assert cfg.llm_layer_names == cost.llm.layer_names


def test_tiny_vocabulary_remap_is_deterministic_and_pins_specials():
    assert tiny_token_id(IMAGE_PAD_ID) == 4064 + 12
    ids = [0, 5, 4063, 4064, 151_642, 151_643, 151_664]
    mapped = [tiny_token_id(i) for i in ids]
    assert all(0 <= m < TINY_VOCAB_SIZE for m in mapped)
    assert mapped[:3] == [0, 5, 4063] and mapped[3] == 0
    assert len({tiny_token_id(i) for i in range(151_643, 151_665)}) == 22  # specials stay distinct
    with pytest.raises(ValueError):
        tiny_token_id(151_936)


def test_stages_compose_to_the_full_model(tiny):
    cfg, model, r = tiny
    ids = ["a", "b", "d"]
    enc = r.encoder_input(ids)
    ref = model.vision(enc.patches, enc.grid_thw).pooler_output
    e0, e1 = build_stage(model, "encoder", 0, 2), build_stage(model, "encoder", 2, 4)
    out = e1(e0(enc.patches, enc.grid_thw), enc.grid_thw)
    assert out.shape == (sum(enc.rows_per_sample), cfg.llm.hidden_size)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    # per-sample rows in sample order: encoding one sample alone gives its rows
    alone = model.vision(r.encoder_input(["b"]).patches, r.encoder_input(["b"]).grid_thw).pooler_output
    start = enc.rows_per_sample[0]
    torch.testing.assert_close(out[start : start + alone.shape[0]], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("cut", [2, 3])  # 3: the merger alone on the second stage
def test_stages_reuse_geometry_across_microbatches(tiny, cut, monkeypatch):
    """Each encoder stage keeps the index tensors of the image grids it saw: a microbatch of other
    grids computes its own, a repeated one reuses them, and every output equals the whole tower's."""
    from entrain.models.families.composition.model import EncoderStage

    _, model, r = tiny
    calls = []
    compute = EncoderStage._compute_geometry
    monkeypatch.setattr(
        EncoderStage, "_compute_geometry", lambda s, g, x: calls.append(1) or compute(s, g, x)
    )
    e0, e1 = build_stage(model, "encoder", 0, cut), build_stage(model, "encoder", cut, 4)
    for ids in (["a", "b", "d"], ["d"], ["a", "b", "d"], ["b"], ["d"]):
        enc = r.encoder_input(ids)
        ref = model.vision(enc.patches, enc.grid_thw).pooler_output
        torch.testing.assert_close(e1(e0(enc.patches, enc.grid_thw), enc.grid_thw), ref, rtol=0, atol=1e-6)
    assert len(calls) == 3 * (1 if cut == 3 else 2)  # 3 distinct grid lists; the merger alone needs none


def test_packed_logits_equal_alone(tiny):
    """A sample's logits are the same alone or packed with others (per-sample causal attention)."""
    cfg, model, r = tiny
    ids = ["a", "b", "c", "d"]
    n = len(cfg.llm_layer_names)
    body, head = build_stage(model, "llm", 0, n - 2), build_stage(model, "llm", n - 2, n - 1)
    feats = {
        i: model.vision(r.encoder_input([i]).patches, r.encoder_input([i]).grid_thw).pooler_output
        for i in ids
        if r.sample(i).image_tokens
    }
    with torch.no_grad():
        packed_batch = r.llm_batch(ids, 1.0)
        x = torch.cat([feats[i] for i in ids if i in feats])
        packed = head(body(x, packed_batch), packed_batch)
        alone = []
        for i in ids:
            b = r.llm_batch([i], 1.0)
            alone.append(head(body(feats.get(i), b), b))
    torch.testing.assert_close(packed, torch.cat(alone), rtol=0, atol=1e-5)


def test_embedding_only_stage_runs_split_backward(tiny):
    """An LLM stage of the embedding alone (the boundary rank of a shared layout) runs
    split backward: torch's ``stage_backward_input`` detaches the stage output in place, which a view
    refuses."""
    from torch.distributed.pipelining._backward import stage_backward_input

    _, model, r = tiny
    ids = ["a", "c"]
    enc = r.encoder_input(ids)
    feats = model.vision(enc.patches, enc.grid_thw).pooler_output.detach().requires_grad_()
    stage = build_stage(model, "llm", 0, 1)
    batch = r.llm_batch(ids, 1.0)
    out = stage(feats, batch)
    ref = model.llm.model.embed_tokens(batch.input_ids).index_put((batch.image_positions,), feats)
    torch.testing.assert_close(out[0], ref, rtol=0, atol=0)
    params = [p for _, p in stage.owned_parameters()]
    stage_backward_input([out], [torch.ones_like(out)], [feats], iter(params))
    torch.testing.assert_close(feats.grad, torch.ones_like(feats))


def test_rendered_sample_layout(tiny):
    cfg, _, r = tiny
    s = r.sample("b")
    assert s.image_tokens == sum(t * h * w // 4 for t, h, w in s.grid_thw)
    assert int((s.input_ids == cfg.token_id(IMAGE_PAD_ID)).sum()) == s.image_tokens
    assert s.num_tokens == 45 + s.image_tokens
    assert s.num_labels == 9  # round(0.2 * 45)
    assert bool((s.label_positions[1:] - s.label_positions[:-1] == 1).all())
    assert int(s.label_positions[-1]) == s.num_tokens - 2
    torch.testing.assert_close(r.patches("b"), r.patches("b"))  # deterministic


def test_frozen_encoder_keeps_merger_trainable(tiny):
    cfg, _, _ = tiny
    model = build_vlm(cfg, seed=0)
    set_trainable(model, encoder=False, merger=True, llm=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(n.startswith(("vision.merger.", "llm.")) for n in trainable)
    assert any(n.startswith("vision.merger.") for n in trainable)


def test_bad_stage_range_is_refused(tiny):
    _, model, _ = tiny
    with pytest.raises(ConfigError, match=r"layers \[3, 9\)"):
        build_stage(model, "encoder", 3, 9)


def test_paper_scale_preset_builds_on_meta_device():
    cfg = get_model_config("qwen25vl-llama3-1b")
    with torch.device("meta"):
        model = build_vlm(cfg)
    assert model.llm.model.embed_tokens.weight.shape == (151_936, 2048)
    assert model.vision.merger.mlp[-1].out_features == 2048
    assert len(model.vision.blocks) == 32 and len(model.llm.model.layers) == 16


def test_weights_from_hugging_face_folders_keep_the_varlen_vision_attention(tiny, tmp_path):
    """``--weights`` with ``vision/`` and ``llm/`` folders loads through transformers' from_pretrained,
    which must not look for a flash kernel package behind the tower's ``entrain_flash_windows``."""
    from entrain.models.families.packed_attention import VISION_ATTENTION

    cfg, model, _ = tiny
    model.vision.save_pretrained(tmp_path / "vision")
    model.llm.save_pretrained(tmp_path / "llm")
    loaded = build_vlm(cfg, seed=1, weights_dir=str(tmp_path))
    assert loaded.vision.config._attn_implementation == VISION_ATTENTION
    assert model.vision.config._attn_implementation == VISION_ATTENTION
    for (name, p), q in zip(model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name
