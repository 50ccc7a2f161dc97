"""Qwen3-VL as Entrain stages equals transformers' ``Qwen3VLForConditionalGeneration`` (float64): loss,
grad norm and every gradient of a packed batch, for cut sets inside the vision tower (between and on
both sides of the DeepStack taps) and between the LLM layers that receive the DeepStack features;
positions, export."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from entrain.models.batch import LLMBatch
from entrain.models.families.qwen3_vl import model as qm
from entrain.models.families.qwen3_vl.positions import mrope_position_ids
from tests.models.oracle import assert_equal_steps, rel_err, staged_step
from tests.models.qwen3_vl_tiny import IMAGE, VIDEO, VSTART, mixed_samples, save_whole

REL = 1e-5
ENCODER_LAYERS, LLM_LAYERS = 7, 8  # patch_embed + 5 blocks + merger; embed + 4 layers + norm + lm_head + loss
CUTS = {
    "whole": ([], []),
    "taps_apart": ([2, 4], [2, 3]),  # a stage per tap span; LLM layers 0 | 1 | 2.. apart
    "every_layer": (list(range(1, ENCODER_LAYERS)), list(range(1, LLM_LAYERS))),
    "around_taps": ([1, 3, 5], [1, 4]),  # before tap 0, after tap 1, after tap 2; embed alone
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_whole(tmp_path_factory.mktemp("qwen3_vl"))


@pytest.fixture(scope="module")
def reference(folder):
    """Transformers' loss and gradients of the mixed samples, one sample per forward (float64)."""
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float64)
    samples = mixed_samples()
    labels = sum(s.targets.numel() for s in samples)
    loss = torch.zeros((), dtype=torch.float64)
    for s in samples:
        kwargs = {}
        if s.grids:
            kwargs = {"pixel_values": s.patches.double(), "image_grid_thw": torch.tensor(s.grids),
                      "mm_token_type_ids": (s.input_ids == IMAGE).int().unsqueeze(0)}  # fmt: skip
        logits = model(input_ids=s.input_ids.unsqueeze(0), **kwargs).logits[0]
        loss = loss + F.cross_entropy(logits[s.label_positions], s.targets, reduction="sum") / labels
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def packed_batch(hf, samples) -> LLMBatch:
    starts = torch.tensor([0, *torch.cumsum(torch.tensor([s.input_ids.numel() for s in samples]), 0)[:-1]])
    labels = sum(s.targets.numel() for s in samples)
    return LLMBatch(
        input_ids=torch.cat([s.input_ids for s in samples]),
        position_ids=mrope_position_ids(hf, samples),
        seq_lens=tuple(s.input_ids.numel() for s in samples),
        image_positions=torch.cat([s.image_positions + o for s, o in zip(samples, starts)]),
        label_positions=torch.cat([s.label_positions + o for s, o in zip(samples, starts)]),
        targets=torch.cat([s.targets for s in samples]),
        loss_scale=1.0 / labels,
    )


def stages(model, component: str, cuts: list[int], n: int):
    bounds = [0, *cuts, n]
    return [qm.build_stage(model, component, a, b) for a, b in zip(bounds, bounds[1:])]


def run_staged(model, samples, cuts) -> torch.Tensor:
    """The loss of the stage modules chained in one process (autograd through every boundary); each
    stage hands on exactly the parts it declares (``parts_out``)."""
    hf = model.config
    grid = torch.tensor([g for s in samples for g in s.grids], dtype=torch.int64)
    parts = {qm.HIDDEN: torch.cat([s.patches for s in samples]).double()}
    chain = stages(model, "encoder", cuts[0], ENCODER_LAYERS) + stages(model, "llm", cuts[1], LLM_LAYERS)
    batch = packed_batch(hf, samples)
    for stage in chain:
        arg = parts if stage.first or not isinstance(stage, qm.VisionStage) else parts[qm.HIDDEN]
        parts = stage(arg, grid if isinstance(stage, qm.VisionStage) else batch)
        assert isinstance(parts, torch.Tensor) or set(parts) == set(stage.parts_out()), stage
    return parts


