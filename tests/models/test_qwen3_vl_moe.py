"""Qwen3-VL-MoE as Entrain stages equals transformers' ``Qwen3VLMoeForConditionalGeneration`` (float64):
the loss with its auxiliary load-balancing term, the grad norm and every gradient of a packed batch,
for cut sets between the dense and the sparse decoder layers, inside the tower and between the
DeepStack layers. transformers computes the auxiliary loss of one forward over that forward's
tokens; the oracle runs every sample alone, so the step loss is each sample's transformers loss
weighted by its share of the batch's label tokens. The test is sharp enough to see the auxiliary
term left out or computed over a pack of samples instead of per sample."""

from __future__ import annotations

import pytest
import torch

from entrain.models.batch import LLMBatch
from entrain.models.families.qwen3_vl import model as dense
from entrain.models.families.qwen3_vl.positions import mrope_position_ids
from entrain.models.families.qwen3_vl_moe import model as mm
from entrain.models.families.qwen3_vl_moe.spec import ROUTER_STATS, shape_of_config, shape_of_folder
from tests.models import oracle
from tests.models.oracle import rel_err
from tests.models.qwen3_vl_moe_tiny import save_whole
from tests.models.qwen3_vl_tiny import IMAGE, make_sample

REL = 1e-5
ENCODER_LAYERS, LLM_LAYERS = 4, 8  # patch_embed + 2 blocks + merger; embed + 4 layers + norm + lm_head + loss
CUTS = {  # decoder layer k is LLM list index k + 1; layer 0 dense, 1-3 sparse
    "sparse_apart": ([2], [2, 3, 4]),  # router_stats made on one stage, added to on two, consumed last
    "dense_alone": ([1, 3], [1, 2, 6]),  # embed | dense layer 0 (no stats yet) | sparse 1-3 + norm | head
}


def samples():
    """An image sample, text only, a wide image: labels on every token but the last."""
    return [
        make_sample([5, (1, 4, 6), 7], seed=1),
        make_sample([11], seed=2),
        make_sample([(1, 4, 8), 3], seed=3),
    ]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_whole(tmp_path_factory.mktemp("qwen3_vl_moe") / "tiny")


def transformers_model(folder):
    from transformers import Qwen3VLMoeForConditionalGeneration

    return Qwen3VLMoeForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float64, experts_implementation="eager"
    )


def sample_outputs(model, group):
    """transformers' output of each sample alone (labels: its targets; router logits kept)."""
    outs = []
    for s in group:
        ids = s.input_ids.unsqueeze(0)
        labels = torch.full_like(ids, -100)
        labels[0, s.label_positions + 1] = s.targets
        kwargs = {}
        if s.grids:
            kwargs = {"pixel_values": s.patches.double(), "image_grid_thw": torch.tensor(s.grids),
                      "mm_token_type_ids": (ids == IMAGE).int()}  # fmt: skip
        model.model.rope_deltas = None
        outs.append(model(input_ids=ids, labels=labels, **kwargs))
    return outs


def weights(group) -> list[float]:
    """Each sample's share of the batch's label tokens."""
    total = sum(s.targets.numel() for s in group)
    return [s.targets.numel() / total for s in group]


@pytest.fixture(scope="module")
def transformers_run(folder):
    """transformers' model and each sample's output (graphs kept)."""
    model = transformers_model(folder)
    return model, sample_outputs(model, samples())


@pytest.fixture(scope="module")
def reference(transformers_run):
    """Every sample alone through transformers (its own per-sequence auxiliary loss), each forward's
    loss (CE mean over its labels ``+ coef * aux``) weighted by its share of the label tokens."""
    model, outs = transformers_run
    loss = sum(o.loss * w for o, w in zip(outs, weights(samples())))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], retain_graph=True, allow_unused=True)
    return loss.detach(), {n: g for (n, _), g in zip(named, grads) if g is not None}


