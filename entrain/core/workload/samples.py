"""Sample metadata and the Qwen2.5-VL vision-token rule.

A sample is its images' ``(H, W)`` sizes plus its text token count (and, where the data says, how
many of those tokens are supervised). Vision work is counted in ViT patches and LLM work in tokens
(text + merged image tokens), both after Qwen's ``smart_resize``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "ImageTokenRule",
    "VisionTokenConfig",
    "SampleMeta",
    "smart_resize",
    "image_llm_tokens",
    "image_vit_patches",
    "sample_image_tokens",
    "sample_encoder_units",
    "audio_llm_tokens",
    "audio_encoder_units",
    "video_encoder_units",
    "LABEL_FRACTION",
]

LABEL_FRACTION = 0.2
"""Supervised share of a sample's LLM tokens when its data does not say (``SampleMeta.label_tokens``):
SynthChartNet's answers are ~17 % of its LLM tokens, LLaVA's ~30 %, ChartQA / COCO-QA's ~1 %."""


class ImageTokenRule(Protocol):
    """How a model family turns one image into work (plain numbers; a family's ``image_rule``):
    encoder units and LLM tokens of an ``(H, W)``-pixel image."""

    min_pixels: int
    max_pixels: int

    def image_tokens(self, height: int, width: int) -> int:
        """Image feature tokens the LLM sees for the image (its placeholder tokens)."""
        ...

    def encoder_units(self, height: int, width: int) -> tuple[int, ...]:
        """Encoder input rows per attention unit of the image (one unit per image, or one per tile);
        the cost model prices each unit's attention separately."""
        ...

    # Optional (a rule whose count of an image depends on the sample's other images, e.g.
    # LLaVA-OneVision's AnyRes for a lone image, one tile per image of several): when a rule has
    # them, ``SampleMeta`` asks these with all of the sample's ``(H, W)`` sizes instead.
    #   sample_image_tokens(sizes) -> tuple[int, ...]   (per image, like image_tokens)
    #   sample_encoder_units(sizes) -> tuple[int, ...]  (every unit of every image, in order)


