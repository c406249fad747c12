"""One GPU check, one command: bit-exactness on the device, kernel speed, and real tensor cores.

Run it whenever a CUDA GPU is at hand (about 5 minutes on an H100/H200) and commit what it
writes into ``benchmarks/results/``::

    python benchmarks/gpu_check.py                              # on a CUDA machine
    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --dry-run # anywhere: tiny, untimed

Sections (each one's failure is recorded and the others still run):

1. ``bitexact``: the Triton kernels against the NumPy reference on the device, codes and values
   bit for bit, for every named format the kernels take, every deterministic rounding mode,
   saturating and not (edge-case probes: every value and midpoint of small formats, ±0, ±inf,
   NaN, ±max and beyond, subnormals, random bit patterns), decode of every code, and MX/NVFP4
   quantize+pack.
2. ``bandwidth``: GB/s of every cast and MX kernel beside a device-to-device copy, torch's own
   casts and ``torch.compile`` (the rows of ``kernels_bench.py``).
3. ``emulation``: ``fpsim.matmul`` and ``fpsim.quantize`` on CUDA tensors against the CPU/NumPy
   path on the same operands (same bits), as the experiments run them.
4. ``model``: a Llama-shaped model's forward natively and under each recipe of
   ``emulate_bench.MODEL_RECIPES`` (operand-only FP8/MXFP8/NVFP4 with deterministic and host
   FP32 sums, exact FP16 sums), best of 3, ratios to the native forward (the CPU table's rows).
5. ``tensor_core_speed``: the tensor-core emulation on the device (``fpsim.matmul`` with
   ``order="tensor_core"``, backend "torch", and "compiled" for the first) beside the native
   ``torch.matmul`` on the same operands, multiply-adds per second, best of 3 interleaved;
   and a Llama-shaped model's forward natively and with its linear layers under the
   ``deepseek-v3`` preset (Hopper FP8 tensor-core model, promotion every 128).
6. ``tensor_cores``: real tensor-core outputs on adversarial inputs (``torch.matmul`` in FP16 and
   BF16 with FP32 accumulation, ``torch._scaled_mm`` in FP8) saved as a small fixture
   (``tests/fixtures/tensor_cores_<gpu>.npz``) so that fpsim's ``tensor_core`` presets can be
   checked against hardware on any CPU afterwards; the presets' agreement is printed too.

The dry run uses CPU tensors in Triton's interpreter and a few formats; its tensor-core
"capture" is CPU torch, written under the name ``dry_run`` and never a hardware claim.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))          # kernels_bench and emulate_bench beside this file
RESULTS = HERE / "results"
FIXTURES = HERE.parent / "tests" / "fixtures"
MODES = ("rne", "rna", "rtz", "rup", "rdown", "rto")
DRY_FORMATS = ("fp8_e4m3fn", "fp4_e2m1", "bf16", "int8")
MX_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8", "nvfp4")


def probe(fmt: Any, n_random: int, seed: int = 0) -> np.ndarray:
    """float32 inputs at every edge of ``fmt``: values and midpoints (all of them for formats of
    at most 12 bits, else the extremes and a sample), their float32 neighbours, overflow,
    underflow, specials and random bit patterns."""
    import fpsim

    fmt = fpsim.get_format(fmt)
    rng = np.random.default_rng(seed)
    top = fmt.num_codes >> int(fmt.signed)
    mags = np.arange(min(top, 4096), dtype=np.uint64)
    if top > 4096:
        mags = np.concatenate([mags, rng.integers(4096, top, 4096, dtype=np.uint64),
                               np.arange(top - 512, top, dtype=np.uint64)])
    with np.errstate(all="ignore"):
        v = fpsim.decode(mags, fmt)
        v = np.unique(v[np.isfinite(v) & (v >= 0)])
        edges = [fmt.max * 1.0625, fmt.max * 2, fmt.min_subnormal / 2, fmt.min_subnormal * 0.75,
                 fmt.min_normal]
        grid = np.concatenate([v, (v[1:] + v[:-1]) / 2, edges]).astype(np.float32)
        grid = np.concatenate([grid, -grid])
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38,
                             1e-45, -1e-45, 2.0**-126], np.float32)
        rand = rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32)
        return np.concatenate([grid, np.nextafter(grid, np.float32(np.inf)),
                               np.nextafter(grid, np.float32(-np.inf)), specials,
                               rand.view(np.float32)])


def _bits(a: Any) -> np.ndarray:
    a = a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)
    return a.view(np.uint8 if a.dtype.itemsize == 1 else f"u{a.dtype.itemsize}")


def bitexact(device: str, dry: bool) -> dict:
    """Mismatch counts of the kernels against NumPy, per format and mode (0 everywhere = pass)."""
    import torch

    import fpsim
    import fpsim_kernels as kernels

    names = DRY_FORMATS if dry else [n for n, f in fpsim.FORMATS.items() if kernels.supports(f)]
    out: dict[str, Any] = {"casts": {}, "decode": {}, "mx": {}}
    for name in names:
        fmt = fpsim.get_format(name)
        x = probe(fmt, 256 if dry else 1 << 16)
        tx = torch.from_numpy(x).to(device)
        bad = 0
        for mode in MODES[:2] if dry else MODES:
            for sat in (False, True):
                kw = dict(rounding=mode, saturate=sat)
                q = kernels.quantize(tx, fmt, **kw)
                bad += int((_bits(q) != _bits(fpsim.quantize(x, fmt, **kw))).sum())
                c = kernels.encode(tx, fmt, pack=False, on_nan="zero", **kw)
                ref = fpsim.encode(x, fmt, on_nan="zero", **kw)
                bad += int((_bits(c).astype(np.uint64) != ref.astype(np.uint64)).sum())
        out["casts"][name] = {"inputs": int(x.size), "mismatches": bad}
        if fmt.bits <= 16:
            codes = np.arange(fmt.num_codes, dtype=np.uint64)
            tc = torch.from_numpy(codes.astype(np.int64)).to(device)
            tc = tc.to(torch.uint8) if fmt.bits <= 8 else tc.to(torch.int32)
            got = kernels.decode(tc, fmt, packed=False)
            with np.errstate(all="ignore"):
                want = fpsim.decode(codes, fmt).astype(np.float32)
            out["decode"][name] = int((_bits(got) != _bits(want)).sum())
        dec = f", decode {out['decode'][name]}" if name in out["decode"] else ""
        print(f"bitexact {name:14} casts {bad} mismatches of {x.size} inputs x modes{dec}",
              flush=True)
    x = np.random.default_rng(1).standard_normal((64 if dry else 4096, 256)).astype(np.float32)
    x[0, :3] = [np.inf, np.nan, 1e30]
    x[1] = 0
    tx = torch.from_numpy(x).to(device)
    for name in MX_FORMATS[:2] if dry else MX_FORMATS:
        got = kernels.mx_quantize(tx, name)
        scales, elements = fpsim.mx.quantize(x, name).pack()
        bad = int((_bits(got.scales).reshape(-1) != _bits(scales).reshape(-1)).sum()
                  + (_bits(got.elements).reshape(-1) != _bits(elements).reshape(-1)).sum())
        out["mx"][name] = bad
        print(f"bitexact {name:14} quantize+pack mismatches {bad}", flush=True)
    out["total_mismatches"] = (sum(v["mismatches"] for v in out["casts"].values())
                               + sum(out["decode"].values()) + sum(out["mx"].values()))
    return out


def bandwidth(device: str, dry: bool) -> list[dict]:
    """The rows of ``kernels_bench.py``: GB/s beside a device copy, torch casts and compile."""
    import torch

    import kernels_bench

    x = torch.randn(1 << (12 if dry else 28), device=device)
    return kernels_bench.measure(kernels_bench.rows_for(x, compile_=not dry)
                                 + kernels_bench.shape_rows(device, dry), dry)


MATMULS: tuple[dict, ...] = (
    {"inputs": "fp16", "accum": "fp16"},
    {"inputs": "bf16", "accum": "fp32", "order": "pairwise"},
    {"inputs": "bf16", "accum": "bf16", "order": "chunked", "chunk": 64},
    {"inputs": "fp8_e4m3fn", "order": "tensor_core", "tensor_core": "hopper_fp8"},
    {"inputs": "fp8_e4m3fn", "order": "tensor_core", "tensor_core": "hopper_fp8", "chunk": 128},
    {"inputs": "fp16", "order": "tensor_core", "tensor_core": "hopper_fp16"},
)


def emulation(device: str, dry: bool) -> dict:
    """``fpsim.matmul``/``quantize``/``mx.quantize`` on device tensors vs the NumPy path."""
    import torch

    import fpsim

    rng = np.random.default_rng(2)
    m, k, n = (8, 96, 8) if dry else (256, 768, 768)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    ta, tb = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
    out: dict[str, Any] = {"shape": [m, k, n], "matmul": {}}
    for cfg in MATMULS:
        key = ",".join(f"{k_}={v}" for k_, v in cfg.items())
        t0 = time.perf_counter()
        got = fpsim.matmul(ta, tb, **cfg)
        t_dev = time.perf_counter() - t0
        t0 = time.perf_counter()
        want = fpsim.matmul(a, b, **cfg)
        t_cpu = time.perf_counter() - t0
        bad = int((_bits(got) != _bits(want)).sum())
        out["matmul"][key] = {"mismatches": bad, "device_s": t_dev, "numpy_s": t_cpu}
        print(f"emulation matmul {key:70} mismatches {bad} ({t_dev:.2f} s device, "
              f"{t_cpu:.2f} s NumPy)", flush=True)
    out["quantize_mismatches"] = int((_bits(fpsim.quantize(ta, "fp8_e4m3fn", saturate=True))
                                      != _bits(fpsim.quantize(a, "fp8_e4m3fn",
                                                              saturate=True))).sum())
    return out


def model(device: str, dry: bool) -> list[dict]:
    """The model table of ``emulate_bench.py`` on ``device`` (dry: a one-layer toy model)."""
    import emulate_bench

    if dry:
        return emulate_bench.model_rows(1, device, emulate_bench.DRY_LLAMA, tokens=16)
    return emulate_bench.model_rows(3, device)


#: the tensor-core emulation rows: fpsim.matmul options (operands rounded to ``inputs``)
TC_SPEED: tuple[dict, ...] = (
    {"inputs": "fp8_e4m3fn", "tensor_core": "hopper_fp8", "chunk": 128},
    {"inputs": "fp8_e4m3fn", "tensor_core": "hopper_fp8"},
    {"inputs": "fp16", "tensor_core": "hopper_fp16"},
    {"inputs": "fp8_e4m3fn", "tensor_core": "blackwell_fp8"},
    {"inputs": "fp8_e4m3fn", "tensor_core": "cdna3_fp8"},
)


def tensor_core_speed(device: str, dry: bool) -> dict:
    """The tensor-core models emulated on ``device`` beside the native GEMM, and a model's
    forward under the ``deepseek-v3`` preset beside its native forward (dry: tiny, torch
    backend only, untimed in meaning)."""
    import torch

    import fpsim
    from fpsim import Rule, Rules
    from fpsim.emulation.presets import get_preset

    from timing import best_times

    import emulate_bench

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    m, k, n = (8, 96, 16) if dry else (512, 2048, 2048)
    rng = np.random.default_rng(4)
    ta = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(device)
    tb = torch.from_numpy((rng.standard_normal((k, n)) * 0.05).astype(np.float32)).to(device)
    fns: dict[Any, Callable[[], Any]] = {"native": lambda: (ta @ tb, sync())}
    for i, cfg in enumerate(TC_SPEED):             # compiling takes a minute: the first only
        for backend in ("torch",) if dry or i else ("torch", "compiled"):
            key = (backend, ",".join(f"{k_}={v}" for k_, v in cfg.items()))
            fns[key] = lambda cfg=cfg, backend=backend: (
                fpsim.matmul(ta, tb, order="tensor_core", backend=backend, **cfg), sync())
    best = best_times(fns, 1 if dry else 3)
    macs = m * k * n
    rows = [{"engine": "native torch.matmul float32", "seconds": best["native"],
             "mac_per_s": macs / best["native"], "over_native": 1.0}]
    for key, t in best.items():
        if key != "native":
            rows.append({"engine": f"fpsim {key[0]}", "options": key[1], "seconds": t,
                         "mac_per_s": macs / t, "over_native": t / best["native"]})
            print(f"tensor_core_speed {key[0]:9}{key[1]:60}{macs / t / 1e6:10.0f} M MAC/s "
                  f"{t / best['native']:9.1f}x native", flush=True)
    config, tokens = (emulate_bench.DRY_LLAMA, 16) if dry else (emulate_bench.LLAMA, 256)
    net, ids = emulate_bench.llama(config, tokens, device)
    deepseek = Rules([Rule(get_preset("deepseek-v3").recipe, kind="linear")], default=None)
    table = emulate_bench.forward_rows(
        net, ids, emulate_bench.forward_macs(config, tokens), 1 if dry else 3, device,
        {"native FP32 (no emulation)": None, "deepseek-v3 preset, linear layers": deepseek})
    print(f"tensor_core_speed model: deepseek-v3 linear layers {table[1]['ratio']:.1f}x native",
          flush=True)
    return {"shape": [m, k, n], "rows": rows, "model": table}


def adversarial(k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Operand pairs (a: 16 x k, b: k x 8) where accumulation order and width show: long sums of
    equal terms, cancellation around large values, terms differing only in their low bits,
    products far below the largest one, and random normals."""
    rows = 16
    a = np.ones((rows, k))
    b = np.ones((k, 8))
    a[1] = rng.uniform(0, 1, k)                                     # one-sided: truncation bias
    a[2, ::2], a[2, 1::2] = 1024.0, -1024.0                        # cancellation
    a[2, 5] = 1.0 / 3
    a[3] = 1 + rng.integers(0, 8, k) * 2.0**-9                     # low bits only
    a[4, 0] = 2.0**10                                              # one large term, many small
    a[4, 1:] = 2.0**-12
    a[5] = rng.standard_normal(k) * 2.0**-10                       # small values
    a[6:] = rng.standard_normal((rows - 6, k))
    b[:, 1] = rng.uniform(0, 1, k)
    b[:, 2:] = rng.standard_normal((k, 6))
    return {"a": a, "b": b}


