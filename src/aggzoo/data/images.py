"""Reading image files into RGB arrays, with errors that name the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = ["ImageReadError", "read_rgb"]


class ImageReadError(OSError):
    """An image file could not be read; the message names the file and the reason."""


def read_rgb(path: str | Path) -> np.ndarray:
    """Read an image as ``uint8 [H, W, 3]`` RGB.

    EXIF orientation is applied (phone photos are stored rotated), and greyscale, palette, RGBA,
    CMYK and 16-bit images are converted to 8-bit RGB.
    """
    path = Path(path)
    try:
        with Image.open(path) as image:
            image.load()
            image = ImageOps.exif_transpose(image)
            if image.mode in ("I;16", "I;16B", "I;16L", "I"):
                # 16/32-bit greyscale: scale to 8 bits instead of clipping.
                array = np.asarray(image, dtype=np.float64)
                peak = array.max() if array.size and array.max() > 0 else 1.0
                image = Image.fromarray((array / peak * 255.0).round().astype(np.uint8), mode="L")
            return np.asarray(image.convert("RGB"))
    except FileNotFoundError as err:
        raise ImageReadError(f"image file not found: {path}") from err
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        size = path.stat().st_size if path.exists() else 0
        reason = "empty file (0 bytes)" if size == 0 else f"{type(err).__name__}: {err}"
        raise ImageReadError(f"cannot read image {path}: {reason}") from err