def sample_image_tokens(rule: ImageTokenRule, sizes: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """LLM tokens per image of one sample's images under ``rule`` (its ``sample_image_tokens`` when it
    has one, else ``image_tokens`` of each image alone)."""
    whole = getattr(rule, "sample_image_tokens", None)
    if whole is not None:
        return tuple(whole(sizes))
    return tuple(rule.image_tokens(h, w) for h, w in sizes)


def sample_encoder_units(rule: ImageTokenRule, sizes: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Encoder units of every image of one sample, in order (``sample_encoder_units`` when the rule
    has one, else ``encoder_units`` of each image alone)."""
    whole = getattr(rule, "sample_encoder_units", None)
    if whole is not None:
        return tuple(whole(sizes))
    return tuple(u for h, w in sizes for u in rule.encoder_units(h, w))


@dataclass(frozen=True, kw_only=True, slots=True)
class VisionTokenConfig:
    """Qwen2.5-VL image processor limits (the released checkpoints' ``preprocessor_config.json``);
    the default ``ImageTokenRule``."""

    factor: int = 28
    """patch_size (14) x spatial merge (2): resized sides are multiples of this."""
    min_pixels: int = 3136
    max_pixels: int = 12845056
    max_aspect_ratio: float = 200.0
    merge_size: int = 2
    """``spatial_merge_size``: merge_size x merge_size patches make one LLM token."""
    temporal_patch_size: int = 2
    """Frames per patch (a still image is repeated to fill them)."""

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.min_pixels <= 0 or self.max_pixels < self.min_pixels:
            raise ValueError(f"invalid vision token limits: {self}")
        if self.merge_size <= 0 or self.factor % self.merge_size or self.temporal_patch_size <= 0:
            raise ValueError(f"invalid vision patch geometry: {self}")

    @property
    def patch_size(self) -> int:
        """Pixels along a patch's side (``factor / merge_size``)."""
        return self.factor // self.merge_size

    @property
    def patch_values(self) -> int:
        """Values of one RGB patch row: ``3 x temporal_patch_size x patch_size**2`` (1,176 for Qwen)."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    def image_tokens(self, height: int, width: int) -> int:
        """``image_llm_tokens``: merged tokens of the ``smart_resize``-d image."""
        return image_llm_tokens(height, width, self)

    def encoder_units(self, height: int, width: int) -> tuple[int, ...]:
        """One unit per image: its ViT patches (``image_vit_patches``)."""
        return (image_vit_patches(height, width, self),)


DEFAULT_VISION = VisionTokenConfig()


def pixel_limits(min_pixels: int | None, max_pixels: int | None) -> VisionTokenConfig:
    """``--min-pixels`` / ``--max-pixels`` (None: Qwen's defaults); ConfigError for impossible limits."""
    from entrain.core.errors import ConfigError

    lo = DEFAULT_VISION.min_pixels if min_pixels is None else min_pixels
    hi = DEFAULT_VISION.max_pixels if max_pixels is None else max_pixels
    factor = DEFAULT_VISION.factor
    if lo < factor * factor or hi < lo:
        raise ConfigError(
            f"--min-pixels {lo} / --max-pixels {hi}: need {factor * factor} <= min-pixels <= max-pixels "
            f"(one merged {factor}x{factor} token at least)"
        )
    return VisionTokenConfig(min_pixels=lo, max_pixels=hi)


def smart_resize(height: int, width: int, cfg: VisionTokenConfig = DEFAULT_VISION) -> tuple[int, int]:
    """Qwen2-VL / Qwen2.5-VL ``smart_resize``: the resized ``(H', W')``, both multiples of ``cfg.factor``.

    Raises ValueError for a non-positive side or an aspect ratio above ``cfg.max_aspect_ratio``.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > cfg.max_aspect_ratio:
        raise ValueError(
            f"aspect ratio {max(height, width) / min(height, width):.1f} of a {height}x{width} image "
            f"exceeds {cfg.max_aspect_ratio:g}"
        )
    f = cfg.factor
    h_bar = round(height / f) * f  # Python round: banker's rounding, as transformers
    w_bar = round(width / f) * f
    if h_bar * w_bar > cfg.max_pixels:
        beta = math.sqrt(height * width / cfg.max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def image_llm_tokens(height: int, width: int, cfg: VisionTokenConfig = DEFAULT_VISION) -> int:
    """Merged image tokens the LLM sees: ``(H'/28) * (W'/28)``."""
    h_bar, w_bar = smart_resize(height, width, cfg)
    return (h_bar // cfg.factor) * (w_bar // cfg.factor)


def image_vit_patches(height: int, width: int, cfg: VisionTokenConfig = DEFAULT_VISION) -> int:
    """ViT patch tokens of a still image: ``4 * (H'/28) * (W'/28)`` (14x14 patches before the 2x2 merge;
    ``merge_size**2`` per LLM token in general)."""
    return cfg.merge_size**2 * image_llm_tokens(height, width, cfg)


AUDIO_CHUNK_FRAMES = 200
"""Mel frames per attention chunk of a Whisper-style audio tower (Qwen2.5-Omni's ``2 * n_window``);
its stride-2 convolution leaves half as many rows."""


def audio_encoder_units(frames: int) -> tuple[int, ...]:
    """Encoder rows per attention chunk of an audio clip of ``frames`` mel frames: chunks of
    ``AUDIO_CHUNK_FRAMES`` frames, each ``ceil(frames / 2)`` rows after the stride-2 convolution."""
    full, rest = divmod(int(frames), AUDIO_CHUNK_FRAMES)
    return (AUDIO_CHUNK_FRAMES // 2,) * full + (((rest + 1) // 2,) if rest else ())


def audio_llm_tokens(frames: int) -> int:
    """LLM tokens of an audio clip of ``frames`` mel frames (10 ms each): a Whisper-style tower's
    stride-2 convolution, then Qwen2.5-Omni's stride-2 pooling."""
    return ((int(frames) - 1) // 2 + 1 - 2) // 2 + 1


def video_encoder_units(grid: tuple[int, int, int]) -> tuple[int, ...]:
    """Encoder rows per attention unit of a video of patch grid ``(t, h, w)``: one unit of ``h * w``
    patches per temporal patch (Qwen's vision towers attend within a frame)."""
    t, h, w = grid
    return (h * w,) * t


@dataclass(frozen=True, slots=True)
class SampleMeta:
    """One training sample's metadata: what the planner and the assignment need to know about it.

    ``images`` holds ``(H, W)`` per image in pixels; ``text_tokens`` counts every non-image token
    of the formatted conversation (chat template and vision start/end markers included);
    ``answer_tokens`` the positions where the loss is taken (the assistant turns' tokens), None where
    the data does not say (``label_tokens`` then assumes ``LABEL_FRACTION``).
    """

    id: str
    images: tuple[tuple[int, int], ...]
    text_tokens: int
    vision: ImageTokenRule = field(default=DEFAULT_VISION, compare=False, repr=False)
    """The model family's image rule (``VisionTokenConfig``: Qwen's ``smart_resize``)."""
    answer_tokens: int | None = None
    audio: tuple[int, ...] = ()
    """Mel frames per audio clip, in order (none: no audio; an audio-capable family's samples)."""
    video: tuple[tuple[int, int, int], ...] = ()
    """Encoder patch grid ``(t, h, w)`` per video, in order (the family's video processor's; none: no
    video); a video's audio track, where used, is one of ``audio``'s clips."""

    def __post_init__(self) -> None:
        if self.answer_tokens is not None and not 0 <= self.answer_tokens <= self.text_tokens:
            raise ValueError(
                f"sample {self.id!r}: answer_tokens {self.answer_tokens} outside 0..text_tokens {self.text_tokens}"
            )
        if any(f <= 0 for f in self.audio):
            raise ValueError(f"sample {self.id!r}: audio clips of {list(self.audio)} mel frames (need > 0)")
        if any(len(g) != 3 or min(g) <= 0 for g in self.video):
            raise ValueError(
                f"sample {self.id!r}: video grids {list(self.video)} (need three positive sides)"
            )

    @property
    def vit_patches_per_image(self) -> tuple[int, ...]:
        """Encoder input rows per attention unit (per image; per tile for a tiling family)."""
        return sample_encoder_units(self.vision, self.images)

    @property
    def vision_units(self) -> tuple[int, ...]:
        """The vision tower's sequence units: its images' (``vit_patches_per_image``), then its videos'
        frames (``video_encoder_units``). With ``audio_units`` the one rule of which encoder rows are
        whose tower (``encoder_units``, ``CostModel.units``, ``sampler.SampleStats``' columns and the
        N-encoder planner's ``planning.encoders.vision_units`` read it)."""
        video = tuple(u for g in self.video for u in video_encoder_units(g))
        return self.vit_patches_per_image + video if video else self.vit_patches_per_image

    @property
    def audio_units(self) -> tuple[int, ...]:
        """The audio tower's sequence units: its clips' attention chunks' rows (``audio_encoder_units``)."""
        return tuple(u for f in self.audio for u in audio_encoder_units(f))

    @property
    def encoder_units(self) -> tuple[int, ...]:
        """Every encoder sequence unit of the sample: ``vision_units``, then ``audio_units``. Where the
        encoder's first layer runs an audio tower (``LayerCost.audio``) the audio rows are priced by that
        tower's own layers, in the cost model (``CostModel.units``) and in the planner's column
        statistics (``sampler.SampleStats``' audio columns) alike; a measured profile, which times no
        audio tower, prices them as rows of the encoder's layers."""
        audio = self.audio_units
        return self.vision_units + audio if audio else self.vision_units

    @property
    def image_tokens_per_image(self) -> tuple[int, ...]:
        return sample_image_tokens(self.vision, self.images)

    @property
    def vit_patches(self) -> int:
        return sum(self.vit_patches_per_image)

    @property
    def image_tokens(self) -> int:
        return sum(self.image_tokens_per_image)

    @property
    def audio_tokens(self) -> int:
        """LLM tokens of the sample's audio clips (``audio_llm_tokens`` of each)."""
        return sum(audio_llm_tokens(f) for f in self.audio)

    @property
    def video_tokens(self) -> int:
        """LLM tokens of the sample's videos: ``t * h * w / merge**2`` per grid (the image rule's
        ``merge_size``, 2 where it has none)."""
        merge = getattr(self.vision, "merge_size", 2)
        return sum(t * h * w // merge**2 for t, h, w in self.video)

    @property
    def llm_tokens(self) -> int:
        """Sequence length on the LLM: text tokens plus merged image tokens plus audio tokens plus
        video tokens."""
        return self.text_tokens + self.image_tokens + self.audio_tokens + self.video_tokens

    @property
    def label_tokens(self) -> float:
        """Tokens the loss is taken at (what ``lm_head`` and the loss run on): ``answer_tokens``, or
        ``LABEL_FRACTION`` of the LLM tokens where the data does not say."""
        if self.answer_tokens is not None:
            return float(self.answer_tokens)
        return LABEL_FRACTION * self.llm_tokens

    def to_json(self) -> dict:
        out = {"id": self.id, "images": [[h, w] for h, w in self.images], "text_tokens": self.text_tokens}
        if self.answer_tokens is not None:
            out["answer_tokens"] = self.answer_tokens
        if self.audio:
            out["audio"] = list(self.audio)
        if self.video:
            out["video"] = [list(g) for g in self.video]
        return out

    @classmethod
    def from_json(cls, d: dict, vision: VisionTokenConfig = DEFAULT_VISION) -> SampleMeta:
        """Inverse of ``to_json`` (the vision limits are not part of it)."""
        answer = d.get("answer_tokens")
        images = tuple((int(h), int(w)) for h, w in d["images"])
        audio = tuple(int(f) for f in d.get("audio") or ())
        video = tuple((int(t), int(h), int(w)) for t, h, w in d.get("video") or ())
        return cls(
            str(d["id"]),
            images,
            int(d["text_tokens"]),
            vision,
            None if answer is None else int(answer),
            audio,
            video,
        )
