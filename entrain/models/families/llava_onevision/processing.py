"""LLaVA-OneVision's processing rules, torch-free: tiles and LLM tokens per image (AnyRes).

What transformers' ``LlavaOnevisionImageProcessor`` and ``LlavaOnevisionModel.pack_image_features``
do to an image of ``h x w`` pixels, as arithmetic:

* **Tiles.** An image alone in its sample is resized into the best of ``image_grid_pinpoints``
  (the resolution keeping the most of the image's pixels, then wasting the fewest) and cut into a
  ``rows x cols`` grid of ``tile_px`` tiles; the whole image, resized to one tile, comes first (the
  "base" tile). An image among several in its sample is padded to a square and gives the base tile only.
* **Tokens.** Each tile gives ``(tile_px / patch_px)**2`` vision tokens (729 for 384-px tiles at
  patch 14). The base tile's tokens come first. The grid's feature map (``rows*side x cols*side``)
  loses the rows (or columns) that were padding ("unpadding"), is shrunk by bilinear interpolation
  when it is larger than 1.1 x ``anyres_max_N`` tiles' worth (``vision_aspect_ratio``), and gets one
  ``image_newline`` token per feature row. A base-only image gets one ``image_newline`` after it.
* **Video.** Each frame (one tile) is pooled 2x2 (``ceil(side / 2)**2`` tokens); one ``image_newline``
  closes the video.
* **Chat.** As transformers' ``LlavaOnevisionProcessor`` builds a prompt: the conversation through the
  tokenizer's chat template (Qwen2's chat markers when it has none:
  ``entrain.data.processing.format_chat``), each ``<image>`` placeholder replaced by ``n`` ``<image>``
  tokens, ``n`` the image's LLM tokens (``LlavaOnevisionProcessor.replace_image_token``; no start/end
  markers). Labels copy each assistant turn's ids. A tokenizer without an ``<image>`` special token
  (Entrain's built-in Qwen2 tokenizer) writes Qwen2's ``<|image_pad|>`` instead, which the family's
  ``map_token_id`` maps onto the model's image id.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from entrain.data.processing import IMAGE_PAD, format_chat
from entrain.data.tokenizer import TextTokenizer

__all__ = [
    "DEFAULT_GRID_PINPOINTS",
    "OneVisionImageRule",
    "OneVisionRules",
    "best_resolution",
    "image_tiles",
    "image_tokens",
    "sample_tiles",
    "sample_tokens",
    "video_tokens",
    "IMAGE_TOKEN",
    "chat_ids",
    "image_token_of",
    "image_processor",
    "shape_processor",
]

DEFAULT_GRID_PINPOINTS: tuple[tuple[int, int], ...] = tuple(
    (384 * r, 384 * c) for r in range(1, 7) for c in range(1, 7)
)
"""``LlavaOnevisionConfig``'s default: every 1..6 x 1..6 grid of 384-px tiles, (height, width)."""

ANYRES_PREFIX = "anyres_max_"


