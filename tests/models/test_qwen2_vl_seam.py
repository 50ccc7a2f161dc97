"""The ``qwen2_vl`` family through the model-family seam: registry lookup of a checkpoint folder, the
shape the planner prices, per-rank loading, position ids, profiler inputs and export."""

from __future__ import annotations

import json

import pytest
import torch

import entrain.models.families.qwen2_vl  # noqa: F401  (registers the family)
from entrain.core.costs.presets import layer_specs
from entrain.core.errors import ConfigError
from entrain.models.families.base import ModelSource, PackedSample
from entrain.models.families.qwen2_vl import model as qm
from entrain.models.families.qwen2_vl.positions import mrope_position_ids
from entrain.models.families.registry import family_of_folder, get_family
from tests.models.qwen_vl_tiny import FAMILIES, IMAGE, VEND, VIDEO, VSTART, mixed_samples, save_whole


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory):
    return save_whole(
        tmp_path_factory.mktemp(request.param), request.param, tied=request.param == "qwen2_5_vl"
    )


def test_registry_claims_whole_checkpoints_only(folder, tmp_path):
    assert family_of_folder(str(folder)).name == "qwen2_vl"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not get_family("qwen2_vl").claims_config({"model_type": "qwen2_5_vl_vision"})
    with pytest.raises(ConfigError, match="config.json"):
        get_family("qwen2_vl").shape(ModelSource(model_path=str(tmp_path)))


def test_shape_prices_the_checkpoint(folder):
    """The planner's shape counts exactly transformers' parameters; one layer spec per stage layer."""
    family = get_family("qwen2_vl")
    shape = family.shape(ModelSource(model_path=str(folder)))
    cfg = qm.read_hf_config(str(folder))
    hf = qm.conditional_generation_class(cfg.model_type).from_pretrained(folder)
    assert shape.num_params() == sum(p.numel() for p in hf.parameters())
    specs = layer_specs(shape)
    for component in ("encoder", "llm"):
        assert len(family.layer_names(shape, component)) == len(specs[component])
    assert shape.llm.qkv_bias and not shape.llm.attention_bias
    plain = (
        cfg.model_type == "qwen2_vl"
    )  # Qwen2-VL's tower: LayerNorm, fc1/fc2; Qwen2.5-VL's: RMSNorm, SwiGLU
    assert (shape.vision.norm, shape.vision.mlp) == (("layer", "plain") if plain else ("rms", "gated"))


def test_rank_loads_only_its_stages(folder):
    """A rank holding encoder blocks [3, 6) and LLM layers [0, 3) reads only those tensors."""
    family = get_family("qwen2_vl")
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    stages = [("encoder", 3, 6), ("llm", 0, 3)]
    model = family.build_model(cfg, stages=stages)
    owned = {n for c, a, b in stages for n, _ in family.build_stage(model, c, a, b).owned_parameters()}
    for name, p in model.named_parameters():
        assert p.is_meta == (name not in owned), name
    assert "model.visual.merger.mlp.0.weight" in owned and "model.language_model.embed_tokens.weight" in owned
    assert "model.visual.patch_embed.proj.weight" not in owned and "lm_head.weight" not in owned


def test_position_ids_through_the_family(folder):
    family = get_family("qwen2_vl")
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    samples = mixed_samples()
    packed = [PackedSample(s.input_ids, s.image_positions, s.grids) for s in samples]
    ids = family.position_ids(cfg, packed)
    assert torch.equal(ids, mrope_position_ids(cfg.hf, samples))
    assert family.token_ids(cfg) == {"image": IMAGE, "image_start": VSTART, "image_end": VEND, "video": VIDEO}
    assert family.map_token_id(cfg, 151_655) == IMAGE and family.map_token_id(cfg, 151_644) < VSTART


