"""metalkv.media's images against transformers' PIL-backend processors (Gemma3ImageProcessorPil,
SiglipImageProcessorPil: the ones transformers picks without torchvision), given the same file
as a data URL, as a chat message would carry it.

Equality is exact, bit for bit: both decode with the same Pillow calls (EXIF transpose,
convert("RGB"), the RGB step's white compositing), resize with the same Pillow filter, and
rescale and normalize with the same float64-then-float32 arithmetic. The images are drawn
here (tests/media/drawn.py): no photographs are on this machine and none may be downloaded.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("transformers")
from transformers.image_utils import load_image as hf_load_image  # noqa: E402
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor  # noqa: E402
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil  # noqa: E402

from metalkv.media import ImageConfig, load_image, preprocess_image  # noqa: E402

from . import checkpoints  # noqa: E402
from .drawn import CASES, data_url  # noqa: E402

# Gemma3Processor passes these to its image processor on every call, over the config's nulls
PROCESSOR_KWARGS = {"gemma3": dict(Gemma3Processor.images_kwargs), "gemma3n": {}}
REFERENCE = {"gemma3": (Gemma3ImageProcessorPil, checkpoints.GEMMA3),
             "gemma3n": (SiglipImageProcessorPil, checkpoints.GEMMA3N)}


def reference_pixels(family: str, url: str, config: dict, **kwargs) -> dict:
    processor_class, _ = REFERENCE[family]
    processor = processor_class.from_dict(config)
    return processor(url, return_tensors="np", **{**PROCESSOR_KWARGS[family], **kwargs})


@pytest.mark.parametrize("case", sorted(CASES))
def test_decoded_pixels_are_load_images(case):
    """The decode step alone: the same RGB pixels, and the same transparent colour kept in .info."""
    data = CASES[case]()
    ours, theirs = load_image(data), hf_load_image(data_url(data))
    assert ours.mode == theirs.mode == "RGB"
    assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    assert ours.info.get("transparency") == theirs.info.get("transparency")


@pytest.mark.parametrize("family", ["gemma3", "gemma3n"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_pixel_values_equal_the_processors(case, family):
    data = CASES[case]()
    config = REFERENCE[family][1]
    ours = preprocess_image(load_image(data), ImageConfig.from_preprocessor_config(config, family))
    theirs = reference_pixels(family, data_url(data), config)
    side = 896 if family == "gemma3" else 768
    assert ours.pixel_values.shape == theirs["pixel_values"].shape == (1, 3, side, side)
    assert ours.pixel_values.dtype == np.float32
    assert np.array_equal(ours.pixel_values, theirs["pixel_values"])
    lo, hi = (-1.0, 1.0) if family == "gemma3" else (0.0, 1.0)  # Gemma 3n's config does not normalize
    assert lo <= ours.pixel_values.min() and ours.pixel_values.max() <= hi


@pytest.mark.parametrize("case", ["wide_png", "tall_jpeg", "huge_aspect_png", "gradient_png", "tiny_3x5_png"])
def test_pan_and_scan_crops_equal_gemma3s(case):
    data = CASES[case]()
    ours = preprocess_image(load_image(data), ImageConfig.from_preprocessor_config(checkpoints.GEMMA3, "gemma3"),
                            pan_and_scan=True)
    theirs = reference_pixels("gemma3", data_url(data), checkpoints.GEMMA3, do_pan_and_scan=True)
    assert [ours.num_crops] == list(theirs["num_crops"])
    assert np.array_equal(ours.pixel_values, theirs["pixel_values"])


def test_wide_image_gives_three_crops():
    """1000x300 is 3.3 times as wide as tall: the whole image and 3 crops of 334, 334 and 332 pixels."""
    data = CASES["wide_png"]()
    ours = preprocess_image(load_image(data), ImageConfig.from_preprocessor_config(checkpoints.GEMMA3, "gemma3"),
                            pan_and_scan=True)
    assert ours.num_crops == 3 and ours.pixel_values.shape == (4, 3, 896, 896)


def test_every_filter_and_an_unsquare_size_match():
    """resample 0-5 (PIL's nearest ... hamming) and a non-square target, without normalizing."""
    data = CASES["shapes_jpeg"]()
    for resample in range(6):
        config = {**checkpoints.GEMMA3, "resample": resample, "size": {"height": 123, "width": 301},
                  "do_normalize": False, "rescale_factor": 0.5}
        ours = preprocess_image(load_image(data), ImageConfig.from_preprocessor_config(config, "gemma3"))
        theirs = reference_pixels("gemma3", data_url(data), config)
        assert np.array_equal(ours.pixel_values, theirs["pixel_values"]), resample


def test_as_decoded_pixels_match_without_resize_rescale_or_normalize():
    """With every step off, what is left is the decode and the RGB step: transformers then returns
    uint8 and metalkv float32 of the same values."""
    config = {**checkpoints.GEMMA3, "do_resize": False, "do_rescale": False, "do_normalize": False}
    for case in ("palette_transparent_png", "rgba_png", "rgb_trns_png", "exif_rotated_jpeg"):
        data = CASES[case]()
        ours = preprocess_image(load_image(data), ImageConfig.from_preprocessor_config(config, "gemma3"))
        theirs = reference_pixels("gemma3", data_url(data), config)["pixel_values"]
        assert np.array_equal(ours.pixel_values, theirs.astype(np.float32)), case


def test_path_bytes_and_data_url_give_the_same_image(tmp_path):
    data = CASES["shapes_jpeg"]()
    path = tmp_path / "shapes.jpg"
    path.write_bytes(data)
    pixels = [np.asarray(load_image(source)) for source in (data, str(path), path, data_url(data, "image/jpeg"))]
    assert all(np.array_equal(pixels[0], p) for p in pixels[1:])


def test_transformers_file_path_behaviours_are_kept():
    """What a file goes through in transformers, kept for parity though one might not expect it
    (docs/MULTIMODAL.md): the EXIF orientation is applied; an alpha channel is dropped, not
    composited (a transparent pixel shows the colour it hides); a palette's transparent colour
    turns white wherever it appears, opaque entries of the same colour included; a 16-bit
    grayscale PNG is clipped to 255, not scaled."""
    rotated = load_image(CASES["exif_rotated_jpeg"]())             # drawn 160x90, orientation 6
    assert rotated.size == (90, 160)
    rgba = CASES["rgba_png"]()
    hidden = np.asarray(Image.open(io.BytesIO(rgba)))[0, 0]           # alpha 0 in the first column
    assert hidden[3] == 0 and np.array_equal(np.asarray(load_image(rgba))[0, 0], hidden[:3])
    config = ImageConfig.from_preprocessor_config({**checkpoints.GEMMA3, "do_resize": False, "do_rescale": False,
                                                   "do_normalize": False}, "gemma3")
    palette = Image.open(io.BytesIO(CASES["palette_transparent_png"]()))
    indices = np.asarray(palette)
    pixels = preprocess_image(load_image(CASES["palette_transparent_png"]()), config).pixel_values[0]
    assert (pixels[:, indices == 3] == 255).all()                     # opaque red, the transparent index's colour
    assert (pixels[:, indices == 1] == np.array([[0], [255], [0]])).all()
    gray16 = np.asarray(Image.open(io.BytesIO(CASES["gray16_png"]())))
    assert np.array_equal(np.asarray(load_image(CASES["gray16_png"]()))[..., 0], np.minimum(gray16, 255))