@dataclass(frozen=True, slots=True)
class OneVisionRules:
    """The numbers the AnyRes rules need (from a ``LlavaOnevisionConfig``)."""

    tile_px: int = 384
    """``vision_config.image_size``: a tile's side in pixels."""
    patch_px: int = 14
    """``vision_config.patch_size``."""
    grid_pinpoints: tuple[tuple[int, int], ...] = DEFAULT_GRID_PINPOINTS
    """``image_grid_pinpoints``: the (height, width) resolutions an image can be tiled at."""
    max_tiles: int = 9
    """N of ``vision_aspect_ratio = "anyres_max_N"``."""

    def __post_init__(self) -> None:
        if not 0 < self.patch_px <= self.tile_px:
            raise ValueError(f"patch {self.patch_px} px does not fit a {self.tile_px}-px tile")
        if not self.grid_pinpoints:
            raise ValueError("image_grid_pinpoints is empty")
        for h, w in self.grid_pinpoints:
            if h <= 0 or w <= 0 or h % self.tile_px or w % self.tile_px:
                raise ValueError(f"grid pinpoint {[h, w]} is not a grid of {self.tile_px}-px tiles")

    @property
    def side(self) -> int:
        """Vision tokens along a tile's side (27 for 384 / 14: the patch convolution drops the rest)."""
        return self.tile_px // self.patch_px

    @property
    def tokens_per_tile(self) -> int:
        """Vision tokens (= SigLIP sequence length) of one tile."""
        return self.side * self.side

    @classmethod
    def from_config(cls, config: dict, where: str = "config.json") -> OneVisionRules:
        """The rules of a ``LlavaOnevisionConfig`` (its ``config.json`` as a dict)."""
        vision = config.get("vision_config") or {}
        aspect = config.get("vision_aspect_ratio", "anyres_max_9")
        if not isinstance(aspect, str) or not aspect.startswith(ANYRES_PREFIX):
            raise ValueError(f"{where}: vision_aspect_ratio {aspect!r} is not 'anyres_max_N'")
        pinpoints = config.get("image_grid_pinpoints") or DEFAULT_GRID_PINPOINTS
        try:
            return cls(
                tile_px=int(vision.get("image_size", 384)),
                patch_px=int(vision.get("patch_size", 14)),
                grid_pinpoints=tuple((int(h), int(w)) for h, w in pinpoints),
                max_tiles=int(aspect[len(ANYRES_PREFIX) :]),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


def best_resolution(height: int, width: int, pinpoints: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The (height, width) of ``pinpoints`` an image is resized into: the most of its pixels kept
    (after an aspect-preserving fit), ties broken by the fewest pixels wasted; first one on a full tie."""
    best, best_kept, best_wasted = pinpoints[0], -1, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = ph * pw - kept
        if kept > best_kept or (kept == best_kept and wasted < best_wasted):
            best, best_kept, best_wasted = (ph, pw), kept, wasted
    return best


def _grid(height: int, width: int, rules: OneVisionRules) -> tuple[int, int]:
    """(rows, cols) of tiles of an image tiled alone."""
    bh, bw = best_resolution(height, width, rules.grid_pinpoints)
    return bh // rules.tile_px, bw // rules.tile_px


def image_tiles(height: int, width: int, rules: OneVisionRules, *, alone: bool = True) -> int:
    """Tiles the vision tower encodes for an image: base + grid when ``alone`` in its sample, else 1."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size {height}x{width} px is not positive")
    if not alone:
        return 1
    rows, cols = _grid(height, width, rules)
    return 1 + rows * cols


def _unpadded(height: int, width: int, rows: int, cols: int, side: int) -> tuple[int, int]:
    """The feature map (height, width) of a ``rows x cols`` grid once the padding rows/cols are cut."""
    cur_h, cur_w = rows * side, cols * side
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= (cur_h - new_h) // 2 * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= (cur_w - new_w) // 2 * 2
    return cur_h, cur_w


def image_tokens(height: int, width: int, rules: OneVisionRules, *, alone: bool = True) -> int:
    """LLM tokens (``<image>`` placeholders) of an image: base tile + unpadded, possibly shrunk grid
    features + one newline per feature row when ``alone``; base tile + one newline otherwise."""
    if image_tiles(height, width, rules, alone=alone) == 1:
        return rules.tokens_per_tile + 1
    rows, cols = _grid(height, width, rules)
    cur_h, cur_w = _unpadded(height, width, rows, cols, rules.side)
    ratio = math.sqrt(cur_h * cur_w / (rules.max_tiles * rules.side**2))
    if ratio > 1.1:
        cur_h, cur_w = int(cur_h // ratio), int(cur_w // ratio)
    return rules.tokens_per_tile + cur_h * cur_w + cur_h


def sample_tiles(sizes: Sequence[tuple[int, int]], rules: OneVisionRules) -> list[int]:
    """Tiles per image of one sample's images ((height, width) each): AnyRes only for a lone image."""
    alone = len(sizes) == 1
    return [image_tiles(h, w, rules, alone=alone) for h, w in sizes]


def sample_tokens(sizes: Sequence[tuple[int, int]], rules: OneVisionRules) -> list[int]:
    """LLM tokens per image of one sample's images."""
    alone = len(sizes) == 1
    return [image_tokens(h, w, rules, alone=alone) for h, w in sizes]


def video_tokens(num_frames: int, rules: OneVisionRules) -> int:
    """LLM tokens of a video: each frame pooled 2x2, one newline at the end."""
    pooled = math.ceil(rules.side / 2)
    return num_frames * pooled * pooled + 1


@dataclass(frozen=True, slots=True)
class OneVisionImageRule:
    """The family's ``entrain.core.workload.samples.ImageTokenRule``: an image's LLM tokens and its encoder
    units (one 729-token unit per tile), for an image alone in its sample; ``sample_image_tokens`` /
    ``sample_encoder_units`` see all of a sample's images (an image among several gets one tile and
    ``tokens_per_tile + 1`` tokens), and ``SampleMeta`` asks those."""

    rules: OneVisionRules = OneVisionRules()
    min_pixels: int = 1
    """AnyRes has no pixel limits (every image is resized into tiles); kept for the plan file."""
    max_pixels: int = 2**62

    def image_tokens(self, height: int, width: int) -> int:
        return image_tokens(height, width, self.rules)

    def encoder_units(self, height: int, width: int) -> tuple[int, ...]:
        return (self.rules.tokens_per_tile,) * image_tiles(height, width, self.rules)

    def sample_image_tokens(self, sizes: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """The multi-image rule (``entrain.core.workload.samples.sample_image_tokens``): ``sample_tokens``."""
        return tuple(sample_tokens(sizes, self.rules))

    def sample_encoder_units(self, sizes: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """One 729-token unit per tile of every image of the sample (``sample_tiles``)."""
        return tuple(u for n in sample_tiles(sizes, self.rules) for u in (self.rules.tokens_per_tile,) * n)


# --- chat ------------------------------------------------------------------------------------------

IMAGE_TOKEN = "<image>"
"""``LlavaOnevisionProcessor.image_token``: one per LLM token of an image."""


def image_token_of(tokenizer: TextTokenizer) -> str:
    """The image token ``tokenizer`` has: ``<image>``, else Qwen2's ``<|image_pad|>``."""
    return IMAGE_TOKEN if IMAGE_TOKEN in tokenizer.special_tokens else IMAGE_PAD


def chat_ids(
    turns: Sequence[tuple[str, str]], image_tokens: Sequence[int], tokenizer: TextTokenizer
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a conversation whose i-th ``<image>`` has ``image_tokens[i]`` LLM
    tokens. ValueError when the placeholder count differs from ``len(image_tokens)``."""
    token = image_token_of(tokenizer)
    return format_chat(turns, image_tokens, tokenizer, lambda n: token * n)


# --- the image processor -------------------------------------------------------------------------


def image_processor(run_cfg):
    """transformers' ``LlavaOnevisionImageProcessorPil`` of a run config (``shape_processor``)."""
    return shape_processor(run_cfg.shape, run_cfg.folder)


def shape_processor(shape, folder: str | None):
    """transformers' ``LlavaOnevisionImageProcessorPil``: the checkpoint folder's
    ``preprocessor_config.json`` when it has one, else the class defaults with the shape's tile size
    and grid pinpoints."""
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    if folder is not None and os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
        return LlavaOnevisionImageProcessorPil.from_pretrained(folder, local_files_only=True)
    rules = shape.rules
    size = {"height": rules.tile_px, "width": rules.tile_px}
    return LlavaOnevisionImageProcessorPil(
        size=size, image_grid_pinpoints=[list(p) for p in rules.grid_pinpoints]
    )