def tensor_cores(device: str, dry: bool, gpu: str, fixtures: Path = FIXTURES) -> dict:
    """Capture real tensor-core products on adversarial inputs into a fixture; compare presets."""
    import torch

    import fpsim

    rng = np.random.default_rng(3)
    cases: dict[str, np.ndarray] = {}
    summary: dict[str, Any] = {}
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    for k in (32, 256) if dry else (32, 256, 4096):
        ops = adversarial(k, rng)
        for dt, name, preset in ((torch.float16, "fp16", "hopper_fp16"),
                                 (torch.bfloat16, "bf16", "hopper_bf16")):
            ta = torch.from_numpy(ops["a"]).to(device, dt)
            tb = torch.from_numpy(ops["b"]).to(device, dt)
            d, rounded_to = _gemm_f32_out(ta, tb)
            key = f"{name}_k{k}"
            cases[f"{key}_a"] = _bits(ta.float())
            cases[f"{key}_b"] = _bits(tb.float())
            cases[f"{key}_d"] = _bits(d)
            cases[f"{key}_d_format"] = np.array(rounded_to or "fp32")
            summary[key] = _agreement(ta.float().cpu().numpy(), tb.float().cpu().numpy(),
                                      d.cpu().numpy(), name, preset, fpsim, rounded_to)
        if hasattr(torch, "_scaled_mm") and (dry or torch.cuda.get_device_capability()[0] >= 9):
            try:
                a8 = torch.from_numpy(ops["a"]).to(device).clamp(-448, 448).to(torch.float8_e4m3fn)
                b8 = torch.from_numpy(ops["b"]).to(device).clamp(-448, 448).to(torch.float8_e4m3fn)
                one = torch.ones((), device=device)
                d8 = torch._scaled_mm(a8, b8.t().contiguous().t(), scale_a=one, scale_b=one,
                                      out_dtype=torch.float32)
                key = f"fp8_k{k}"
                cases[f"{key}_a"] = _bits(a8.float())
                cases[f"{key}_b"] = _bits(b8.float())
                cases[f"{key}_d"] = _bits(d8)
                cases[f"{key}_d_format"] = np.array("fp32")
                summary[key] = _agreement(a8.float().cpu().numpy(), b8.float().cpu().numpy(),
                                          d8.cpu().numpy(), "fp8_e4m3fn", "hopper_fp8", fpsim)
            except (RuntimeError, NotImplementedError) as e:
                summary[f"fp8_k{k}"] = {"error": repr(e)[:300]}
    fixtures.mkdir(parents=True, exist_ok=True)
    path = fixtures / f"tensor_cores_{_slug(gpu, dry)}.npz"
    np.savez_compressed(path, **cases, meta=np.array(json.dumps(
        {"gpu": gpu, "torch": torch.__version__, "dry_run": dry,
         "note": "a, b, d as float32 bit patterns; d = a @ b from the device's GEMM with an "
                 "FP32 result (fp16/bf16: torch.matmul with reduced-precision reduction off; "
                 "fp8: torch._scaled_mm with unit scales)"})))
    print(f"tensor_cores: wrote {path} ({path.stat().st_size / 1e3:.0f} kB)", flush=True)
    summary["fixture"] = str(path)
    return summary


