"""InternVL's processing rules, torch-free: tiles and LLM tokens per image (dynamic tiling).

What transformers' ``GotOcr2ImageProcessor`` (InternVL's image processor, called by ``InternVLProcessor``
with ``crop_to_patches=True``) and ``InternVLModel.get_image_features`` do to an image of ``h x w``
pixels, as arithmetic:

* **Tiles.** Among every ``cols x rows`` grid with ``min_tiles <= cols * rows <= max_tiles``
  (``min_patches`` / ``max_patches`` of ``preprocessor_config.json``), the one whose aspect ratio
  ``cols / rows`` is closest to the image's ``w / h`` (a tie goes to the later, larger grid while the
  image's area exceeds half of the grid's pixels). The image is resized to that grid of ``tile_px``
  tiles and cut, row by row; a grid of more than one tile is followed by the whole image resized to
  one tile (the *thumbnail*, last).
* **Tokens.** A tile is one InternViT sequence: a CLS token and ``(tile_px / patch_px)**2`` patches.
  The CLS token is dropped, the patch map is pixel-shuffled by ``downsample_ratio`` (0.5: 2x2 patches
  become one token of 4x the width) and projected: ``image_seq_length`` = ``(side * ratio)**2`` LLM
  tokens per tile (256 for 448-px tiles at patch 14). The prompt holds ``<img>``, ``tiles x
  image_seq_length`` ``<IMG_CONTEXT>`` tokens and ``</img>`` per image.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache

from entrain.core.errors import ConfigError

__all__ = [
    "InternVLRules",
    "InternVLImageRule",
    "tile_grid",
    "image_tiles",
    "image_tokens",
    "START",
    "CONTEXT",
    "END",
    "read_processor_config",
    "added_tokens",
    "folder_token_ids",
    "format_chat",
    "image_processor",
]


@dataclass(frozen=True, slots=True)
class InternVLRules:
    """The numbers the tiling rules need (``config.json`` and ``preprocessor_config.json``)."""

    tile_px: int = 448
    """``vision_config.image_size`` (= the image processor's ``size``): a tile's side in pixels."""
    patch_px: int = 14
    """``vision_config.patch_size``."""
    downsample_ratio: float = 0.5
    """``downsample_ratio``: the pixel shuffle's scale (0.5 merges 2x2 patches)."""
    min_tiles: int = 1
    """``min_patches`` of the image processor (``min_dynamic_patch`` of the original InternVL)."""
    max_tiles: int = 12
    """``max_patches`` (``max_dynamic_patch``)."""
    crop_to_patches: bool = True
    """Dynamic tiling on (``InternVLProcessor`` passes ``crop_to_patches=True``); off: one tile."""

    def __post_init__(self) -> None:
        if not 0 < self.patch_px <= self.tile_px or self.tile_px % self.patch_px:
            raise ValueError(f"patch {self.patch_px} px does not tile a {self.tile_px}-px tile")
        if not 1 <= self.min_tiles <= self.max_tiles:
            raise ValueError(
                f"min_patches {self.min_tiles} / max_patches {self.max_tiles}: need 1 <= min <= max"
            )
        scaled = self.side * self.downsample_ratio
        if not 0 < self.downsample_ratio <= 1 or scaled != int(scaled):
            raise ValueError(
                f"downsample_ratio {self.downsample_ratio} does not divide the {self.side}x{self.side} patch map"
            )

    @property
    def side(self) -> int:
        """Patches along a tile's side (32 for 448 / 14)."""
        return self.tile_px // self.patch_px

    @property
    def patches_per_tile(self) -> int:
        """Encoder input rows of one tile (its CLS token is added by the embeddings)."""
        return self.side * self.side

    @property
    def tokens_per_tile(self) -> int:
        """LLM tokens of one tile after the pixel shuffle (``image_seq_length``)."""
        return int(self.side * self.downsample_ratio) ** 2


@cache
def _arrangements(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every ``(cols, rows)`` grid of ``min_tiles..max_tiles`` tiles, by tile count (stable)."""
    grids = [
        (c, r)
        for c in range(1, max_tiles + 1)
        for r in range(1, max_tiles + 1)
        if min_tiles <= c * r <= max_tiles
    ]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def tile_grid(height: int, width: int, rules: InternVLRules) -> tuple[int, int]:
    """``(cols, rows)`` of the grid an image is resized to (``get_optimal_tiled_canvas``)."""
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in _arrangements(rules.min_tiles, rules.max_tiles):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * rules.tile_px * rules.tile_px * cols * rows:
            best = (cols, rows)
    return best


def image_tiles(height: int, width: int, rules: InternVLRules) -> int:
    """Tiles the vision tower encodes for an image: the grid's, plus the thumbnail when more than one."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size {height}x{width} px is not positive")
    if not rules.crop_to_patches or rules.max_tiles <= 1:
        return 1
    cols, rows = tile_grid(height, width, rules)
    return cols * rows + 1 if cols * rows > 1 else 1


def image_tokens(height: int, width: int, rules: InternVLRules) -> int:
    """``<IMG_CONTEXT>`` tokens of an image (``<img>`` / ``</img>`` not counted)."""
    return image_tiles(height, width, rules) * rules.tokens_per_tile


@dataclass(frozen=True, slots=True)
class InternVLImageRule:
    """The family's ``entrain.core.workload.samples.ImageTokenRule``: LLM tokens and encoder units (one unit of
    ``side**2`` patch rows per tile) of an image; every image of a sample is tiled on its own."""

    rules: InternVLRules = InternVLRules()
    min_pixels: int = 1
    """Dynamic tiling has no pixel limits (every image is resized into tiles); kept for the plan file."""
    max_pixels: int = 2**62

    def image_tokens(self, height: int, width: int) -> int:
        return image_tokens(height, width, self.rules)

    def encoder_units(self, height: int, width: int) -> tuple[int, ...]:
        return (self.rules.patches_per_tile,) * image_tiles(height, width, self.rules)


# --- tokens, chat and the image processor -------------------------------------------------------

START, CONTEXT, END = "<img>", "<IMG_CONTEXT>", "</img>"
"""``InternVLProcessor``'s image tokens: ``<img>``, n x ``<IMG_CONTEXT>``, ``</img>`` per image."""


def read_processor_config(folder: str) -> dict | None:
    """The folder's ``preprocessor_config.json`` (None without one); ConfigError naming a bad file."""
    path = os.path.join(folder, "preprocessor_config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            got = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(got, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return got


def added_tokens(folder: str) -> dict[str, int]:
    """Special tokens of the folder's tokenizer files (``tokenizer.json``'s ``added_tokens``,
    ``tokenizer_config.json``'s ``added_tokens_decoder``), plain JSON."""
    found: dict[str, int] = {}
    path = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(path):
        with open(path) as f:
            found.update({t["content"]: int(t["id"]) for t in json.load(f).get("added_tokens", [])})
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            decoder = json.load(f).get("added_tokens_decoder") or {}
        found.update({t["content"]: int(i) for i, t in decoder.items()})
    return found


@cache
def folder_token_ids(folder: str) -> tuple[tuple[str, int], ...]:
    """``(key, id)`` of ``ModelFamily.token_ids``: ``<IMG_CONTEXT>`` is the config's ``image_token_id``;
    ``<img>`` / ``</img>`` the tokenizer's (-1: a folder without tokenizer files has no markers)."""
    from entrain.models.families.registry import read_config

    added = added_tokens(folder)
    image = int(read_config(folder).get("image_token_id", 151667))
    return (("image", image), ("image_start", added.get(START, -1)), ("image_end", added.get(END, -1)))


def format_chat(turns, image_tokens, tokenizer) -> tuple[list[int], list[int]]:
    """The tokenizer's chat template, each ``<image>`` expanded as ``InternVLProcessor`` does: ``<img>``
    + n x ``<IMG_CONTEXT>`` + ``</img>`` (Qwen2's vision markers for a tokenizer without them, which
    the family's ``map_token_id`` maps); labels on the assistant turns only."""
    from entrain.data.processing import format_chat as chat
    from entrain.data.processing import vision_markers

    if CONTEXT in tokenizer.special_tokens:
        return chat(turns, image_tokens, tokenizer, lambda n: START + CONTEXT * n + END)
    return chat(turns, image_tokens, tokenizer, vision_markers)


def image_processor(run_cfg):
    """transformers' ``GotOcr2ImageProcessorPil`` (InternVL's): the folder's ``preprocessor_config.json``
    when it has one (its size, tile limits, mean and std), else the class defaults at the tile size."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    folder = run_cfg.folder
    if folder is not None and os.path.isfile(os.path.join(folder, "preprocessor_config.json")):
        return GotOcr2ImageProcessorPil.from_pretrained(folder, local_files_only=True)
    rules = run_cfg.shape.rules
    size = {"height": rules.tile_px, "width": rules.tile_px}
    return GotOcr2ImageProcessorPil(size=size, min_patches=rules.min_tiles, max_patches=rules.max_tiles)
