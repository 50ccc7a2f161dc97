"""``--precision bf16`` on the CPU, for every model family: bf16 autocast
compute, fp32 master weights and AdamW state; the loss moves off the fp32 loss by bf16 rounding only.
Both runs freeze the vision tower (``--freeze vit``): its parameters stay as built, every other one
trains."""

from __future__ import annotations

import json

import pytest
import torch

from entrain.cli.main import build_parser
from entrain.cli.train import _spec
from entrain.runtime.session import run_systems

from .cli_ranks import cli_argv
from .families import FAMILY_MODELS, family_flags
from .harness import run_workers


def _train(env, spec):
    import entrain.runtime.trainer as trainer_mod

    seen = {}
    step = trainer_mod.PipelineTrainer.train_step

    def spy(self, it, **kw):  # dtypes of the master weights and the AdamW state after a step
        before = [p.detach().clone() for _, p in self.named_params]
        out = step(self, it, **kw)
        seen["params"] = {p.dtype for p in self.params}
        seen["state"] = {v.dtype for s in self.optimizer.state.values() for v in s.values() if v.dim()}
        moved = [not torch.equal(b, p) for b, (_, p) in zip(before, self.named_params, strict=True)]
        seen["moved"] = {(p.requires_grad, m) for m, (_, p) in zip(moved, self.named_params, strict=True)}
        return out

    trainer_mod.PipelineTrainer.train_step = spy
    return [s.first_loss for s in run_systems(spec, env)], seen


@pytest.mark.parametrize("family", ["composition", *FAMILY_MODELS])
def test_bf16_compute_fp32_master_weights(tmp_path, family):
    model = {"model": "tiny"} if family == "composition" else family_flags(family, tmp_path / "model")
    losses = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        flags = {**model, "dataset": "skewed", "system": "dip", "dp": 1, "global_batch": 2, "microbatch_size": 1,
                 "steps": 1, "out": out, "no_progress": True, "precision": precision, "freeze": "vit"}  # fmt: skip
        spec = _spec(build_parser().parse_args(cli_argv("train", flags)))
        [(loss, seen)] = run_workers(_train, 1, tmp_path / f"w-{precision}", spec)
        assert seen["params"] == {torch.float32} and seen["state"] == {torch.float32}
        assert seen["moved"] == {(False, False), (True, True)}, "frozen: kept; the rest: trained"
        assert json.loads((out / "config.json").read_text())["precision"] == precision
        losses[precision] = loss[0]
    assert losses["bf16"] != losses["fp32"]  # the compute did run in bf16
    assert abs(losses["bf16"] - losses["fp32"]) < 0.02 * abs(losses["fp32"])
