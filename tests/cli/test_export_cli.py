"""``entrain export``: a run's stage shards -> Hugging Face folders that transformers loads, with the
trained model's logits; JSON validated against entrain/schemas/export.json."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest
import torch

from entrain.cli.main import main
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.checkpoint import load_model_state, step_dir
from entrain.runtime.data import SampleRenderer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "run"
    argv = ["train", "--model", "tiny", "--dataset", "skewed", "--system", "dip", "--global-batch", "4"]
    argv += ["--microbatch-size", "1", "--steps", "2", "--lr", "3e-3", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    return out


def _logits(vision, llm, renderer, sid: str) -> torch.Tensor:
    s = renderer.sample(sid)
    grid = torch.tensor(s.grid_thw, dtype=torch.int64)
    feats = vision(renderer.patches(sid), grid_thw=grid).pooler_output
    emb = llm.model.embed_tokens(s.input_ids).index_put((s.image_positions,), feats)
    hidden = llm.model(inputs_embeds=emb[None]).last_hidden_state
    return llm.lm_head(hidden)[0]


def test_export_reloads_with_transformers_and_gives_the_trained_logits(run_dir, tmp_path, capsys):
    from transformers import LlamaForCausalLM
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    capsys.readouterr()
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    schema = json.loads(resources.files("entrain").joinpath("schemas/export.json").read_text())
    jsonschema.validate(info, schema)
    assert info["step"] == 2 and info["model"] == "tiny"
    assert (out / "vision" / "model.safetensors").exists() and (out / "llm" / "config.json").exists()

    cfg = get_model_config("tiny")
    _, params = load_model_state(step_dir(run_dir, 2))
    trained = build_vlm(cfg, seed=0)
    init = {k: v.clone() for k, v in trained.state_dict().items()}
    missing, unexpected = trained.load_state_dict(params, strict=False)
    assert not unexpected and not [k for k in missing if k in dict(trained.named_parameters())]
    assert not torch.equal(init["llm.lm_head.weight"], params["llm.lm_head.weight"])  # it trained

    vision = Qwen2_5_VisionTransformerPretrainedModel.from_pretrained(out / "vision").eval()
    llm = LlamaForCausalLM.from_pretrained(out / "llm").eval()
    metas = {"a": SampleMeta("a", ((112, 84),), 40), "b": SampleMeta("b", ((56, 168), (84, 84)), 24)}
    renderer = SampleRenderer(cfg, metas, seed=0)
    with torch.no_grad():
        for sid in metas:
            ref = _logits(trained.vision, trained.llm, renderer, sid)
            got = _logits(vision, llm, renderer, sid)
            assert got.shape == (renderer.sample(sid).num_tokens, cfg.llm.vocab_size)
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_export_refuses_a_folder_without_checkpoints(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "no checkpoints found" in capsys.readouterr().err


def test_export_in_bfloat16_is_the_float32_export_rounded(run_dir, tmp_path, capsys):
    """``--dtype bfloat16``: every floating tensor of every folder is the float32 export's rounded to
    bfloat16 (the same names), each ``config.json`` says so, transformers loads it as bfloat16 with
    ``dtype="auto"``, and the JSON (schema-valid) records the dtype."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    full, half = tmp_path / "fp32", tmp_path / "bf16"
    assert main(["export", str(run_dir), "--out", str(full)]) == 0
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(half), "--dtype", "bfloat16", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    schema = json.loads(resources.files("entrain").joinpath("schemas/export.json").read_text())
    jsonschema.validate(info, schema)
    assert info["dtype"] == "bfloat16"
    assert json.loads((full / "entrain_export.json").read_text())["dtype"] == "float32"
    for folder in ("vision", "llm"):
        ref, got = (
            load_file(full / folder / "model.safetensors"),
            load_file(half / folder / "model.safetensors"),
        )
        assert set(got) == set(ref)
        for name, t in ref.items():
            assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], t.to(torch.bfloat16)), name
        assert json.loads((half / folder / "config.json").read_text())["dtype"] == "bfloat16"
    llm = LlamaForCausalLM.from_pretrained(half / "llm", dtype="auto")
    assert {p.dtype for p in llm.parameters()} == {torch.bfloat16}
