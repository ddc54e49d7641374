"""A WAV clip from a path, bytes, a data URL or OpenAI's input_audio part, decoded by the
standard library's `wave` into float32 mono, then resampled to the rate a model wants.

    load_audio("clip.wav")                                  (n,) float32 at 16 kHz
    load_audio({"data": "<base64>", "format": "wav"})       OpenAI's input_audio

Integer PCM of 8, 16, 24 or 32 bits, any number of channels (mixed to mono by their mean),
scaled to [-1, 1) as soundfile and librosa scale it: 8-bit is unsigned around 128, the others
are divided by 2**(bits - 1). Python 3.11's wave reads no float or WAVE_FORMAT_EXTENSIBLE
files (3.12's reads extensible PCM): those are refused by name.
"""
from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .errors import MediaError
from .limits import MediaLimits
from .resample import resample
from .sources import decode_base64, describe, read_source

# What a clip that is not a WAV most likely is, by its first bytes, for the message.
_NOT_WAV = ((b"ID3", "MP3"), (b"\xff\xfb", "MP3"), (b"\xff\xf3", "MP3"), (b"OggS", "Ogg"), (b"fLaC", "FLAC"),
            (b"\x1aE\xdf\xa3", "WebM"), (b"FORM", "AIFF"))
_CONVERT = "convert it to PCM WAV (e.g. ffmpeg -i IN -ar 16000 -ac 1 -c:a pcm_s16le OUT.wav)"
MIN_RATE, MAX_RATE = 1000, 384_000


@dataclass(frozen=True)
class Audio:
    samples: np.ndarray  # (n,) float32, mono, full scale +-1
    sample_rate: int     # Hz


def decode_wav(source, limits: MediaLimits | None = None) -> Audio:
    """The clip at `source` at its own rate: a path, bytes, 'data:audio/wav;base64,...', or an
    input_audio part {"data": <base64>, "format": "wav"}."""
    limits = limits or MediaLimits()
    what, data = _read(source, limits)
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        kind = next((name for magic, name in _NOT_WAV if data.startswith(magic)), None)
        kind = kind or ("MP4/M4A" if data[4:8] == b"ftyp" else None)
        raise MediaError(f"[audio] {what}: not a WAV file" + (f" (it looks like {kind})" if kind else "")
                         + f": metalkv decodes WAV only; {_CONVERT}")
    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if width not in (1, 2, 3, 4):
                raise MediaError(f"[audio] {what}: {8 * width}-bit samples: expected 8, 16, 24 or 32")
            if not MIN_RATE <= rate <= MAX_RATE:
                raise MediaError(f"[audio] {what}: a sample rate of {rate} Hz: expected {MIN_RATE} to {MAX_RATE}")
            if frames > limits.max_audio_seconds * rate:
                raise MediaError(f"[audio] {what}: {frames / rate:.1f} s long, over the limit of "
                                 f"{limits.max_audio_seconds:g} s (MediaLimits.max_audio_seconds; Gemma 3n hears "
                                 "30 s a clip): cut it into shorter clips")
            raw = w.readframes(frames)
    except MediaError:
        raise
    except (wave.Error, EOFError, RuntimeError, ValueError, struct.error) as e:  # wave's ways of failing on bad data
        raise MediaError(f"[audio] {what}: not a WAV file metalkv can read (wave: {str(e) or type(e).__name__}): "
                         f"expected integer PCM of 8, 16, 24 or 32 bits; {_CONVERT}") from None
    got = len(raw) // (width * channels)
    if got < frames:
        raise MediaError(f"[audio] {what}: truncated: its header says {frames:,} frames, it holds {got:,}")
    if got == 0:
        raise MediaError(f"[audio] {what}: no samples")
    return Audio(samples=_to_mono_float(raw[:got * width * channels], width, channels), sample_rate=rate)


def load_audio(source, sampling_rate: int = 16_000, limits: MediaLimits | None = None) -> np.ndarray:
    """(n,) float32 mono at `sampling_rate` (resample.py's windowed sinc when the file's rate differs)."""
    audio = decode_wav(source, limits)
    return resample(audio.samples, audio.sample_rate, sampling_rate)


def _read(source, limits: MediaLimits) -> tuple[str, bytes]:
    if not isinstance(source, Mapping):
        return describe(source), read_source(source, "audio", limits)
    fmt, payload = source.get("format"), source.get("data")
    what = f"input_audio (format {fmt!r})"
    if not isinstance(fmt, str) or fmt.lower() != "wav":
        raise MediaError(f"[audio] {what}: only 'wav' is decoded; {_CONVERT}")
    if not isinstance(payload, str):
        raise MediaError(f"[audio] {what}: 'data' is a {type(payload).__name__}, expected the file's bytes in base64")
    return what, decode_base64(payload, "audio", what, limits.max_audio_bytes)


def _to_mono_float(raw: bytes, width: int, channels: int) -> np.ndarray:
    """Interleaved little-endian PCM -> (n,) float32, channels averaged."""
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float64) - 128.0) / 128.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8) / float(1 << 23)  # sign-extend 24 bits
    else:
        x = np.frombuffer(raw, f"<i{width}").astype(np.float64) / float(1 << (8 * width - 1))
    return x.reshape(-1, channels).mean(axis=1).astype(np.float32)
