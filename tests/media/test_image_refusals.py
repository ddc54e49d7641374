"""What metalkv.media refuses to take as an image, each by name: remote URLs, missing files,
oversized files and images, corrupt data, and what is not an image at all."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from metalkv.media import ImageConfig, MediaError, MediaLimits, load_image, preprocess_image

from .damage import damaged_copies
from .drawn import CASES, data_url, gradient, png_claiming


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "HTTP://example.com/cat.png"])
def test_remote_urls_are_refused(url):
    with pytest.raises(MediaError, match=r"\[image\] .*: a remote URL, and fetching media is off: download the "
                                         r"file and give its local path or a data URL, or turn fetching on"):
        load_image(url)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(MediaError, match=r"\[image\] '.*nope\.png': no such file"):
        load_image(str(tmp_path / "nope.png"))
    with pytest.raises(MediaError, match=r"\[image\] '.*': a directory; give the path of an image file"):
        load_image(tmp_path)


def test_byte_limits_for_every_source(tmp_path):
    data = CASES["gradient_png"]()
    path = tmp_path / "g.png"
    path.write_bytes(data)
    limits = MediaLimits(max_image_bytes=1000)
    for source in (data, str(path), data_url(data)):
        with pytest.raises(MediaError, match=r": [\d,]+ bytes, over the limit of 1,000 \(MediaLimits.max_image_bytes\)"):
            load_image(source, limits)


def test_pixel_limit_is_ours_and_read_from_the_header():
    """9000x9000 is past metalkv's 8192x8192 and under Pillow's own guard; 20000x20000 is past
    Pillow's too, which refuses at open: both are named as MediaLimits.max_image_pixels."""
    with pytest.raises(MediaError, match=r"the bytes given: 9000x9000 = 81,000,000 pixels, over the limit of 67,108,864 "
                                         r"\(MediaLimits.max_image_pixels\): scale it down"):
        load_image(png_claiming(9000, 9000))
    with pytest.raises(MediaError, match=r"more pixels than Pillow will decode, over the limit of 67,108,864"):
        load_image(png_claiming(20000, 20000))
    with pytest.raises(MediaError, match=r": 640x480 = 307,200 pixels, over the limit of 1,000"):
        load_image(CASES["gradient_png"](), MediaLimits(max_image_pixels=1000))


def test_not_an_image():
    with pytest.raises(MediaError, match=r"\[image\] the bytes given: not an image Pillow can read \(PNG, JPEG"):
        load_image(b"this is not an image ...")


@pytest.mark.parametrize("case, cut", [("gradient_png", 0.5), ("shapes_jpeg", 0.3)])
def test_truncated_files(case, cut):
    data = CASES[case]()
    with pytest.raises(MediaError, match=r"the bytes given: corrupt or truncated \(.*\): the (PNG|JPEG) header says \d+x\d+"):
        load_image(data[:int(len(data) * cut)])


def test_corrupt_png_data():
    with pytest.raises(MediaError, match=r": corrupt or truncated"):
        load_image(png_claiming(64, 64))  # a valid header over 16 zero bytes of pixels


@pytest.mark.parametrize("url, message", [
    ("data:image/png,abc", r"not a base64 data URL: expected 'data:image/<type>;base64,<data>'"),
    ("data:audio/wav;base64,UklGRg==", r"holds 'audio/wav', not image data"),
    ("data:image/png;base64,@@@@", r"not valid base64"),
])
def test_bad_data_urls(url, message):
    with pytest.raises(MediaError, match=r"\[image\] the data URL '.*' \(\d+ characters\): " + message):
        load_image(url)


def test_bare_base64_is_not_taken_for_a_path():
    bare = base64.b64encode(CASES["gradient_png"]()).decode()
    with pytest.raises(MediaError, match=r"\[image\] 'iVBOR.*' \([\d,]+ characters\): not a path nor a data URL; "
                                         r"to send the file itself, give its bytes or a data URL "
                                         r"\('data:image/...;base64,' before the base64\)"):
        load_image(bare)


def test_not_a_source():
    with pytest.raises(MediaError, match=r"\[image\] a value of type int: not a media source: give a path, bytes, or a data URL"):
        load_image(42)


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match=r"\[media\] max_image_bytes=0: expected a positive int"):
        MediaLimits(max_image_bytes=0)
    with pytest.raises(ValueError, match=r"\[media\] max_audio_seconds=-1: expected a positive number of seconds"):
        MediaLimits(max_audio_seconds=-1)


def test_preprocess_refusals():
    image = gradient(40, 30)
    gemma3n = ImageConfig.from_preprocessor_config({}, "gemma3n")
    with pytest.raises(MediaError, match=r"pan_and_scan=True: pan-and-scan is Gemma 3's; gemma3n takes the whole image"):
        preprocess_image(image, gemma3n, pan_and_scan=True)
    raw = ImageConfig.from_preprocessor_config({"do_convert_rgb": False}, "gemma3")
    with pytest.raises(MediaError, match=r"an image of mode RGBA with do_convert_rgb false: expected an RGB image"):
        preprocess_image(image.convert("RGBA"), raw)
    assert preprocess_image(image, raw).pixel_values.dtype == np.float32


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow warns of each bad TIFF tag it skips
def test_damaged_files_are_refused_as_media_errors():
    """Bytes of valid files overwritten or cut at random (seeded): whatever Pillow's decoders
    raise on them, the caller gets a MediaError, never a bare OSError or a crash."""
    rng = np.random.default_rng(20261205)
    for case in ("gradient_png", "shapes_jpeg", "gif", "bmp", "tiff", "palette_transparent_png", "exif_rotated_jpeg"):
        data = CASES[case]()
        for damaged in damaged_copies(data, rng, 40, head=400, max_flips=8):
            try:
                load_image(damaged)
            except MediaError as e:
                assert str(e).startswith("[image] the bytes given: ")