def _gemm_f32_out(ta: Any, tb: Any) -> tuple[Any, str | None]:
    """a @ b of half/bf16 operands from the device GEMM, with the format its result was rounded
    to: FP32 where torch can return the FP32 accumulator (``out_dtype``), else the input dtype
    (the FP32 sum rounded to nearest even), which the comparison then applies too."""
    import torch

    try:
        return torch.mm(ta, tb, out_dtype=torch.float32), None
    except (TypeError, RuntimeError, NotImplementedError):
        name = "fp16" if ta.dtype == torch.float16 else "bf16"
        return torch.mm(ta, tb).float(), name


def _agreement(a: np.ndarray, b: np.ndarray, d: np.ndarray, inputs: str, preset: str,
               fpsim: Any, output: str | None = None) -> dict:
    """How many of the captured outputs each candidate model reproduces bit for bit."""
    cands = {preset: dict(inputs=inputs, order="tensor_core", tensor_core=preset),
             "fp32 sequential": dict(inputs=inputs, accum="fp32"),
             "fp32 pairwise": dict(inputs=inputs, accum="fp32", order="pairwise")}
    res: dict[str, Any] = {"result rounded to": output or "fp32"}
    for name, cfg in cands.items():
        try:
            got = np.asarray(fpsim.matmul(a, b, output=output, **cfg), np.float32)
            res[name] = float((got.view(np.uint32) == d.view(np.uint32)).mean())
        except (ValueError, TypeError) as e:
            res[name] = repr(e)[:200]
    print(f"tensor_cores {inputs:11} K={a.shape[1]:5}: share reproduced {res}", flush=True)
    return res


