"""The model families the runtime tests parametrize over, beyond the composition's ``--model tiny``:
the flags of a tiny model of each (a saved checkpoint folder, or a preset); and, for the in-process
exactness tests, each family's model, batch, Plans and a transformers oracle (``FamilyModel``), and
what every transformers-oracle test shares: the fp64 step over the samples (``transformers_step``),
the forked ranks' training step (``train_step``, ``train_cases``) and their comparison with the oracle
(``assert_ranks_match``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .cases import MAX_GRAD_NORM, SEED, batch_metas, plan_for, works
from .harness import ReferenceStep, assert_matches_reference, reference_step, train_step_before_clip

FAMILY_MODELS = ("qwen2_vl", "llava_onevision")
"""``qwen2_vl``: a whole Qwen2-VL checkpoint (its own vision tower: LayerNorm, fc1/fc2 MLP; a
Qwen2.5-VL checkpoint runs the composition's tower, which the composition's tests cover);
``llava_onevision``: the ``llava-ov-tiny`` preset."""

EVERY_FAMILY = ("composition", *FAMILY_MODELS)
"""The runtime tests' parameter: the composition's ``tiny`` preset and ``FAMILY_MODELS``."""

WHOLE_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava_onevision")
"""``FAMILY_MODELS`` and a whole Qwen2.5-VL checkpoint (M-RoPE LLM on the composition's tower):
the exact-gradient tests, whose oracle is transformers' own class (the composition's exactness
cases run on their own, tests/runtime/test_exact_gradients.py)."""


def family_flags(family: str, folder: Path, **whole) -> dict:
    """``train`` flags of a tiny model of ``family`` (a Qwen checkpoint is saved under ``folder``:
    2 vision blocks, 2 decoder layers, tied embeddings; ``whole``: more ``save_whole`` arguments)."""
    if family == "llava_onevision":
        return {"model": "llava-ov-tiny"}
    if family == "composition":
        return {"model": "tiny"}
    from tests.models.qwen_vl_tiny import save_whole

    path = save_whole(folder, family, text_layers=2, vision_depth=2, tied=True, **whole)
    return {"model_path": str(path)}


@dataclass
class FamilyModel:
    """A tiny model of one family with the runtime tests' skewed batch (``cases.batch_metas`` under the
    family's image rule) and its cost model on ``cpu-tiny`` (for Plans)."""

    label: str
    family: Any
    cfg: Any
    cost: Any
    metas: dict

    def plan(self, system: str, encoder_stages: int, llm_stages: int, dp: int, num_microbatches: int):
        batch = works(list(self.metas.values()), self.cost)
        return plan_for(system, encoder_stages, llm_stages, dp, num_microbatches, batch, cost=self.cost)

    def build(self, dtype: torch.dtype | None = None, *, frozen_encoder: bool = False):
        model = self.family.build_model(self.cfg, seed=SEED, dtype=dtype)
        if frozen_encoder:
            self.family.set_trainable(model, encoder=False)
        return model

    def renderer(self, dtype: torch.dtype | None = None):
        from entrain.runtime.data import SampleRenderer

        return SampleRenderer(self.cfg, dict(self.metas), seed=SEED, **({"dtype": dtype} if dtype else {}))


def family_model(
    label: str, folder: Path, *, kv_heads: int | None = None, num_samples: int = 8
) -> FamilyModel:
    """``label``: ``composition`` or one of ``WHOLE_FAMILIES``; a checkpoint is saved under ``folder``.
    ``kv_heads``: the LLM's KV heads instead of the tiny model's (a preset's shape is changed);
    ``num_samples``: the batch's first samples."""
    from entrain.core.costs.presets import build_cost_model
    from entrain.models.families.base import ModelSource
    from entrain.models.families.registry import family_of_source

    checkpoint = label not in ("composition", "llava_onevision")
    flags = family_flags(label, folder, **({"kv_heads": kv_heads} if checkpoint and kv_heads else {}))
    source = ModelSource(preset=flags.get("model", "tiny"), model_path=flags.get("model_path"))
    family = family_of_source(source)
    shape = family.shape(source)
    if kv_heads and not checkpoint:
        shape = replace(shape, llm=replace(shape.llm, num_key_value_heads=kv_heads))
    cfg, _ = family.runtime_config(source, shape)
    rule = family.image_rule(cfg.shape, None, None)
    metas = {m.id: replace(m, vision=rule) for m in batch_metas()[:num_samples]}
    return FamilyModel(label, family, cfg, build_cost_model(cfg.shape, "cpu-tiny"), metas)


