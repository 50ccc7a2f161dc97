"""Oracle: whole Qwen2-VL / Qwen2.5-VL checkpoints run as Entrain stages give transformers' own
``...ForConditionalGeneration`` logits and gradients (fp32, relative 1e-5), one-stage and 2+2-stage
layouts, packed microbatches mixing image sizes, several images per sample and text-only samples;
and packing is exact (a sample's logits in a packed microbatch equal its logits alone)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from entrain.models.batch import LLMBatch
from entrain.models.families.qwen2_vl import model as qm
from entrain.models.families.qwen2_vl.positions import model_class, mrope_position_ids
from tests.models.oracle import rel_err
from tests.models.qwen_vl_tiny import FAMILIES, mixed_samples, save_whole

RTOL = 1e-5
ENCODER_DEPTH, TEXT_LAYERS = 4, 4


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory):
    family = request.param
    # Qwen2.5-VL-3B ties its lm_head to the embedding; take both kinds
    return save_whole(tmp_path_factory.mktemp(family), family, tied=family == "qwen2_5_vl",
                      text_layers=TEXT_LAYERS, vision_depth=ENCODER_DEPTH)  # fmt: skip


def layouts() -> dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    enc, llm = ENCODER_DEPTH + 2, TEXT_LAYERS + 4
    return {"one-stage": ([(0, enc)], [(0, llm)]), "2+2": ([(0, 3), (3, enc)], [(0, 3), (3, llm)])}


def hf_model(folder):
    cfg = qm.read_hf_config(str(folder))
    model = qm.conditional_generation_class(cfg.model_type).from_pretrained(
        folder, attn_implementation="sdpa"
    )
    return model.float().train()


def hf_logits(model, s) -> torch.Tensor:
    """Transformers' own forward of one sample alone: ``[L, V]``."""
    types = torch.zeros(1, s.input_ids.numel(), dtype=torch.int32)
    types[0, s.image_positions] = 1
    model.model.rope_deltas = None
    kwargs = {}
    if s.grids:
        kwargs = dict(pixel_values=s.patches, image_grid_thw=torch.tensor(s.grids))
    return model(input_ids=s.input_ids[None], mm_token_type_ids=types, **kwargs).logits[0]


def packed_batch(
    hf_config, samples, *, all_positions: bool, loss_scale: float = 1.0, positions=None
) -> LLMBatch:
    offsets = [0]
    for s in samples:
        offsets.append(offsets[-1] + s.input_ids.numel())
    labels = [torch.arange(s.input_ids.numel()) if all_positions else s.label_positions for s in samples]
    return LLMBatch(
        input_ids=torch.cat([s.input_ids for s in samples]),
        position_ids=mrope_position_ids(hf_config, samples) if positions is None else positions(samples),
        seq_lens=tuple(s.input_ids.numel() for s in samples),
        image_positions=torch.cat([s.image_positions + o for s, o in zip(samples, offsets)]),
        label_positions=torch.cat([p + o for p, o in zip(labels, offsets)]),
        targets=torch.cat([s.targets for s in samples])
        if not all_positions
        else torch.zeros(0, dtype=torch.int64),
        loss_scale=loss_scale,
    )


def run_staged(
    model, samples, layout, *, loss: bool, loss_scale: float = 1.0, positions=None
) -> torch.Tensor:
    """Encoder stages then LLM stages in one process: the loss, or ``[T, V]`` logits at every position."""
    enc, llm = layout
    if not loss:
        llm = [(a, min(b, TEXT_LAYERS + 3)) for a, b in llm]
    x = None
    grids = [g for s in samples for g in s.grids]
    if grids:
        x = torch.cat([s.patches for s in samples])
        for a, b in enc:
            x = qm.build_stage(model, "encoder", a, b)(x, torch.tensor(grids))
    batch = packed_batch(
        model.config, samples, all_positions=not loss, loss_scale=loss_scale, positions=positions
    )
    for a, b in llm:
        x = qm.build_stage(model, "llm", a, b)(x, batch)
    return x


