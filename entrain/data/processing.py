"""Turning a ``Record`` into model inputs: images through a model family's image processor and the
conversation through the Qwen2 chat template.

- Images: the model family's image processor (``ProcessImages``, passed in by the caller: data never
  imports ``entrain.models``) does the resizing, normalisation and patching; this module only decodes
  files and converts non-RGB8 images to RGB8 (alpha composited onto white, 16-bit scaled to 8-bit),
  like Qwen's ``qwen_vl_utils``.
- Text: ``<|im_start|>{role}\\n{text}<|im_end|>\\n`` per turn after the default system block
  ``You are a helpful assistant.`` (unless the record starts with a system turn); each ``<image>``
  placeholder becomes ``<|vision_start|>`` + N x ``<|image_pad|>`` + ``<|vision_end|>`` with N the
  image's merged token count. Labels copy the ids of each assistant turn after its
  ``<|im_start|>assistant\\n`` header and are -100 elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from entrain.core.errors import DataError
from entrain.core.workload.samples import DEFAULT_VISION, ImageTokenRule, VisionTokenConfig
from entrain.data.problems import image_error
from entrain.data.records import IMAGE_PLACEHOLDER, PLACEHOLDERS, Record
from entrain.data.tokenizer import TextTokenizer

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "IGNORE_INDEX",
    "EncodedSample",
    "ImageText",
    "ProcessImages",
    "conversion_reason",
    "count_text_tokens",
    "count_tokens",
    "encode_sample",
    "format_chat",
    "load_image",
    "merged_tokens",
    "vision_markers",
]

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
IGNORE_INDEX = -100
MERGE_SIZE = 2
"""Spatial merge of a ``smart_resize`` rule's patch grid (2x2 ViT patches -> one LLM token)."""

ProcessImages = Callable[[Sequence, ImageTokenRule], tuple[np.ndarray, np.ndarray]]
"""A model family's image processor: ``(RGB8 PIL images, image rule) -> (pixel_values,
image_grid_thw)`` (``ModelFamily.process_images`` with its model config bound)."""

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


AUDIO_PLACEHOLDER = PLACEHOLDERS["audio"]


def _messages(turns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    if turns and turns[0][0] == "system":
        return list(turns)
    return [("system", DEFAULT_SYSTEM_PROMPT), *turns]


ImageText = Callable[[int], str]
"""The text an image of ``n`` LLM tokens becomes in the conversation (a model family's convention)."""


def vision_markers(n: int) -> str:
    """The default ``ImageText``: ``<|vision_start|>`` + n x ``<|image_pad|>`` + ``<|vision_end|>``."""
    return VISION_START + IMAGE_PAD * n + VISION_END


AUDIO_MARKERS = {
    "omni": ("<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"),
    "qwen2": ("<|object_ref_end|>", "<|object_ref_start|>", "<|box_start|>"),
}
"""An audio clip's start, placeholder and end tokens: Qwen2.5-Omni's tokenizer's names, or, in a Qwen2
tokenizer without them, the names of the same ids (151647, 151646, 151648), which an audio family maps
to its audio tokens (``ModelFamily.map_token_id``)."""


def audio_markers(tokenizer: TextTokenizer) -> Callable[[int], str]:
    """The text an audio clip of ``n`` LLM tokens becomes, as Qwen2.5-Omni's processor expands it:
    ``<|audio_bos|>`` + n x ``<|AUDIO|>`` + ``<|audio_eos|>`` (``AUDIO_MARKERS``)."""
    names = AUDIO_MARKERS["omni" if "<|AUDIO|>" in tokenizer.special_tokens else "qwen2"]
    return lambda n: names[0] + names[1] * n + names[2]


def _expand(
    text: str,
    counts: Sequence[int],
    first: int,
    image_text: ImageText = vision_markers,
    audio: tuple[Sequence[int], int, ImageText] | None = None,
) -> tuple[str, int] | tuple[str, int, int]:
    """``text`` with its placeholders expanded using ``counts[first:]``; returns (text, next index).
    With ``audio`` ``(audio counts, first clip, audio text)``, ``<audio>`` placeholders too, each kind
    in its own order; returns (text, next image, next clip)."""
    if audio is None:
        parts = text.split(IMAGE_PLACEHOLDER)
        out = [parts[0]]
        k = first
        for part in parts[1:]:
            out.append(image_text(counts[k]) + part)
            k += 1
        return "".join(out), k
    clips, c, audio_text = audio
    out, k = [], first
    for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(AUDIO_PLACEHOLDER)})", text):
        if piece == IMAGE_PLACEHOLDER:
            out.append(image_text(counts[k]))
            k += 1
        elif piece == AUDIO_PLACEHOLDER:
            out.append(audio_text(clips[c]))
            c += 1
        else:
            out.append(piece)
    return "".join(out), k, c