@pytest.fixture(scope="module")
def model(folder):
    return qm.build_model(str(folder)).double()


@pytest.mark.parametrize("layout", sorted(CUTS))
def test_loss_grad_norm_and_every_gradient_equal_transformers(model, reference, layout):
    got = staged_step(model, lambda: run_staged(model, mixed_samples(), CUTS[layout]))
    assert_equal_steps(got, reference, rel=REL)


def test_every_deepstack_merger_gets_a_gradient(reference):
    _, grads = reference
    names = {n.split(".")[3] for n in grads if "deepstack_merger_list" in n}
    assert names == {"0", "1", "2"}


def test_parts_each_stage_declares_match_the_cost_model(model, folder):
    """The parts a stage module sends are those the shape declares for the cut after its last layer."""
    from entrain.models.families.qwen3_vl.spec import shape_of_folder

    shape = shape_of_folder(str(folder))
    specs = shape.layer_specs()
    for component, n in (("encoder", ENCODER_LAYERS), ("llm", LLM_LAYERS - 1)):
        for first in range(n):
            for end in range(first + 1, n + 1):
                stage = qm.build_stage(model, component, first, end)
                declared = tuple(p.name for p in specs[component][end - 1].message_parts)
                assert stage.parts_out()[1:] == declared, (component, first, end)


def test_position_ids_are_transformers_get_rope_index_per_sample(model):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    hf = model.config
    samples = mixed_samples()
    packed = mrope_position_ids(hf, samples)
    start = 0
    for s in samples:
        owner = model.model
        kwargs = {"image_grid_thw": torch.tensor(s.grids)} if s.grids else {}
        types = (s.input_ids == IMAGE).int().unsqueeze(0)
        want, _ = Qwen3VLModel.get_rope_index(
            owner, s.input_ids.unsqueeze(0), mm_token_type_ids=types, **kwargs
        )
        n = s.input_ids.numel()
        assert torch.equal(packed[:, start : start + n], want[:, 0])
        start += n


