"""preprocessor_config.json of the released checkpoints as the media tests read them: Gemma 3's
as google/gemma-3-4b-it publishes it, Gemma 3n's (image and audio keys share the file) as public
copies of google/gemma-3n-E4B-it's show it. Written out here: tests download nothing."""

GEMMA3 = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896},
}

GEMMA3N = {
    "data_format": "channels_first", "do_convert_rgb": True, "do_normalize": False, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "SiglipImageProcessorFast",
    "image_std": [0.5, 0.5, 0.5], "resample": 2, "rescale_factor": 0.00392156862745098,
    "size": {"height": 768, "width": 768},
    # the audio feature extractor's keys share the file
    "feature_extractor_type": "Gemma3nAudioFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
    "padding_value": 0.0, "padding_side": "right", "return_attention_mask": True, "frame_length": 512,
    "hop_length": 160, "fft_length": 1024, "fft_overdrive": True, "min_frequency": 125.0, "max_frequency": 7600.0,
    "preemphasis": 0.97, "preemphasis_htk_flavor": True, "dither": 0.0, "input_scale_factor": 1.0,
    "mel_floor": 1e-05, "per_bin_mean": None, "per_bin_stddev": None, "processor_class": "Gemma3nProcessor",
}