def _slug(gpu: str, dry: bool) -> str:
    return "dry_run" if dry else re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")


def machine() -> dict:
    import torch

    import triton

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "numpy": np.__version__,
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = torch.cuda.get_device_capability()
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU tensors in the Triton interpreter, tiny sizes (checks the script)")
    ap.add_argument("--only", nargs="*", choices=["bitexact", "bandwidth", "emulation",
                                                  "model", "tensor_core_speed",
                                                  "tensor_cores"],
                    help="run these sections")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON report goes")
    ap.add_argument("--fixture-dir", type=Path, default=FIXTURES,
                    help="where the tensor-core capture goes (default tests/fixtures/)")
    args = ap.parse_args(argv)
    import torch

    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--dry-run needs TRITON_INTERPRET=1 set before Python starts")
        device, gpu = "cpu", "dry-run"
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU; none is visible. "
                         "`TRITON_INTERPRET=1 python benchmarks/gpu_check.py --dry-run` checks "
                         "the script on a CPU.")
    else:
        device, gpu = "cuda", torch.cuda.get_device_name()
    sections: dict[str, Callable[[], Any]] = {
        "bitexact": lambda: bitexact(device, args.dry_run),
        "bandwidth": lambda: bandwidth(device, args.dry_run),
        "emulation": lambda: emulation(device, args.dry_run),
        "model": lambda: model(device, args.dry_run),
        "tensor_core_speed": lambda: tensor_core_speed(device, args.dry_run),
        "tensor_cores": lambda: tensor_cores(device, args.dry_run, gpu, args.fixture_dir)}
    report: dict[str, Any] = {"machine": machine(), "dry_run": args.dry_run}
    failed = False
    for name, fn in sections.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception:  # noqa: BLE001  (one failing section must not lose the others)
            failed = True
            report[name] = {"error": traceback.format_exc(limit=5)[-2000:]}
            print(f"{name} FAILED:\n{report[name]['error']}", file=sys.stderr, flush=True)
        report.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 2)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"gpu_check_{_slug(gpu, args.dry_run)}.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    exact = report.get("bitexact", {}).get("total_mismatches")
    emu = report.get("emulation", {})
    emu_bad = sum(v["mismatches"] for v in emu.get("matmul", {}).values()) if emu else 0
    print(f"wrote {path}; kernel mismatches: {exact}; emulation mismatches: {emu_bad}")
    return 1 if failed or exact or emu_bad else 0


if __name__ == "__main__":
    sys.exit(main())
