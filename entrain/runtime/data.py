"""Render sample metadata into real tensors and pack them per (sub-)microbatch.

A rendered sample is deterministic in ``(seed, sample id)``, so every rank renders the same tensors
for a sample without communication. What depends on the model is its family's
(``ModelFamily.image_grids``, ``image_feature_rows``, ``token_ids``, ``map_token_id``,
``encoder_input_width``, ``position_ids``). Layout of one sample's LLM sequence::

    [<image_start> <image> * m_i <image_end>] per image,
    [<audio_start> <audio> * a_j <audio_end>] per audio clip, prompt text, answer text

``text_tokens`` counts every non-image token (markers included); text ids follow a Zipf law over the
first 4,000 regular ids. The answer is the last ``answer_tokens`` tokens where the metadata says,
else ``max(1, round(0.2 * text_tokens))`` (``LABEL_FRACTION``), at most what the text holds; the loss
is taken at the positions that predict them (labels on the answer part only). Pixel values are seeded
N(0, 1) rows (windows of a seeded bank): ``t * h * w`` rows of ``encoder_input_width`` per image of
grid ``(t, h, w)``. An audio clip of ``f`` mel frames (``SampleMeta.audio``; a family whose
``accepts_audio``) is ``f`` seeded N(0, 1) rows of ``audio_input_width`` (its mel bins), or a record's
real log-mel features (``record_source.RecordSource.audio_features``): the first encoder stage's ``audio_mel`` part
(every clip's frames in order) with ``audio_lengths`` (frames per clip). A video of grid ``(t, h, w)``
(``SampleMeta.video``; a family that ``accepts_video``) is a visual item like an image: its
``t * h / m * w / m`` video tokens (``<image_start> <video>* <image_end>``, after the images) and its
``t * h * w`` patch rows ride with the images' in the order their tokens come, or a record's decoded
frames (``RecordSource.pixels``; ``entrain.data.video``), its audio track among the clips where the
record asks for it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from entrain.core.errors import DataError
from entrain.core.workload.samples import LABEL_FRACTION, SampleMeta, audio_llm_tokens
from entrain.models.batch import LLMBatch
from entrain.models.families.base import PackedSample
from entrain.models.families.registry import family_of
from entrain.runtime.h2d import InputPrefetcher, host_to_device
from entrain.runtime.record_source import RecordSource

__all__ = [
    "RenderedSample",
    "SampleRenderer",
    "EncoderInput",
    "PATCH_BANK_ROWS",
    "AUDIO_MEL",
    "AUDIO_LENGTHS",
]

PATCH_BANK_ROWS = 8192
AUDIO_MEL, AUDIO_LENGTHS = "audio_mel", "audio_lengths"
"""The first encoder stage's audio input parts (``EncoderInput.audio``)."""
ENCODER_INPUTS = ("encoder", "images", "audio")
"""What an encoder pipeline's first stage reads (``SampleRenderer.encoder_input``'s ``kind``): the
samples' images and audio clips (one encoder component), or with a pipeline per tower their images
only or their clips only."""
ZIPF_EXPONENT = 1.1
TEXT_VOCAB = 4_000
"""Text ids are drawn from ``0..TEXT_VOCAB-1`` (regular ids in every vocabulary, tiny's included)."""


@dataclass(frozen=True)
class RenderedSample:
    id: str
    input_ids: torch.Tensor
    """``[L]`` int64, already in the model's vocabulary."""
    image_positions: torch.Tensor
    """``[M]`` positions of the image placeholders, images in order."""
    label_positions: torch.Tensor
    targets: torch.Tensor
    grid_thw: tuple[tuple[int, int, int], ...]
    image_tokens: int
    """Merged image tokens (rows of this sample's encoder output)."""
    extras: tuple[tuple[int, ...], ...] = ()
    """Per image, the family's ``image_extras`` columns (``()``: none)."""
    audio_frames: tuple[int, ...] = ()
    """Mel frames per audio clip, in order."""
    audio_tokens: int = 0
    """Audio placeholder tokens (rows of this sample's audio features)."""
    video_items: tuple[int, ...] = ()
    """Which of ``grid_thw`` are videos (their indices; ``image_tokens`` counts their tokens too)."""
    second_per_grids: tuple[float, ...] = ()
    """Seconds per temporal patch of each video, in order."""

    @property
    def encoded_rows(self) -> int:
        """Rows the encoder stages make for this sample: image feature rows plus audio tokens."""
        return self.image_tokens + self.audio_tokens

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_labels(self) -> int:
        return int(self.label_positions.numel())


