"""Every kind of image file a real dataset holds, written here: read correctly or reported by path."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

import aggzoo.data.images as images_module
from aggzoo.data.images import ImageReadError, read_rgb
from aggzoo.data.transforms import eval_transform, train_transform


def _noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------ bad files


def test_truncated_jpeg_is_reported_by_path(tmp_path: Path) -> None:
    good = tmp_path / "good.jpg"
    Image.fromarray(_noise(64, 64)).save(good, quality=95)
    data = good.read_bytes()
    for cut in (len(data) // 2, 300):
        bad = tmp_path / f"cut{cut}.jpg"
        bad.write_bytes(data[:cut])
        with pytest.raises(ImageReadError, match=rf"cannot read image .*cut{cut}\.jpg: truncated or corrupt"):
            read_rgb(bad)


def test_truncated_png_is_reported(tmp_path: Path) -> None:
    good = tmp_path / "good.png"
    Image.fromarray(_noise(64, 64)).save(good)
    bad = tmp_path / "bad.png"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ImageReadError, match=r"bad\.png: truncated or corrupt"):
        read_rgb(bad)


def test_zero_byte_text_missing_and_directory(tmp_path: Path) -> None:
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ImageReadError, match=r"empty\.jpg: empty file \(0 bytes\)"):
        read_rgb(tmp_path / "empty.jpg")
    (tmp_path / "notes.jpg").write_text("this is not a picture\n")
    with pytest.raises(ImageReadError, match=r"notes\.jpg: not an image Pillow can identify"):
        read_rgb(tmp_path / "notes.jpg")
    with pytest.raises(ImageReadError, match=r"image file not found: .*missing\.jpg"):
        read_rgb(tmp_path / "missing.jpg")
    (tmp_path / "folder.jpg").mkdir()
    with pytest.raises(ImageReadError, match=r"folder\.jpg: it is a directory"):
        read_rgb(tmp_path / "folder.jpg")


def test_format_comes_from_content_not_extension(tmp_path: Path) -> None:
    pixels = _noise(5, 7)
    Image.fromarray(pixels).save(tmp_path / "really_a_png.jpg", format="PNG")
    np.testing.assert_array_equal(read_rgb(tmp_path / "really_a_png.jpg"), pixels)


def test_float_and_out_of_range_integer_images_are_reported(tmp_path: Path) -> None:
    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32), mode="F").save(tmp_path / "f.tif")
    with pytest.raises(ImageReadError, match=r"f\.tif: 32-bit floating-point image"):
        read_rgb(tmp_path / "f.tif")
    Image.fromarray(np.full((4, 4), 70000, dtype=np.int32), mode="I").save(tmp_path / "i.tif")
    with pytest.raises(ImageReadError, match=r"i\.tif: 32-bit integer image with values outside 0\.\.65535"):
        read_rgb(tmp_path / "i.tif")


# -------------------------------------------------------------------------------------- conversions


def test_greyscale_and_bilevel_become_three_equal_channels(tmp_path: Path) -> None:
    grey = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    Image.fromarray(grey, mode="L").save(tmp_path / "grey.png")
    out = read_rgb(tmp_path / "grey.png")
    assert out.dtype == np.uint8 and out.shape == (6, 8, 3)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], grey)
    Image.fromarray(grey > 100).save(tmp_path / "bw.png")  # mode "1"
    np.testing.assert_array_equal(read_rgb(tmp_path / "bw.png")[..., 1], np.where(grey > 100, 255, 0))


def test_alpha_is_composited_over_white(tmp_path: Path) -> None:
    rgb = _noise(3, 4, seed=1)
    alpha = np.array([[255, 0, 128, 255]] * 3, dtype=np.uint8)
    Image.fromarray(np.dstack([rgb, alpha]), mode="RGBA").save(tmp_path / "alpha.png")
    out = read_rgb(tmp_path / "alpha.png").astype(int)
    np.testing.assert_array_equal(out[:, 0], rgb[:, 0])  # opaque: unchanged
    np.testing.assert_array_equal(out[:, 1], np.full((3, 3), 255))  # transparent: background
    expected = rgb[:, 2] * (128 / 255) + 255 * (1 - 128 / 255)  # half: blended
    assert np.abs(out[:, 2] - expected).max() <= 1
    # Greyscale + alpha.
    Image.fromarray(np.dstack([np.full((2, 2), 40, np.uint8), np.array([[0, 255], [255, 0]], np.uint8)]),
                    mode="LA").save(tmp_path / "la.png")
    np.testing.assert_array_equal(read_rgb(tmp_path / "la.png")[..., 0], [[255, 40], [40, 255]])


def test_rgb_with_a_transparent_colour_key(tmp_path: Path) -> None:
    """An RGB PNG whose tRNS chunk names one transparent colour: that colour becomes the background,
    the rest is unchanged, and the result keeps three channels (an RGB file is not copied to RGB
    again, so the composited image must be the one returned)."""
    rgb = _noise(3, 4, seed=3)
    key = tuple(int(v) for v in rgb[1, 2])
    Image.fromarray(rgb).save(tmp_path / "key.png", transparency=key)
    out = read_rgb(tmp_path / "key.png")
    expected = rgb.copy()
    expected[(rgb == key).all(axis=-1)] = 255
    np.testing.assert_array_equal(out, expected)


def test_palette_with_and_without_transparency(tmp_path: Path) -> None:
    palette = [0, 0, 0, 200, 10, 20, 30, 40, 250] + [0] * (256 * 3 - 9)
    index = np.array([[0, 1, 2], [2, 1, 0]], dtype=np.uint8)
    image = Image.fromarray(index, mode="P")
    image.putpalette(palette)
    image.save(tmp_path / "p.png")
    colours = np.array(palette[:9]).reshape(3, 3)
    np.testing.assert_array_equal(read_rgb(tmp_path / "p.png"), colours[index])
    image.save(tmp_path / "p_transparent.png", transparency=0)  # colour 0 is transparent
    expected = colours[index].copy()
    expected[index == 0] = 255
    np.testing.assert_array_equal(read_rgb(tmp_path / "p_transparent.png"), expected)
    image.save(tmp_path / "p.gif")
    np.testing.assert_array_equal(read_rgb(tmp_path / "p.gif"), colours[index])


def test_sixteen_bit_grey_and_rgb(tmp_path: Path) -> None:
    values = np.array([[0, 257, 1000, 32768], [40000, 65278, 65534, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    out = read_rgb(tmp_path / "g16.png")
    np.testing.assert_array_equal(out[..., 2], np.round(values / 257.0).astype(np.uint8))
    rgb16 = np.stack([values, values[::-1], 65535 - values], axis=-1)
    cv2.imwrite(str(tmp_path / "rgb16.png"), rgb16[..., ::-1])  # OpenCV writes BGR
    out = read_rgb(tmp_path / "rgb16.png").astype(int)
    assert out.shape == (2, 4, 3)
    assert np.abs(out - rgb16 / 257.0).max() <= 1


def test_cmyk_tiff_and_jpeg(tmp_path: Path) -> None:
    cmyk = np.random.default_rng(2).integers(0, 256, (4, 5, 4), dtype=np.uint8)
    Image.fromarray(cmyk, mode="CMYK").save(tmp_path / "c.tif")
    c = cmyk.astype(float)
    expected = np.round((255 - c[..., :3]) * (255 - c[..., 3:]) / 255)  # no-profile CMYK -> RGB
    assert np.abs(read_rgb(tmp_path / "c.tif") - expected).max() <= 1
    flat = np.broadcast_to(np.array([10, 20, 30, 40], np.uint8), (16, 16, 4)).copy()
    Image.fromarray(flat, mode="CMYK").save(tmp_path / "c.jpg", quality=100)
    out = read_rgb(tmp_path / "c.jpg").astype(int)
    assert np.abs(out - np.round((255 - np.array([10, 20, 30])) * 215 / 255)).max() <= 2


@pytest.mark.parametrize(("orientation", "turn"), [(3, 2), (6, -1), (8, 1)])
def test_exif_orientation_is_applied(tmp_path: Path, orientation: int, turn: int) -> None:
    path = tmp_path / f"o{orientation}.jpg"
    image = Image.fromarray(_noise(24, 40, seed=orientation))
    exif = Image.Exif()
    exif[0x0112] = orientation
    image.save(path, exif=exif, quality=95)
    with Image.open(path) as raw:  # the stored pixels, as decoded, without the rotation
        stored = np.asarray(raw.convert("RGB"))
    out = read_rgb(path)
    np.testing.assert_array_equal(out, np.rot90(stored, k=turn))
    assert out.shape[:2] == ((24, 40) if orientation == 3 else (40, 24))


# -------------------------------------------------------------------------------------------- sizes


@pytest.mark.parametrize("shape", [(1, 1), (1, 500), (500, 1), (2, 3)])
def test_very_small_images_go_through_both_transforms(tmp_path: Path, shape: tuple[int, int]) -> None:
    Image.fromarray(_noise(*shape)).save(tmp_path / "small.png")
    pixels = read_rgb(tmp_path / "small.png")
    assert pixels.shape == (*shape, 3)
    for transform in (eval_transform((48, 64)), train_transform((48, 64))):
        out = transform(pixels)
        assert tuple(out.shape) == (3, 48, 64) and bool(out.isfinite().all())


def test_large_jpeg_is_decoded_at_reduced_scale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = np.kron(_noise(30, 40), np.ones((10, 10, 1), dtype=np.uint8))  # 300 x 400 in 10-px blocks
    Image.fromarray(pixels).save(tmp_path / "big.jpg", quality=95)
    full = read_rgb(tmp_path / "big.jpg")
    assert full.shape == (300, 400, 3)
    monkeypatch.setattr(images_module, "MAX_PIXELS", 10_000)  # 120000 px: 1/4 scale gives 7500 px
    reduced = read_rgb(tmp_path / "big.jpg")
    assert reduced.shape == (75, 100, 3)
    # The reduced decode is the same picture: compare with an area downscale of the full decode.
    expected = cv2.resize(full, (100, 75), interpolation=cv2.INTER_AREA).astype(int)
    assert np.abs(reduced.astype(int) - expected).mean() < 8


def test_large_non_jpeg_and_decompression_bombs_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Image.fromarray(_noise(300, 400)).save(tmp_path / "big.png")
    monkeypatch.setattr(images_module, "MAX_PIXELS", 10_000)
    with pytest.raises(ImageReadError, match=r"big\.png: 400x300 = 0\.1 Mpx exceeds the 0\.0 Mpx decoding limit"):
        read_rgb(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20_000)  # Pillow refuses > 2x its limit at open
    with pytest.raises(ImageReadError, match=r"big\.png: .*decompression bomb.*PIL\.Image\.MAX_IMAGE_PIXELS, with no command-line option"):
        read_rgb(tmp_path / "big.png", max_pixels=10**9)
