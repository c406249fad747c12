"""Regenerate tests/data/mmasim_fixture.npz: MMA-Sim's outputs on adversarial inputs.

For every preset of ``fpsim.arith.TENSOR_CORES`` this runs the PTX instruction it models through
microsoft/MMA-Sim (its Python models run on the CPU) twice in a chain, D = A2·B2 + (A1·B1 + C),
on inputs built to break a model: zeros beside large values (the alignment of zero operands),
subnormals and near-maximal values, products straddling the alignment cut-off, C cancelling
the sum (results truncated to zero, their sign), inf and NaN, overflow; for the FMA chains
(FP64, AMD FP32) also products whose order changes the result.  The fixture stores the inputs
as float32 codes (float64 for FP64 instructions) and MMA-Sim's D as codes of its result
format; the test ``tests/test_tensor_core_fixture.py`` compares fpsim bit for bit without
MMA-Sim.

    python scripts/mmasim_fixture.py [--mmasim PATH/TO/MMA-Sim] [--out tests/data/...npz]

PATH is a checkout of https://github.com/microsoft/MMA-Sim (needs torch); without it the
``mmasim`` package must be importable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import fpsim

#: preset[:variant] -> (MMA-Sim architecture, instruction class, qualifier, format of A, of B)
INSTRUCTIONS: dict[str, tuple[str, str, str, str, str]] = {
    "volta_fp16": ("Volta", "mma", "m8n8k4.f32.f16.f16.f32", "fp16", "fp16"),
    "volta_fp16_f16": ("Volta", "mma", "m8n8k4.f16.f16.f16.f16", "fp16", "fp16"),
    "turing_fp16": ("Turing", "mma", "m16n8k8.f32.f16.f16.f32", "fp16", "fp16"),
    "turing_fp16_f16": ("Turing", "mma", "m16n8k8.f16.f16.f16.f16", "fp16", "fp16"),
    "ampere_fp16": ("Ampere", "mma", "m16n8k16.f32.f16.f16.f32", "fp16", "fp16"),
    "ampere_fp16_f16": ("Ampere", "mma", "m16n8k16.f16.f16.f16.f16", "fp16", "fp16"),
    "ampere_bf16": ("Ampere", "mma", "m16n8k16.f32.bf16.bf16.f32", "bf16", "bf16"),
    "ampere_tf32": ("Ampere", "mma", "m16n8k8.f32.tf32.tf32.f32", "tf32", "tf32"),
    "ada_fp16": ("Ada Lovelace", "mma", "m16n8k16.f32.f16.f16.f32", "fp16", "fp16"),
    "ada_fp16_f16": ("Ada Lovelace", "mma", "m16n8k16.f16.f16.f16.f16", "fp16", "fp16"),
    "ada_bf16": ("Ada Lovelace", "mma", "m16n8k16.f32.bf16.bf16.f32", "bf16", "bf16"),
    "ada_tf32": ("Ada Lovelace", "mma", "m16n8k8.f32.tf32.tf32.f32", "tf32", "tf32"),
    "ada_fp8": ("Ada Lovelace", "mma", "m16n8k32.f32.e4m3.e5m2.f32", "e4m3", "e5m2"),
    "ada_fp8_f16": ("Ada Lovelace", "mma", "m16n8k32.f16.e4m3.e5m2.f16", "e4m3", "e5m2"),
    "hopper_fp16": ("Hopper", "wgmma", "m64n8k16.f32.f16.f16", "fp16", "fp16"),
    "hopper_fp16_f16": ("Hopper", "wgmma", "m64n8k16.f16.f16.f16", "fp16", "fp16"),
    "hopper_bf16": ("Hopper", "wgmma", "m64n8k16.f32.bf16.bf16", "bf16", "bf16"),
    "hopper_tf32": ("Hopper", "wgmma", "m64n8k8.f32.tf32.tf32", "tf32", "tf32"),
    "hopper_fp8": ("Hopper", "wgmma", "m64n8k32.f32.e4m3.e5m2", "e4m3", "e5m2"),
    "hopper_fp8_f16": ("Hopper", "wgmma", "m64n8k32.f16.e5m2.e4m3", "e5m2", "e4m3"),
    "blackwell_fp16": ("Blackwell", "tcgen05mma", "m64n8k16.f32.f16.f16", "fp16", "fp16"),
    "blackwell_fp16_f16": ("Blackwell", "tcgen05mma", "m64n8k16.f16.f16.f16", "fp16", "fp16"),
    "blackwell_bf16": ("Blackwell", "tcgen05mma", "m64n8k16.f32.bf16.bf16", "bf16", "bf16"),
    "blackwell_tf32": ("Blackwell", "tcgen05mma", "m64n8k8.f32.tf32.tf32", "tf32", "tf32"),
    "blackwell_fp8": ("Blackwell", "tcgen05mma", "m64n8k32.f32.e4m3.e5m2", "e4m3", "e5m2"),
    "blackwell_fp8_f16": ("Blackwell", "tcgen05mma", "m64n8k32.f16.e4m3.e4m3", "e4m3", "e4m3"),
    "rtx_blackwell_fp16": ("RTX Blackwell", "mma", "m16n8k16.f32.f16.f16.f32", "fp16", "fp16"),
    "rtx_blackwell_fp16_f16": ("RTX Blackwell", "mma", "m16n8k16.f16.f16.f16.f16", "fp16",
                               "fp16"),
    "rtx_blackwell_bf16": ("RTX Blackwell", "mma", "m16n8k16.f32.bf16.bf16.f32", "bf16", "bf16"),
    "rtx_blackwell_tf32": ("RTX Blackwell", "mma", "m16n8k8.f32.tf32.tf32.f32", "tf32", "tf32"),
    "rtx_blackwell_fp8": ("RTX Blackwell", "mma", "m16n8k32.f32.e4m3.e5m2.f32", "e4m3", "e5m2"),
    "rtx_blackwell_fp8_k16": ("RTX Blackwell", "mma", "m16n8k16.f32.e5m2.e4m3.f32", "e5m2",
                              "e4m3"),
    "rtx_blackwell_fp8_f16": ("RTX Blackwell", "mma", "m16n8k32.f16.e4m3.e4m3.f16", "e4m3",
                              "e4m3"),
    "ampere_fp64": ("Ampere", "mma", "m8n8k4.f64.f64.f64.f64", "fp64", "fp64"),
    "hopper_fp64": ("Hopper", "mma", "m16n8k16.f64.f64.f64.f64", "fp64", "fp64"),
    "cdna1_fp32": ("CDNA1", "mfma", "f32_32x32x2f32", "fp32", "fp32"),
    "cdna2_fp32": ("CDNA2", "mfma", "f32_16x16x4f32", "fp32", "fp32"),
    "cdna2_fp64": ("CDNA2", "mfma", "f64_16x16x4f64", "fp64", "fp64"),
    "cdna3_fp32": ("CDNA3", "mfma", "f32_16x16x4_f32", "fp32", "fp32"),
    "cdna3_fp64": ("CDNA3", "mfma", "f64_16x16x4_f64", "fp64", "fp64"),
    "cdna1_fp16": ("CDNA1", "mfma", "f32_32x32x4f16", "fp16", "fp16"),
    "cdna1_bf16": ("CDNA1", "mfma", "f32_32x32x2bf16", "bf16", "bf16"),
    "cdna2_fp16": ("CDNA2", "mfma", "f32_32x32x4f16", "fp16", "fp16"),
    "cdna2_bf16": ("CDNA2", "mfma", "f32_32x32x4bf16_1k", "bf16", "bf16"),
    "cdna2_bf16_k2": ("CDNA2", "mfma", "f32_32x32x2bf16", "bf16", "bf16"),
    "cdna3_fp16": ("CDNA3", "mfma", "f32_16x16x16_f16", "fp16", "fp16"),
    "cdna3_bf16": ("CDNA3", "mfma", "f32_16x16x16_bf16", "bf16", "bf16"),
    "cdna3_fp16_k4": ("CDNA3", "mfma", "f32_32x32x4_2b_f16", "fp16", "fp16"),
    "cdna3_bf16_k4": ("CDNA3", "mfma", "f32_16x16x4_4b_bf16", "bf16", "bf16"),
    "cdna3_xf32": ("CDNA3", "mfma", "f32_16x16x8_xf32", "tf32", "tf32"),
    "cdna3_fp8": ("CDNA3", "mfma", "f32_16x16x32_fp8_bf8", "fp8_e4m3fnuz", "fp8_e5m2fnuz"),
    # FP32 operands that TF32/XF32 instructions truncate to TF32 (preset:variant entries)
    "ampere_tf32:fp32": ("Ampere", "mma", "m16n8k8.f32.tf32.tf32.f32", "fp32", "fp32"),
    "hopper_tf32:fp32": ("Hopper", "wgmma", "m64n8k8.f32.tf32.tf32", "fp32", "fp32"),
    "cdna3_xf32:fp32": ("CDNA3", "mfma", "f32_16x16x8_xf32", "fp32", "fp32"),
}
#: block-scaled entries -> (preset, MMA-Sim architecture, class, qualifier, MX format of A, of
#: B, block size)
BLOCK_SCALED: dict[str, tuple[str, str, str, str, str, str, int]] = {
    "blackwell_mxf8f6f4": ("blackwell_mxf8f6f4", "Blackwell", "tcgen05mma_block_scale",
                           "m128n8k32.block32.f32.e4m3.e5m2.ue8m0", "mxfp8_e4m3", "mxfp8_e5m2",
                           32),
    "blackwell_mxf4nvf4": ("blackwell_mxf4nvf4", "Blackwell", "tcgen05mma_block_scale",
                           "m128n8k64.block32.f32.e2m1.e2m1.ue8m0", "mxfp4", "mxfp4", 32),
    "blackwell_mxf4nvf4:block16": ("blackwell_mxf4nvf4", "Blackwell", "tcgen05mma_block_scale",
                                   "m128n8k64.block16.f32.e2m1.e2m1.ue8m0", "mxfp4", "mxfp4",
                                   16),
    "blackwell_mxf4nvf4:nvfp4": ("blackwell_mxf4nvf4", "Blackwell", "tcgen05mma_block_scale",
                                 "m128n8k64.block16.f32.e2m1.e2m1.ue4m3", "nvfp4", "nvfp4", 16),
    "rtx_blackwell_mxf8f6f4": ("rtx_blackwell_mxf8f6f4", "RTX Blackwell", "mma_block_scale",
                               "m16n8k32.block32.f32.e5m2.e4m3.f32.ue8m0", "mxfp8_e5m2",
                               "mxfp8_e4m3", 32),
    "rtx_blackwell_mxf4nvf4": ("rtx_blackwell_mxf4nvf4", "RTX Blackwell", "mma_block_scale",
                               "m16n8k64.block16.f32.e2m1.e2m1.f32.ue4m3", "nvfp4", "nvfp4", 16),
}
ROWS = 16           # rows of A kept (the instructions' m is 8 to 64; rows are independent)
CHAIN = 2           # instructions chained per case (more where k < 4: K >= 8)
CASES = 4           # cases per preset, the first with ordinary values only


def values(fmt: str, shape: tuple, rng: np.random.Generator, mixed: bool) -> np.ndarray:
    """Ordinary values of ``fmt`` or (``mixed``) a mixture of ordinary, wide-range (products
    stay finite), subnormal and zero values."""
    f = fpsim.get_format(fmt)
    p = [0.55, 0.2, 0.15, 0.1] if mixed else [1.0, 0, 0, 0]
    kind = rng.choice(4, size=shape, p=p)
    sign = rng.choice([-1.0, 1.0], size=shape)
    ordinary = rng.standard_normal(shape) * np.exp2(rng.integers(-4, 5, shape))
    wide = np.exp2(rng.uniform(f.emin - f.mbits, f.emax // 2, shape))
    sub = f.min_normal * rng.uniform(0, 1, shape)
    x = np.choose(kind, [ordinary, sign * wide, sign * sub, sign * 0.0])
    return fpsim.quantize(x, fmt, saturate=True)


def case(name: str, rng: np.random.Generator, m: int, k: int,
         mixed: bool) -> dict[str, np.ndarray]:
    """Inputs of one preset's chain: A (ROWS, K), B (K, 8), C (ROWS, 8), K = CHAIN*k or 8."""
    _, _, q, fa, fb = INSTRUCTIONS[name]
    model = fpsim.arith.TENSOR_CORES[name.split(":")[0]]
    cfmt = model.c_format.name
    rows, K = min(ROWS, m), max(CHAIN * k, 8)
    a, b = values(fa, (rows, K), rng, mixed), values(fb, (K, 8), rng, mixed)
    ga, gb = fpsim.get_format(fa), fpsim.get_format(fb)
    # row 0 / col 0: a zero beside a large operand, then small products (zero alignment)
    a[0, :] = 0.0
    b[:, 0] = 0.0
    a[0, 1:4], b[0, 0], b[1:4, 0] = ga.min_normal * 1.875, gb.max, gb.min_normal * 1.5
    # row 1: products straddling the cut-off below a leading product of 1
    a[1, :] = fpsim.quantize(np.exp2(-rng.integers(10, 30, K)) * rng.uniform(1, 2, K), fa)
    a[1, 0] = 1.0
    # rows 2, 3: inf (NaN where the format has no inf) and NaN
    a[2, 3] = np.inf if ga.inf else np.nan
    a[3, 5] = np.nan
    # row 4: every value near the maximum (overflow of narrow results)
    a[4, :] = ga.max * np.sign(rng.standard_normal(K) + 0.5)
    if model.structure == "fma":
        # row 5: +big, -big, then small products: each fma rounds, so the order shows
        big, small = 2.0 ** (ga.emax // 2), 2.0 ** -(ga.mbits + 5)
        a[5, :3], b[:3, :] = 1.0, np.array([[big], [-big], [small]])
        # row 6: products that fall below the least subnormal unless C and their sum keep them
        a[6, :] = ga.min_normal * rng.uniform(0, 1, K)
        # row 7: -0 products onto C = -0 (column 5) stay -0 in IEEE fma
        a[7, :], b[:, 5] = -0.0, abs(b[:, 5])
    c = values(cfmt, (rows, 8), rng, mixed)
    c[:, 5] = -0.0
    exact = a.astype(np.float64) @ b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        c[:, 6:] = -fpsim.quantize(exact[:, 6:], cfmt)            # cancellation: D near 0
    c[:, 6:] = np.where(np.isfinite(c[:, 6:]), c[:, 6:], 0.0)
    return {"a": a, "b": b, "c": c}


def _float32_pairwise_dot(amd: object) -> None:
    """MMA-Sim's ``pairwise_dot`` asserts float32 operands, but its CDNA1/2 ``mfma`` passes the
    FP16/BF16 ones as they are: convert them (exactly) first, changing nothing else."""
    inner = amd.pairwise_dot
    if getattr(inner, "float32_shim", False):
        return

    def shim(a: object, b: object, flush_denormal: bool = False) -> float:
        return inner(a.float(), b.float(), flush_denormal)

    shim.float32_shim = True
    amd.pairwise_dot = shim


def instruction(name: str) -> object:
    """MMA-Sim's model of the preset's instruction."""
    from mmasim.simulator import amd, nv_ptx

    _float32_pairwise_dot(amd)
    arch, cls, q, _, _ = INSTRUCTIONS[name]
    return getattr(amd if cls == "mfma" else nv_ptx, cls)(arch, q)


def run_mmasim(name: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """MMA-Sim's D for the chain, as codes of the result format (uint16 or uint32)."""
    import torch

    inst = instruction(name)
    a, b, c = inputs["a"], inputs["b"], inputs["c"]
    rows, k, cols = a.shape[0], inst.k, b.shape[1]
    D = torch.zeros((inst.m, inst.n), dtype=inst.c_type)
    D[:rows, :cols] = torch.from_numpy(c).to(inst.c_type)
    for r in range(a.shape[1] // k):
        A = torch.zeros((inst.m, k), dtype=inst.a_type)
        A[:rows] = torch.from_numpy(a[:, r * k:(r + 1) * k]).to(inst.a_type)
        B = torch.zeros((k, inst.n), dtype=inst.b_type)
        B[:, :cols] = torch.from_numpy(b[r * k:(r + 1) * k]).to(inst.b_type)
        D = inst(A, B, D)
    D = D[:rows, :cols].contiguous()
    bits = {torch.float16: torch.int16, torch.float64: torch.int64}.get(D.dtype, torch.int32)
    return D.view(bits).numpy().view(f"u{bits.itemsize}")


def codes(spec: str, shape: tuple, rng: np.random.Generator, mixed: bool) -> np.ndarray:
    """Element codes of an MX format: every code when ``mixed`` (NaN and inf codes rare),
    else codes of ordinary values."""
    elem = fpsim.mx.get_mx_format(spec).elem
    finite = np.flatnonzero(np.isfinite(fpsim.decode(np.arange(elem.num_codes), elem)))
    out = rng.choice(finite, size=shape).astype(np.uint8)
    if mixed:
        out[rng.uniform(size=shape) < 0.01] = rng.integers(0, elem.num_codes, dtype=np.uint8)
    return out


def scale_codes(spec: str, shape: tuple, rng: np.random.Generator, mixed: bool) -> np.ndarray:
    """E8M0 codes near 2^0 (mixed: 2^-127 to 2^50; MMA-Sim's mxf4nvf4 path cannot take NaN
    scales nor an infinite C, so results stay finite) or positive E4M3 codes (mixed: subnormal,
    zero)."""
    if fpsim.mx.get_mx_format(spec).is_mx:
        out = rng.integers(120, 135, shape) if not mixed else rng.integers(0, 178, shape)
        if mixed:
            out[rng.uniform(size=shape) < 0.9] = rng.integers(100, 155)
        return out.astype(np.uint8)
    return rng.integers(0 if mixed else 0x30, 0x7F, shape).astype(np.uint8)


def block_case(entry: str, rng: np.random.Generator, m: int, k: int,
               mixed: bool) -> dict[str, np.ndarray]:
    """Codes of a block-scaled chain: A (ROWS, CHAIN*k) with its scales, B, C."""
    _, _, _, _, fa, fb, bs = BLOCK_SCALED[entry]
    rows, K = min(ROWS, m), CHAIN * k
    out = {"a": codes(fa, (rows, K), rng, mixed), "b": codes(fb, (K, 8), rng, mixed),
           "sa": scale_codes(fa, (rows, K // bs), rng, mixed),
           "sb": scale_codes(fb, (K // bs, 8), rng, mixed)}
    ma, mb = mx_arrays(out, fa, fb, bs)
    exact = ma.dequantize(np.float64) @ mb.dequantize(np.float64)
    c = values("fp32", (rows, 8), rng, mixed)
    with np.errstate(invalid="ignore", over="ignore"):
        c[:, 6:] = -fpsim.quantize(exact[:, 6:], "fp32")
    out["c"] = np.where(np.isfinite(c), c, 0.0)
    return out


def mx_arrays(x: dict[str, np.ndarray], fa: str, fb: str, bs: int) -> tuple:
    """The fixture's codes as fpsim MXArrays, blocked along K (tensor scale 1)."""
    ts = 1.0 if fa == "nvfp4" else None
    a = fpsim.mx.MXArray(x["sa"], x["a"], fpsim.mx.get_mx_format(fa), x["a"].ndim - 1, bs,
                         x["a"].shape, ts)
    b = fpsim.mx.MXArray(x["sb"], x["b"], fpsim.mx.get_mx_format(fb), x["b"].ndim - 2, bs,
                         x["b"].shape, ts)
    return a, b


def run_mmasim_block(entry: str, x: dict[str, np.ndarray]) -> np.ndarray:
    """MMA-Sim's D (float32 codes) for a block-scaled chain."""
    import torch
    from mmasim.simulator import nv_ptx

    _, arch, cls, q, fa, fb, bs = BLOCK_SCALED[entry]
    inst = getattr(nv_ptx, cls)(arch, q)
    rows, k, pack = x["a"].shape[0], inst.k, inst.packing
    D = torch.zeros((inst.m, inst.n), dtype=torch.float32)
    D[:rows] = torch.from_numpy(x["c"].astype(np.float32))
    for r in range(CHAIN):
        a, b = x["a"][:, r * k:(r + 1) * k], x["b"][r * k:(r + 1) * k]
        sa, sb = x["sa"][:, r * k // bs:(r + 1) * k // bs], x["sb"][r * k // bs:(r + 1) * k // bs]
        if pack == 2:
            a, b = a[:, 0::2] | a[:, 1::2] << 4, b[0::2] | b[1::2] << 4
        A = torch.zeros((inst.m, k // pack), dtype=torch.uint8)
        A[:rows] = torch.from_numpy(np.ascontiguousarray(a))
        SA = torch.full((inst.m, k // bs), 127 if fa != "nvfp4" else 0x38, dtype=torch.uint8)
        SA[:rows] = torch.from_numpy(np.ascontiguousarray(sa))
        B = torch.from_numpy(np.ascontiguousarray(b))
        SB = torch.from_numpy(np.ascontiguousarray(sb))
        if pack == 1:
            A, B = A.view(inst.a_type), B.view(inst.b_type)
        D = inst(A, B, D, SA.view(inst.s_type), SB.view(inst.s_type))
    return D[:rows].contiguous().view(torch.int32).numpy().view(np.uint32)


def main(argv: list[str] | None = None) -> int:
    """Build the fixture; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mmasim", help="path to a checkout of microsoft/MMA-Sim")
    parser.add_argument("--out", default=str(Path(__file__).parents[1] / "tests" / "data" /
                                             "mmasim_fixture.npz"))
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args(argv)
    if args.mmasim:
        sys.path.insert(0, args.mmasim)
    from mmasim.simulator import nv_ptx

    rng = np.random.default_rng(args.seed)
    arrays, meta = {}, {}
    for name, (arch, cls, q, fa, fb) in INSTRUCTIONS.items():
        inst = instruction(name)
        cases = [case(name, rng, inst.m, inst.k, mixed=i > 0) for i in range(CASES)]
        wide = "fp64" in (fa, fb)                  # FP64 operands: float64 codes
        for key in "abc":
            arrays[f"{name}.{key}"] = np.stack([x[key] for x in cases]).astype(
                np.float64 if wide else np.float32).view(np.uint64 if wide else np.uint32)
        arrays[f"{name}.d"] = np.stack([run_mmasim(name, x) for x in cases])
        meta[name] = {"arch": arch, "instruction": f"{cls}.{q}", "inputs": [fa, fb],
                      "preset": name.split(":")[0]}
        print(f"{name}: {arch} {cls}.{q}", flush=True)
    for entry, (preset, arch, cls, q, fa, fb, bs) in BLOCK_SCALED.items():
        inst = getattr(nv_ptx, cls)(arch, q)
        cases = [block_case(entry, rng, inst.m, inst.k, mixed=i > 0) for i in range(CASES)]
        for key in ("a", "b", "sa", "sb"):
            arrays[f"{entry}.{key}"] = np.stack([x[key] for x in cases])
        arrays[f"{entry}.c"] = np.stack([x["c"] for x in cases]).astype(np.float32).view(
            np.uint32)
        arrays[f"{entry}.d"] = np.stack([run_mmasim_block(entry, x) for x in cases])
        meta[entry] = {"arch": arch, "instruction": f"{cls}.{q}", "preset": preset,
                       "mx": [fa, fb], "block_size": bs}
        print(f"{entry}: {arch} {cls}.{q}", flush=True)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