def packed_batch(config, group) -> LLMBatch:
    starts = torch.tensor([0, *torch.cumsum(torch.tensor([s.input_ids.numel() for s in group]), 0)[:-1]])
    return LLMBatch(
        input_ids=torch.cat([s.input_ids for s in group]),
        position_ids=mrope_position_ids(config, group),
        seq_lens=tuple(s.input_ids.numel() for s in group),
        image_positions=torch.cat([s.image_positions + o for s, o in zip(group, starts)]),
        label_positions=torch.cat([s.label_positions + o for s, o in zip(group, starts)]),
        targets=torch.cat([s.targets for s in group]),
        loss_scale=1.0 / sum(s.targets.numel() for s in samples()),
    )


def run_staged(model, group, cuts) -> torch.Tensor:
    """The loss of the stage modules chained in one process on one packed microbatch; each stage hands
    on exactly the parts it declares (``parts_out``)."""
    grid = torch.tensor([g for s in group for g in s.grids], dtype=torch.int64)
    parts = {dense.HIDDEN: torch.cat([s.patches for s in group]).double()}
    chain = []
    for component, n, cs in (("encoder", ENCODER_LAYERS, cuts[0]), ("llm", LLM_LAYERS, cuts[1])):
        bounds = [0, *cs, n]
        chain += [mm.build_stage(model, component, a, b) for a, b in zip(bounds, bounds[1:])]
    batch = packed_batch(model.config, group)
    for stage in chain:
        vision = isinstance(stage, dense.VisionStage)
        parts = stage(parts if stage.first or not vision else parts[dense.HIDDEN], grid if vision else batch)
        assert isinstance(parts, torch.Tensor) or set(parts) == set(stage.parts_out()), stage
    return parts


@pytest.fixture(scope="module")
def model(folder):
    return mm.build_model(str(folder)).double()


