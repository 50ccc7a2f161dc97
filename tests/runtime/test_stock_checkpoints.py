"""Stock Hugging Face checkpoints: tiny models saved with save_pretrained,
shapes from config.json for the cost model, per-stage loading from sharded safetensors, and a
single-process ``entrain train --lr 0`` whose export equals the loaded tensors bitwise."""

from __future__ import annotations

import glob
import json

import pytest
import torch

from entrain.core.errors import ConfigError
from entrain.models.families.composition.config import VLMConfig
from entrain.models.families.composition.hf_checkpoint import SafetensorsFolder, materialize
from entrain.models.families.composition.model import VLM, build_stage, build_vlm
from entrain.models.families.composition.spec import arch_from_folders
from tests.models.stock import save_llm, save_tokenizer, save_vision


def _tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in glob.glob(f"{folder}/*.safetensors"):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    d = tmp_path_factory.mktemp("stock")
    return {
        "vis25": save_vision(d / "vis25"),
        "vis2_whole": save_vision(d / "vis2", family="qwen2_vl", whole=True),
        "llama": save_tokenizer(save_llm(d / "llama", vocab=290)),
        "qwen2": save_llm(d / "qwen2", family="qwen2", tied=False),
        "narrow": save_llm(d / "narrow", hidden=32),
    }


@pytest.mark.parametrize("vision,llm", [("vis25", "llama"), ("vis2_whole", "qwen2")])
def test_config_json_shapes_match_the_built_modules(stock, vision, llm):
    """The cost model's parameter counts (from config.json) equal the transformers modules'."""
    arch = arch_from_folders(str(stock[vision]), str(stock[llm]))
    model = VLM(VLMConfig(arch=arch, vision_dir=str(stock[vision]), llm_dir=str(stock[llm])))
    assert arch.vision.num_params() == sum(p.numel() for p in model.vision.parameters())
    untied_head = arch.llm.vocab_size * arch.llm.hidden_size if arch.llm.tie_word_embeddings else 0
    assert arch.llm.num_params() + untied_head == sum(p.numel() for p in model.llm.parameters())
    assert all(p.is_meta for p in model.parameters())  # built on the meta device


def test_merger_width_mismatch_is_a_clear_error(stock):
    with pytest.raises(ConfigError, match="merger outputs 64 features but --llm-model .* hidden size 32"):
        arch_from_folders(str(stock["vis25"]), str(stock["narrow"]))


def test_a_rank_reads_only_its_stages_tensors(stock):
    arch = arch_from_folders(str(stock["vis2_whole"]), str(stock["qwen2"]))
    cfg = VLMConfig(arch=arch, vision_dir=str(stock["vis2_whole"]), llm_dir=str(stock["qwen2"]))
    model = VLM(cfg)
    names = [n for n, _ in build_stage(model, "llm", 2, 5).owned_parameters()]  # layers.1, norm, lm_head
    read = materialize(model, names, vision_dir=cfg.vision_dir, llm_dir=cfg.llm_dir)
    shards = SafetensorsFolder(cfg.llm_dir).files
    wanted = {shards["model.layers.1.mlp.up_proj.weight"], shards["lm_head.weight"]}
    assert wanted <= set(read[cfg.llm_dir]) and len(read[cfg.llm_dir]) < len(set(shards.values()))
    assert cfg.vision_dir not in read
    loaded = {n for n, p in model.named_parameters() if not p.is_meta}
    assert loaded == {n for n in names}
    ref = _tensors(cfg.llm_dir)
    assert torch.equal(
        model.llm.model.layers[1].self_attn.q_proj.bias, ref["model.layers.1.self_attn.q_proj.bias"]
    )


