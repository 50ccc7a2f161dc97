"""A stage message of several named parts (``entrain.core.model.layer_specs.MessagePart``) trains exactly.

The toy family of ``test_toy_family`` with a DeepStack-like second encoder output: the encoder emits
``hidden`` and ``deep`` (one row per image token each); ``deep`` is consumed only by the LLM's second
decoder layer (added at the image positions), so on a 1+3 pipeline it crosses the encoder -> LLM
boundary (cut per sample on the first LLM stage), rides along the first LLM stage (a sliced tensor
it passes on) and the second (a received leaf it passes on untouched) and is consumed on the last.
The family declares the parts on its ``LayerSpec``s only; the planner puts them on the Plan's stages.
Four forked gloo ranks train one step of ``1f1b`` with full and with split (I/W) backwards; every
rank's gradients equal a single-process reference that runs the same stage modules one sample at a
time, with no pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from entrain.core.costs.presets import build_cost_model
from entrain.core.ir.plan import ActionKind, ComponentLayout, Layout, Plan, StageSpec
from entrain.core.model.layer_specs import MessagePart
from entrain.core.workload.samples import SampleMeta
from entrain.models.families.registry import register_family, unregister_family
from entrain.runtime.data import SampleRenderer
from entrain.runtime.planning import make_plan
from entrain.runtime.trainer import OptimConfig, PipelineTrainer

from .harness import relative_errors, run_workers, train_step_before_clip
from .test_toy_family import OwnedLayers, ToyConfig, ToyFamily, ToyRule, ToyShape, toy_encoder_layers

TOY = "toy_parts"
DEEP = "deep"


@dataclass(frozen=True)
class PartsShape(ToyShape):
    """The toy whose encoder also emits ``deep``, carried after the encoder and the first two LLM
    layers (embedding, decoder layer 0) and consumed by decoder layer 1."""

    name: str = "toy-parts-mlp"

    def layer_specs(self, label_fraction=None):
        specs = super().layer_specs(label_fraction)
        enc_part = MessagePart(DEEP, self.hidden, 4)
        llm_part = MessagePart(DEEP, self.hidden, 4, rows="image_tokens")
        specs["encoder"][-1] = replace(specs["encoder"][-1], message_parts=(enc_part,))
        for i in (0, 1):
            specs["llm"][i] = replace(specs["llm"][i], message_parts=(llm_part,))
        return specs


def _model(shape: PartsShape):
    from torch import nn

    from .test_toy_family import _toy_model

    model = _toy_model(shape)
    model.deep = nn.Linear(shape.enc_hidden, shape.hidden)
    model.entrain_family = TOY
    return model


def _sample_means(h, seq_lens):
    """Each token's sample mean: what carries the image rows to the label positions (the toy's layers
    are per token)."""
    return torch.cat([seg.mean(0, keepdim=True).expand_as(seg) for seg in h[0].split(list(seq_lens))])[None]


def _stage(model, component: str, first: int, end: int):
    import torch.nn.functional as F
    from torch import nn

    blocks, n = len(model.enc_blocks), len(model.layers)

    class PartsStage(OwnedLayers, nn.Module):
        """Takes and returns message parts: the encoder's last layer emits ``hidden`` and ``deep``;
        decoder layer 1 adds ``deep`` at the image positions; nothing else touches ``deep``."""

        entrain_family = TOY
        takes_parts = True

        def __init__(self):
            super().__init__()
            self.model, self.component, self.first, self.end = [model], component, first, end
            enc = ["enc_embed", *(f"enc_blocks.{i}" for i in range(blocks)), "proj"]
            llm = ["tokens", *(f"layers.{i}" for i in range(n)), "head", None]
            names = (enc if component == "encoder" else llm)[first:end]
            names += (
                ["deep"] if "proj" in names else ["positions"] if component == "llm" and first == 0 else []
            )
            self.owned = [x for x in names if x is not None]

        def forward(self, x, arg):
            m = self.model[0]
            if self.component == "encoder":
                h = toy_encoder_layers(
                    m, x if self.first == 0 else x["hidden"], self.first, min(self.end, blocks + 1)
                )
                return {"hidden": m.proj(h), DEEP: m.deep(h)} if self.end == blocks + 2 else {"hidden": h}
            return self._llm(m, x.get("hidden"), x.get(DEEP), arg)

        def _llm(self, m, h, deep, batch):
            for i in range(self.first, self.end):
                if i == 0:
                    emb = m.tokens(batch.input_ids) + m.positions(batch.position_ids)
                    if batch.image_positions.numel():
                        emb = emb.index_put((batch.image_positions,), h.to(emb.dtype))
                    h = torch.stack([emb])  # not a view: a split backward detaches outputs in place
                elif i <= n:
                    if i == 2 and batch.image_positions.numel():  # decoder layer 1 takes the deep features
                        add = torch.zeros_like(h[0]).index_put((batch.image_positions,), deep.to(h.dtype))
                        h = h + add.unsqueeze(0)
                    h = h + torch.tanh(m.layers[i - 1](h + _sample_means(h, batch.seq_lens)))
                elif i == n + 1:
                    h = m.head(h[0, batch.label_positions])
                else:
                    return F.cross_entropy(h.float(), batch.targets, reduction="sum") * batch.loss_scale
            return {"hidden": h}

    return PartsStage()


class PartsFamily(ToyFamily):
    name = TOY
    description = "the toy family with a second encoder output (tests/runtime/test_message_parts.py)"

    def preset_names(self):
        return ()

    def shape(self, source):
        return PartsShape()

    def runtime_config(self, source, shape=None):
        return ToyConfig(shape or PartsShape(), TOY), None

    def build_model(self, cfg, *, seed=0, weights_dir=None, dtype=None, stages=None):
        torch.manual_seed(seed)
        model = _model(cfg.shape)
        return model.to(dtype) if dtype is not None else model

    def build_stage(self, model, component, first, end):
        return _stage(model, component, first, end)


METAS = [
    SampleMeta("a", ((112, 224),), 20, vision=ToyRule()),
    SampleMeta("b", ((336, 112),), 12, vision=ToyRule()),
    SampleMeta("c", ((224, 224),), 30, vision=ToyRule()),
    SampleMeta("d", ((112, 112),), 16, vision=ToyRule()),
]


def _plan() -> Plan:
    shape = PartsShape()
    cost = build_cost_model(shape, "cpu-tiny")
    enc, llm = len(shape.layer_specs()["encoder"]), len(shape.layer_specs()["llm"])
    stages = (StageSpec(0, "encoder", 0, enc, 0), StageSpec(1, "llm", 0, 1, 1),
              StageSpec(2, "llm", 1, 2, 2), StageSpec(3, "llm", 2, llm, 3))  # fmt: skip
    layout = Layout(1, 2, 2, {"encoder": ComponentLayout(), "llm": ComponentLayout()}, stages)
    return make_plan("1f1b", layout, [[cost.sample_work(m) for m in METAS]], cost)


def _split_backward(plan: Plan) -> Plan:
    it = plan.iterations[0]
    actions = {
        r: tuple(
            x
            for a in acts
            for x in (
                [replace(a, kind=ActionKind.I), replace(a, kind=ActionKind.W)]
                if a.kind is ActionKind.B
                else [a]
            )
        )
        for r, acts in it.actions.items()
    }
    return replace(plan, iterations=(replace(it, actions=actions),))


def _cfg() -> ToyConfig:
    return ToyConfig(PartsShape(), TOY)


def _train(env, plans):
    out = []
    for plan in plans:
        model = PartsFamily().build_model(_cfg(), seed=0, dtype=torch.float64)
        renderer = SampleRenderer(_cfg(), {m.id: m for m in METAS}, seed=0, dtype=torch.float64)
        trainer = PipelineTrainer(
            layout=plan.layout, model=model, env=env, renderer=renderer, optim=OptimConfig(max_grad_norm=None)
        )
        val_loss = trainer.evaluate(plan.iterations[0])  # forward only: parts with no gradient
        _, grads = train_step_before_clip(trainer, plan.iterations[0])
        out.append(({n: g.clone() for n, g in grads.items()}, val_loss))
    return out


def _reference() -> tuple[dict[str, torch.Tensor], float]:
    """Every sample alone through the stage modules in order, no pipeline, no message parts routed by
    the runtime: ``sum(token CE) / label tokens of the batch``."""
    family, cfg = PartsFamily(), _cfg()
    model = family.build_model(cfg, seed=0, dtype=torch.float64)
    renderer = SampleRenderer(cfg, {m.id: m for m in METAS}, seed=0, dtype=torch.float64)
    shape = cfg.shape
    enc_n, llm_n = len(shape.layer_specs()["encoder"]), len(shape.layer_specs()["llm"])
    encoder = family.build_stage(model, "encoder", 0, enc_n)
    llm = family.build_stage(model, "llm", 0, llm_n)
    scale, total = 1.0 / renderer.num_labels([m.id for m in METAS]), 0.0
    for m in METAS:
        inp = renderer.encoder_input([m.id])
        loss = llm(encoder(inp.patches, inp.grid_thw), renderer.llm_batch([m.id], scale))
        loss.backward()
        total += float(loss.detach())
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, total


@pytest.fixture
def parts_family():
    family = register_family(PartsFamily())
    yield family
    unregister_family(TOY)


def test_a_part_riding_along_two_llm_stages_trains_like_one_process(parts_family, tmp_path):
    plan = _plan()
    assert [s.part_names for s in plan.layout.stages[:3]] == [("hidden", DEEP)] * 3
    assert plan.layout.stages[3].part_names == ("hidden",)
    ref, ref_loss = _reference()
    results = run_workers(_train, 4, tmp_path, [plan, _split_backward(plan)], timeout_s=60)
    for case in (0, 1):
        grads = {n: g for rank in results for n, g in rank[case][0].items()}
        assert all(abs(rank[case][1] - ref_loss) < 1e-6 * ref_loss for rank in results)  # an fp32 loss
        assert set(grads) == set(ref), sorted(set(grads) ^ set(ref))
        errors = relative_errors(grads, ref)
        worst = max(errors, key=errors.get)
        assert errors[worst] < 1e-9, (case, worst, errors[worst])
