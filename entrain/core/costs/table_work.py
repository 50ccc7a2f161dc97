"""Per-sample work of a drawn batch, priced column-wise: ``CostModel.sample_work`` over a ``TableDraw``.

``sample_work`` sums, per phase and layer, each sequence unit's size-dependent time in Python; a
global batch of 8192 samples costs about a second that way. ``draw_work_arrays`` does the same
additions in the same order on numpy arrays (one array operation per phase, layer and unit slot,
adding ``0.0`` where a sample has fewer units, which changes no sum), so the results are the same
floats, not approximations of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from entrain.core.costs.costmodel import CostModel, Quadratic, parallel_key
from entrain.core.workload.sample_table import TableDraw
from entrain.core.workload.samples import LABEL_FRACTION
from entrain.core.workload.work import SampleWork

__all__ = ["draw_work_arrays", "draw_works"]


def _variable_ms(q: Quadratic, x: np.ndarray) -> np.ndarray:
    """``q.variable_ms`` of every entry of ``x`` (the same float operations)."""
    if not q.table:
        return q.a * x * x + q.b * x
    values, inverse = np.unique(x, return_inverse=True)
    return np.array([q.variable_ms(float(v)) for v in values])[inverse.reshape(x.shape)]


def _component_ms(
    cost: CostModel, comp: str, units: list[np.ndarray], masks: list[np.ndarray], labels: np.ndarray | None,
    tp: int, cp: int,
) -> np.ndarray:  # fmt: skip
    """Forward + backward ms of the whole component per sample, constants excluded, as
    ``CostModel.sample_work`` adds them: phases, then layers, then units in order."""
    component = cost.component(comp)
    key = parallel_key(tp, cp)
    n = len(masks[0]) if masks else (len(labels) if labels is not None else 0)
    total = np.zeros(n)
    for phase in ("fwd", "bwd"):
        stage = np.zeros(n)
        for i, layer in enumerate(component.layers):
            q = layer.fwd[key] if phase == "fwd" else cost._bwd_quadratic(component, i, key)
            layer_ms = np.zeros(n)
            if q is not None:
                cols = units
                if layer.per_label:
                    cols = [labels] if labels is not None else [LABEL_FRACTION * u for u in units]
                for x, mask in zip(cols, masks):
                    layer_ms = layer_ms + np.where(mask, _variable_ms(q, x), 0.0)
                layer_ms = layer_ms + q.constant_ms * 0
            stage = stage + layer_ms
        total = total + stage
    return total


def draw_work_arrays(
    draw: TableDraw, cost: CostModel, tp: int = 1, cp: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Per drawn sample, ``cost.sample_work(sample, tp, cp)``'s (encoder, llm) ms, bit for bit."""
    t, idx = draw.table, draw.idx
    starts = t.image_offsets[idx]
    counts = t.image_offsets[idx + 1] - starts
    slots = int(counts.max()) if len(idx) else 0
    enc_masks = [counts > k for k in range(slots)]
    last = max(len(t.vit_patches) - 1, 0)
    enc_units = [
        np.where(m, t.vit_patches[np.minimum(starts + k, last)] if len(t.vit_patches) else 0, 0).astype(
            np.float64
        )
        for k, m in enumerate(enc_masks)
    ]
    enc = _component_ms(cost, "encoder", enc_units, enc_masks, None, tp, cp) if slots else np.zeros(len(idx))
    llm_units = [t.llm_x1[idx]]
    llm = _component_ms(cost, "llm", llm_units, [np.ones(len(idx), bool)], t.label_tokens()[idx], tp, cp)
    return enc, llm


def draw_works(
    items: Sequence, cost: CostModel, tp: int = 1, cp: int = 1, *, numbered: bool = False
) -> list[SampleWork]:
    """``SampleWork`` of each drawn item (raw-work items as they are), priced at ``tp`` x ``cp``
    (column-wise for a ``TableDraw``); ``numbered``: each id gets ``#position`` (a draw with
    replacement may hold a sample twice, a global batch holds every id once)."""
    if isinstance(items, TableDraw):
        enc, llm = draw_work_arrays(items, cost, tp, cp)
        works = [SampleWork(m.id, e, w, m) for m, e, w in zip(items, enc.tolist(), llm.tolist())]
    else:
        works = [x if isinstance(x, SampleWork) else cost.sample_work(x, tp, cp) for x in items]
    if numbered:
        works = [replace(w, id=f"{w.id}#{k}") for k, w in enumerate(works)]
    return works
