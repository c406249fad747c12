"""The small things a new user trips on in the first hour (issue 29), one test each."""

import numpy as np
import pytest

import fpsim


def test_triton_without_a_gpu_names_the_interpreter(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: backend='triton' runs")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.ones(4)
    for call in (lambda: fpsim.quantize(x, "e4m3", backend="triton"),
                 lambda: fpsim.encode(x, "e4m3", backend="triton"),
                 lambda: fpsim.mx.quantize(torch.ones(2, 32), "mxfp4", backend="triton")):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1") as err:
            call()
        assert "no CUDA GPU" in str(err.value) and "backend='auto'" in str(err.value)


def test_loss_scaler_first_scale_follows_the_gradient_format():
    from fpsim.nn import LossScaler

    assert LossScaler().get_scale() == 2.0**16                       # GradScaler's default
    assert "57,344" in LossScaler.__doc__                            # and why it can overflow
    assert LossScaler(grad_format="e5m2").get_scale() == 2.0**15     # 57,344 holds 2^15
    assert LossScaler(grad_format="fp16").get_scale() == 2.0**15     # 65,504 too
    assert LossScaler(grad_format="e4m3").get_scale() == 2.0**8      # 448
    assert LossScaler(grad_format="bf16").get_scale() == 2.0**16     # never above GradScaler's
    assert LossScaler(init_scale=4.0, grad_format="e5m2").get_scale() == 4.0
    assert fpsim.get_format("e5m2").max < LossScaler().get_scale()


@pytest.mark.parametrize("granularity", ["tensor", "channel", ("block", 4)])
def test_scaled_quantize_keeps_a_narrow_input_dtype(granularity):
    import ml_dtypes

    x32 = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    want = fpsim.scaled_quantize(x32, "e4m3", granularity=granularity).values
    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = x32.astype(dtype)
        got = fpsim.scaled_quantize(x, "e4m3", granularity=granularity)
        ref = fpsim.scaled_quantize(x.astype(np.float32), "e4m3", granularity=granularity)
        assert got.values.dtype == x.dtype                        # float16 in, float16 out
        np.testing.assert_array_equal(got.values.view(np.uint16),  # one rounding of float32's
                                      ref.values.astype(dtype).view(np.uint16))
        np.testing.assert_array_equal(got.codes, ref.codes)
    assert want.dtype == np.float32


def test_scaled_quantize_keeps_a_narrow_tensor_dtype():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-3, 3, 64)
    for dtype in (torch.float16, torch.bfloat16):
        got = fpsim.scaled_quantize(x.to(dtype), "e4m3", granularity=("block", 32))
        ref = fpsim.scaled_quantize(x.to(dtype).float(), "e4m3", granularity=("block", 32))
        assert got.values.dtype == dtype
        assert torch.equal(got.values, ref.values.to(dtype))


def test_error_statistics_are_public_and_documented():
    assert fpsim.summarize is fpsim.summary.summarize and "summarize" in fpsim.__all__
    assert "ErrorSummary" in fpsim.__all__
    x = np.array([0.1, 1000.0, 1e-5, -2.0], np.float32)
    s = fpsim.summarize(x, fpsim.quantize(x, "e4m3", saturate=True), "e4m3")
    assert (s.count, s.overflow, s.underflow, s.max_abs) == (4, 1, 1, 552.0)
    assert ">>>" in fpsim.summarize.__doc__


def test_summarize_takes_tensors():
    torch = pytest.importorskip("torch")
    x = torch.tensor([0.1, 1000.0], dtype=torch.bfloat16)
    s = fpsim.summarize(x, fpsim.quantize(x, "e4m3"), "e4m3")
    assert (s.count, s.overflow, s.nonfinite_out) == (2, 1, 1)


def test_help_of_scaled_quantize_says_what_it_does():
    doc = fpsim.scaled_quantize.__doc__
    assert "see the module doc" not in doc.splitlines()[0]
    assert "scale" in doc.splitlines()[0] and ">>>" in doc
