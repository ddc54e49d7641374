"""Signals the media tests generate, and WAV files written with the standard library's wave."""
from __future__ import annotations

import io
import struct
import wave

import numpy as np


def signal(kind: str, n: int, rate: int = 16_000, seed: int = 0) -> np.ndarray:
    """(n,) float32: 'tone' (440 Hz), 'chirp' (100 Hz rising to 6.1 kHz over a second), 'noise', 'silence'."""
    t = np.arange(n) / rate
    if kind == "tone":
        return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    if kind == "chirp":
        return (0.3 * np.sin(2 * np.pi * (100 * t + 3000 * t * t))).astype(np.float32)
    if kind == "noise":
        return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)
    if kind == "silence":
        return np.zeros(n, dtype=np.float32)
    raise ValueError(kind)


def tone(frequency: float, rate: int, seconds: float = 0.5, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def wav_bytes(codes: np.ndarray, rate: int, width: int) -> bytes:
    """A PCM WAV of integer `codes` ((n,) or (n, channels)), `width` bytes a sample: 1 is unsigned."""
    codes = np.asarray(codes)
    channels = 1 if codes.ndim == 1 else codes.shape[1]
    if width == 1:
        raw = codes.astype(np.uint8).tobytes()
    elif width == 3:
        raw = codes.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        raw = codes.astype(f"<i{width}").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return out.getvalue()


def wav_of(samples: np.ndarray, rate: int) -> bytes:
    """16-bit mono WAV of float samples in [-1, 1)."""
    return wav_bytes(np.clip(np.round(samples * 32768), -32768, 32767).astype(np.int16), rate, 2)


def float_wav(samples: np.ndarray, rate: int) -> bytes:
    """A WAV of IEEE float samples (format tag 3), which Python's wave does not read."""
    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body
