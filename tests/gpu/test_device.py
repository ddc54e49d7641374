"""Device selection, buffers, blits and counters."""
import numpy as np
import pytest

import metalkv
from .kernels import run


def test_devices_lists_host():
    kinds = metalkv.devices()
    assert "host" in kinds
    assert kinds[-1] == "host"  # the fallback comes last
    assert metalkv.device("auto").kind == kinds[0]


def test_metal_is_refused_clearly_without_apple_gpu():
    if "metal" in metalkv.devices():
        pytest.skip("this machine has a Metal GPU")
    with pytest.raises(metalkv.GpuError, match="'metal' needs macOS on Apple Silicon"):
        metalkv.device("metal")


def test_cuda_without_a_gpu_is_refused_clearly():
    """A build with the CUDA device loads and runs on a machine without a GPU (CI
    builds it: METALKV_EXPECT_CUDA=1); asking for cuda there says why not."""
    import os

    built = metalkv._core.build_info()["cuda"]
    if os.environ.get("METALKV_EXPECT_CUDA") == "1":
        assert built, "this build has no CUDA device, but METALKV_EXPECT_CUDA=1 (nvcc was expected)"
    if "cuda" in metalkv.devices():
        pytest.skip("this machine has a CUDA GPU")
    expected = r"no cuda GPU is available on this machine \(" if built else r"'cuda' needs a build with the CUDA toolkit"
    with pytest.raises(metalkv.GpuError, match=expected):
        metalkv.device("cuda")
    assert metalkv.device("auto").kind == "host"  # quietly: no GPU is not a fallback worth a warning


def test_buffer_view_is_zero_copy_and_writable():
    dev = metalkv.device("host")
    buf = dev.buffer(64)
    view = buf.numpy().view(np.float32)
    assert view.shape == (16,) and not view.any()  # zero-filled
    view[:] = np.arange(16)
    np.testing.assert_array_equal(buf.numpy().view(np.float32), np.arange(16))
    buf.write(np.array([7, 8], np.float32), offset=8)
    np.testing.assert_array_equal(view[:4], [0, 1, 7, 8])
    with pytest.raises(metalkv.GpuError, match="overflows the 64-byte buffer"):
        buf.write(np.zeros(17, np.float32))
    with pytest.raises(metalkv.GpuError, match="at least 1 byte"):
        dev.buffer(0)


def test_blit_copy_and_fill_with_counters():
    dev = metalkv.device("host")
    src = dev.buffer_from(np.arange(32, dtype=np.uint8))
    dst = dev.buffer(32)
    cb = dev.command_buffer()
    blit = cb.blit()
    blit.copy(src, 4, dst, 0, 8)
    blit.fill(dst, 16, 4, 0xAB)
    with pytest.raises(metalkv.GpuError, match=r"range \[28, 36\) is outside the 32-byte buffer"):
        blit.copy(src, 28, dst, 0, 8)
    with pytest.raises(metalkv.GpuError, match="multiples of 4 bytes"):
        blit.copy(src, 2, dst, 0, 8)
    blit.end()
    cb.commit()
    cb.wait()
    out = dst.numpy()
    np.testing.assert_array_equal(out[:8], np.arange(4, 12))
    np.testing.assert_array_equal(out[16:20], 0xAB)
    assert not out[8:16].any() and not out[20:].any()
    assert cb.counters == {"dispatches": 0, "compute_encoders": 0, "blit_encoders": 1,
                           "command_buffers_committed": 1, "waits": 1, "blit_bytes_copied": 8}


def test_device_counters_accumulate_over_command_buffers():
    dev = metalkv.device("host")
    dev.reset_counters()
    x = np.arange(64, dtype=np.float32)
    for _ in range(3):
        run(dev, "test_neighbour_barrier", [x, np.zeros_like(x)], 1, 64)
    c = dev.counters()
    assert c["dispatches"] == 3 and c["compute_encoders"] == 3
    assert c["command_buffers_committed"] == 3 and c["waits"] == 3
    dev.reset_counters()
    assert set(dev.counters().values()) == {0}


def test_pipeline_properties():
    dev = metalkv.device("host")
    p = dev.pipeline("gemv_f16")
    assert p.name == "gemv_f16"
    assert p.thread_execution_width == 32
    # a kernel's declared [[max_total_threads_per_threadgroup(n)]], else the device's 1024
    assert p.max_total_threads_per_threadgroup == 64  # kGemvSimds * 32
    assert dev.pipeline("attn_decode_f16_d128").max_total_threads_per_threadgroup == 256
    assert dev.pipeline("sample_f32").max_total_threads_per_threadgroup == 1024


@pytest.mark.parametrize("rows,cols", [(49, 576), (8, 12), (100, 64)])
def test_gemv_f16_matches_numpy(dev, rows, cols):
    """The raw kernel (metal/matmul.metal); tests/ops covers every weight type."""
    rng = np.random.default_rng(rows * cols)
    w = rng.uniform(-1, 1, (rows, cols)).astype(np.float16)
    x = rng.uniform(-1, 1, cols).astype(np.float32)
    # mkv_params::Matmul {n_tokens, n_in, n_out, flags, split_a, split_b}; no bias: x stands in at index 4
    params = np.array([1, cols, rows, 0, 0, 0], np.uint32).tobytes()
    groups = -(-rows // 16)  # 2 SIMD-groups x 8 rows per threadgroup
    *_, y, _ = run(dev, "gemv_f16", [params, w, x, np.zeros(rows, np.float32), x], groups, 64)
    ref = w.astype(np.float64) @ x.astype(np.float64)
    # f32 accumulation over <= 576 products of magnitude <= 1: error << 1e-4
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4)
