"""Regenerate tests/data/mmasim_fixture.npz: MMA-Sim's outputs on adversarial inputs.

For every preset of ``fpsim.arith.TENSOR_CORES`` this runs the PTX instruction it models through
microsoft/MMA-Sim (its Python models run on the CPU) twice in a chain, D = A2·B2 + (A1·B1 + C),
on inputs built to break a model: zeros beside large values (the alignment of zero operands),
subnormals and near-maximal values, products straddling the alignment cut-off, C cancelling
the sum (results truncated to zero, their sign), inf and NaN, overflow.  The fixture stores the
inputs as float32 codes and MMA-Sim's D as codes of its result format; the test
``tests/test_tensor_core_fixture.py`` compares fpsim bit for bit without MMA-Sim.

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

#: preset -> (MMA-Sim architecture, instruction class, qualifier, format of A, format of B)
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
}
ROWS = 16           # rows of A kept (the instructions' m is 8 to 64; rows are independent)
CHAIN = 2           # instructions chained per case
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
    """Inputs of one preset's chain: A (ROWS, CHAIN*k), B (CHAIN*k, 8), C (ROWS, 8)."""
    _, _, q, fa, fb = INSTRUCTIONS[name]
    model = fpsim.arith.TENSOR_CORES[name]
    cfmt = model.c_format.name
    rows, K = min(ROWS, m), CHAIN * k
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
    c = values(cfmt, (rows, 8), rng, mixed)
    c[:, 5] = -0.0
    exact = a.astype(np.float64) @ b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        c[:, 6:] = -fpsim.quantize(exact[:, 6:], cfmt)            # cancellation: D near 0
    c[:, 6:] = np.where(np.isfinite(c[:, 6:]), c[:, 6:], 0.0)
    return {"a": a, "b": b, "c": c}


def run_mmasim(name: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """MMA-Sim's D for the chain, as codes of the result format (uint16 or uint32)."""
    import torch
    from mmasim.simulator import nv_ptx

    arch, cls, q, fa, fb = INSTRUCTIONS[name]
    inst = getattr(nv_ptx, cls)(arch, q)
    a, b, c = inputs["a"], inputs["b"], inputs["c"]
    rows, k = a.shape[0], inst.k
    D = torch.zeros((inst.m, inst.n), dtype=inst.c_type)
    D[:rows] = torch.from_numpy(c).to(inst.c_type)
    for r in range(CHAIN):
        A = torch.zeros((inst.m, k), dtype=inst.a_type)
        A[:rows] = torch.from_numpy(a[:, r * k:(r + 1) * k]).to(inst.a_type)
        B = torch.from_numpy(b[r * k:(r + 1) * k]).to(inst.b_type)
        D = inst(A, B, D)
    D = D[:rows].contiguous()
    bits = torch.int16 if D.dtype == torch.float16 else torch.int32
    return D.view(bits).numpy().view(np.uint16 if bits == torch.int16 else np.uint32)


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
        inst = getattr(nv_ptx, cls)(arch, q)
        cases = [case(name, rng, inst.m, inst.k, mixed=i > 0) for i in range(CASES)]
        for key in "abc":
            arrays[f"{name}.{key}"] = np.stack([x[key] for x in cases]).astype(
                np.float32).view(np.uint32)
        arrays[f"{name}.d"] = np.stack([run_mmasim(name, x) for x in cases])
        meta[name] = {"arch": arch, "instruction": f"{cls}.{q}", "inputs": [fa, fb]}
        print(f"{name}: {arch} {cls}.{q}", flush=True)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
