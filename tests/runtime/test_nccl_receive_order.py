"""NCCL's receive order on the CPU: with ``ENTRAIN_RECEIVE_ORDER=nccl`` gloo posts every receive at
its action (none ahead, ``entrain.runtime.comm``), the order a GPU run uses, and one case of every
system still has the single-process reference's gradients (one forked group of two ranks)."""

from __future__ import annotations

import pytest

from entrain.core.systems import SYSTEMS
from entrain.models.families.composition.config import get_model_config
from entrain.models.families.composition.model import build_vlm
from entrain.runtime.comm import RECEIVE_ORDER_ENV

from . import test_exact_gradients as exact
from .cases import MAX_GRAD_NORM, SEED, plan_for, works
from .harness import assert_matches_reference, reference_step, run_workers


@pytest.fixture(scope="module")
def reference():
    """The plain batch's single-process float64 reference (as ``test_exact_gradients``'s)."""
    cfg, metas = get_model_config("tiny"), exact._metas("plain")
    model = build_vlm(cfg, seed=SEED, dtype=exact.F64)
    return reference_step(model, cfg, metas, sorted(metas), seed=SEED, max_grad_norm=MAX_GRAD_NORM)


def _case(system: str) -> tuple:
    stages = 2 if SYSTEMS[system].colocated else 1  # two ranks either way
    name = f"{system}-{stages}+{stages}"
    plan = plan_for(system, stages, stages, 1, 4, works(list(exact._metas(name).values())))
    assert plan.layout.world_size == 2, name
    return name, plan, exact.F32


def test_every_system_matches_the_reference_receiving_in_nccl_order(reference, tmp_path, monkeypatch):
    monkeypatch.setenv(RECEIVE_ORDER_ENV, "nccl")  # the forked workers inherit it
    cases = [_case(s) for s in sorted(SYSTEMS)]
    results = run_workers(exact._train_cases, 2, tmp_path, cases)
    ref = reference
    assert ref.grad_norm > MAX_GRAD_NORM
    for name, _, _ in cases:
        before, after = {}, {}
        for rank_result in results:
            before.update(rank_result[name][0])
            after.update(rank_result[name][1])
        preposted = [r[name][5] for r in results]
        assert all(num == 0 for num, _ in preposted), (name, preposted)  # every receive at its action
        assert sum(want for _, want in preposted) > 0, name  # and there were gradient receives
        _, _, loss, grad_norm, val_loss, _ = results[0][name]
        assert_matches_reference(
            name, before=before, after=after, loss=loss, grad_norm=grad_norm, ref=ref, tol=1e-5
        )
        assert abs(val_loss - ref.loss) < 1e-5 * abs(ref.loss), f"{name}: validation loss {val_loss}"
