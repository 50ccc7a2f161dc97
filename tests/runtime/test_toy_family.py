"""A model family registered from this file alone (a toy MLP encoder and a toy MLP language model of its
own, with its own image rule, layer lists, cost specs, tokens and position ids) runs ``entrain plan``
-> ``entrain simulate`` -> a 2-rank ``entrain train`` (forked ranks, no torchrun) with no other edit:
the seam (``entrain.models.families``) is all the rest of Entrain asks.

The toy's position ids restart per sample modulo ``TOY_POSITIONS`` and its position table has only
that many rows, so a runtime that bypassed ``ModelFamily.position_ids`` (``0..L-1`` for samples longer
than that) fails with an index error instead of training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from entrain.core.model.layer_specs import LayerSpec
from entrain.models.families.base import FamilyBase, ModelSource
from entrain.models.families.registry import register_family, unregister_family

TOY = "toy_seam"
PRESET = "toy-seam-mlp"
TOY_POSITIONS = 48
"""Rows of the toy's position table: sample positions restart modulo this."""
TILE_PX = 112
"""Pixels per side of one toy encoder row (an image is at most 4 x 4 rows)."""


@dataclass(frozen=True)
class ToyRule:
    """The toy's ``ImageTokenRule``: one encoder row (and one LLM token) per started 112-px tile, at
    most 4 per side."""

    min_pixels: int = TILE_PX * TILE_PX
    max_pixels: int = 16 * TILE_PX * TILE_PX

    @staticmethod
    def grid(height: int, width: int) -> tuple[int, int, int]:
        return (1, min(4, -(-height // TILE_PX)), min(4, -(-width // TILE_PX)))

    def image_tokens(self, height: int, width: int) -> int:
        _, h, w = self.grid(height, width)
        return h * w

    def encoder_units(self, height: int, width: int) -> tuple[int, ...]:
        return (self.image_tokens(height, width),)


@dataclass(frozen=True)
class ToyShape:
    """``ModelShape`` of the toy: widths, vocabulary and layer counts."""

    name: str = PRESET
    pixels: int = 12
    enc_hidden: int = 16
    hidden: int = 24
    vocab: int = 96
    enc_blocks: int = 2
    llm_layers: int = 2

    def _spec(self, name, kind, comp, width, params, per_label=False) -> LayerSpec:
        return LayerSpec(name, kind, comp, 0.0, 2.0 * params, 4.0 * width, width, 0, 0.0, 1,
                         8.0 * width, 2.0 * width, params, per_label=per_label)  # fmt: skip

    def layer_specs(self, label_fraction=None) -> dict[str, list[LayerSpec]]:
        e, h = self.enc_hidden, self.hidden
        enc = [self._spec("embed", "patch_embed", "encoder", e, self.pixels * e)]
        enc += [
            self._spec(f"block.{i}", "vit_block", "encoder", e, e * e + e) for i in range(self.enc_blocks)
        ]
        enc.append(self._spec("proj", "merger", "encoder", h, e * h + h))
        llm = [self._spec("embed", "embedding", "llm", h, (self.vocab + TOY_POSITIONS) * h)]
        llm += [
            self._spec(f"layer.{i}", "decoder_layer", "llm", h, h * h + h) for i in range(self.llm_layers)
        ]
        llm += [self._spec("head", "lm_head", "llm", h, h * self.vocab, True),
                self._spec("loss", "loss", "llm", h, 0, True)]  # fmt: skip
        return {"encoder": enc, "llm": llm}

    def num_params(self) -> int:
        return sum(s.param_count for layers in self.layer_specs().values() for s in layers)


@dataclass(frozen=True)
class ToyConfig:
    shape: ToyShape
    family: str = TOY

    @property
    def name(self) -> str:
        return self.shape.name


def _toy_model(shape: ToyShape):
    from torch import nn

    e, h = shape.enc_hidden, shape.hidden

    class ToyModel(nn.Module):
        entrain_family = TOY

        def __init__(self):
            super().__init__()
            self.enc_embed = nn.Linear(shape.pixels, e)
            self.enc_blocks = nn.ModuleList(nn.Linear(e, e) for _ in range(shape.enc_blocks))
            self.proj = nn.Linear(e, h)
            self.tokens = nn.Embedding(shape.vocab, h)
            self.positions = nn.Embedding(TOY_POSITIONS, h)
            self.layers = nn.ModuleList(nn.Linear(h, h) for _ in range(shape.llm_layers))
            self.head = nn.Linear(h, shape.vocab)

    return ToyModel()


def toy_encoder_layers(m, x, first: int, end: int):
    """The toy encoder's embedding and blocks ``[first, end)`` (its projector, layer ``blocks + 1``,
    excluded)."""
    import torch

    for i in range(first, end):
        x = m.enc_embed(x) if i == 0 else x + torch.tanh(m.enc_blocks[i - 1](x))
    return x


class OwnedLayers:
    """A toy stage's ``owned_parameters`` and ``move_to``: the submodules named ``self.owned`` of
    ``self.model[0]``."""

    def owned_parameters(self):
        m = self.model[0]
        return [(f"{n}.{pn}", p) for n in self.owned for pn, p in m.get_submodule(n).named_parameters()]

    def move_to(self, device):
        for _, p in self.owned_parameters():
            p.data = p.data.to(device)


def _toy_stage(model, component: str, first: int, end: int):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ToyStage(OwnedLayers, nn.Module):
        entrain_family = TOY

        def __init__(self):
            super().__init__()
            self.model, self.component, self.first, self.end = [model], component, first, end
            enc = ["enc_embed", *(f"enc_blocks.{i}" for i in range(len(model.enc_blocks))), "proj"]
            llm = ["tokens", *(f"layers.{i}" for i in range(len(model.layers))), "head", None]
            names = (enc if component == "encoder" else llm)[first:end]
            if component == "llm" and first == 0:
                names.append("positions")
            self.owned = [n for n in names if n is not None]

        def forward(self, x, arg):
            m = self.model[0]
            return self._encoder(m, x) if self.component == "encoder" else self._llm(m, x, arg)

        def _encoder(self, m, x):
            x = toy_encoder_layers(m, x, self.first, min(self.end, len(m.enc_blocks) + 1))
            return m.proj(x) if self.end == len(m.enc_blocks) + 2 else x

        def _llm(self, m, x, batch):
            n = len(m.layers)
            for i in range(self.first, self.end):
                if i == 0:
                    emb = m.tokens(batch.input_ids) + m.positions(batch.position_ids)
                    if batch.image_positions.numel():
                        emb = emb.index_put((batch.image_positions,), x.to(emb.dtype))
                    x = emb.unsqueeze(0)
                elif i <= n:
                    x = x + torch.tanh(m.layers[i - 1](x))
                elif i == n + 1:
                    x = m.head(x[0, batch.label_positions])
                else:
                    x = F.cross_entropy(x.float(), batch.targets, reduction="sum") * batch.loss_scale
            return x

    return ToyStage()


class ToyFamily(FamilyBase):
    name = TOY
    description = "a toy MLP encoder + MLP language model (tests/models/test_toy_family.py)"

    def preset_names(self):
        return (PRESET,)

    def shape(self, source: ModelSource) -> ToyShape:
        return ToyShape()

    def image_rule(self, shape, min_pixels, max_pixels) -> ToyRule:
        return ToyRule()

    def runtime_config(self, source, shape=None):
        return ToyConfig(shape or self.shape(source)), None

    def build_model(self, cfg, *, seed=0, weights_dir=None, dtype=None, stages=None):
        import torch

        torch.manual_seed(seed)
        return _toy_model(cfg.shape)

    def build_stage(self, model, component, first, end):
        return _toy_stage(model, component, first, end)

    def set_trainable(self, model, *, encoder=True, merger=True, llm=True):
        for name, p in model.named_parameters():
            p.requires_grad_(
                merger if name.startswith("proj.") else encoder if name.startswith("enc_") else llm
            )

    def encoder_output_width(self, stage):
        return (
            stage.model[0].proj.out_features
            if stage.end == len(stage.model[0].enc_blocks) + 2
            else stage.model[0].enc_embed.out_features
        )

    def recompute_modules(self, stage, mode):
        return []

    def fsdp_units(self, stage):
        return []

    def image_grids(self, cfg, meta):
        return tuple(ToyRule.grid(h, w) for h, w in meta.images)

    def image_feature_rows(self, cfg, grid):
        return grid[0] * grid[1] * grid[2]

    def encoder_input_width(self, cfg):
        return cfg.shape.pixels

    def token_ids(self, cfg):
        return {"image": cfg.shape.vocab - 1, "image_start": -1, "image_end": -1}

    def map_token_id(self, cfg, qwen_id):
        return qwen_id % (cfg.shape.vocab - 1)

    def position_ids(self, cfg, samples):
        import torch

        parts = [torch.arange(int(s.input_ids.numel())) % TOY_POSITIONS for s in samples]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)


@pytest.fixture
def toy():
    family = register_family(ToyFamily())
    yield family
    unregister_family(TOY)


COMMON = ["--model", PRESET, "--dataset", "skewed", "--hardware", "cpu-tiny", "--global-batch", "4",
          "--microbatch-size", "1", "--seed", "3"]  # fmt: skip


def test_a_toy_family_plans_simulates_and_trains_on_two_ranks(toy, tmp_path, capsys):
    from entrain.cli.main import main

    from .cli_ranks import run_ranks

    plan = tmp_path / "plan.json"
    assert main(["plan", *COMMON, "--gpus", "2", "--system", "1f1b", "--out", str(plan), "--json"]) == 0
    capsys.readouterr()
    assert json.loads(plan.read_text())["model"] == PRESET
    assert (
        main(["simulate", *COMMON, "--gpus", "2", "--systems", "1f1b,entrain", "--iterations", "2", "--json"])
        == 0
    )
    sim = json.loads(capsys.readouterr().out)
    assert set(sim["systems"]) == {"1f1b", "entrain"}
    out = tmp_path / "run"
    argv = ["train", "--plan", str(plan), "--steps", "2", "--out", str(out), "--no-progress"]
    results = run_ranks(argv, 2, tmp_path / "ranks", timeout_s=120)
    assert [r.exitcode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["loss"] > 0 for r in rows)
