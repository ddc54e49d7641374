"""Images the media tests draw with Pillow, encoded as a user's files would be. There are no
photographs on this machine and none may be downloaded: gradients, shapes and noise stand in
for them, in every mode and encoding whose decoding could differ."""
from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image, ImageDraw, features


def gradient(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    r = x * 255 // max(width - 1, 1)
    g = y * 255 // max(height - 1, 1)
    b = (x + y) * 255 // max(width + height - 2, 1)
    return Image.fromarray(np.stack([r, g, b], axis=-1).astype(np.uint8))


def shapes(width: int, height: int) -> Image.Image:
    image = gradient(width, height)
    draw = ImageDraw.Draw(image)
    draw.ellipse((width // 8, height // 8, width // 2, height // 2), fill=(250, 30, 30), outline=(0, 0, 0), width=3)
    draw.rectangle((width // 2, height // 3, width - 5, height - 5), fill=(20, 200, 60))
    draw.line((0, height - 1, width - 1, 0), fill=(255, 255, 255), width=2)
    return image


def noise(width: int, height: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def _png(width: int, height: int, bit_depth: int, color_type: int, idat: bytes) -> bytes:
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def png_rgb16(width: int, height: int) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow writes none): a gradient with distinct low bytes."""
    values = (np.arange(width * height * 3, dtype=np.uint32) * 2654435761 % 65536).astype(">u2")
    rows = values.reshape(height, width * 3)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)  # filter type 0 per row
    return _png(width, height, 16, 2, zlib.compress(raw))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height and whose data is a stub: refused from its header."""
    return _png(width, height, 8, 2, zlib.compress(b"\x00" * 16))


def jpeg_with_orientation(image: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    return encode(image, "JPEG", quality=92, exif=exif.tobytes())


def _palette(transparent: bool) -> Image.Image:
    image = Image.new("P", (37, 23))
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 0, 0, 250, 250, 0, 9, 9, 9] + [0] * 750)
    image.putdata(list(noise(37, 23, 1, seed=3).ravel() % 6))
    if transparent:
        image.info["transparency"] = 0  # index 0 is red; index 3 is the same red, opaque
    return image


def _rgba() -> Image.Image:
    pixels = noise(64, 48, 4, seed=1)
    pixels[..., 3] = np.linspace(0, 255, 64, dtype=np.uint8)[None, :]
    return Image.fromarray(pixels)


# name -> encoded file; each drawn when asked for
CASES = {
    "gradient_png": lambda: encode(gradient(640, 480), "PNG"),
    "shapes_jpeg": lambda: encode(shapes(500, 375), "JPEG", quality=90),
    "noise_png": lambda: encode(Image.fromarray(noise(256, 256)), "PNG"),
    "wide_png": lambda: encode(shapes(1000, 300), "PNG"),
    "tall_jpeg": lambda: encode(shapes(300, 1000), "JPEG", quality=85),
    "tiny_1x1_png": lambda: encode(Image.new("RGB", (1, 1), (12, 200, 99)), "PNG"),
    "tiny_3x5_png": lambda: encode(Image.fromarray(noise(3, 5, seed=2)), "PNG"),
    "huge_aspect_png": lambda: encode(Image.fromarray(noise(4000, 20, seed=4)), "PNG"),
    "rgba_png": lambda: encode(_rgba(), "PNG"),
    "la_png": lambda: encode(_rgba().convert("LA"), "PNG"),
    "gray_png": lambda: encode(gradient(200, 120).convert("L"), "PNG"),
    "gray_jpeg": lambda: encode(shapes(200, 120).convert("L"), "JPEG"),
    "bilevel_png": lambda: encode(shapes(90, 60).convert("1"), "PNG"),
    "palette_png": lambda: encode(_palette(False), "PNG"),
    "palette_transparent_png": lambda: encode(_palette(True), "PNG"),
    "rgb_trns_png": lambda: encode(shapes(80, 60), "PNG", transparency=(250, 30, 30)),
    "gray16_png": lambda: encode(Image.fromarray((noise(50, 40, 1, seed=5).astype(np.uint16) * 257)), "PNG"),
    "rgb16_png": lambda: png_rgb16(45, 30),
    "cmyk_jpeg": lambda: encode(shapes(120, 80).convert("CMYK"), "JPEG"),
    "exif_rotated_jpeg": lambda: jpeg_with_orientation(shapes(160, 90), 6),
    "gif": lambda: encode(shapes(120, 90).convert("P"), "GIF"),
    "bmp": lambda: encode(shapes(120, 90), "BMP"),
    "tiff": lambda: encode(shapes(120, 90), "TIFF"),
    **({"webp": lambda: encode(shapes(120, 90), "WEBP", quality=80)} if features.check("webp") else {}),
}
