"""What the dataset readers share without importing one another: opening an image safely and the
wording of their problems (a file cut off, an image in an assistant turn, an image error)."""

from __future__ import annotations

import io

from entrain.core.files import file_problem
from entrain.data.records import IMAGE_PLACEHOLDER, ImageRef

__all__ = ["ASSISTANT_IMAGE", "exif_orientation", "image_error", "open_image", "orientation_note", "unread"]

ASSISTANT_IMAGE = f"{IMAGE_PLACEHOLDER} placeholder in an assistant turn (images belong to user turns)"


def unread(records_read: int) -> str:
    """The tail of a message for a file that cannot be read to its end."""
    return f"the file cannot be read to its end ({records_read} record(s) read before this point)"


def open_image(src: str | bytes | ImageRef):
    """The PIL image of a file path, encoded bytes or an image inside a shard (``ImageRef``), opened
    lazily (header read, pixels not decoded).

    Raises OSError naming the problem for a path that is not a readable regular file (never opens a
    FIFO or device), PIL's errors otherwise (``image_error`` words them)."""
    from PIL import Image

    if isinstance(src, str):
        problem = file_problem(src)
        if problem is not None:
            raise OSError(problem)
    if isinstance(src, ImageRef):
        src = src.read_bytes()
    return Image.open(io.BytesIO(src) if isinstance(src, bytes) else src)


EXIF_ORIENTATION_TAG = 0x0112
TRANSPOSED_ORIENTATIONS = (5, 6, 7, 8)
"""EXIF orientations that swap width and height (a quarter turn, with or without a mirror)."""


def exif_orientation(im) -> int:
    """The EXIF orientation (1..8) of an opened PIL image; 1 (upright) when absent or unreadable."""
    try:
        value = int(im.getexif().get(EXIF_ORIENTATION_TAG, 1))
    except (TypeError, ValueError, OSError, SyntaxError):
        return 1
    return value if 1 <= value <= 8 else 1


def oriented_size(im) -> tuple[int, int]:
    """``(H, W)`` of an opened PIL image once its EXIF orientation is applied (as training loads it)."""
    width, height = im.size
    return (width, height) if exif_orientation(im) in TRANSPOSED_ORIENTATIONS else (height, width)


def orientation_note(orientation: int) -> str | None:
    """What ``entrain data check`` reports for an image with EXIF ``orientation`` (None: upright)."""
    if orientation == 1:
        return None
    return f"EXIF orientation {orientation} applied (the image is turned upright before processing)"


def image_error(e: BaseException) -> str:
    """An image error in words, without the object reprs PIL puts in some messages."""
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        return "not an image in a format PIL can read"
    return str(e) or type(e).__name__
