"""An image from a path, bytes or a data URL, decoded by Pillow into the RGB pixels that
transformers.image_utils.load_image gives for the same file (what a processor does with a path
or URL): the EXIF orientation applied, then Pillow's convert("RGB").

convert("RGB") drops an alpha channel as it is (a transparent pixel keeps whatever colour it
hides) and keeps a palette's or tRNS chunk's transparent colour in `.info["transparency"]`;
the processors' RGB step (image_preprocess.to_rgb) then paints that colour white. Both are
transformers' behaviour, kept so that the same file gives the same pixels (docs/MULTIMODAL.md).
"""
from __future__ import annotations

import io

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import MediaError
from .limits import MediaLimits
from .sources import describe, read_source


def load_image(source, limits: MediaLimits | None = None) -> Image.Image:
    """The image at `source` (a path, bytes, or a 'data:image/...;base64,' URL) as an RGB PIL image."""
    limits = limits or MediaLimits()
    what = describe(source)
    data = read_source(source, "image", limits)
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError:
        raise _too_many_pixels(what, None, limits) from None
    except UnidentifiedImageError:
        raise MediaError(f"[image] {what}: not an image Pillow can read (PNG, JPEG, GIF, WebP, BMP, TIFF, ...): "
                         "check the file, or convert it to PNG or JPEG") from None
    except OSError as e:  # a format recognized, its header not understood
        raise MediaError(f"[image] {what}: corrupt ({e}): its header cannot be read") from None
    with image:
        if image.width * image.height > limits.max_image_pixels:
            raise _too_many_pixels(what, image.size, limits)
        try:
            image.load()
            return ImageOps.exif_transpose(image).convert("RGB")
        except MemoryError:
            raise
        except Exception as e:  # Pillow's decoders raise OSError, ValueError, SyntaxError, struct.error ... on bad data
            raise MediaError(f"[image] {what}: corrupt or truncated ({e}): the {image.format or 'image'} "
                             f"header says {image.width}x{image.height} but its data cannot be decoded") from None


def _too_many_pixels(what: str, size, limits: MediaLimits) -> MediaError:
    shown = f"{size[0]}x{size[1]} = {size[0] * size[1]:,} pixels" if size else "more pixels than Pillow will decode"
    return MediaError(f"[image] {what}: {shown}, over the limit of {limits.max_image_pixels:,} "
                      "(MediaLimits.max_image_pixels): scale it down first (the models see it at 896x896 or "
                      "768x768 at most)")
