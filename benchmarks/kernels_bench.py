"""Triton cast kernels on a GPU: GB/s moved and the share of the device's own copy bandwidth.

For 2^28-element inputs (``--log2n``) each row reports the bytes it must move (bytes read +
bytes written), its median time (``triton.testing.do_bench``) and GB/s, also as a share of a
device-to-device copy timed in the same run (the practical ceiling).  Rows:

* peers: torch's native casts ``x.to(torch.float8_e4m3fn)`` and ``.to(torch.bfloat16)``;
* the kernels: quantize / encode / decode for FP8, BF16, packed FP6 and FP4, stochastic rounding,
  16-bit inputs, MX (MXFP8, MXFP4, NVFP4) quantize and dequantize;
* what fusion buys: the same fake quantization (float32 -> E4M3 -> float32) as fpsim's eager
  torch ops (bytes counted per op with a dispatch mode), under ``torch.compile`` (bytes: its
  input and output only, the least it can move) and as the Triton kernel;
* one cast at a ragged and at a "nice" size: 50257 x 768 (GPT-2's vocabulary) vs 50304 x 768.

Prints a table and writes JSON and markdown into ``benchmarks/results/`` named after the GPU.
Needs a CUDA GPU; ``--dry-run`` runs every row once at 4096 elements on CPU through the Triton
interpreter (``TRITON_INTERPRET=1``) to check the script itself, timing nothing of interest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fpsim

RESULTS = Path(__file__).parent / "results"


@dataclass
class Row:
    group: str
    name: str
    fn: Callable[[], object]
    bytes_moved: int | None = None       # None: count the bytes of every op of one call
    note: str = ""


class _ByteCounter(TorchDispatchMode):
    """Bytes of every tensor each torch op reads and writes (inputs and outputs, once each);
    views and ``empty`` allocations move nothing.  Triton launches are not seen."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or func._schema.name.startswith("aten::empty")):
            for t in _tensors((args, kwargs or {}, out)):
                self.bytes += t.numel() * t.element_size()
        return out


def _tensors(obj: object):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def counted_bytes(fn: Callable[[], object]) -> int:
    with _ByteCounter() as counter:
        fn()
    return counter.bytes


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def rows_for(x: torch.Tensor, compile_: bool) -> list[Row]:
    """Every measured row for a float32 input ``x`` (outputs allocated once, up front)."""
    import fpsim_kernels as kernels

    n = x.numel()
    xb, xh = x.to(torch.bfloat16), x.to(torch.float16)
    e4 = kernels.encode(x, "fp8_e4m3fn", saturate=True)
    f4 = kernels.encode(x, "fp4_e2m1")
    f6 = kernels.encode(x, "fp6_e3m2")
    in_out = lambda out: nbytes(x, out)  # noqa: E731
    dst = torch.empty_like(x)
    rows = [
        Row("copy", "device copy (ceiling)", lambda: dst.copy_(x), 2 * nbytes(x)),
        Row("torch", "x.to(float8_e4m3fn)", lambda: x.to(torch.float8_e4m3fn), in_out(e4)),
        Row("torch", "x.to(bfloat16)", lambda: x.to(torch.bfloat16), in_out(xb)),
        Row("kernels", "encode fp32->e4m3 (saturate, = torch)",
            lambda: kernels.encode(x, "fp8_e4m3fn", saturate=True), in_out(e4)),
        Row("kernels", "quantize fp32->bf16->fp32", lambda: kernels.quantize(x, "bf16"),
            2 * nbytes(x)),
        Row("kernels", "quantize bf16->e4m3->bf16", lambda: kernels.quantize(xb, "fp8_e4m3fn"),
            2 * nbytes(xb)),
        Row("kernels", "quantize fp16->e5m2->fp16", lambda: kernels.quantize(xh, "fp8_e5m2"),
            2 * nbytes(xh)),
        Row("kernels", "encode fp32->e3m2 packed (FP6)", lambda: kernels.encode(x, "fp6_e3m2"),
            in_out(f6)),
        Row("kernels", "encode fp32->e2m1 packed (FP4)", lambda: kernels.encode(x, "fp4_e2m1"),
            in_out(f4)),
        Row("kernels", "encode fp32->e4m3 stochastic",
            lambda: kernels.encode(x, "fp8_e4m3fn", rounding="stochastic", seed=0), in_out(e4)),
        Row("kernels", "decode e4m3->fp32", lambda: kernels.decode(e4, "fp8_e4m3fn"),
            in_out(e4)),
        Row("kernels", "decode e2m1 packed->bf16",
            lambda: kernels.decode(f4, "fp4_e2m1", count=n, dtype=torch.bfloat16),
            nbytes(f4, xb)),
    ]
    for fmt, extra in (("mxfp8_e4m3", {}), ("mxfp4", {}), ("nvfp4", {"tensor_scale": 0.01})):
        packed = kernels.mx_quantize(x, fmt, **extra)
        moved = nbytes(x, packed.scales, packed.elements)
        rows.append(Row("mx", f"mx_quantize {fmt}{' (tensor_scale given)' if extra else ''}",
                        lambda f=fmt, e=extra: kernels.mx_quantize(x, f, **e), moved))
    nvfp4 = lambda: kernels.mx_quantize(x, "nvfp4")  # noqa: E731
    rows.append(Row("mx", "mx_quantize nvfp4 (tensor amax first)", nvfp4,
                    rows[-1].bytes_moved + counted_bytes(nvfp4),
                    "bytes: kernel I/O + the torch ops of fpsim's tensor amax"))
    packed = kernels.mx_quantize(x, "mxfp4")
    rows.append(Row("mx", "mx_dequantize mxfp4 -> fp32",
                    lambda: kernels.mx_dequantize(packed.scales, packed.elements, "mxfp4",
                                                  tuple(x.shape)),
                    nbytes(x, packed.scales, packed.elements)))

    def fake_quant_torch() -> torch.Tensor:
        return fpsim.quantize(x, "e4m3", saturate=True, backend="torch")

    rows.append(Row("fusion", "fake-quant e4m3: fpsim torch ops, eager", fake_quant_torch, None,
                    "bytes counted op by op"))
    if compile_:
        compiled = torch.compile(fake_quant_torch)
        rows.append(Row("fusion", "fake-quant e4m3: fpsim torch ops, torch.compile", compiled,
                        2 * nbytes(x), "bytes: input + output (the least it can move)"))
    rows.append(Row("fusion", "fake-quant e4m3: Triton kernel",
                    lambda: kernels.quantize(x, "e4m3", saturate=True), 2 * nbytes(x)))
    return rows


