"""What the dataset readers share without importing one another: opening an image safely and the
wording of their problems (a file cut off, an image in an assistant turn, an image error)."""

from __future__ import annotations

import io

from entrain.core.files import file_problem
from entrain.data.records import IMAGE_PLACEHOLDER

__all__ = ["ASSISTANT_IMAGE", "image_error", "open_image", "unread"]

ASSISTANT_IMAGE = f"{IMAGE_PLACEHOLDER} placeholder in an assistant turn (images belong to user turns)"


def unread(records_read: int) -> str:
    """The tail of a message for a file that cannot be read to its end."""
    return f"the file cannot be read to its end ({records_read} record(s) read before this point)"


def open_image(src: str | bytes):
    """The PIL image of a file path or encoded bytes, opened lazily (header read, pixels not decoded).

    Raises OSError naming the problem for a path that is not a readable regular file (never opens a
    FIFO or device), PIL's errors otherwise (``image_error`` words them)."""
    from PIL import Image

    if isinstance(src, str):
        problem = file_problem(src)
        if problem is not None:
            raise OSError(problem)
    return Image.open(io.BytesIO(src) if isinstance(src, bytes) else src)


def image_error(e: BaseException) -> str:
    """An image error in words, without the object reprs PIL puts in some messages."""
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        return "not an image in a format PIL can read"
    return str(e) or type(e).__name__
