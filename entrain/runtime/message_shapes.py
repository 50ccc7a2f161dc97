"""The shapes of the forward messages a rank receives, known from the plan before they arrive
(``MessageShapes``): once a sending stage's first messages agreed with the plan's rows, its
receives are posted without waiting for their headers (``entrain.runtime.comm``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from entrain.core.ir.plan import Layout
from entrain.core.model.layer_specs import HIDDEN
from entrain.runtime.data import SampleRenderer

__all__ = ["MessageShapes", "Parts"]

Parts = dict[str, torch.Tensor]
"""A message's tensors by part name (``HIDDEN`` first)."""


@dataclass
class _Template:
    """A part's shape as its first message had it, the axes that may hold the plan's rows (one once
    trusted), its dtype, and how many messages agreed with it."""

    shape: tuple[int, ...]
    axes: frozenset[int]
    dtype: torch.dtype
    agreed: int = 1

    def agrees(self, t: torch.Tensor, rows: int) -> frozenset[int]:
        """The axes still possible after message part ``t`` of ``rows`` plan rows (empty: none)."""
        if t.dtype != self.dtype or t.dim() != len(self.shape):
            return frozenset()
        same = [a == b for a, b in zip(t.shape, self.shape)]
        return frozenset(
            i for i in self.axes if t.shape[i] == rows and all(same[j] for j in range(len(same)) if j != i)
        )


class MessageShapes:
    """The shapes of the forward messages a rank receives, known before they arrive where the plan
    fixes them: a part's rows are the plan's (``rows``: the sending component's tokens, LLM tokens or
    encoder patches, or the samples' image feature rows; a declared part's by its ``MessagePart.rows``
    rule) on one axis, its other dimensions and dtype are the sending stage's constants, read from the
    headers of its first messages. A stage's messages are sized once ``TRUST`` of them agreed with the
    rule on every part, on one axis; a part whose message disagrees once (rows that depend on the data in another way, a
    tiling encoder's ``[tiles, ...]``) keeps its header for the whole run. A sized receive still
    carries its header, compared at the end of the step (``Transport.verify``)."""

    TRUST = 2
    """Agreeing messages a stage's parts need before its messages are sized from the plan."""

    def __init__(self, layout: Layout, renderer: SampleRenderer, encoder_rows: dict[str, str] | None = None):
        self.layout, self.renderer = layout, renderer
        self.encoder_rows = encoder_rows or {}
        """With several encoder pipelines: per encoder name, its output's rows per sample
        (``MessagePart.rows``; ``ModelFamily.encoder_parts``): ``image_tokens`` or ``audio_tokens``."""
        self._templates: dict[tuple[int, str], _Template | None] = {}
        """(sending stage, part name) -> its template; None: data-dependent, always read its header."""

    def rows(self, stage: int, name: str, ids: Sequence[str]) -> int | None:
        """Rows of part ``name`` of stage ``stage``'s forward message for ``ids`` by the plan (None:
        not a whole number)."""
        spec, samples = self.layout.stages[stage], [self.renderer.sample(i) for i in ids]
        image_rows = sum(s.image_tokens for s in samples)
        audio_rows = sum(s.audio_tokens for s in samples)
        if spec.component == "llm":
            tokens = sum(s.num_tokens for s in samples)
        else:
            tokens = sum(t * h * w for s in samples for t, h, w in s.grid_thw)
        if name == HIDDEN:
            rule = self.encoder_rows.get(spec.encoder, "image_tokens")
            last_encoder = spec.component == "encoder" and self.layout.next_stage(stage) == self.first_llm
            if last_encoder:
                return audio_rows if rule == "audio_tokens" else image_rows
            return None if rule == "audio_tokens" else tokens  # an audio tower's inner rows: per chunk
        part = next(p for p in spec.parts if p.name == name)
        if part.rows != "tokens":
            return audio_rows if part.rows == "audio_tokens" else image_rows
        rows = tokens * part.rows_per_token
        return int(rows) if float(rows).is_integer() else None

    @property
    def first_llm(self) -> int:
        return self.layout.num_encoder_stages

    def known_stages(self) -> frozenset[int]:
        """The sending stages whose forward messages are sized from the plan."""
        names = {st.stage: st.part_names for st in self.layout.stages}
        return frozenset(
            stage
            for stage, parts in names.items()
            if all(
                (t := self._templates.get((stage, n))) is not None
                and t.agreed >= self.TRUST
                and len(t.axes) == 1
                for n in parts
            )
        )

    def observe(self, stage: int, ids: Sequence[str], parts: Parts) -> None:
        """Learn from a forward message of ``stage`` received with its headers."""
        for name, t in parts.items():
            key, rows = (stage, name), self.rows(stage, name, ids)
            known = self._templates.get(key, False)
            if known is None:
                continue
            if rows is None:
                self._templates[key] = None
            elif known is False:
                axes = frozenset(i for i, n in enumerate(t.shape) if n == rows)
                self._templates[key] = _Template(tuple(t.shape), axes, t.dtype) if axes else None
            else:
                axes = known.agrees(t, rows)
                self._templates[key] = replace(known, axes=axes, agreed=known.agreed + 1) if axes else None

    def likes(self, stage: int, ids: Sequence[str]) -> list[torch.Tensor]:
        """Meta tensors of the shapes and dtypes of ``stage``'s message parts for ``ids``."""
        out = []
        for name in self.layout.stages[stage].part_names:
            t = self._templates[(stage, name)]
            (axis,) = t.axes
            shape = list(t.shape)
            shape[axis] = self.rows(stage, name, ids)
            out.append(torch.empty(shape, dtype=t.dtype, device="meta"))
        return out
