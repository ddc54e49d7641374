"""Gemma 3's pan-and-scan: an image much wider than tall (or taller than wide) is also cut into
2 to max_num_crops crops along its long side, each seen at full resolution beside the whole.

    pan_and_scan_boxes(1800, 600, 256, 4, 1.2) -> 3 boxes of 600x600, left to right
"""
from __future__ import annotations

import math


def pan_and_scan_boxes(width: int, height: int, min_crop_size: int, max_num_crops: int,
                       min_ratio_to_activate: float) -> list[tuple[int, int, int, int]]:
    """Crop boxes (left, top, right, bottom) as Gemma3ImageProcessor cuts them, in row order;
    [] when the image is not elongated enough or its crops would be under min_crop_size."""
    landscape = width >= height
    long_side, short_side = (width, height) if landscape else (height, width)
    if long_side / short_side < min_ratio_to_activate:
        return []
    n = int(math.floor(long_side / short_side + 0.5))           # the aspect, rounded half up
    n = min(n, int(math.floor(long_side / min_crop_size)))      # no crop under min_crop_size ...
    n = min(max_num_crops, max(2, n))                           # ... but at least 2, at most max_num_crops
    across, down = (n, 1) if landscape else (1, n)
    crop_w, crop_h = -(-width // across), -(-height // down)    # ceil: the last crop may be narrower
    if min(crop_w, crop_h) < min_crop_size:
        return []
    return [(x, y, min(x + crop_w, width), min(y + crop_h, height))
            for y in range(0, down * crop_h, crop_h) for x in range(0, across * crop_w, crop_w)]