def format_chat(
    turns: Sequence[tuple[str, str]],
    image_tokens: Sequence[int],
    tokenizer: TextTokenizer,
    image_text: ImageText = vision_markers,
    audio_tokens: Sequence[int] = (),
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a conversation whose i-th ``<image>`` has ``image_tokens[i]`` tokens
    (its text: ``image_text(n)``) and whose j-th ``<audio>`` has ``audio_tokens[j]`` (its text:
    ``audio_markers``), through the tokenizer's chat template when it has one, Qwen2's chat markers
    otherwise.

    Raises ValueError if a placeholder count differs from its inputs'.
    """
    placeholders = sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
    if placeholders != len(image_tokens):
        raise ValueError(
            f"{placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but {len(image_tokens)} image(s)"
        )
    clips = sum(text.count(AUDIO_PLACEHOLDER) for _, text in turns)
    if clips != len(audio_tokens):
        raise ValueError(f"{clips} {AUDIO_PLACEHOLDER} placeholder(s) but {len(audio_tokens)} audio clip(s)")
    audio = (audio_tokens, 0, audio_markers(tokenizer)) if clips else None
    if tokenizer.chat is not None:
        return _format_with_template(turns, image_tokens, tokenizer, image_text, audio)
    ids: list[int] = []
    labels: list[int] = []
    k = 0
    header_len = {}
    for role, text in _messages(turns):
        body, k, *rest = _expand(text, image_tokens, k, image_text, audio)
        if audio is not None:
            audio = (audio[0], rest[0], audio[2])
        msg = tokenizer.encode(f"{IM_START}{role}\n{body}{IM_END}\n")
        ids.extend(msg)
        if role == "assistant":
            if role not in header_len:
                header_len[role] = len(tokenizer.encode(f"{IM_START}{role}\n"))
            h = header_len[role]
            labels.extend([IGNORE_INDEX] * h + msg[h:])
        else:
            labels.extend([IGNORE_INDEX] * len(msg))
    return ids, labels


def _format_with_template(
    turns: Sequence[tuple[str, str]],
    image_tokens: Sequence[int],
    tokenizer: TextTokenizer,
    image_text: ImageText = vision_markers,
    audio: tuple[Sequence[int], int, ImageText] | None = None,
) -> tuple[list[int], list[int]]:
    """A Hugging Face tokenizer's own chat template: ids of the whole conversation; labels copy the
    ids of each assistant message after its generation prompt (the ids that
    ``apply_chat_template(messages[:i], add_generation_prompt=True)`` ends with) up to the end of
    ``apply_chat_template(messages[:i + 1])``, and are -100 elsewhere."""
    messages, k = [], 0
    for role, text in turns:
        body, k, *rest = _expand(text, image_tokens, k, image_text, audio)
        if audio is not None:
            audio = (audio[0], rest[0], audio[2])
        messages.append({"role": role, "content": body})
    ids = tokenizer.chat(messages)
    labels = [IGNORE_INDEX] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(tokenizer.chat(messages[:i], add_generation_prompt=True)) if i else 0
        upto = tokenizer.chat(messages[: i + 1])
        if ids[: len(upto)] != upto:
            raise ValueError(
                f"{tokenizer.name}: the chat template renders message {i} differently in context"
            )
        labels[start : len(upto)] = ids[start : len(upto)]
    return ids, labels


def count_text_tokens(turns: Sequence[tuple[str, str]], tokenizer: TextTokenizer) -> int:
    """Tokens of the chat-formatted conversation other than ``<|image_pad|>`` and audio placeholder
    tokens (template, vision and audio start/end markers included): ``len(input_ids) - sum(image tokens)``."""
    if tokenizer.chat is not None or any(AUDIO_PLACEHOLDER in text for _, text in turns):
        return count_tokens(turns, tokenizer)[0]
    n = 0
    for role, text in _messages(turns):
        body = text.replace(IMAGE_PLACEHOLDER, VISION_START + VISION_END)
        n += tokenizer.count(f"{IM_START}{role}\n{body}{IM_END}\n")
    return n


def count_tokens(turns: Sequence[tuple[str, str]], tokenizer: TextTokenizer) -> tuple[int, int]:
    """``(text tokens, answer tokens)`` of the chat-formatted conversation: ``count_text_tokens``, and
    the positions the loss is taken at (a supervised next token: ``labels[1:]`` not ignored), which
    image tokens never are (``<image>`` in an assistant turn is a data error)."""
    counts = [0] * sum(text.count(IMAGE_PLACEHOLDER) for _, text in turns)
    clips = [0] * sum(text.count(AUDIO_PLACEHOLDER) for _, text in turns)
    ids, labels = format_chat(turns, counts, tokenizer, audio_tokens=clips)
    return len(ids), sum(1 for x in labels[1:] if x != IGNORE_INDEX)


# --- images ---------------------------------------------------------------------------------------

_CONVERSIONS = {
    "1": "bilevel (1-bit) converted to RGB",
    "L": "grayscale converted to RGB",
    "LA": "grayscale with alpha converted to RGB",
    "La": "grayscale with alpha converted to RGB",
    "RGBA": "RGBA converted to RGB (alpha onto white)",
    "RGBa": "RGBA converted to RGB (alpha onto white)",
    "P": "palette converted to RGB",
    "PA": "palette with alpha converted to RGB",
    "I;16": "16-bit converted to 8-bit RGB",
    "I;16L": "16-bit converted to 8-bit RGB",
    "I;16B": "16-bit converted to 8-bit RGB",
    "I;16N": "16-bit converted to 8-bit RGB",
    "I": "16-bit or 32-bit integer converted to 8-bit RGB",
    "F": "32-bit float converted to 8-bit RGB (values in [0, 1] scaled by 255)",
    "CMYK": "CMYK converted to RGB",
    "YCbCr": "YCbCr converted to RGB",
    "LAB": "LAB converted to RGB",
    "HSV": "HSV converted to RGB",
}


def conversion_reason(mode: str) -> str | None:
    """Why an image of PIL ``mode`` is converted before processing (None for RGB8)."""
    if mode == "RGB":
        return None
    return _CONVERSIONS.get(mode, f"mode {mode} converted to RGB")


def _float_to_8bit(arr: np.ndarray) -> np.ndarray:
    """A float image's values on 0..255: scaled by 255 when they all lie in [0, 1] (the usual float
    convention), rounded as they are otherwise; NaN becomes 0."""
    arr = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
    if arr.size and arr.min() >= 0.0 and arr.max() <= 1.0:
        arr = arr * 255.0
    return np.rint(arr)


def to_rgb(im):
    from PIL import Image

    if im.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        arr = np.asarray(im)
        if im.mode == "F":
            arr = _float_to_8bit(arr)
        elif arr.max(initial=0) > 255:
            arr = arr.astype(np.int64) >> 8
        im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    if im.mode in ("P", "PA") and ("transparency" in im.info or im.mode == "PA"):
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "RGBa", "LA", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB") if im.mode != "RGB" else im


def load_image(src: str | bytes):
    """Decode an image file or bytes fully and return it as an RGB8 PIL image, turned upright by its
    EXIF orientation.

    Raises OSError/ValueError for a missing, unreadable or truncated image.
    """
    from PIL import ImageOps

    from entrain.data.problems import open_image

    with open_image(src) as im:
        im.load()
        return to_rgb(ImageOps.exif_transpose(im))


def merged_tokens(grid_thw: np.ndarray, merge_size: int = MERGE_SIZE) -> list[int]:
    """LLM tokens per image from its ``(t, h, w)`` patch grid: ``t*h*w / merge**2``."""
    return [int(np.prod(g)) // (merge_size * merge_size) for g in np.asarray(grid_thw).reshape(-1, 3)]


def no_pixels(vision) -> tuple[np.ndarray, np.ndarray]:
    """The empty ``(pixel_values, image_grid_thw)`` of a sample without images under ``vision``."""
    width = getattr(vision, "patch_values", 3 * 2 * (vision.factor // MERGE_SIZE) ** 2)
    return np.zeros((0, width), np.float32), np.zeros((0, 3), np.int64)


@dataclass(frozen=True, slots=True)
class EncodedSample:
    """Model inputs of one record. ``labels`` is -100 except on assistant turns."""

    id: str
    input_ids: np.ndarray
    labels: np.ndarray
    pixel_values: np.ndarray
    image_grid_thw: np.ndarray

    @property
    def num_image_tokens(self) -> int:
        return sum(merged_tokens(self.image_grid_thw)) if len(self.image_grid_thw) else 0


def encode_sample(
    record: Record,
    tokenizer: TextTokenizer,
    process_images: ProcessImages,
    vision: VisionTokenConfig = DEFAULT_VISION,
) -> EncodedSample:
    """Decode, convert and process ``record``'s images (through the family's ``process_images``) and
    format its conversation into ids/labels.

    Raises DataError naming the record and image for an unreadable image or one the processor rejects.
    """
    images = []
    for i, src in enumerate(record.images):
        try:
            images.append(load_image(src))
        except (OSError, ValueError, SyntaxError) as e:
            raise DataError(
                record.file, record.line or f"#{record.index}", f"images[{i}]", image_error(e)
            ) from None
    if images:
        try:
            pixels, grid = process_images(images, vision)
        except ValueError as e:
            raise DataError(
                record.file, record.line or f"#{record.index}", "images", f"processor: {e}"
            ) from None
    else:
        pixels, grid = no_pixels(vision)
    merge = getattr(vision, "merge_size", MERGE_SIZE)
    ids, labels = format_chat(record.turns, merged_tokens(grid, merge), tokenizer)
    return EncodedSample(record.id, np.asarray(ids, np.int64), np.asarray(labels, np.int64), pixels, grid)