def test_video_positions_split_per_frame_as_transformers(model):
    """A 2-frame video whose frames the processor separates by timestamp text: per-frame grids."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    from entrain.models.families.qwen3_vl.positions import sample_position_ids

    frame = [VSTART] + [VIDEO] * 4 + [253]
    ids = torch.tensor([5, 6, *[7, 8], *frame, *[9], *frame, 10])
    types = (ids == VIDEO).int().unsqueeze(0) * 2
    grid = torch.tensor([[2, 4, 4]])
    want, _ = Qwen3VLModel.get_rope_index(
        model.model, ids.unsqueeze(0), mm_token_type_ids=types, video_grid_thw=grid
    )
    got = sample_position_ids(model.config, ids, torch.zeros(0, dtype=torch.int64), (),
                              video_positions=(ids == VIDEO).nonzero()[:, 0], video_grids=((2, 4, 4),))  # fmt: skip
    assert torch.equal(got, want[:, 0])


def test_export_loads_in_transformers_with_every_tensor(model, folder, tmp_path):
    from transformers import Qwen3VLForConditionalGeneration

    from entrain.models.families.qwen3_vl.export import export_folder

    params = {n: p.detach().float() for n, p in model.named_parameters()}
    export_folder(str(folder), params, str(tmp_path / "out"))
    loaded, info = Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for n, p in loaded.named_parameters():
        assert torch.equal(p, params[n]), n


def test_touching_images_are_split_as_if_one_text_token_sat_between(model):
    """Images with no token between (short texts): each keeps its own grid positions, the second
    continuing right after the first's largest id — transformers' ids with one separator token,
    which is dropped, and every later id one less."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    from entrain.models.families.qwen3_vl.positions import sample_position_ids

    ids = torch.tensor([5, 6, *[IMAGE] * 4, *[IMAGE] * 8, 7, 8])
    got = sample_position_ids(model.config, ids, torch.arange(2, 14), ((1, 4, 4), (1, 4, 8)))
    apart = torch.cat([ids[:6], torch.tensor([9]), ids[6:]])
    want, _ = Qwen3VLModel.get_rope_index(
        model.model, apart.unsqueeze(0), mm_token_type_ids=(apart == IMAGE).int().unsqueeze(0),
        image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 8]]),
    )  # fmt: skip
    want = torch.cat([want[:, 0, :6], want[:, 0, 7:] - 1], dim=1)
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("frames", "fps"), [((0, 12, 24, 36), 24.0), ((0, 5, 10), 2.0), ((3, 9, 15, 21), None)]
)
def test_video_placeholder_text_is_the_processors(frames, fps):
    """transformers' ``Qwen3VLProcessor.replace_video_token`` (timestamps per temporal patch) on the
    same grid and sampled frames."""
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    from entrain.models.families.qwen3_vl.processing import video_placeholder_text

    t = (len(frames) + 1) // 2
    grid = torch.tensor([[t, 4, 6]])
    owner = SimpleNamespace(
        video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
        vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>", video_token="<|video_pad|>",
    )  # fmt: skip
    owner._calculate_timestamps = lambda *a: Qwen3VLProcessor._calculate_timestamps(owner, *a)
    meta = SimpleNamespace(fps=fps, frames_indices=list(frames))
    want = Qwen3VLProcessor.replace_video_token(owner, {"video_grid_thw": grid, "video_metadata": [meta]}, 0)
    assert video_placeholder_text((t, 4, 6), frames, fps) == want


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_keeps_loss_and_every_gradient(folder, reference, mode):
    """``--recompute``: the family's recompute modules (blocks with their DeepStack mergers, decoder
    layers) wrapped in activation checkpointing give transformers' loss and gradients."""
    from entrain.models.families.registry import build_stage
    from entrain.runtime.recompute import apply_recompute

    staged = qm.build_model(str(folder)).double()
    staged.entrain_family = "qwen3_vl"
    cuts = CUTS["around_taps"]
    for component, n, cs in (("encoder", ENCODER_LAYERS, cuts[0]), ("llm", LLM_LAYERS, cuts[1])):
        bounds = [0, *cs, n]
        wrapped = [
            apply_recompute(build_stage(staged, component, a, b), mode) for a, b in zip(bounds, bounds[1:])
        ]
        assert sum(wrapped) > 0
    loss = run_staged(staged, mixed_samples(), cuts)
    loss.backward()
    ref_loss, ref_grads = reference
    assert rel_err(loss.detach(), ref_loss) < REL
    bad = {n: rel_err(p.grad, ref_grads[n]) for n, p in staged.named_parameters() if n in ref_grads}
    assert all(e < REL for e in bad.values()), bad


def test_chat_template_and_vision_tokens_come_from_the_checkpoint_folder(tmp_path):
    """A folder with its own tokenizer: the family's vision token ids are the config's (= the
    tokenizer's), and a conversation is rendered through the folder's chat template with one
    placeholder per image feature row between vision_start and vision_end."""
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_folder
    from tests.models.qwen3_vl_tiny import save_with_tokenizer

    folder = save_with_tokenizer(tmp_path / "ckpt", text_layers=3)
    family = family_of_folder(str(folder))
    cfg, tok = family.runtime_config(ModelSource(model_path=str(folder)))
    ids = family.token_ids(cfg)
    assert tok is not None and tok.chat is not None
    hf_tok = __import__("transformers").AutoTokenizer.from_pretrained(folder)
    assert ids == {k: hf_tok.convert_tokens_to_ids(t) for k, t in
                   (("image", "<|image_pad|>"), ("image_start", "<|vision_start|>"), ("image_end", "<|vision_end|>"),
                    ("video", "<|video_pad|>"))}  # fmt: skip
    turns = [("user", "<image>\nWhat is shown in the chart?"), ("assistant", "The bars rise.")]
    input_ids, labels = family.format_chat(cfg, turns, [6], tok)
    at = input_ids.index(ids["image"])
    assert input_ids[at - 1] == ids["image_start"] and input_ids[at : at + 7] == [ids["image"]] * 6 + [
        ids["image_end"]
    ]
    answer = [t for t, lab in zip(input_ids, labels) if lab != -100]
    assert hf_tok.decode(answer).startswith("The bars rise.")