def per_sample(logits: torch.Tensor, samples) -> list[torch.Tensor]:
    return list(logits.split([s.input_ids.numel() for s in samples]))


@pytest.mark.parametrize("layout", list(layouts()))
def test_logits_and_gradients_equal_transformers(folder, layout):
    samples = mixed_samples()
    hf = hf_model(folder)
    staged = qm.build_model(str(folder))
    with torch.no_grad():
        got = per_sample(run_staged(staged, samples, layouts()[layout], loss=False), samples)
        for i, s in enumerate(samples):
            want = hf_logits(hf, s)
            assert rel_err(got[i], want) < RTOL, f"sample {i} logits differ"
    scale = 1.0 / sum(s.label_positions.numel() for s in samples)
    hf_loss = sum(
        F.cross_entropy(hf_logits(hf, s)[s.label_positions], s.targets, reduction="sum") for s in samples
    )
    (hf_loss * scale).backward()
    loss = run_staged(staged, samples, layouts()[layout], loss=True, loss_scale=scale)
    loss.backward()
    assert rel_err(loss.detach(), hf_loss.detach() * scale) < RTOL
    want = dict(hf.named_parameters())
    got = dict(staged.named_parameters())
    assert set(got) == set(want) | ({"lm_head.weight"} if staged.entrain_tied_source else set())
    for name, p in got.items():
        if name == "lm_head.weight" and staged.entrain_tied_source:
            continue
        expected = want[name].grad
        grad = p.grad
        if name.endswith("embed_tokens.weight") and staged.entrain_tied_source:
            grad = grad + got["lm_head.weight"].grad  # the tied weight's gradient is the sum of both uses
        assert grad is not None and expected is not None, name
        assert rel_err(grad, expected) < RTOL, f"{name}: gradient differs ({rel_err(grad, expected):.2e})"


def test_packing_is_exact(folder):
    """Each sample's logits in the packed microbatch equal its logits alone (2+2 stages)."""
    samples = mixed_samples()
    staged = qm.build_model(str(folder))
    with torch.no_grad():
        packed = per_sample(run_staged(staged, samples, layouts()["2+2"], loss=False), samples)
        for i, s in enumerate(samples):
            alone = run_staged(staged, [s], layouts()["2+2"], loss=False)
            assert rel_err(packed[i], alone) < RTOL, f"sample {i}"


def test_position_ids_are_transformers_per_sample(folder):
    """``[3, T]`` ids restart per sample and equal a built transformers model's ``get_rope_index``."""
    samples = mixed_samples()
    cfg = qm.read_hf_config(str(folder))
    with torch.device("meta"):
        inner = model_class(cfg.model_type)(cfg)
    ids = mrope_position_ids(cfg, samples)
    assert ids.shape == (3, sum(s.input_ids.numel() for s in samples))
    start = 0
    for s in samples:
        n = s.input_ids.numel()
        types = torch.zeros(1, n, dtype=torch.int32)
        types[0, s.image_positions] = 1
        grid = torch.tensor(s.grids) if s.grids else None
        want, _ = inner.get_rope_index(s.input_ids[None], mm_token_type_ids=types, image_grid_thw=grid)
        assert torch.equal(ids[:, start : start + n], want[:, 0])
        assert ids[:, start].tolist() == [0, 0, 0]
        start += n
    # an image's tokens sit on its merged grid: sample 0's first image is 2 x 3 merged tokens
    first = samples[0].image_positions[:6]
    assert ids[1, first].tolist() == [6, 6, 6, 7, 7, 7] and ids[2, first].tolist() == [6, 7, 8, 6, 7, 8]


