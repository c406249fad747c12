"""``fpsim experiment --device``: the path a CUDA run takes gives the CPU path's bits.

Without a GPU, :func:`fpsim.dispatch.device_kind` is patched to call CPU tensors CUDA tensors, so
every ``"auto"`` engine choice takes the CUDA route (the Triton kernels, in Triton's interpreter,
for FP32 casts and MX blocks; the torch engine for float64 casts and emulated accumulators) while
the default CPU run takes NumPy's: their replay statistics, end-to-end metrics and logits must be
the same bits.  With a GPU, the same captured operands are replayed on both devices (bit for
bit) and one quick experiment runs on both (JSON to 1e-4: the model's own FP32 GELU and float64
libm/BLAS calls are the device's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Any

import pytest
import torch

import fpsim.dispatch
from fpsim_experiments import cli, context, endtoend, replay
from fpsim_experiments.gpt2.checkpoint import load_gpt2
from fpsim_experiments.gpt2.data import windows
from fpsim_experiments.recipes import Recipe
from fpsim_experiments.report import load_json

SCALED = (Recipe("fp16", output="fp16"),               # Triton cast (FP32 lanes)
          Recipe("e4m3", scaling="channel"),           # torch engine (float64 scales)
          Recipe("mxfp8_e4m3", scaling="block"))       # Triton MX kernel
#: Emulated accumulators (fpsim.matmul's torch engine) on two small sites: every addition of
#: the first rounds through the Triton cast, which the interpreter runs slowly.
ACCUM = (Recipe("bf16", accum="bf16", order="sequential", output="bf16", name="bf16 acc"),
         Recipe("bf16", order="tensor_core", tensor_core="hopper_bf16", name="tensor core"))
ACCUM_SITES = ("h0.ln_1", "h0.attn.qk")


def _context(device: str = "cpu") -> context.Context:
    """The tiny model on two 32-token held-out windows (the experiments' Context, made small
    enough for the Triton interpreter)."""
    net = load_gpt2(context.DEFAULT_MODEL).to(device)
    wins = windows(context.heldout_tokens(net, context.DEFAULT_MODEL), 32, 2).to(device)
    sizes = dataclasses.replace(context.QUICK, tokens=64, rows=16, cols=32, emulation_rows=2,
                                emulation_cols=4)
    return context.Context(net, "tiny", wins, sizes, quick=True)


def _digest(tensors: list[torch.Tensor]) -> str:
    """SHA-256 of the float32 bit patterns of ``tensors``."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().view(torch.int32).numpy().tobytes())
    return h.hexdigest()


def _measure(ctx: context.Context) -> dict[str, Any]:
    """Replay statistics and end-to-end metrics of the recipes, and hashes of their logits."""
    out: dict[str, Any] = {}
    for r in SCALED:
        ops = endtoend.RecipeRun(r)
        logits = endtoend.logits(ctx.model, ctx.wins, ops)
        out[r.name] = {"sites": ctx.replay([r])[0], "logits_sha256": _digest(logits),
                       "e2e": endtoend.compare_logits(ctx.wins, ctx.ref_logits, logits),
                       "events": ops.events, "nonfinite": ops.nonfinite}
    for r, stats in zip(ACCUM, ctx.replay(ACCUM, where=ACCUM_SITES.__contains__)):
        out[r.name] = stats
    out["fp32_logits_sha256"] = _digest(ctx.ref_logits)
    return out


def test_the_cuda_route_on_cpu_tensors_gives_the_cpu_routes_bits(monkeypatch):
    pytest.importorskip("triton")
    import fpsim_kernels as kernels

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs CUDA or TRITON_INTERPRET=1 (conftest sets it without CUDA)")
    calls = {"cast": 0, "mx": 0}
    for name, key in (("quantize", "cast"), ("mx_quantize", "mx")):
        real = getattr(kernels, name)

        def counted(*a: Any, _real: Any = real, _key: str = key, **k: Any) -> Any:
            calls[_key] += 1
            return _real(*a, **k)

        monkeypatch.setattr(kernels, name, counted)
    cpu = json.dumps(_measure(_context()), sort_keys=True)
    assert calls == {"cast": 0, "mx": 0}                 # NumPy and torch-CPU drivers only
    monkeypatch.setattr(fpsim.dispatch, "device_kind", lambda x: "cuda")
    cuda_route = json.dumps(_measure(_context()), sort_keys=True)
    assert calls["cast"] > 0 and calls["mx"] > 0
    assert cuda_route == cpu


def test_the_device_is_recorded_and_bad_devices_are_one_line(capsys):
    ctx = _context()
    assert ctx.meta()["device"] == "cpu" and ctx.device.type == "cpu"
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: --device cuda is valid here")
    with pytest.raises(SystemExit) as exc:
        cli.main(["activations", "--device", "cuda"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "no CUDA device" in err
    assert cli.parse_args(["activations"]).device == "cpu"


def _close(a: Any, b: Any, rel: float) -> bool:
    """Equal JSON, floats to ``rel`` relative (NaN equals NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _close(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(
            _close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=0)
    return a == b


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real GPU run)")
def test_sites_replay_on_cuda_to_the_cpu_bits():
    """The emulation itself on a real GPU: the same captured operands, replayed on CUDA (Triton
    kernels, torch engine) and on the CPU (NumPy), give the same output bits."""
    ctx, whole, small = _context(), {}, {}

    def keep(c: context.Captured) -> None:
        whole[c.name] = c.sites
        if c.name in ACCUM_SITES:
            small[c.name] = c.emulation

    ctx.stream(keep)
    for recipe, sites in [*((r, whole) for r in SCALED), *((r, small) for r in ACCUM)]:
        for name, site in sites.items():
            gpu = dataclasses.replace(site, **{k: getattr(site, k).cuda() for k in
                                               ("a", "output", "b", "bias", "mask")
                                               if getattr(site, k) is not None})
            want = replay.site_output(site, recipe)
            got = replay.site_output(gpu, recipe)
            assert got.device.type == "cuda", (recipe.name, name)
            assert _digest([got]) == _digest([want]), (recipe.name, name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (real GPU run)")
def test_a_quick_experiment_on_cuda_matches_cpu(tmp_path):
    """End to end the model's own FP32 elementwise ops (GELU's tanh and pow) and float64
    libm/BLAS calls are the device's, which may differ from the CPU's in the last bit, so the
    JSON is compared to 1e-4 relative (names, counts and structure exactly)."""
    for device in ("cpu", "cuda"):
        assert cli.main(["fp16-vs-bf16", "--quick", "--device", device,
                         "--out", str(tmp_path / device)]) == 0
    cpu, gpu = (load_json(tmp_path / d / "fp16-vs-bf16" / "results.json") for d in ("cpu", "cuda"))
    assert gpu["meta"].pop("device") == "cuda" and cpu["meta"].pop("device") == "cpu"
    for meta in (cpu["meta"], gpu["meta"]):
        meta.pop("seconds")
    assert _close(cpu, gpu, 1e-4)