@dataclass(frozen=True)
class EncoderInput:
    patches: torch.Tensor
    """``[N, 1176]`` packed patches of every image of the (sub-)microbatch."""
    grid_thw: torch.Tensor
    """``[images, 3 + k]`` int64: the grids, then the family's ``image_extras`` columns."""
    rows_per_sample: tuple[int, ...]
    """Merged output rows each sample contributes, in order."""
    audio: dict[str, torch.Tensor] = field(default_factory=dict)
    """With audio clips: ``audio_mel`` ``[frames, mel]`` (every clip's frames in order) and
    ``audio_lengths`` ``[clips]`` int64 (frames per clip); empty without."""


def _background_priority() -> None:
    """Lower the calling thread's scheduling priority (Linux: nice 19 on its thread id), so data
    preparation takes idle CPU time and yields the cores to the ranks' compute when they contend."""
    import os
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux / not permitted: run at normal priority
        pass


def _packed(s: RenderedSample, videos_among_images: bool = False) -> PackedSample:
    """What ``ModelFamily.position_ids`` sees of a rendered sample (with videos: the images' grids in
    ``grids``, the videos' in ``video_grids``, or every visual item's in ``grids`` for a family whose
    ``videos_among_images``; ``image_positions`` every visual token)."""
    if not s.video_items or videos_among_images:
        return PackedSample(s.input_ids, s.image_positions, s.grid_thw, s.audio_frames)
    images = tuple(g for i, g in enumerate(s.grid_thw) if i not in s.video_items)
    videos = tuple(s.grid_thw[i] for i in s.video_items)
    return PackedSample(s.input_ids, s.image_positions, images, s.audio_frames, videos, s.second_per_grids)


def _grid_rows(samples: Sequence[RenderedSample]) -> torch.Tensor:
    """``[images, 3 + k]`` int64 host tensor: each image's grid, then its ``extras`` columns."""
    rows = [g + (s.extras[i] if s.extras else ()) for s in samples for i, g in enumerate(s.grid_thw)]
    width = len(rows[0]) if rows else 3
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, width)


def _seed_of(seed: int, sample_id: str, salt: str) -> int:
    return zlib.crc32(f"{seed}:{salt}:{sample_id}".encode())