def oracle_step(
    fm: FamilyModel, *, max_grad_norm: float | None, frozen_encoder: bool = False
) -> ReferenceStep:
    """The single-process reference step of the whole batch in fp64, every sample alone: transformers'
    own ``...ForConditionalGeneration`` for a whole-checkpoint family (``loss = sum(token CE) / label
    tokens of the batch``), the Hugging Face modules (``harness.reference_step``) for a composition."""
    ids = sorted(fm.metas)
    # a checkpoint family builds float32 whatever ``dtype`` says: cast the whole model
    model = fm.build(torch.float64, frozen_encoder=frozen_encoder).to(torch.float64)
    if fm.label == "composition":
        return reference_step(model, fm.cfg, fm.metas, ids, seed=SEED, max_grad_norm=max_grad_norm)
    hf = getattr(model, "hf", model)  # LLaVA-OneVision's stage model wraps transformers' class
    renderer = fm.renderer(torch.float64)

    def inputs(sid: str, _sample) -> dict:
        return _image_inputs(fm, renderer, sid, hf)

    return transformers_step(hf, renderer, ids, inputs, max_grad_norm=max_grad_norm)


def transformers_step(
    hf, renderer, ids: list[str], inputs: Callable, *, max_grad_norm: float | None, extra_loss=None
) -> ReferenceStep:
    """The single-process reference step of transformers' ``hf`` over ``ids``, every sample alone (fed
    ``input_ids`` and ``inputs(sid, sample)``, its backward adding to the gradients): ``loss =
    (sum(token CE) + extra_loss(output, sample)) / label tokens of the batch``, summed over the samples;
    then ``step_of``."""
    num_labels = renderer.num_labels(ids)
    total = 0.0
    for sid in ids:
        s = renderer.sample(sid)
        out = hf(input_ids=s.input_ids[None], **inputs(sid, s))
        loss = F.cross_entropy(out.logits[0, s.label_positions], s.targets, reduction="sum")
        if extra_loss is not None:
            loss = loss + extra_loss(out, s)
        loss = loss / num_labels
        loss.backward()
        total += float(loss.detach())
    return step_of(hf, total, max_grad_norm=max_grad_norm)


def step_of(model, loss: float, *, max_grad_norm: float | None) -> ReferenceStep:
    """``model``'s accumulated gradients as a ``ReferenceStep``: before clipping, their global norm, and
    after torch's global-norm clipping at ``max_grad_norm`` (none: unclipped)."""
    named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    grads = {n: p.grad.detach().clone() for n, p in named}
    norm = float(torch.sqrt(sum(p.grad.pow(2).sum() for _, p in named)))
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_([p for _, p in named], max_grad_norm)
    return ReferenceStep(grads, {n: p.grad.detach().clone() for n, p in named}, norm, loss)


def _image_inputs(fm: FamilyModel, renderer, sid: str, hf) -> dict:
    """transformers' image arguments of one rendered sample (none for a text-only one)."""
    s = renderer.sample(sid)
    if not s.grid_thw:
        return {}
    if fm.family.name == "llava_onevision":
        from .test_llava_onevision_train import _pixels

        return _pixels(renderer, sid, [g[0] for g in s.grid_thw], [list(e) for e in s.extras])
    types = torch.zeros(1, s.num_tokens, dtype=torch.int32)
    types[0, s.image_positions] = 1
    hf.model.rope_deltas = None
    grid = torch.tensor(s.grid_thw)
    return {"pixel_values": renderer.patches(sid), "image_grid_thw": grid, "mm_token_type_ids": types}


