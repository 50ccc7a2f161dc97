"""Columnar sample metadata: a dataset of a million samples as a few numpy arrays.

``SampleTable`` holds what ``SampleMeta`` holds (id, image sizes, text and answer tokens) one array
per field, with no Python object per record: ids as one UTF-8 byte buffer with offsets, images as
flat height / width arrays with per-sample offsets. It is a ``Sequence[SampleMeta]`` (a record is
built when indexed), and keeps the per-sample columns the planner reads (ViT patches and their
squares, LLM tokens), computed once with a vectorised ``smart_resize`` that gives the same integers
as ``samples.smart_resize``. ``TableDraw`` is a draw from a table by index (what ``pool_sampler``
returns for a table), again without building records until one is indexed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.workload.samples import DEFAULT_VISION, LABEL_FRACTION, SampleMeta, VisionTokenConfig

__all__ = ["SampleTable", "TableDraw", "resized_sides", "NO_ANSWER"]

NO_ANSWER = -1
"""``answer_tokens`` entry of a sample whose data does not say (``SampleMeta.answer_tokens`` None)."""


def resized_sides(heights: np.ndarray, widths: np.ndarray, cfg: VisionTokenConfig = DEFAULT_VISION):
    """``samples.smart_resize`` over arrays (aspect ratios assumed checked): ``(H', W')`` as int64,
    the same operations in the same IEEE order, so the same integers."""
    h = np.asarray(heights, dtype=np.int64)
    w = np.asarray(widths, dtype=np.int64)
    f = cfg.factor
    h_bar = np.round(h / f).astype(np.int64) * f  # half to even, as Python's round
    w_bar = np.round(w / f).astype(np.int64) * f
    area = h * w
    big = h_bar * w_bar > cfg.max_pixels
    small = ~big & (h_bar * w_bar < cfg.min_pixels)
    if big.any():
        beta = np.sqrt(area[big] / cfg.max_pixels)
        h_bar[big] = np.maximum(f, np.floor(h[big] / beta / f).astype(np.int64) * f)
        w_bar[big] = np.maximum(f, np.floor(w[big] / beta / f).astype(np.int64) * f)
    if small.any():
        beta = np.sqrt(cfg.min_pixels / area[small])
        h_bar[small] = np.ceil(h[small] * beta / f).astype(np.int64) * f
        w_bar[small] = np.ceil(w[small] * beta / f).astype(np.int64) * f
    return h_bar, w_bar


@dataclass(frozen=True, eq=False)
class SampleTable(Sequence[SampleMeta]):
    """Samples as columns (see the module docstring). Build with ``SampleTable.build``."""

    id_bytes: np.ndarray
    """uint8: every id's UTF-8 bytes, concatenated."""
    id_offsets: np.ndarray
    """int64 ``[n + 1]``: id ``i`` is ``id_bytes[id_offsets[i]:id_offsets[i + 1]]``."""
    image_offsets: np.ndarray
    """int64 ``[n + 1]``: sample ``i``'s images are ``image_offsets[i]:image_offsets[i + 1]``."""
    heights: np.ndarray
    widths: np.ndarray
    text_tokens: np.ndarray
    answer_tokens: np.ndarray
    """int64, ``NO_ANSWER`` where the data does not say."""
    vision: VisionTokenConfig
    vit_patches: np.ndarray
    """int64 per image: ``4 * (H'/28) * (W'/28)``."""
    enc_x1: np.ndarray
    """float64 per sample: ViT patches summed over its images."""
    enc_x2: np.ndarray
    """float64 per sample: sum of each image's patches squared."""
    llm_x1: np.ndarray
    """float64 per sample: LLM tokens (text + merged image tokens)."""

    @classmethod
    def build(
        cls,
        id_bytes: np.ndarray,
        id_offsets: np.ndarray,
        image_offsets: np.ndarray,
        heights: np.ndarray,
        widths: np.ndarray,
        text_tokens: np.ndarray,
        answer_tokens: np.ndarray,
        vision: VisionTokenConfig = DEFAULT_VISION,
    ) -> SampleTable:
        """The table with its derived columns (image sizes must be positive with allowed aspect ratios)."""
        image_offsets = np.asarray(image_offsets, dtype=np.int64)
        n = len(image_offsets) - 1
        h_bar, w_bar = resized_sides(heights, widths, vision)
        merged = (h_bar // vision.factor) * (w_bar // vision.factor)
        owner = np.repeat(np.arange(n), np.diff(image_offsets))
        per_token = vision.merge_size**2  # ViT patches per merged LLM token (4 for Qwen)
        patches = (per_token * merged).astype(np.float64)
        text = np.asarray(text_tokens, dtype=np.int64)
        return cls(
            np.asarray(id_bytes, dtype=np.uint8), np.asarray(id_offsets, dtype=np.int64), image_offsets,
            np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64), text,
            np.asarray(answer_tokens, dtype=np.int64), vision, per_token * merged,
            np.bincount(owner, weights=patches, minlength=n), np.bincount(owner, weights=patches**2, minlength=n),
            text + np.bincount(owner, weights=merged.astype(np.float64), minlength=n),
        )  # fmt: skip

    @classmethod
    def from_samples(
        cls, samples: Iterable[SampleMeta], vision: VisionTokenConfig = DEFAULT_VISION
    ) -> SampleTable:
        """A table of the given records (tests and small lists; readers build the columns directly)."""
        ids, id_ends, image_ends, hs, ws, text, answer = bytearray(), [0], [0], [], [], [], []
        for s in samples:
            ids += s.id.encode("utf-8")
            id_ends.append(len(ids))
            hs += [h for h, _ in s.images]
            ws += [w for _, w in s.images]
            image_ends.append(len(hs))
            text.append(s.text_tokens)
            answer.append(NO_ANSWER if s.answer_tokens is None else s.answer_tokens)
        return cls.build(
            np.frombuffer(bytes(ids), np.uint8), id_ends, image_ends, hs, ws, text, answer, vision
        )

    def __len__(self) -> int:
        return len(self.text_tokens)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} of a table of {len(self)}")
        a, b = self.image_offsets[i], self.image_offsets[i + 1]
        images = tuple(zip(self.heights[a:b].tolist(), self.widths[a:b].tolist()))
        answer = int(self.answer_tokens[i])
        return SampleMeta(
            self.sample_id(i),
            images,
            int(self.text_tokens[i]),
            self.vision,
            None if answer == NO_ANSWER else answer,
        )

    def sample_id(self, i: int) -> str:
        return self.id_bytes[self.id_offsets[i] : self.id_offsets[i + 1]].tobytes().decode("utf-8")

    def label_tokens(self) -> np.ndarray:
        """Per sample, ``SampleMeta.label_tokens``: the answer tokens, or ``LABEL_FRACTION`` of the LLM tokens."""
        given = self.answer_tokens != NO_ANSWER
        return np.where(given, self.answer_tokens.astype(np.float64), LABEL_FRACTION * self.llm_x1)

    def take(self, idx: np.ndarray) -> TableDraw:
        return TableDraw(self, np.asarray(idx, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of every array the table holds."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))


class _IndexView(Sequence):
    """Entries ``idx`` of a table (repeats allowed)."""

    __slots__ = ("table", "idx")

    def __init__(self, table: SampleTable, idx: np.ndarray):
        self.table, self.idx = table, idx

    def __len__(self) -> int:
        return len(self.idx)


class TableDraw(_IndexView, Sequence[SampleMeta]):
    """Samples ``idx`` of a table (repeats allowed), a record built only when one is indexed."""

    __slots__ = ()

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return TableDraw(self.table, self.idx[j])
        return self.table[int(self.idx[j])]

    @property
    def ids(self) -> Sequence[str]:
        return _IdView(self.table, self.idx)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ViT patches, sum of squared per-image patches, LLM tokens) per drawn sample, float64."""
        t, i = self.table, self.idx
        return t.enc_x1[i], t.enc_x2[i], t.llm_x1[i]


class _IdView(_IndexView, Sequence[str]):
    __slots__ = ()

    def __getitem__(self, j):  # type: ignore[override]
        if isinstance(j, slice):
            return [self.table.sample_id(int(k)) for k in self.idx[j]]
        return self.table.sample_id(int(self.idx[j]))