class SampleRenderer:
    """Renders ``SampleMeta`` into tensors for ``cfg`` (seeded by ``seed``) and packs them; with a
    ``source`` (a LLaVA dataset) the real images and conversations are used instead.

    With a source, ``sample`` (ids, labels, grid) never runs the image processor: the grid and merged
    token counts follow from the header sizes in the metadata. Pixels are processed only by
    ``patches`` (the first encoder stage), once per use; ``prefetch`` queues the pixels of the next
    step's samples on one background thread so the processing overlaps the current step. Results are
    the same tensors with or without prefetching.
    """

    def __init__(
        self,
        cfg,
        metas: dict[str, SampleMeta],
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        source: RecordSource | None = None,
    ):
        self.cfg, self.metas, self.seed, self.source = cfg, metas, seed, source
        self.family = family_of(cfg)
        """The model family's processing rules (``ModelFamily``)."""
        if source is not None:
            source.bind(self.family, cfg)
            if not getattr(self.family, "accepts_audio", False):  # refused before the first step
                for rid in (rid for rid, rec in source.records.items() if rec.audio):
                    source.check_audio(rid)
            if not getattr(self.family, "accepts_video", False):
                for rid in (rid for rid, rec in source.records.items() if rec.video):
                    source.check_video(rid)
        self._ids = self.family.token_ids(cfg)
        self.device, self.dtype = torch.device(device), dtype
        self._cache: dict[str, RenderedSample] = {}
        self._pending: dict[str, Future] = {}
        """Prefetched pixels by sample id (consumed by ``patches``)."""
        self._wanted: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._bank: torch.Tensor | None = None
        self._zipf_cdf: torch.Tensor | None = None
        self._inputs = InputPrefetcher(self.device)
        """On a GPU: the next forward's inputs, copied on a side stream (``expect_forwards``)."""

    def add(self, metas: dict[str, SampleMeta]) -> None:
        self.metas.update(metas)

    # --- one sample ---------------------------------------------------------------------------------
    def grid(self, meta: SampleMeta) -> tuple[tuple[int, int, int], ...]:
        return self.family.image_grids(self.cfg, meta)

    def sample(self, sample_id: str) -> RenderedSample:
        if sample_id not in self._cache:
            self._cache[sample_id] = self._render(self.metas[sample_id])
        return self._cache[sample_id]

    def _render(self, meta: SampleMeta) -> RenderedSample:
        if self.source is not None:
            return self._from_record(meta)
        gen = torch.Generator().manual_seed(_seed_of(self.seed, meta.id, "text"))
        grid = self.grid(meta)
        img_tokens = self.family.sample_feature_rows(self.cfg, meta)
        videos = self._video_tokens(meta)
        text = meta.text_tokens
        start, pad, end = self._ids["image_start"], self._ids["image"], self._ids["image_end"]
        visual = len(grid) + len(videos)
        use_markers = text >= 2 * visual + 2 and start >= 0 and end >= 0
        num_markers = 2 * visual if use_markers else 0
        clips = self._audio_clips(meta)
        num_markers += 2 * len(clips)
        wanted = (
            meta.answer_tokens if meta.answer_tokens is not None else max(1, round(LABEL_FRACTION * text))
        )
        num_answer = max(0, min(wanted, text - num_markers - 1))
        words = self._words(max(0, text - num_markers), gen)
        ids: list[int] = []
        image_pos: list[int] = []
        for m in img_tokens:
            if use_markers:
                ids.append(start)
            image_pos.extend(range(len(ids), len(ids) + m))
            ids.extend([pad] * m)
            if use_markers:
                ids.append(end)
        for m in videos:
            ids.extend([start] if use_markers else [])
            image_pos.extend(range(len(ids), len(ids) + m))
            ids.extend([self._ids["video"]] * m)
            ids.extend([end] if use_markers else [])
        for m in clips:
            ids.extend([self._ids["audio_start"], *[self._ids["audio"]] * m, self._ids["audio_end"]])
        ids.extend(self.family.map_token_id(self.cfg, w) for w in words)
        ids_t = torch.tensor(ids, dtype=torch.int64)
        n = len(ids)
        label_pos = torch.arange(n - num_answer - 1, n - 1, dtype=torch.int64)
        return RenderedSample(
            id=meta.id,
            input_ids=ids_t,
            image_positions=torch.tensor(image_pos, dtype=torch.int64),
            label_positions=label_pos,
            targets=ids_t[label_pos + 1],
            grid_thw=tuple(grid) + tuple(meta.video) if videos else grid,
            image_tokens=sum(img_tokens) + sum(videos),
            extras=self.family.image_extras(self.cfg, meta),
            audio_frames=tuple(meta.audio),
            audio_tokens=sum(clips),
            **self._video_fields(meta, range(len(grid), visual)),
        )

    def _video_tokens(self, meta: SampleMeta) -> list[int]:
        """LLM tokens per video of ``meta``; DataError for videos a family does not read."""
        if not meta.video:
            return []
        if not getattr(self.family, "accepts_video", False):
            raise DataError(
                f"sample {meta.id}", None, "video", f"model family {self.family.name!r} reads no video"
            )
        if self.source is None and getattr(self.family, "videos_among_images", False):
            raise DataError(f"sample {meta.id}", None, "video",
                            f"model family {self.family.name!r} reads videos of records only (their "
                            "frames' timestamps are text)")  # fmt: skip
        merge = getattr(meta.vision, "merge_size", 2)
        return [t * h * w // merge**2 for t, h, w in meta.video]

    def _video_fields(self, meta: SampleMeta, items: Iterable[int]) -> dict:
        """``RenderedSample``'s video fields: which grids are videos, their seconds per temporal patch."""
        if not meta.video:
            return {}
        fps = [None] * len(meta.video)
        if self.source is not None:  # a record's videos: the frames kept per second of each
            from entrain.data.video import VideoFileError, sampled_fps

            record = self.source.records[meta.id]
            settings = self.source.video_settings()
            for i, path in enumerate(record.video):
                try:
                    fps[i] = sampled_fps(path, settings)
                except VideoFileError as e:
                    raise DataError(*self.source._where(meta.id), f"{record.video_field}[{i}]",
                                    f"{path}: {e.problem}") from None  # fmt: skip
        return {
            "video_items": tuple(items),
            "second_per_grids": tuple(float(self.family.second_per_grid(self.cfg, f)) for f in fps),
        }

    def _video_texts(self, meta: SampleMeta, clips: list[int]) -> tuple[list[str], list[int]]:
        """What each ``<video>`` of a record becomes (``ModelFamily.video_text``: with its audio track
        where the record asks for it) and the LLM tokens of its ``<audio>`` clips; ``clips``: the
        tokens of every audio input in token order (``entrain.data.video_records.audio_slots``)."""
        from entrain.data.video_records import audio_slots

        record = self.source.records[meta.id]
        tracks: dict[int, int] = {}
        standalone = clips
        if record.audio_in_video:
            slots = audio_slots(record)
            standalone = [n for (kind, _), n in zip(slots, clips) if kind == "audio"]
            tracks = {i: n for (kind, i), n in zip(slots, clips) if kind == "video"}
        from entrain.data.video import VideoFileError, frames_of

        tok, settings = self.source.tokenizer, self.source.video_settings()
        texts = []
        for i, g in enumerate(meta.video):
            try:
                frames = frames_of(record.video[i], settings)
            except VideoFileError as e:
                raise DataError(*self.source._where(meta.id), f"{record.video_field}[{i}]",
                                f"{record.video[i]}: {e.problem}") from None  # fmt: skip
            texts.append(self.family.video_text(self.cfg, tok, g, tracks.get(i), frames=frames))
        return texts, standalone

    def _audio_clips(self, meta: SampleMeta) -> list[int]:
        """LLM tokens per audio clip of ``meta``; DataError for audio a family does not read."""
        if not meta.audio:
            return []
        if not getattr(self.family, "accepts_audio", False):
            raise DataError(
                f"sample {meta.id}", None, "audio", f"model family {self.family.name!r} reads no audio"
            )
        return [audio_llm_tokens(f) for f in meta.audio]

    def audio_features(self, sample_id: str) -> torch.Tensor:
        """``[frames, mel]`` mel features of every audio clip of a sample, in order: a record's real
        log-mel features (``record_source.RecordSource.audio_features``), else seeded N(0, 1) rows."""
        s = self.sample(sample_id)
        width = self.family.audio_input_width(self.cfg)
        if self.source is not None:
            mel = torch.as_tensor(self.source.audio_features(sample_id, width))
            if tuple(mel.shape) != (sum(s.audio_frames), width):
                raise DataError(
                    *self.source._where(sample_id),
                    "audio",
                    f"{mel.shape[0]} mel frames where its metadata says {sum(s.audio_frames)} (a clip changed "
                    "since the metadata pass)",
                )
            return host_to_device(mel, self.device, self.dtype)
        gen = torch.Generator().manual_seed(_seed_of(self.seed, sample_id, "audio"))
        mel = torch.randn((sum(s.audio_frames), width), generator=gen)
        return host_to_device(mel, self.device, self.dtype)

    def _from_record(self, meta: SampleMeta) -> RenderedSample:
        self.source.check_audio(meta.id)
        self.source.check_video(meta.id)
        grid = self.grid(meta)
        counts = list(self.family.sample_feature_rows(self.cfg, meta))
        clips = self._audio_clips(meta)
        videos = self._video_tokens(meta)
        texts, standalone = self._video_texts(meta, clips) if videos else ([], clips)
        raw_ids, raw_labels = self.source.text(meta.id, counts, standalone, texts)
        if self.source.model_ids:
            ids = torch.as_tensor(raw_ids, dtype=torch.int64)
        else:
            ids = torch.tensor(
                [self.family.map_token_id(self.cfg, int(i)) for i in raw_ids], dtype=torch.int64
            )
        image_pos = torch.nonzero(ids == self._ids["image"]).flatten()
        self.source.check_image_slots(meta.id, len(image_pos), counts)
        if videos:
            image_pos, grid, items = self._visual_items(meta, ids, grid, videos)
        if clips and int((ids == self._ids["audio"]).sum()) != sum(clips):
            raise DataError(
                *self.source._where(meta.id),
                "conversations",
                f"{int((ids == self._ids['audio']).sum())} audio tokens where its clips need {sum(clips)}",
            )
        labels = torch.as_tensor(raw_labels, dtype=torch.int64)
        label_pos = torch.nonzero(labels[1:] != -100).flatten()
        return RenderedSample(
            id=meta.id,
            input_ids=ids,
            image_positions=image_pos,
            label_positions=label_pos,
            targets=ids[label_pos + 1],
            grid_thw=tuple(grid),
            image_tokens=sum(counts) + sum(videos),
            extras=self.family.image_extras(self.cfg, meta),
            audio_frames=tuple(meta.audio),
            audio_tokens=sum(clips),
            **(self._video_fields(meta, items) if videos else {}),
        )

    def _visual_items(self, meta: SampleMeta, ids: torch.Tensor, grid, videos: list[int]):
        """``(visual token positions, every visual item's grid, the videos' indices among them)`` of a
        record with videos, items in the order their placeholders come; DataError unless the text
        holds each video's tokens."""
        from entrain.data.video_records import placeholder_kinds

        got = int((ids == self._ids["video"]).sum())
        if got != sum(videos):
            raise DataError(*self.source._where(meta.id), "conversations",
                            f"{got} video tokens where its videos need {sum(videos)}")  # fmt: skip
        kinds = [k for k in placeholder_kinds(self.source.records[meta.id].turns) if k != "audio"]
        images, vids = iter(grid), iter(meta.video)
        grids = [next(images) if k == "image" else next(vids) for k in kinds]
        items = tuple(i for i, k in enumerate(kinds) if k == "video")
        visual = (ids == self._ids["image"]) | (ids == self._ids["video"])
        return torch.nonzero(visual).flatten(), grids, items

    def _words(self, n: int, gen: torch.Generator) -> list[int]:
        """``n`` text token ids drawn from a Zipf(1.1) law over the regular ids (learnable statistics,
        like text, so a short demo run shows the loss falling)."""
        if self._zipf_cdf is None:
            ranks = torch.arange(1, TEXT_VOCAB + 1, dtype=torch.float64)
            p = ranks.pow(-ZIPF_EXPONENT)
            self._zipf_cdf = torch.cumsum(p / p.sum(), 0)
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        return torch.searchsorted(self._zipf_cdf, u).clamp_(max=TEXT_VOCAB - 1).tolist()

    def patches(self, sample_id: str) -> torch.Tensor:
        """``[N, 1176]`` seeded pixel patches of every image of a sample: a window of a seeded N(0, 1)
        bank (``PATCH_BANK_ROWS`` rows, drawn once), starting at a per-sample seeded offset, so
        rendering costs a slice rather than drawing millions of numbers inside a step."""
        if self.source is not None:
            return self._record_patches(sample_id)
        s = self.sample(sample_id)
        rows = sum(t * h * w for t, h, w in s.grid_thw)
        bank = self._patch_bank()
        start = _seed_of(self.seed, sample_id, "pixels") % bank.shape[0]
        index = (start + torch.arange(rows)) % bank.shape[0]
        return host_to_device(bank[index], self.device, self.dtype)

    def _record_patches(self, sample_id: str) -> torch.Tensor:
        pending = self._pending.pop(sample_id, None)
        vision = self.metas[sample_id].vision
        pixels, grid = pending.result() if pending is not None else self.source.pixels(sample_id, vision)
        expected = self.sample(sample_id).grid_thw
        got = tuple(tuple(int(v) for v in g) for g in grid)
        if got != expected and self.sample(sample_id).video_items:
            raise DataError(
                *self.source._where(sample_id),
                "video",
                f"decoded visual grids {list(got)} differ from the metadata pass's {list(expected)} (a video "
                "changed since, or the checkpoint's video_preprocessor_config.json differs from the "
                "defaults the metadata pass used)",
            )
        if got != expected:
            raise DataError(
                *self.source._where(sample_id),
                "images",
                f"image processor grids {list(got)} differ from the header sizes' {list(expected)} "
                "(an image whose decoded size differs from its header)",
            )
        return host_to_device(torch.as_tensor(pixels), self.device, self.dtype)

    def prefetch(self, ids: Iterable[str]) -> None:
        """Start processing the pixels of ``ids`` (the samples the next ``patches`` calls will ask
        for) on a background thread, in order. A no-op without a source (seeded patches cost a
        slice). Prefetched pixels not asked for by the time of the next-but-one call are dropped."""
        if self.source is None:
            return
        ids = [i for i in dict.fromkeys(ids) if self.metas[i].images or self.metas[i].video]
        keep = self._wanted | set(ids)
        for sid in [k for k in self._pending if k not in keep]:
            self._pending.pop(sid).cancel()
        self._wanted = set(ids)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="entrain-data", initializer=_background_priority
            )
        for sid in ids:
            if sid not in self._pending:
                self._pending[sid] = self._pool.submit(self.source.pixels, sid, self.metas[sid].vision)

    def close(self) -> None:
        """Stop the prefetch thread (queued work is cancelled)."""
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _patch_bank(self) -> torch.Tensor:
        if self._bank is None:
            gen = torch.Generator().manual_seed(_seed_of(self.seed, "", "patch-bank"))
            width = self.family.encoder_input_width(self.cfg)
            self._bank = torch.randn((PATCH_BANK_ROWS, width), generator=gen)
        return self._bank

    # --- packs --------------------------------------------------------------------------------------
    def expect_forwards(self, inputs: Sequence[tuple[str, Sequence[str]]]) -> None:
        """The packs a step's forwards will ask for, in order: ``(kind, ids)`` for ``encoder_input``
        (``ENCODER_INPUTS``), ``("llm", ids)`` for ``llm_batch``. On a GPU each is copied to the device
        on a side stream while the previous one computes; elsewhere a no-op."""
        builders = {
            **{k: partial(self._encoder_input, kind=k) for k in ENCODER_INPUTS},
            "llm": self._llm_batch,
        }
        self._inputs.expect(
            [((kind, tuple(ids)), lambda k=kind, i=ids: builders[k](i)) for kind, ids in inputs]
        )

    def encoder_input(self, ids: Sequence[str], kind: str = "encoder") -> EncoderInput:
        """The first encoder stage's input of ``ids``: their images and audio clips, or ``kind`` only
        (``ENCODER_INPUTS``)."""
        return self._inputs.take((kind, tuple(ids)), lambda: self._encoder_input(ids, kind))

    def _encoder_input(self, ids: Sequence[str], kind: str = "encoder") -> EncoderInput:
        samples = [self.sample(i) for i in ids]
        with_images = [s for s in samples if s.grid_thw and kind != "audio"]
        patches = [self.patches(s.id) for s in with_images]
        with_audio = [s for s in samples if s.audio_frames and kind != "images"]
        audio = {}
        if with_audio:
            audio = {
                AUDIO_MEL: torch.cat([self.audio_features(s.id) for s in with_audio]),
                AUDIO_LENGTHS: self.audio_lengths(ids),
            }
        return EncoderInput(
            patches=torch.cat(patches)
            if patches
            else torch.empty(
                (0, self.family.encoder_input_width(self.cfg)), device=self.device, dtype=self.dtype
            ),
            grid_thw=_grid_rows(with_images),  # host: see grid_thw()
            rows_per_sample=tuple(s.image_tokens for s in samples),
            audio=audio,
        )

    def grid_thw(self, ids: Sequence[str]) -> torch.Tensor:
        """``[images, 3]`` grids of the samples' images, in order (no pixels rendered). Grids stay on the
        host: the encoder derives its index tensors from them with Python loops, which on a GPU would
        otherwise wait for the device in every forward."""
        return _grid_rows([self.sample(i) for i in ids])

    def audio_lengths(self, ids: Sequence[str]) -> torch.Tensor:
        """``[clips]`` int64 mel frames of every audio clip of the samples, in order; on the host, as
        the grids."""
        return torch.tensor([f for i in ids for f in self.sample(i).audio_frames], dtype=torch.int64)

    def llm_batch(self, ids: Sequence[str], loss_scale: float) -> LLMBatch:
        batch = self._inputs.take(("llm", tuple(ids)), lambda: self._llm_batch(ids))
        return replace(batch, loss_scale=loss_scale)

    def _llm_batch(self, ids: Sequence[str]) -> LLMBatch:
        samples = [self.sample(i) for i in ids]
        offsets = [0]
        for s in samples:
            offsets.append(offsets[-1] + s.num_tokens)
        dev = self.device

        def packed(parts: list[torch.Tensor]) -> torch.Tensor:
            return host_to_device(torch.cat(parts), dev)

        return LLMBatch(
            input_ids=packed([s.input_ids for s in samples]),
            position_ids=host_to_device(
                self.family.position_ids(
                    self.cfg,
                    [_packed(s, getattr(self.family, "videos_among_images", False)) for s in samples],
                ),
                dev,
            ),
            seq_lens=tuple(s.num_tokens for s in samples),
            image_positions=packed([s.image_positions + o for s, o in zip(samples, offsets)]),
            label_positions=packed([s.label_positions + o for s, o in zip(samples, offsets)]),
            targets=packed([s.targets for s in samples]),
            loss_scale=0.0,  # set by llm_batch
        )

    def num_labels(self, ids: Sequence[str]) -> int:
        return sum(self.sample(i).num_labels for i in ids)
