"""The model families the runtime tests parametrize over, beyond the composition's ``--model tiny``:
the flags of a tiny model of each (a saved checkpoint folder, or a preset); and, for the in-process
exactness tests, each family's model, batch, Plans and a transformers oracle (``FamilyModel``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .cases import SEED, batch_metas, plan_for, works
from .harness import ReferenceStep, reference_step

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
    num_labels = renderer.num_labels(ids)
    total = 0.0
    for sid in ids:
        s = renderer.sample(sid)
        logits = hf(input_ids=s.input_ids[None], **_image_inputs(fm, renderer, sid, hf)).logits
        loss = F.cross_entropy(logits[0, s.label_positions], s.targets, reduction="sum") / num_labels
        loss.backward()
        total += float(loss.detach())
    named = [(n, p) for n, p in hf.named_parameters() if p.grad is not None]
    grads = {n: p.grad.detach().clone() for n, p in named}
    norm = float(torch.sqrt(sum(p.grad.pow(2).sum() for _, p in named)))
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_([p for _, p in named], max_grad_norm)
    return ReferenceStep(grads, {n: p.grad.detach().clone() for n, p in named}, norm, total)


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
