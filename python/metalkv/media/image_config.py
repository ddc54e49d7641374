"""How a checkpoint wants its images prepared, read from its preprocessor_config.json (a dict).

A key that is absent or null takes transformers' default for the model's processor:

    family    processor in transformers           absent: size, resample, normalize
    gemma3    Gemma3ImageProcessor(Pil)           224x224, bilinear, mean = std = 0.5
    gemma3n   SiglipImageProcessor(Pil)           224x224, bicubic,  mean = std = 0.5

Released checkpoints set their own: Gemma 3 896x896 bilinear, normalized to [-1, 1]; Gemma 3n
768x768 bilinear, do_normalize false (pixels in [0, 1]). Pan-and-scan (Gemma 3 only) takes
Gemma3Processor's defaults (crops of at least 256 pixels, at most 4, from an aspect of 1.2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import MediaError

FAMILIES = ("gemma3", "gemma3n")
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}  # PIL's numbers

_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": {"resample": 2, "do_pan_and_scan": False, "pan_and_scan_min_crop_size": 256,
               "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_ratio_to_activate": 1.2},
    "gemma3n": {"resample": 3, "do_pan_and_scan": False},
}
_COMMON = {"size": {"height": 224, "width": 224}, "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255,
           "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True}


@dataclass(frozen=True)
class ImageConfig:
    family: str
    height: int
    width: int
    resample: int                          # PIL's filter number (RESAMPLE_NAMES)
    do_resize: bool
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    do_convert_rgb: bool
    do_pan_and_scan: bool
    pan_and_scan_min_crop_size: int = 0
    pan_and_scan_max_num_crops: int = 0
    pan_and_scan_min_ratio_to_activate: float = 0.0

    @classmethod
    def from_preprocessor_config(cls, config: Mapping[str, Any], family: str) -> "ImageConfig":
        """The image settings of `config` (preprocessor_config.json as a dict) for `family`."""
        if family not in FAMILIES:
            raise MediaError(f"[image] family={family!r}: expected one of {', '.join(FAMILIES)}")
        if not isinstance(config, Mapping):
            raise MediaError(f"[image] preprocessor config is a {type(config).__name__}: expected a dict "
                             "(preprocessor_config.json as json.load gives it)")
        given = {**_COMMON, **_DEFAULTS[family], **{k: v for k, v in config.items() if v is not None}}
        height, width = _size(given["size"], family)
        if given["do_pan_and_scan"] and family != "gemma3":
            raise MediaError(f"[image] do_pan_and_scan=True: pan-and-scan is Gemma 3's; {family} has no crops")
        return cls(family=family, height=height, width=width, resample=_resample(given["resample"]),
                   do_resize=_flag(given, "do_resize"), do_rescale=_flag(given, "do_rescale"),
                   rescale_factor=_number(given, "rescale_factor"), do_normalize=_flag(given, "do_normalize"),
                   image_mean=_triple(given, "image_mean"), image_std=_triple(given, "image_std", positive=True),
                   do_convert_rgb=_flag(given, "do_convert_rgb"), do_pan_and_scan=_flag(given, "do_pan_and_scan"),
                   **({} if family != "gemma3" else {
                       "pan_and_scan_min_crop_size": _count(given, "pan_and_scan_min_crop_size"),
                       "pan_and_scan_max_num_crops": _count(given, "pan_and_scan_max_num_crops"),
                       "pan_and_scan_min_ratio_to_activate": _number(given, "pan_and_scan_min_ratio_to_activate")}))


def _bad(key: str, value, expected: str) -> MediaError:
    return MediaError(f"[image] preprocessor config {key}={value!r}: expected {expected}")


def _size(size, family: str) -> tuple[int, int]:
    if isinstance(size, int) and not isinstance(size, bool) and size > 0 and family == "gemma3":
        return size, size  # Gemma3ImageProcessor reads an int as a square
    if isinstance(size, Mapping) and set(size) == {"height", "width"}:
        h, w = size["height"], size["width"]
        if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (h, w)):
            return h, w
    raise _bad("size", size, '{"height": H, "width": W} with positive ints (the resize to a fixed size '
                             "these processors do)")


def _resample(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value in RESAMPLE_NAMES:
        return value
    raise _bad("resample", value, "one of PIL's filter numbers " +
               ", ".join(f"{k} ({v})" for k, v in RESAMPLE_NAMES.items()))


def _flag(given, key: str) -> bool:
    if not isinstance(given[key], bool):
        raise _bad(key, given[key], "true or false")
    return given[key]


def _number(given, key: str) -> float:
    v = given[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise _bad(key, v, "a positive number")
    return float(v)


def _count(given, key: str) -> int:
    v = given[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _bad(key, v, "a positive int")
    return v


def _triple(given, key: str, positive: bool = False) -> tuple[float, float, float]:
    v = given[key]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * 3  # transformers repeats a single number over the channels
    if (isinstance(v, (list, tuple)) and len(v) == 3
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and (x > 0 or not positive) for x in v)):
        return tuple(float(x) for x in v)
    raise _bad(key, v, "3 numbers, one per RGB channel" + (", each positive" if positive else ""))