def test_export_loads_in_transformers_with_the_trained_logits(folder, tmp_path):
    """After a training step, ``export_folder`` writes one folder ``from_pretrained`` loads whose
    logits equal the staged model's; tokenizer / processor files come along."""
    from entrain.models.families.qwen2_vl.export import export_folder

    extra = {
        "tokenizer_config.json": '{"x": 1}\n',
        "preprocessor_config.json": '{"y": 2}\n',
        "chat_template.jinja": "T",
    }
    for name, text in extra.items():
        (folder / name).write_text(text)
    samples = mixed_samples()
    staged = qm.build_model(str(folder))
    run_staged(staged, samples, layouts()["2+2"], loss=True, loss_scale=0.1).backward()
    with torch.no_grad():
        for p in staged.parameters():
            p -= 0.5 * p.grad  # a visible step: lm_head and embedding part ways
        want = per_sample(run_staged(staged, samples, layouts()["one-stage"], loss=False), samples)
    out = tmp_path / "export"
    files = export_folder(str(folder), dict(staged.named_parameters()), str(out))
    assert all((out / n).read_text() == t for n, t in extra.items())
    assert str(out / "config.json") in files
    loaded = hf_model(out)
    assert not loaded.config.tie_word_embeddings
    with torch.no_grad():
        for i, s in enumerate(samples):
            assert rel_err(hf_logits(loaded, s), want[i]) < RTOL, f"sample {i}"


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_keeps_loss_and_gradients(folder, mode):
    """``--recompute``: the family's recompute modules wrapped in activation checkpointing give the
    same loss and gradients (2+2 stages)."""
    from entrain.models.families.registry import build_stage
    from entrain.runtime.recompute import apply_recompute

    samples = mixed_samples()
    grads = []
    for recompute in (None, mode):
        staged = qm.build_model(str(folder))
        staged.entrain_family = "qwen2_vl"
        if recompute:
            stages = [
                build_stage(staged, c, a, b)
                for c, spans in zip(("encoder", "llm"), layouts()["2+2"])
                for a, b in spans
            ]
            assert all(apply_recompute(s, recompute) > 0 for s in stages if s.first > 0)
        run_staged(staged, samples, layouts()["2+2"], loss=True, loss_scale=0.1).backward()
        grads.append({n: p.grad for n, p in staged.named_parameters()})
    for name, g in grads[0].items():
        assert rel_err(grads[1][name], g) < RTOL, name


def test_freeze_parts(folder):
    """``--freeze vit`` keeps the merger and the LLM trainable; ``llm`` freezes embeddings to lm_head."""
    from entrain.models.families.registry import get_family

    staged = qm.build_model(str(folder), stages=[])
    get_family("qwen2_vl").set_trainable(staged, encoder=False, merger=True, llm=True)
    trainable = {n for n, p in staged.named_parameters() if p.requires_grad}
    assert any(n.startswith("model.visual.merger.") for n in trainable)
    assert not any(n.startswith(("model.visual.blocks.", "model.visual.patch_embed.")) for n in trainable)
    assert {"lm_head.weight", "model.language_model.embed_tokens.weight"} <= trainable
    get_family("qwen2_vl").set_trainable(staged, llm=False)
    assert all(n.startswith("model.visual.") for n, p in staged.named_parameters() if p.requires_grad)


def test_an_mrope_section_that_does_not_cover_the_head_is_a_config_error(tmp_path):
    """2 heads of a 64-wide text model: head_dim 32 needs sections summing to 16, not 8 (the first
    forward failed deep in the rotary embedding before)."""
    from entrain.core.errors import ConfigError
    from tests.models.qwen_vl_tiny import _configs

    cfg, _ = _configs("qwen2_vl", text_layers=1, vision_depth=1, tied=False)
    cfg.text_config.num_attention_heads = cfg.text_config.num_key_value_heads = 2
    cfg.save_pretrained(tmp_path)
    with pytest.raises(
        ConfigError, match=r"config\.json: text_config mrope_section \[2, 3, 3\] sums to 8.* 32"
    ):
        qm.read_hf_config(str(tmp_path))
    cfg.text_config.rope_parameters["mrope_section"] = [4, 6, 6]
    cfg.save_pretrained(tmp_path)
    assert qm.read_hf_config(str(tmp_path)).get_text_config().num_attention_heads == 2
