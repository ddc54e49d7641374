"""ImageConfig read from preprocessor_config.json dicts: the released checkpoints' values, and
transformers' defaults for what a config leaves out (read from transformers itself), and the
refusal of what these processors cannot mean."""
from __future__ import annotations

import pytest

from metalkv.media import ImageConfig, MediaError, pan_and_scan_boxes

from . import checkpoints


def test_released_checkpoints():
    g3 = ImageConfig.from_preprocessor_config(checkpoints.GEMMA3, "gemma3")
    assert (g3.height, g3.width, g3.resample, g3.do_normalize, g3.image_mean) == (896, 896, 2, True, (0.5,) * 3)
    assert (g3.do_convert_rgb, g3.do_pan_and_scan, g3.pan_and_scan_min_crop_size,
            g3.pan_and_scan_max_num_crops, g3.pan_and_scan_min_ratio_to_activate) == (True, False, 256, 4, 1.2)
    g3n = ImageConfig.from_preprocessor_config(checkpoints.GEMMA3N, "gemma3n")
    assert (g3n.height, g3n.width, g3n.resample, g3n.do_normalize, g3n.do_pan_and_scan) == (768, 768, 2, False, False)


@pytest.mark.parametrize("family", ["gemma3", "gemma3n"])
def test_absent_keys_take_transformers_defaults(family):
    pytest.importorskip("transformers")
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    processor = (Gemma3ImageProcessorPil if family == "gemma3" else SiglipImageProcessorPil)()
    ours = ImageConfig.from_preprocessor_config({}, family)
    assert (ours.height, ours.width) == (processor.size.height, processor.size.width)
    assert ours.resample == int(processor.resample)
    assert ours.rescale_factor == processor.rescale_factor
    assert ours.image_mean == tuple(processor.image_mean) and ours.image_std == tuple(processor.image_std)
    for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        assert getattr(ours, flag) == getattr(processor, flag), flag
    if family == "gemma3":
        for key, value in Gemma3Processor.images_kwargs.items():
            assert getattr(ours, key) == value, key


@pytest.mark.parametrize("change, message", [
    ({"size": {"shortest_edge": 224}}, r"size=\{'shortest_edge': 224\}: expected \{\"height\": H, \"width\": W\}"),
    ({"size": {"height": 0, "width": 896}}, r"size=.*expected \{\"height\": H"),
    ({"resample": 7}, r"resample=7: expected one of PIL's filter numbers 0 \(nearest\)"),
    ({"image_mean": [0.5, 0.5]}, r"image_mean=\[0.5, 0.5\]: expected 3 numbers, one per RGB channel"),
    ({"image_std": [0.5, 0.0, 0.5]}, r"image_std=.*each positive"),
    ({"do_normalize": "yes"}, r"do_normalize='yes': expected true or false"),
    ({"rescale_factor": -1}, r"rescale_factor=-1: expected a positive number"),
    ({"pan_and_scan_max_num_crops": 0}, r"pan_and_scan_max_num_crops=0: expected a positive int"),
])
def test_bad_values_are_refused_by_name(change, message):
    with pytest.raises(MediaError, match=r"\[image\] preprocessor config " + message):
        ImageConfig.from_preprocessor_config({**checkpoints.GEMMA3, **change}, "gemma3")


def test_wrong_family_or_shape_is_refused():
    with pytest.raises(MediaError, match=r"family='llava': expected one of gemma3, gemma3n"):
        ImageConfig.from_preprocessor_config({}, "llava")
    with pytest.raises(MediaError, match=r"preprocessor config is a list: expected a dict"):
        ImageConfig.from_preprocessor_config([], "gemma3")
    with pytest.raises(MediaError, match=r"do_pan_and_scan=True: pan-and-scan is Gemma 3's; gemma3n has no crops"):
        ImageConfig.from_preprocessor_config({**checkpoints.GEMMA3N, "do_pan_and_scan": True}, "gemma3n")


def test_an_int_size_is_a_square_for_gemma3_only():
    assert ImageConfig.from_preprocessor_config({"size": 448}, "gemma3").height == 448
    with pytest.raises(MediaError, match=r"size=448"):
        ImageConfig.from_preprocessor_config({"size": 448}, "gemma3n")


@pytest.mark.parametrize("width, height, boxes", [
    (896, 896, []),                                          # square: nothing to pan
    (1000, 880, []),                                         # aspect 1.14 < 1.2
    (1000, 300, [(0, 0, 334, 300), (334, 0, 668, 300), (668, 0, 1000, 300)]),
    (300, 700, [(0, 0, 300, 350), (0, 350, 300, 700)]),      # portrait: crops top to bottom
    (5000, 600, [(0, 0, 1250, 600), (1250, 0, 2500, 600), (2500, 0, 3750, 600), (3750, 0, 5000, 600)]),  # at most 4
    (400, 200, []),                                          # 2 crops of 200 < 256
])
def test_pan_and_scan_boxes(width, height, boxes):
    assert pan_and_scan_boxes(width, height, 256, 4, 1.2) == boxes