def staged_step(model, cuts, packs):
    model.zero_grad()
    loss = sum(run_staged(model, group, cuts) for group in packs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_equal_steps(got, ref):
    oracle.assert_equal_steps(got, ref, rel=REL)


@pytest.mark.parametrize("layout", sorted(CUTS))
def test_loss_grad_norm_and_every_gradient_equal_transformers(model, reference, layout):
    """Two packs (the image sample alone; the text and the wide image sample packed together)."""
    s = samples()
    assert_equal_steps(staged_step(model, CUTS[layout], [s[:1], s[1:]]), reference)


def test_the_oracle_sees_the_auxiliary_loss_left_out_or_taken_per_pack(transformers_run, reference):
    """The step without the auxiliary loss, or with transformers' ``load_balancing_loss_func`` over the
    router logits of a pack of samples (the text and the wide image sample) instead of each alone, is
    far from the per-sample step in the loss and in every router's gradient: the comparison above
    would catch either."""
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

    model, outs = transformers_run
    text = model.config.text_config
    w = weights(samples())
    ce = [o.loss - text.router_aux_loss_coef * o.aux_loss for o in outs]
    without = sum(c * x for c, x in zip(ce, w))
    logits = tuple(torch.cat(layer) for layer in zip(*(o.router_logits for o in outs[1:])))
    pack = load_balancing_loss_func(logits, text.num_experts, text.num_experts_per_tok)
    per_pack = without + text.router_aux_loss_coef * (outs[0].aux_loss * w[0] + pack * (w[1] + w[2]))
    routers = [(n, p) for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")]
    assert len(routers) == 3
    for other in (without, per_pack):
        assert rel_err(other.detach(), reference[0]) > 1e2 * REL
        grads = torch.autograd.grad(other, [p for _, p in routers], retain_graph=True)
        assert all(rel_err(g, reference[1][n]) > 1e2 * REL for (n, _), g in zip(routers, grads))


def test_parts_each_stage_declares_match_the_cost_model(model, folder):
    """The parts a stage module sends are those the shape declares for the cut after its last layer:
    ``router_stats`` from the first sparse layer on."""
    shape = shape_of_folder(str(folder))
    specs = shape.layer_specs()
    for first in range(LLM_LAYERS):
        for end in range(first + 1, LLM_LAYERS + 1):
            stage = mm.build_stage(model, "llm", first, end)
            declared = tuple(p.name for p in specs["llm"][end - 1].message_parts)
            assert stage.parts_out()[1:] == declared, (first, end)
            assert (ROUTER_STATS in declared) == (3 <= end < LLM_LAYERS), (first, end)


def test_sparse_layers_and_experts_priced_as_transformers_builds_them(folder):
    """``mlp_only_layers`` and ``decoder_sparse_step`` pick the sparse layers as transformers does;
    a sparse layer holds every expert's parameters and computes the router and top-k experts."""
    import json

    from transformers import Qwen3VLMoeForConditionalGeneration

    from tests.models.qwen3_vl_moe_tiny import config

    raw = json.loads((folder / "config.json").read_text())
    for mlp_only, step in (([0], 1), ([], 2), ([1, 2], 1)):
        text = {**raw["text_config"], "mlp_only_layers": mlp_only, "decoder_sparse_step": step}
        shape = shape_of_config({**raw, "text_config": text}, "test", "t")
        with torch.device("meta"):
            hf = Qwen3VLMoeForConditionalGeneration(config(mlp_only=mlp_only, sparse_step=step))
        layers = hf.model.language_model.layers
        assert shape.sparse == tuple(i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts"))
        specs = shape.layer_specs()["llm"]
        for i, layer in enumerate(layers):
            own = sum(p.numel() for p in layer.parameters())
            assert specs[1 + i].param_count == own, (mlp_only, step, i)
        assert shape.num_params() == sum(p.numel() for p in hf.parameters())


def test_export_loads_in_transformers_with_every_tensor(model, folder, tmp_path):
    from transformers import Qwen3VLMoeForConditionalGeneration

    from entrain.models.families.qwen3_vl_moe.family import QWEN3_VL_MOE_FAMILY

    params = {n: p.detach().float() for n, p in model.named_parameters()}
    QWEN3_VL_MOE_FAMILY.export({"model_source": {"model_path": str(folder)}}, params, str(tmp_path / "out"))
    loaded, info = Qwen3VLMoeForConditionalGeneration.from_pretrained(
        tmp_path / "out", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    for n, p in loaded.named_parameters():
        assert torch.equal(p, params[n]), n


def test_recomputed_layers_keep_the_auxiliary_gradient(folder, reference):
    """Under full activation recomputation the router logits kept for the statistics come from inside
    a recomputed layer; the gradient still reaches every router (selective recomputation wraps only
    the attention)."""
    from entrain.runtime.recompute import apply_recompute

    model = mm.build_model(str(folder)).double()
    cuts = CUTS["sparse_apart"]
    for stage in [mm.build_stage(model, "llm", a, b) for a, b in zip([0, *cuts[1]], [*cuts[1], LLM_LAYERS])]:
        stage.entrain_family = "qwen3_vl_moe"
        assert apply_recompute(stage, "full")
    s = samples()
    assert_equal_steps(staged_step(model, cuts, [s[:1], s[1:]]), reference)


def test_without_output_router_logits_the_loss_has_no_auxiliary_term(model, transformers_run):
    """A checkpoint whose ``output_router_logits`` is off: no ``router_stats`` part, and the loss and
    every gradient are transformers' without the auxiliary term."""
    hf, outs = transformers_run
    text = hf.config.text_config
    ce = sum((o.loss - text.router_aux_loss_coef * o.aux_loss) * w for o, w in zip(outs, weights(samples())))
    named = [(n, p) for n, p in hf.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(ce, [p for _, p in named], retain_graph=True, allow_unused=True)
    want = ce.detach(), {n: g for (n, _), g in zip(named, grads) if g is not None}
    model.config.text_config.output_router_logits = False
    try:
        assert ROUTER_STATS not in mm.build_stage(model, "llm", 0, 4).parts_out()
        s = samples()
        assert_equal_steps(staged_step(model, CUTS["sparse_apart"], [s[:1], s[1:]]), want)
    finally:
        model.config.text_config.output_router_logits = True