def image_and_video_inputs(renderer, sid: str) -> dict:
    """transformers' image and video arguments of one rendered sample: its patch rows split per
    image/video (placeholder order) into ``pixel_values`` + ``image_grid_thw`` of the images and
    ``pixel_values_videos`` + ``video_grid_thw`` of the videos (each only where the sample has one)."""
    s = renderer.sample(sid)
    parts = torch.split(renderer.patches(sid), [t * h * w for t, h, w in s.grid_thw])
    images = [i for i in range(len(s.grid_thw)) if i not in s.video_items]
    kw = {}
    if images:
        kw.update(pixel_values=torch.cat([parts[i] for i in images]),
                  image_grid_thw=torch.tensor([s.grid_thw[i] for i in images]))  # fmt: skip
    if s.video_items:
        kw.update(pixel_values_videos=torch.cat([parts[i] for i in s.video_items]),
                  video_grid_thw=torch.tensor([s.grid_thw[i] for i in s.video_items]))  # fmt: skip
    return kw


def without_zero_gradients(ref: ReferenceStep, *grads: dict) -> tuple[ReferenceStep, ...]:
    """``ref`` and ``grads`` without the tensors whose true gradient is zero (round-off in the oracle:
    SigLIP's key biases, without rotary positions, shift every score of a query alike), which no
    relative bound measures; asserts those stay at round-off (``1e-6`` of the gradient norm) in
    ``grads``."""
    zero = {n for n, g in ref.grads.items() if float(g.norm()) < 1e-9 * ref.grad_norm}
    for g in grads:
        assert all(float(g[n].norm()) < 1e-6 * ref.grad_norm for n in zero if n in g), zero
    keep = [n for n in ref.grads if n not in zero]
    rest = replace(ref, grads={n: ref.grads[n] for n in keep}, clipped={n: ref.clipped[n] for n in keep})
    return rest, *({n: v for n, v in g.items() if n not in zero} for g in grads)


def assert_ranks_match(name: str, ranks: list, ref: ReferenceStep, *, tol: float) -> tuple:
    """``ranks``: each rank's ``train_step`` result of one step (its stages' gradients before and after
    clipping, the loss, the gradient norm); all the ranks' gradients, the loss and the gradient norm
    equal ``ref``'s (``harness.assert_matches_reference``) once the true-zero gradients are set aside
    (``without_zero_gradients``). Returns ``ref`` and the gathered gradients before and after clipping
    without them."""
    before = {k: v for r in ranks for k, v in r[0].items()}
    after = {k: v for r in ranks for k, v in r[1].items()}
    loss, grad_norm = ranks[0][2], ranks[0][3]
    rest, before, after = without_zero_gradients(ref, before, after)
    assert_matches_reference(
        name, before=before, after=after, loss=loss, grad_norm=grad_norm, ref=rest, tol=tol
    )
    return rest, before, after


def train_step(env, fm: FamilyModel, plan, frozen: bool = False, max_grad_norm: float = MAX_GRAD_NORM):
    """One training step of ``plan``'s first iteration on this rank (a forked worker): its gradients
    before and after clipping, the step's loss and gradient norm."""
    from entrain.runtime.trainer import OptimConfig, PipelineTrainer

    trainer = PipelineTrainer(layout=plan.layout, model=fm.build(frozen_encoder=frozen), env=env,
                              renderer=fm.renderer(), optim=OptimConfig(max_grad_norm=max_grad_norm))  # fmt: skip
    result, before = train_step_before_clip(trainer, plan.iterations[0])
    return before, trainer.named_grads(), result.loss, result.grad_norm


def train_cases(env, fm: FamilyModel, cases) -> dict:
    """``train_step`` of each ``(name, plan, encoder frozen)`` case, by name."""
    return {name: train_step(env, fm, plan, frozen) for name, plan, frozen in cases}


class RecordModel(FamilyModel):
    """A ``FamilyModel`` whose samples are the records of the dataset file ``path`` (the renderer reads
    them)."""

    path: str = ""

    def renderer(self, dtype: torch.dtype | None = None):
        from entrain.runtime.data import SampleRenderer
        from entrain.runtime.record_source import RecordSource

        kw = {"dtype": dtype} if dtype else {}
        return SampleRenderer(self.cfg, dict(self.metas), seed=SEED, source=RecordSource(self.path), **kw)
