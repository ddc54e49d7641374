"""Images and audio in: decoded and prepared as transformers' processors prepare them for
Gemma 3 and Gemma 3n, in numpy and Pillow (docs/MULTIMODAL.md). Nothing here runs a tower.

    image = load_image("photo.jpg")                     # path, bytes, or data:image/...;base64,
    config = ImageConfig.from_preprocessor_config(json.load(f), "gemma3")
    preprocess_image(image, config).pixel_values        # (1 + crops, 3, 896, 896) float32

    samples = load_audio({"data": b64, "format": "wav"})   # (n,) float32 mono at 16 kHz
    log_mel_features(samples, AudioFeatureConfig.from_preprocessor_config(cfg))  # (frames, 128)

    tokens = MediaTokens.from_hf_config(config, tokenizer.id_to_token)   # how the prompt holds them
    ids = tokenizer.encode(expand(rendered_chat, tokens, images=1)); media_spans(ids, tokens)

Layers, each importing only those above it: errors, limits -> sources -> image_load, wav
(with resample) -> image_config, pan_and_scan, audio_config, mel -> image_preprocess, audio_features;
prompt apart (the placeholders and soft tokens; it reads no media).
"""
from .audio_config import AudioFeatureConfig
from .audio_features import AudioFeatures, log_mel_features
from .errors import MediaError
from .image_config import ImageConfig
from .image_load import load_image
from .image_preprocess import PreparedImage, preprocess_image, to_rgb
from .limits import MediaLimits
from .pan_and_scan import pan_and_scan_boxes
from .prompt import MediaSlot, MediaTokens, Span, count_placeholders, expand, media_spans
from .resample import resample
from .wav import Audio, decode_wav, load_audio

__all__ = [
    "Audio", "AudioFeatureConfig", "AudioFeatures", "ImageConfig", "MediaError", "MediaLimits", "MediaSlot",
    "MediaTokens", "PreparedImage", "Span", "count_placeholders", "decode_wav", "expand", "load_audio", "load_image",
    "log_mel_features", "media_spans", "pan_and_scan_boxes", "preprocess_image", "resample", "to_rgb",
]
