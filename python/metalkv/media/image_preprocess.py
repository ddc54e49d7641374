"""An RGB image made into the float32 pixels a vision tower takes, as transformers' PIL-backend
processors (Gemma3ImageProcessorPil, SiglipImageProcessorPil) make them: the same Pillow calls
on the same uint8 pixels, then the same float arithmetic, so the arrays are equal bit for bit.

    prepared = preprocess_image(load_image("cat.png"), ImageConfig.from_preprocessor_config(cfg, "gemma3"))
    prepared.pixel_values   # (1 + num_crops, 3, 896, 896) float32
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from .errors import MediaError
from .image_config import ImageConfig
from .pan_and_scan import pan_and_scan_boxes


@dataclass(frozen=True)
class PreparedImage:
    pixel_values: np.ndarray  # (1 + num_crops, 3, height, width) float32: the whole image, then its crops in row order
    num_crops: int            # Gemma 3's pan-and-scan crops (0 without it)


def to_rgb(image: Image.Image) -> Image.Image:
    """The processors' RGB step: an image with alpha, or with a transparent colour in .info (a
    palette's or a tRNS chunk's, which convert("RGB") keeps), composited onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def preprocess_image(image: Image.Image, config: ImageConfig, *, pan_and_scan: bool | None = None) -> PreparedImage:
    """`image` (from load_image) resized, rescaled and normalized as `config` says; pan_and_scan
    (Gemma 3 only) None: as the config says."""
    if pan_and_scan is None:
        pan_and_scan = config.do_pan_and_scan
    if pan_and_scan and config.family != "gemma3":
        raise MediaError(f"[image] pan_and_scan=True: pan-and-scan is Gemma 3's; {config.family} takes the whole image")
    if pan_and_scan and not config.do_resize:
        raise MediaError("[image] pan_and_scan=True with do_resize false: crops of several sizes cannot be stacked")
    if config.do_convert_rgb:
        image = to_rgb(image)
    if image.mode != "RGB":
        raise MediaError(f"[image] an image of mode {image.mode} with do_convert_rgb false: expected an RGB image "
                         "(load_image gives one)")
    boxes = pan_and_scan_boxes(image.width, image.height, config.pan_and_scan_min_crop_size,
                               config.pan_and_scan_max_num_crops,
                               config.pan_and_scan_min_ratio_to_activate) if pan_and_scan else []
    views = [image] + [image.crop(box) for box in boxes]
    return PreparedImage(pixel_values=np.stack([_pixels(view, config) for view in views]), num_crops=len(boxes))


def _pixels(view: Image.Image, config: ImageConfig) -> np.ndarray:
    """(3, height, width) float32 of one view."""
    if config.do_resize:
        view = view.resize((config.width, config.height), resample=Image.Resampling(config.resample))
    x = np.asarray(view, dtype=np.uint8).transpose(2, 0, 1)
    if config.do_rescale:
        x = (x.astype(np.float64) * config.rescale_factor).astype(np.float32)  # in float64, as transformers rescales
    x = x.astype(np.float32)
    if config.do_normalize:
        mean = np.asarray(config.image_mean, dtype=np.float32).reshape(3, 1, 1)
        std = np.asarray(config.image_std, dtype=np.float32).reshape(3, 1, 1)
        x = (x - mean) / std
    return np.ascontiguousarray(x)
