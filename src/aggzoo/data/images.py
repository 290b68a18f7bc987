"""Reading image files into RGB arrays, with errors that name the file.

Every readable image becomes ``uint8 [H, W, 3]`` RGB, upright:

- EXIF orientation is applied (phone photos are stored rotated and flagged).
- Greyscale (``L``, ``1``), palette (``P``), CMYK, YCbCr: converted to RGB.
- Transparency (RGBA, LA, PA, palette or colour-key transparency) is composited over white, the way
  a viewer shows the picture; dropping the alpha channel would expose whatever colours happen to be
  stored under fully transparent pixels.
- 16-bit greyscale (``I;16*``, or ``I`` within 0..65535): divided by 257 (65535 -> 255), a fixed
  mapping that does not depend on the content of the image. 16-bit RGB PNG/TIFF arrive from Pillow
  already reduced to 8 bits.
- Very small images are returned as they are (the transforms resize them).
- Very large images: above :data:`MAX_PIXELS` a JPEG is decoded at 1/2, 1/4 or 1/8 scale (libjpeg's
  draft mode: fast, and still far above any training resolution); any other format is refused.
  Beyond twice Pillow's ``PIL.Image.MAX_IMAGE_PIXELS`` Pillow refuses to open the file at all.

Everything else (missing, empty, truncated or corrupt files, non-images with image extensions,
32-bit float images) raises :class:`ImageReadError` naming the file and the reason.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from aggzoo.errors import ImageReadError

__all__ = ["read_rgb", "MAX_PIXELS"]

#: Pixel count above which a JPEG is decoded at reduced scale and other formats are refused.
#: Pillow's own warning threshold (~89.5 Mpx); set ``aggzoo.data.images.MAX_PIXELS`` to change it.
MAX_PIXELS: int = 89_478_485

_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_BACKGROUND = (255, 255, 255, 255)


def _error(path: Path, reason: str) -> ImageReadError:
    return ImageReadError(f"cannot read image {path}: {reason}", path, reason)


def _reason(path: Path, err: BaseException) -> str:
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    if size == 0:
        return "empty file (0 bytes)"
    if isinstance(err, UnidentifiedImageError):
        return "not an image Pillow can identify (corrupt, or not an image despite its extension)"
    text = str(err)
    if "truncated" in text.lower():
        return f"truncated or corrupt image data ({text})"
    return f"{type(err).__name__}: {text}"


def _reduce_large(image: Image.Image, path: Path, max_pixels: int) -> None:
    """Ask libjpeg for a reduced-scale decode when ``image`` is larger than ``max_pixels``."""
    width, height = image.size
    if width * height <= max_pixels:
        return
    if image.format in ("JPEG", "MPO"):
        for scale in (2, 4, 8):
            if math.ceil(width / scale) * math.ceil(height / scale) <= max_pixels:
                image.draft(image.mode, (math.ceil(width / scale), math.ceil(height / scale)))
                if image.size[0] * image.size[1] <= max_pixels:
                    return
    raise _error(path, (
        f"{width}x{height} = {width * height / 1e6:.1f} Mpx exceeds the {max_pixels / 1e6:.1f} Mpx decoding "
        "limit (a guard against decompression bombs; only JPEGs can be decoded at reduced size). Downscale "
        "the file (e.g. to a JPEG); the limit is a Python setting, aggzoo.data.images.MAX_PIXELS, with no "
        "command-line option."
    ))


def _to_rgb(image: Image.Image, path: Path) -> np.ndarray:
    mode = image.mode
    if mode in _SIXTEEN_BIT or mode == "I":
        array = np.asarray(image).astype(np.int64)
        if array.size and (array.min() < 0 or array.max() > 65535):
            raise _error(path, "32-bit integer image with values outside 0..65535 has no standard 8-bit "
                               "mapping; save it as an 8- or 16-bit image")
        grey = ((array * 255 + 32767) // 65535).astype(np.uint8)  # = round(v / 257)
        return np.repeat(grey[..., None], 3, axis=2)
    if mode == "F":
        raise _error(path, "32-bit floating-point image (mode F) has no standard 8-bit mapping; save it "
                           "as an 8- or 16-bit image")
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, _BACKGROUND), rgba)
    # convert() copies even when the mode is already RGB; each copy is ~1 ms of a 480x640 image.
    return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))


def read_rgb(path: str | Path, *, max_pixels: int | None = None) -> np.ndarray:
    """Read an image file as upright ``uint8 [H, W, 3]`` RGB (see the module docstring).

    Args:
        path: the image file (the format is read from its content, not its extension).
        max_pixels: decoding limit; default :data:`MAX_PIXELS`.

    Raises:
        ImageReadError: the file is missing, empty, truncated, corrupt, not an image, too large, or
            of a pixel type without a standard 8-bit mapping. The message names the file.
    """
    path = Path(path)
    limit = MAX_PIXELS if max_pixels is None else int(max_pixels)
    try:
        with warnings.catch_warnings():
            # The size is checked below (with a reduced-scale decode for JPEGs), not warned about.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                _reduce_large(image, path, limit)
                image.load()
                # In place: the copying variant copies every image, even the (usual) upright ones.
                ImageOps.exif_transpose(image, in_place=True)
                return _to_rgb(image, path)
    except ImageReadError:
        raise
    except FileNotFoundError as err:
        raise ImageReadError(f"image file not found: {path}", path, "file not found") from err
    except IsADirectoryError as err:
        raise _error(path, "it is a directory") from err
    except Image.DecompressionBombError as err:
        raise _error(path, f"{err} Pillow refuses files this large; downscale the file (the limit is a Python "
                           "setting, PIL.Image.MAX_IMAGE_PIXELS, with no command-line option).") from err
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as err:
        raise _error(path, _reason(path, err)) from err