def shape_rows(device: str, dry: bool) -> list[Row]:
    """One cast at a ragged and at a nice size (GPT-2's vocabulary x 768 vs padded to 64)."""
    import fpsim_kernels as kernels

    rows = []
    for vocab in ((50, 64) if dry else (50257, 50304)):
        w = torch.randn(vocab, 12 if dry else 768, device=device)
        out = torch.empty(w.shape, dtype=torch.uint8, device=device)
        rows.append(Row("shape", f"encode e4m3 {vocab}x{w.shape[1]}",
                        lambda w=w: kernels.encode(w, "fp8_e4m3fn", saturate=True),
                        nbytes(w, out)))
        rows.append(Row("shape", f"torch .to(e4m3) {vocab}x{w.shape[1]}",
                        lambda w=w: w.to(torch.float8_e4m3fn), nbytes(w, out)))
    return rows


def time_ms(fn: Callable[[], object], dry: bool) -> float:
    if dry:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def measure(rows: list[Row], dry: bool) -> list[dict]:
    out, copy_gbs = [], None
    for r in rows:
        try:
            moved = r.bytes_moved if r.bytes_moved is not None else counted_bytes(r.fn)
            ms = time_ms(r.fn, dry)
        except Exception as e:  # noqa: BLE001  (one failing row must not lose the others)
            print(f"{r.group:8} {r.name:52} failed: {e!r:.300}", flush=True)
            out.append({"group": r.group, "row": r.name, "error": repr(e)[:1000]})
            continue
        gbs = moved / ms / 1e6
        copy_gbs = gbs if r.group == "copy" else copy_gbs
        out.append({"group": r.group, "row": r.name, "bytes_moved": moved, "ms": ms,
                    "GB/s": gbs, "share_of_copy": gbs / copy_gbs if copy_gbs else None,
                    "note": r.note})
        print(f"{r.group:8} {r.name:52} {moved / 1e6:10.1f} MB {ms:9.3f} ms {gbs:8.1f} GB/s"
              f" {100 * out[-1]['share_of_copy'] if copy_gbs else float('nan'):6.1f} %",
              flush=True)
    return out


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Triton cast kernels on {meta['gpu']}", "",
             f"{meta['elements']:,} float32 elements (2^{meta['log2n']}); time: {meta['timer']}; "
             "share = GB/s / device-copy GB/s measured in the same run "
             f"({rows[0]['GB/s']:.0f} GB/s). torch {meta['torch']}, triton {meta['triton']}.",
             "", "| group | row | MB moved | ms | GB/s | share of copy | note |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['group']} | {r['row']} | | | | | failed: {r['error'][:80]} |")
            continue
        lines.append(f"| {r['group']} | {r['row']} | {r['bytes_moved'] / 1e6:.1f} | "
                     f"{r['ms']:.3f} | {r['GB/s']:.0f} | {100 * r['share_of_copy']:.0f}% | "
                     f"{r['note']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("--dry-run", action="store_true",
                    help="check the script on CPU in the Triton interpreter (tiny, untimed)")
    args = ap.parse_args(argv)
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--dry-run needs TRITON_INTERPRET=1 set before Python starts")
        device, log2n, gpu = "cpu", 12, "dry-run"
    elif not torch.cuda.is_available():
        raise SystemExit("kernels_bench.py measures GPU memory bandwidth and needs a CUDA GPU; "
                         "none is visible here. Without one: `python -m fpsim_kernels.ptx` shows what "
                         "the kernels compile to (vector widths, SASS per element), and "
                         "`TRITON_INTERPRET=1 python benchmarks/kernels_bench.py --dry-run` "
                         "checks this script.")
    else:
        device, log2n, gpu = "cuda", args.log2n, torch.cuda.get_device_name()
    x = torch.randn(1 << log2n, device=device)
    rows = measure(rows_for(x, compile_=not (args.no_compile or args.dry_run))
                   + shape_rows(device, args.dry_run), args.dry_run)
    import triton

    meta = {"gpu": gpu, "log2n": log2n, "elements": 1 << log2n, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "timer": "perf_counter (dry run)" if
            args.dry_run else "triton.testing.do_bench median, warmup 25 ms, rep 200 ms"}
    slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"kernels_{slug}.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                         indent=2))
    (out / f"kernels_{slug}.md").write_text(markdown(meta, rows))
    print(f"wrote {out / f'kernels_{slug}.json'} and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