def test_qwen2_vl_tower_matches_transformers(stock):
    """Our stage forward of Qwen2-VL's tower (no window permutation) equals transformers' forward."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLForConditionalGeneration

    arch = arch_from_folders(str(stock["vis2_whole"]), str(stock["qwen2"]))
    model = build_vlm(VLMConfig(arch=arch, vision_dir=str(stock["vis2_whole"]), llm_dir=str(stock["qwen2"])))
    ref = Qwen2VLForConditionalGeneration.from_pretrained(stock["vis2_whole"]).model.visual
    torch.manual_seed(0)
    x, grid = torch.randn(2 * 16, 1176), torch.tensor([[1, 4, 4], [1, 4, 4]])
    ours = build_stage(model, "encoder", 0, len(model.cfg.encoder_layer_names))(x, grid)
    torch.testing.assert_close(ours, ref(x, grid_thw=grid).pooler_output)


def _train(env, spec):
    from entrain.runtime.session import run_systems

    return [s.last_loss for s in run_systems(spec, env)]


def test_train_lr0_then_export_equals_the_stock_tensors_bitwise(stock, tmp_path, capsys):
    """1 encoder + 1 LLM stage on two forked ranks, each building its stage from the folders."""
    from entrain.cli.main import build_parser, main
    from entrain.cli.train import _spec

    from .harness import run_workers

    vis, llm = stock["vis25"], stock["llama"]
    argv = ["train", "--vision-model", str(vis), "--llm-model", str(llm), "--system", "1f1b", "--global-batch",
            "2", "--microbatch-size", "1", "--steps", "1", "--lr", "0", "--out", str(tmp_path / "run"),
            "--no-progress"]  # fmt: skip
    spec = _spec(build_parser().parse_args(argv))
    losses = run_workers(_train, 2, tmp_path / "workers", spec, timeout_s=120)
    assert losses[0] == losses[1]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["spec"]["llm_model"] == str(llm) and config["precision"] == "fp32"
    assert config["flags"]["llm_model"] == str(llm) and config["flags"]["lr"] == 0  # for --config
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == "hf:vis25+llama"
    a, b = _tensors(vis), _tensors(tmp_path / "hf" / "vision")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    a, b = _tensors(llm), _tensors(tmp_path / "hf" / "llm")
    assert set(b) == set(a) | {"lm_head.weight"}  # the tied lm_head is exported untied
    for k in a:  # the 3 image tokens the tokenizer lacked were appended as mean rows
        assert torch.equal(b[k][: a[k].shape[0]], a[k]), k
    emb = a["model.embed_tokens.weight"]
    assert b["model.embed_tokens.weight"].shape[0] == 293 == info["image_token_id"] + 1
    assert torch.equal(b["lm_head.weight"][:290], emb)
    assert torch.equal(b["model.embed_tokens.weight"][290:], emb.mean(0, keepdim=True).expand(3, -1))
    assert json.loads((tmp_path / "hf" / "llm" / "config.json").read_text())["vocab_size"] == 293


def test_plan_simulate_profile_take_their_shapes_from_the_folders(stock, tmp_path, capsys):
    from entrain.cli.main import main

    flags = ["--vision-model", str(stock["vis25"]), "--llm-model", str(stock["llama"]), "--json"]
    prof = tmp_path / "prof.json"
    argv = ["profile", "--tokens", "8,16", "--repeats", "1", "--warmup", "0", "--out", str(prof), *flags]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "hf:vis25+llama"
    argv = ["plan", "--gpus", "2", "--global-batch", "8", "--microbatch-size", "1", "--profile", str(prof)]
    assert main([*argv, *flags]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "hf:vis25+llama"
    argv = ["plan", "--gpus", "4", "--global-batch", "32", "--microbatch-size", "2", "--dataset", "chartqa"]
    assert main([*argv, *flags]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "hf:vis25+llama"
    argv = ["simulate", "--gpus", "4", "--dp", "1", "--global-batch", "8", "--microbatch-size", "2",
            "--iterations", "2", "--systems", "1f1b"]  # fmt: skip
    assert main([*argv, *flags]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "hf:vis25+llama"
    assert main(["plan", "--vision-model", str(stock["vis25"]), "--llm-model", str(stock["narrow"])]) == 2
    err = capsys.readouterr().err
    assert "hidden size 32" in err and len(err.splitlines()) == 1


def test_profile_times_the_stock_modules_themselves(stock, tmp_path, capsys):
    """A Qwen2-VL tower and a Qwen2 LLM (q/k/v biases) are timed as themselves, one block per kind."""
    from transformers import Qwen2ForCausalLM
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    from entrain.cli.main import main
    from entrain.runtime.profiler import representative_config, timing_model

    vis, llm = str(stock["vis2_whole"]), str(stock["qwen2"])
    small, _ = representative_config(VLMConfig(arch=arch_from_folders(vis, llm), vision_dir=vis, llm_dir=llm))
    model = timing_model(small)
    assert isinstance(model.vision, Qwen2VisionTransformerPretrainedModel) and len(model.vision.blocks) == 1
    assert isinstance(model.llm, Qwen2ForCausalLM) and len(model.llm.model.layers) == 1
    assert model.llm.model.layers[0].self_attn.q_proj.bias is not None
    assert not any(p.is_meta for p in model.parameters())
    argv = ["profile", "--vision-model", vis, "--llm-model", llm, "--tokens", "8,16", "--repeats", "1"]
    assert main([*argv, "--warmup", "0", "--out", str(tmp_path / "p.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "hf:vis2+qwen2"
