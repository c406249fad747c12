"""Compile the kernels for an NVIDIA GPU without one: what the GPU would run, for review and tests.

``python -m fpsim_kernels.ptx [--arch 90]`` compiles representative specialisations ahead of time with
Triton's own compiler and bundled ptxas (no driver, no GPU needed) and prints, per variant: the
widest global load and store, SASS instructions per element, registers, spills, and whether a
flush-to-zero float instruction (it would break subnormals) or an inexact division slipped in.
The Triton interpreter never runs this code generator: this is the check that the GPU path
compiles at all.
Run it without ``TRITON_INTERPRET=1`` (``@triton.jit`` then builds compilable functions).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fpsim.formats import get_format

from fpsim.backend import float64_bits
from fpsim.blockrules import get_block_format

from . import cast, mx
from .rounding import format_spec

ALIGNED = [["tt.divisibility", 16]]


@dataclass(frozen=True)
class Variant:
    """One specialisation: kernel, argument types (``*fp32``, ``i32``...), constexprs."""

    name: str
    kernel: Any
    types: dict
    constexprs: dict
    elements: int            # elements one program handles

    def compile(self, arch: int) -> Any:
        sig = dict(self.types) | {k: "constexpr" for k in self.constexprs}
        names = list(self.kernel.arg_names)
        attrs = {(names.index(k),): ALIGNED for k, t in self.types.items()
                 if t.startswith("*") or k in ("n", "n_bytes", "length")}
        src = ASTSource(fn=self.kernel, signature=sig, constexprs=self.constexprs, attrs=attrs)
        return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": cast.NUM_WARPS})


def _round(name: str, fmt: str, x: str = "*fp32", y: str = "*fp32", mode: str = "rne",
           want: str = "value", pack: bool = False, count_nan: bool = False,
           srbits: int | None = None, given: bool = False) -> Variant:
    f = get_format(fmt)
    per = cast.codes_per_group(f) if pack else 1
    types = {"x_ptr": x, "y_ptr": y, "nan_ptr": "*i32", "rbits_ptr": "*i32", "n": "i32",
             "n_bytes": "i32", "seed": "i64"}
    cons = dict(FMT=format_spec(f), MODE=mode, SATURATE=False, SUBNORMALS=True, WANT=want,
                COUNT_NAN=count_nan, BITS=f.bits, PER=per, BLOCK=cast.BLOCK, SRBITS=srbits,
                GIVEN=given)
    return Variant(name, cast._round_kernel, types, cons, cast.BLOCK)


def _decode(name: str, fmt: str, y: str = "*fp32", pack: bool = False) -> Variant:
    f = get_format(fmt)
    per = cast.codes_per_group(f) if pack else 1
    types = {"c_ptr": "*u8", "y_ptr": y, "n": "i32", "n_bytes": "i32"}
    cons = dict(FMT=format_spec(f), BITS=f.bits, PER=per, BLOCK=cast.BLOCK)
    return Variant(name, cast._decode_kernel, types, cons, cast.BLOCK)


def _mx(name: str, fmt: str, mode: str = "rne", scale_mode: str = "floor",
        ragged: bool = False, x: str = "*fp32", srbits: int | None = None,
        given: bool = False) -> Variant:
    spec = get_block_format(fmt)
    types = {"x_ptr": x, "scale_ptr": "*u8", "elem_ptr": "*u8", "rbits_ptr": "*i32",
             "n_blocks": "i32", "row_blocks": "i32", "length": "i32", "n_bytes": "i32",
             "seed": "i64", "ts": "fp32"}
    cons = dict(ELEM=format_spec(spec.elem), EMAX=spec.emax, MAX_BITS=float64_bits(spec.max),
                MBITS=spec.mbits, ELEM_EXP=spec.elem_exp, SCALE_MODE=scale_mode, MODE=mode,
                NV=not spec.is_mx, IS_INT=spec.elem.is_int, BITS=spec.elem.bits,
                PER=cast.codes_per_group(spec.elem), BS=spec.block_size,
                NB=mx.TILE // spec.block_size, RAGGED=ragged, SRBITS=srbits, GIVEN=given)
    return Variant(name, mx._mx_quantize_kernel, types, cons, mx.TILE)


def _mx_dequant(name: str, fmt: str) -> Variant:
    spec = get_block_format(fmt)
    types = {"scale_ptr": "*u8", "elem_ptr": "*u8", "y_ptr": "*fp32", "n_blocks": "i32",
             "row_blocks": "i32", "length": "i32", "n_bytes": "i32", "ts": "fp32"}
    cons = dict(ELEM=format_spec(spec.elem), ELEM_EXP=spec.elem_exp, NV=not spec.is_mx,
                BITS=spec.elem.bits, PER=cast.codes_per_group(spec.elem), BS=spec.block_size,
                NB=mx.TILE // spec.block_size, RAGGED=False)
    return Variant(name, mx._mx_dequantize_kernel, types, cons, mx.TILE)


def variants() -> list[Variant]:
    return [
        _round("quantize fp32->e4m3->fp32", "fp8_e4m3fn"),
        _round("quantize bf16->e4m3->bf16", "fp8_e4m3fn", "*bf16", "*bf16"),
        _round("quantize fp16->bf16->fp16", "bf16", "*fp16", "*fp16"),
        _round("quantize fp32 stochastic e4m3", "fp8_e4m3fn", mode="stochastic"),
        _round("quantize fp32 stochastic_c e4m3, 8 bits", "fp8_e4m3fn", mode="stochastic_c",
               srbits=8),
        _round("encode fp32->bf16 stochastic, 16 bits given", "bf16", y="*i32", want="code",
               mode="stochastic", srbits=16, given=True),
        _round("encode fp32->e4m3", "fp8_e4m3fn", y="*u8", want="code"),
        _round("encode fp32->int8, NaN count", "int8", y="*u8", want="code", count_nan=True),
        _round("encode fp32->e2m1 packed", "fp4_e2m1", y="*u8", want="code", pack=True),
        _round("encode fp32->e3m2 packed", "fp6_e3m2", y="*u8", want="code", pack=True),
        _round("encode fp32->e3m3 packed (int64 lanes)", "e3m3", y="*u8", want="code",
               pack=True),
        _round("encode fp32->fp32 codes", "fp32", y="*i64", want="code"),
        _decode("decode e4m3->fp32", "fp8_e4m3fn"),
        _decode("decode e2m1 packed->bf16", "fp4_e2m1", y="*bf16", pack=True),
        _decode("decode e3m2 packed->fp32", "fp6_e3m2", pack=True),
        _mx("mx_quantize mxfp8_e4m3", "mxfp8_e4m3"),
        _mx("mx_quantize mxfp8_e4m3 bf16 in, ceil", "mxfp8_e4m3", scale_mode="ceil",
            x="*bf16"),
        _mx("mx_quantize mxfp4 ragged rows", "mxfp4", ragged=True),
        _mx("mx_quantize mxfp6_e3m2 stochastic", "mxfp6_e3m2", mode="stochastic"),
        _mx("mx_quantize mxfp4 stochastic_b, 8 bits given", "mxfp4", mode="stochastic_b",
            srbits=8, given=True),
        _mx("mx_quantize mxint8 rup, even", "mxint8", mode="rup", scale_mode="even"),
        _mx("mx_quantize nvfp4", "nvfp4"),
        _mx_dequant("mx_dequantize mxfp4", "mxfp4"),
        _mx_dequant("mx_dequantize nvfp4", "nvfp4"),
    ]


def _cuda_tool(tool: str, cubin: bytes, *args: str) -> str:
    """Output of one of the CUDA binary tools Triton bundles, run on ``cubin``."""
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([path, *args, f.name], capture_output=True, text=True,
                              check=True).stdout


def _sass(cubin: bytes) -> list[str]:
    text = _cuda_tool("nvdisasm", cubin, "-c")
    return [line for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]


def _resources(cubin: bytes) -> dict:
    """Registers and local memory (spills) per thread, from ``cuobjdump``."""
    text = _cuda_tool("cuobjdump", cubin, "--dump-resource-usage")
    return {k: int(re.search(rf"\b{k}:(\d+)", text)[1]) for k in ("REG", "LOCAL")}


def _widest(ptx: str, op: str) -> int:
    """Widest vector access ``op`` (``ld.global``/``st.global``) in bits, 0 if none."""
    found = re.findall(op + r"(?:\.\w+)*?(?:\.v(\d))?\.b(\d+)", ptx)
    widths = [int(v or 1) * int(b) for v, b in found]
    return max(widths, default=0)


def report(v: Variant, arch: int) -> dict:
    k = v.compile(arch)
    ptx, cubin = k.asm["ptx"], k.asm["cubin"]
    res = _resources(cubin)
    threads = 32 * cast.NUM_WARPS
    return {"variant": v.name, "arch": f"sm_{arch}",
            "widest_load_bits": _widest(ptx, r"ld\.global"),
            "widest_store_bits": _widest(ptx, r"st\.global"),
            "sass_per_element": round(len(_sass(cubin)) * threads / v.elements, 1),
            "registers": res["REG"], "local_bytes": res["LOCAL"],
            "ftz": bool(re.search(r"\.ftz", ptx)),
            "approx_div": bool(re.search(r"div\.(approx|full)", ptx))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90, 100")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter has no compiler to inspect")
    rows = [report(v, args.arch) for v in variants()]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'variant':42}{'load':>6}{'store':>7}{'SASS/elem':>11}{'regs':>6}{'local':>7}"
          f"{'ftz':>6}{'~div':>6}")
    for r in rows:
        print(f"{r['variant']:42}{r['widest_load_bits']:6}{r['widest_store_bits']:7}"
              f"{r['sass_per_element']:11}{r['registers']:6}{r['local_bytes']:7}"
              f"{str(r['ftz']):>6}{str(r['approx_div']):>6}")


if __name__ == "__main__":
    main()
