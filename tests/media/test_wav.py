"""WAV decoding: every integer PCM width to the float values soundfile and librosa give
(exactly), channels mixed by their mean, every source form, and each refusal's message."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from metalkv.media import MediaError, MediaLimits, decode_wav, load_audio, resample

from .damage import damaged_copies
from .sounds import float_wav, signal, wav_bytes, wav_of

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("width, low, high, expected", [
    (1, 0, 256, lambda c: (c - 128.0) / 128.0),               # 8-bit WAV is unsigned
    (2, -(1 << 15), 1 << 15, lambda c: c / 32768.0),
    (3, -(1 << 23), 1 << 23, lambda c: c / float(1 << 23)),
    (4, -(1 << 31), 1 << 31, lambda c: c / float(1 << 31)),
])
def test_every_width_decodes_to_its_full_scale_value(width, low, high, expected):
    codes = RNG.integers(low, high, 4000, dtype=np.int64)
    codes[:2] = low, high - 1  # both extremes
    audio = decode_wav(wav_bytes(codes, 22_050, width))
    assert audio.sample_rate == 22_050 and audio.samples.dtype == np.float32
    assert np.array_equal(audio.samples, expected(codes.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("channels", [2, 3, 6])
def test_channels_are_mixed_to_their_mean(channels):
    codes = RNG.integers(-32768, 32768, (3000, channels), dtype=np.int64)
    audio = decode_wav(wav_bytes(codes, 16_000, 2))
    assert np.array_equal(audio.samples, (codes.astype(np.float64).mean(axis=1) / 32768.0).astype(np.float32))


def test_every_source_form_gives_the_same_clip(tmp_path):
    data = wav_of(signal("chirp", 8000), 16_000)
    path = tmp_path / "chirp.wav"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    sources = [data, str(path), path, f"data:audio/wav;base64,{b64}", {"data": b64, "format": "wav"},
               {"data": b64, "format": "WAV"}]
    clips = [decode_wav(s).samples for s in sources]
    assert all(np.array_equal(clips[0], c) for c in clips[1:])


def test_load_audio_resamples_to_the_models_rate():
    data = wav_of(signal("tone", 48_000, rate=48_000), 48_000)
    samples = load_audio(data)
    assert samples.shape == (16_000,) and samples.dtype == np.float32
    assert np.array_equal(samples, resample(decode_wav(data).samples, 48_000, 16_000))
    at_16k = wav_of(signal("tone", 1600), 16_000)
    assert np.array_equal(load_audio(at_16k), decode_wav(at_16k).samples)  # no resampling at the model's rate


@pytest.mark.parametrize("data, message", [
    (b"ID3\x04\x00" + bytes(100), r"not a WAV file \(it looks like MP3\): metalkv decodes WAV only; convert it"),
    (b"OggS" + bytes(100), r"not a WAV file \(it looks like Ogg\)"),
    (b"fLaC" + bytes(100), r"not a WAV file \(it looks like FLAC\)"),
    (b"just some text, not audio", r"not a WAV file: metalkv decodes WAV only; convert it to PCM WAV \(e.g. ffmpeg"),
    (float_wav(signal("tone", 800), 16_000), r"not a WAV file metalkv can read \(wave: .*\): expected integer PCM "
                                            r"of 8, 16, 24 or 32 bits"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt ", r"not a WAV file metalkv can read \(wave: "),
    (wav_of(signal("tone", 16_000), 16_000)[:20_000], r"truncated: its header says 16,000 frames, it holds 9,978"),
    (wav_bytes(np.zeros(0, np.int16), 16_000, 2), r"no samples"),
    (wav_bytes(np.zeros(31 * 8000, np.uint8), 8000, 1), r"31.0 s long, over the limit of 30 s "
                                                        r"\(MediaLimits.max_audio_seconds; Gemma 3n hears 30 s a clip\)"),
    (wav_bytes(np.zeros(100, np.int16), 500, 2), r"a sample rate of 500 Hz: expected 1000 to 384000"),
])
def test_bad_clips_are_refused_by_name(data, message):
    with pytest.raises(MediaError, match=r"\[audio\] the bytes given: " + message):
        decode_wav(data)


def test_input_audio_refusals():
    with pytest.raises(MediaError, match=r"\[audio\] input_audio \(format 'mp3'\): only 'wav' is decoded; convert it"):
        decode_wav({"data": "AAAA", "format": "mp3"})
    with pytest.raises(MediaError, match=r"input_audio \(format 'wav'\): 'data' is a NoneType, expected the file's "
                                         r"bytes in base64"):
        decode_wav({"format": "wav"})
    with pytest.raises(MediaError, match=r"input_audio \(format 'wav'\): not valid base64"):
        decode_wav({"data": "**", "format": "wav"})
    big = base64.b64encode(wav_of(signal("noise", 16_000), 16_000)).decode()
    with pytest.raises(MediaError, match=r"input_audio \(format 'wav'\): 32,04\d bytes, over the limit of 1,000 "
                                         r"\(MediaLimits.max_audio_bytes\)"):
        decode_wav({"data": big, "format": "wav"}, MediaLimits(max_audio_bytes=1000))


def test_limits_and_remote_urls():
    two_seconds = wav_of(signal("tone", 32_000), 16_000)
    with pytest.raises(MediaError, match=r"2.0 s long, over the limit of 1 s"):
        decode_wav(two_seconds, MediaLimits(max_audio_seconds=1))
    with pytest.raises(MediaError, match=r"\[audio\] 'https://example.com/a.wav': a remote URL, and fetching "
                                         r"media is off: download the file"):
        decode_wav("https://example.com/a.wav")
    with pytest.raises(MediaError, match=r"\[audio\] the data URL 'data:image/png;base64,...' \(\d+ characters\): "
                                         r"holds 'image/png', not audio data"):
        decode_wav("data:image/png;base64,AAAA")


def test_damaged_files_are_refused_as_media_errors():
    """Header bytes overwritten or the file cut at random (seeded): wave's RuntimeError,
    EOFError and the rest reach the caller as a MediaError."""
    rng = np.random.default_rng(20261205)
    for width in (1, 2, 3, 4):
        data = wav_bytes(np.full((500, 2), 128 if width == 1 else 0), 16_000, width)
        for damaged in damaged_copies(data, rng, 100, head=60, max_flips=6):
            try:
                decode_wav(damaged)
            except MediaError as e:
                assert str(e).startswith("[audio] the bytes given: ")