def test_touching_images_continue_as_if_apart(folder):
    """Two images with no token between them (the renderer's short texts) take transformers' ids of
    the same sample with a token between them, less that token (transformers itself would take the two
    runs for one image); a sample whose image tokens do not match its grids is refused."""
    family = get_family("qwen2_vl")
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    grids = ((1, 4, 4), (1, 2, 6))
    touching = PackedSample(torch.tensor([5] + [IMAGE] * 7 + [6]), torch.arange(1, 8), grids)
    apart = PackedSample(
        torch.tensor([5] + [IMAGE] * 4 + [9] + [IMAGE] * 3 + [6]), torch.tensor([1, 2, 3, 4, 6, 7, 8]), grids
    )
    want = family.position_ids(cfg, [apart])
    want = torch.cat([want[:, :5], want[:, 6:] - 1], dim=1)
    assert torch.equal(family.position_ids(cfg, [touching]), want)
    with pytest.raises(ConfigError, match="packed sample 0: 7 image tokens"):
        family.position_ids(cfg, [PackedSample(touching.input_ids, touching.image_positions, ((1, 4, 4),))])


def test_profiler_inputs_run_each_reduced_layer(folder):
    """The reduced model (one block per attention kind, one decoder layer) runs every one-layer stage
    on ``profile_input``'s inputs."""
    family = get_family("qwen2_vl")
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    small, reps = family.representative_config(cfg)
    model = family.build_model(small)
    for component, rep in reps.items():
        for layer in sorted(set(rep.values())):
            args, units = family.profile_input(small, component, layer, 16, torch.device("cpu"), False)
            out = family.build_stage(model, component, layer, layer + 1)(*args)
            assert out.isfinite().all() and units > 0


def test_export_through_the_family(folder, tmp_path):
    family = get_family("qwen2_vl")
    cfg, _ = family.runtime_config(ModelSource(model_path=str(folder)))
    model = family.build_model(cfg)
    manifest = {"model_source": {"model_path": str(folder)}}
    fields = family.export(manifest, dict(model.named_parameters()), str(tmp_path / "out"))
    assert (
        fields["model_dir"] == fields["vision"] == fields["llm"] == str(tmp_path / "out")
        and fields["image_token_id"] == IMAGE
    )
    loaded = qm.conditional_generation_class(cfg.hf.model_type).from_pretrained(tmp_path / "out")
    for name, p in loaded.named_parameters():
        assert torch.equal(p, model.get_parameter(name)), name


def test_both_checkpoint_layouts_are_read(folder):
    """transformers 5 saves the older layout (``visual.*``, ``model.layers.*``, what the published
    checkpoints hold); a folder in the new one (``model.visual.*``, ``model.language_model.*``) and a
    flat pre-5 ``config.json`` read the same."""
    from entrain.models.families.qwen2_vl.spec import text_arch

    class Reader:
        folder = "f"

        def __init__(self, keys):
            self.keys = set(keys)

        def __contains__(self, key):
            return key in self.keys

    new = Reader({"model.visual.blocks.0.attn.qkv.weight", "model.language_model.layers.0.mlp.up_proj.weight",
                  "model.language_model.embed_tokens.weight"})  # fmt: skip
    old = Reader(
        {"visual.blocks.0.attn.qkv.weight", "model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight"}
    )
    for name in ("model.visual.blocks.0.attn.qkv.weight", "model.language_model.layers.0.mlp.up_proj.weight"):
        assert qm.checkpoint_key(name, new) == name
        assert qm.checkpoint_key(name, old) in old.keys
    assert qm.checkpoint_key("lm_head.weight", new) == "model.language_model.embed_tokens.weight"
    assert qm.checkpoint_key("lm_head.weight", old) == "model.embed_tokens.weight"
    config = json.loads((folder / "config.json").read_text())
    flat = {**{k: v for k, v in config.items() if k != "text_config"}, **config["text_config"]}
    assert text_arch(flat, "flat") == text_arch(config, "nested")
