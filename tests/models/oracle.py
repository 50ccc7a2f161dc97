"""What the in-process family tests share when they chain a family's stage modules in one process
(fp64) against transformers' own class on the same samples: the relative error, and the check that
a step's loss, gradient norm and every gradient equal the reference step's."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` (Frobenius norms; ``b`` of norm 0 counts as 1e-30)."""
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def staged_step(model, forward) -> tuple:
    """``(loss, {parameter: gradient})`` of ``forward()``, the loss of ``model``'s stage modules chained
    in one process, its gradients from zero."""
    model.zero_grad()
    loss = forward()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_equal_steps(got: tuple, ref: tuple, *, rel: float = 1e-5, norm: bool = True) -> None:
    """``got`` and ``ref``: a step's ``(loss, {parameter: gradient})``. The same parameters have a
    gradient; the loss, the global gradient norm (where ``norm``) and every gradient equal the
    reference's within relative error ``rel``."""
    (loss, grads), (ref_loss, ref_grads) = got, ref
    assert set(grads) == set(ref_grads)
    assert rel_err(loss, ref_loss) < rel
    if norm:
        total = torch.stack([g.norm() for g in grads.values()]).norm()
        assert rel_err(total, torch.stack([g.norm() for g in ref_grads.values()]).norm()) < rel
    bad = {n: rel_err(grads[n], g) for n, g in ref_grads.items() if rel_err(grads[n], g) > rel}
    assert not bad, bad
