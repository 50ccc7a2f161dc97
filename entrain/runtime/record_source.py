"""Real samples of a LLaVA JSON/JSONL or Parquet dataset by sample id (``RecordSource``): the chat template's ids and labels, the image processor's pixel patches, a video's decoded frames and an audio clip's log-mel features, each computed only where and when it is needed; ``entrain.runtime.data.SampleRenderer`` renders them (or seeded stand-ins) into tensors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from entrain.core.errors import DataError
from entrain.core.workload.samples import ImageTokenRule
from entrain.models.families.registry import DEFAULT_FAMILY, get_family

__all__ = ["RecordSource"]


class RecordSource:
    """Real samples of a LLaVA JSON/JSONL or Parquet dataset, by sample id: the chat template's ids /
    labels (``text``, no image decoded: the image token counts come from the header sizes in the
    sample's metadata) and the Qwen2.5-VL image processor's pixel patches (``pixels``), separately, so
    each is computed only where and when it is needed (``entrain.data.processing``)."""

    def __init__(
        self, path: str, image_root: str | None = None, records: Sequence | None = None, tokenizer=None
    ):
        """``records``: the already parsed (screened) records of ``path``; read from it when None.
        ``tokenizer``: a stock model's (its ids are the model's); default: the built-in Qwen2 one."""
        from entrain.data.llava import iter_records
        from entrain.data.tokenizer import default_tokenizer

        if records is None:
            records = iter_records(path, image_root)
        self.records = {r.id: r for r in records}
        self.tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
        self.model_ids = tokenizer is not None
        """True: ``text`` returns the model's ids (no ``ModelFamily.map_token_id`` remap)."""
        self.family = self.cfg = None
        """The model family whose processing rules apply (``bind``; None: ``entrain.data.processing``'s chat
        template and the default family's image processor)."""

    def bind(self, family, cfg) -> None:
        """Use ``family``'s chat template and image processor (``ModelFamily.format_chat`` /
        ``process_images``) for model config ``cfg`` (the renderer binds its own)."""
        self.family, self.cfg = family, cfg

    def _where(self, sample_id: str) -> tuple[str, str]:
        r = self.records[sample_id]
        return r.file, r.line or f"#{r.index}"

    def text(
        self,
        sample_id: str,
        image_tokens: Sequence[int],
        audio_tokens: Sequence[int] = (),
        video_texts: Sequence[str] = (),
    ) -> tuple[list[int], list[int]]:
        """``(input_ids, labels)`` of the conversation whose i-th image has ``image_tokens[i]`` merged
        tokens (``entrain.core.workload.samples.image_llm_tokens`` of its header size, equal to the image
        processor's count) and whose j-th audio clip ``audio_tokens[j]``. Raises DataError if the
        record's image or clip count differs."""
        from entrain.data.processing import format_chat

        turns = self.records[sample_id].turns
        extra = {"audio_tokens": tuple(audio_tokens)} if audio_tokens else {}
        try:
            if video_texts or self.records[sample_id].video:
                from entrain.data.video_records import expand_videos

                turns = expand_videos(turns, video_texts)
            if self.family is not None:
                return self.family.format_chat(self.cfg, turns, image_tokens, self.tokenizer, **extra)
            return format_chat(turns, image_tokens, self.tokenizer, **extra)
        except ValueError as e:
            raise DataError(*self._where(sample_id), "conversations", str(e)) from None

    def check_audio(self, sample_id: str) -> None:
        """DataError naming the record's file, line, id and audio field when it has audio clips and the
        bound model family reads no audio (``ModelFamily.accepts_audio``)."""
        record = self.records[sample_id]
        if record.audio and not getattr(self.family, "accepts_audio", False):
            name = getattr(self.family, "name", None)
            raise DataError(
                *self._where(sample_id),
                record.audio_field,
                f"record id {record.id!r} has {len(record.audio)} audio clip(s) but model family "
                f"{name!r} reads no audio (train it with an audio family, e.g. a Qwen2.5-Omni thinker "
                "through --model-path, or drop the record)",
            )

    def check_video(self, sample_id: str) -> None:
        """DataError naming the record's file, line, id and video field when it has videos and the
        bound model family reads no video (``ModelFamily.accepts_video``)."""
        record = self.records[sample_id]
        if record.video and not getattr(self.family, "accepts_video", False):
            name = getattr(self.family, "name", None)
            raise DataError(
                *self._where(sample_id),
                record.video_field,
                f"record id {record.id!r} has {len(record.video)} video(s) but model family {name!r} "
                "reads no video (train it with a video family, e.g. a Qwen2.5-Omni thinker through "
                "--model-path, or drop the record)",
            )

    def video_settings(self):
        """The bound family's video processor numbers (``entrain.data.video.VideoSettings``)."""
        from entrain.data.video import VideoSettings

        hook = getattr(self.family, "video_settings", None)
        return hook(self.cfg) if hook is not None else VideoSettings()

    def audio_features(self, sample_id: str, mel_bins: int) -> np.ndarray:
        """``[frames, mel_bins]`` float32 log-mel features of the record's audio clips, clip after clip in
        the order of its ``<audio>`` placeholders (``entrain.data.audio.clip_features``: Qwen2.5-Omni's
        processor, the checkpoint's feature extractor where its folder has one). Raises DataError
        naming an unreadable clip."""
        from entrain.data.audio import AudioFileError, clip_features, load_clip
        from entrain.data.video import VideoFileError, audio_track
        from entrain.data.video_records import audio_slots

        record = self.records[sample_id]
        clips = []
        slots = (
            audio_slots(record) if record.audio_in_video else [("audio", i) for i in range(len(record.audio))]
        )
        for kind, i in slots:
            path = record.audio[i] if kind == "audio" else record.video[i]
            try:
                clips.append(load_clip(path) if kind == "audio" else audio_track(path))
            except AudioFileError as e:
                raise DataError(
                    *self._where(sample_id), f"{record.audio_field}[{i}]", f"{path}: {e.reason}"
                ) from None
            except VideoFileError as e:
                raise DataError(
                    *self._where(sample_id), f"{record.video_field}[{i}]", f"{path}: {e.problem}"
                ) from None
        feats = clip_features(clips, self._extractor(mel_bins))
        return np.concatenate([f.T for f in feats]) if feats else np.zeros((0, mel_bins), np.float32)

    def _extractor(self, mel_bins: int):
        if getattr(self, "_feature_extractor", None) is None:
            from entrain.data.audio import feature_extractor

            self._feature_extractor = feature_extractor(getattr(self.cfg, "folder", None), mel_bins)
        return self._feature_extractor

    def check_image_slots(self, sample_id: str, slots: int, image_tokens: Sequence[int]) -> None:
        """DataError unless the formatted conversation holds ``slots`` image tokens (the model's image
        id) where its images need ``sum(image_tokens)``."""
        need = sum(image_tokens)
        if slots != need:
            why = (
                "the text holds chat-template special tokens (`entrain data check` lists them)"
                if slots > need
                else "the tokenizer does not write the model's image token"
            )
            raise DataError(
                *self._where(sample_id),
                "conversations",
                f"{slots} image tokens where its images need {need}: {why}",
            )

    def pixels(self, sample_id: str, vision: ImageTokenRule) -> tuple[np.ndarray, np.ndarray]:
        """``(pixel_values [patches, 1176] float32, image_grid_thw [images, 3] int64)`` of the record's
        images through the image processor. Raises DataError naming an unreadable image. Thread-safe
        (no shared state), so it runs on the renderer's prefetch thread."""
        from entrain.data.problems import image_error
        from entrain.data.processing import load_image, no_pixels

        record = self.records[sample_id]
        images = []
        for i, src in enumerate(record.images):
            try:
                images.append(load_image(src))
            except (OSError, ValueError, SyntaxError) as e:
                raise DataError(*self._where(sample_id), f"images[{i}]", image_error(e)) from None
        if record.video:
            return self._with_videos(sample_id, images, vision)
        if not images:
            return no_pixels(vision)
        try:
            return self._process_images(images, vision)
        except ValueError as e:
            raise DataError(*self._where(sample_id), "images", f"processor: {e}") from None

    def _with_videos(self, sample_id: str, images: list, vision) -> tuple[np.ndarray, np.ndarray]:
        """``pixels`` of a record with videos: its images' and videos' rows and grids in the order
        their placeholders come (``entrain.data.video.load_video`` per video)."""
        from entrain.data.video import VideoFileError, load_video
        from entrain.data.video_records import placeholder_kinds

        record = self.records[sample_id]
        try:
            pix, grids = self._process_images(images, vision) if images else (None, None)
        except ValueError as e:
            raise DataError(*self._where(sample_id), "images", f"processor: {e}") from None
        rows = [] if pix is None else np.split(pix, np.cumsum([int(np.prod(g)) for g in grids])[:-1])
        settings = self.video_settings()
        parts, out_grids, image, video = [], [], 0, 0
        for kind in placeholder_kinds(record.turns):
            if kind == "image":
                parts.append(rows[image])
                out_grids.append(tuple(int(v) for v in grids[image]))
                image += 1
            elif kind == "video":
                path = record.video[video]
                try:
                    pixels, grid = load_video(path, settings)
                except VideoFileError as e:
                    raise DataError(
                        *self._where(sample_id), f"{record.video_field}[{video}]", f"{path}: {e.problem}"
                    ) from None
                parts.append(pixels)
                out_grids.append(grid)
                video += 1
        return np.concatenate(parts).astype(np.float32), np.asarray(out_grids, dtype=np.int64).reshape(-1, 3)

    def encode(self, sample_id: str, vision):
        """The whole ``EncodedSample`` (images and text) of one record."""
        from entrain.data.processing import encode_sample

        return encode_sample(self.records[sample_id], self.tokenizer, self._process_images, vision)

    def _process_images(self, images: Sequence, vision: ImageTokenRule) -> tuple[np.ndarray, np.ndarray]:
        """The bound family's ``process_images`` (unbound: the default family's, without a config)."""
        family = self.family if self.family is not None else get_family(DEFAULT_FAMILY)
        return family.process_images(self.cfg, images, vision)
