"""Emulated matmul: speed against the naive loop, on one GPT-2 projection, and tensor-core error.

Headline: the exact engines (every FP16 addition correctly rounded), NumPy (no compile) and
numba (``backend="numba"``, its first call timed apart: a compile or a disk-cache load),
against the naive torch loop that adds in FP32 and casts to FP16 each step (inexact), same run,
interleaved, for sequential, chunked and pairwise orders and M in --sweep-m; a ratio > 1 means
fpsim is faster.  The machine and its load average are recorded beside every absolute number.

Speed: M=512, K=768, N=768 (GPT-2 small's attention output projection on 512 tokens), operands
rounded to FP16, sequential FP16 accumulation, every addition rounded once.  Reports emulated
multiply-adds per second for each engine beside plain ``torch.matmul`` in float32, measured in
the same run (read the ratios: these machines are shared and noisy), checks that every engine
gives the NumPy engine's bits, and reports the NumPy engine's peak extra memory (tracemalloc)
as a multiple of the output's size.  The compiled engine's one-off compile is timed separately.

Error: the Hopper FP8 tensor-core preset (MMA-Sim's model: 13 fraction bits after aligning 32
products and the accumulator, E8M13 accumulator truncated toward zero) for K up to 4096, with
and without promotion to FP32 every 128 products, beside DeepSeek-V3's "maximum relative error
of nearly 2%" at K=4096 (arXiv 2412.19437, §3.3.2).  The reference is the exact product in
float64 (exact here).  Input distributions are stated in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np

import fpsim

CASE = dict(inputs="fp16", accum="fp16", order="sequential", rounding="rne")
ORDERS = ("sequential", "chunked", "pairwise")


def timed(fn, repeat: int) -> tuple[float, object]:
    """Best wall time of ``repeat`` runs, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def naive_fp16_loop(ta, tb):
    """The peer: a 10-line torch loop that adds each product in FP32 and casts the running sum
    to FP16 after every step.  Not exact (the FP32 sum is rounded twice): it differs from the
    correctly rounded sequential FP16 sum in a few per cent of outputs."""
    import torch

    a, b = ta.float(), tb.float()
    acc = torch.zeros((a.shape[0], b.shape[1]), dtype=torch.float16)
    for k in range(a.shape[1]):
        acc = (acc.float() + a[:, k:k + 1] * b[k]).half()
    return acc


def numpy_floor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Not a result: the least any NumPy engine must do for sequential accumulation, one
    float32 multiply and one float32 add per step, with no rounding to FP16 at all, given
    NumPy's best case: the engine's cache-sized tiles (``TILE`` outputs, temporaries in L2),
    preallocated buffers and one thread per core.  Its speed against the naive loop bounds
    what a NumPy (no compile) exact engine can reach: rounding each step costs more passes
    over the tile (NumPy's own float32 -> float16 cast alone takes several times a multiply)."""
    from concurrent.futures import ThreadPoolExecutor

    from fpsim.arith.driver import TILE

    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    M, K = a32.shape
    N = b32.shape[1]
    out = np.empty((M, N), np.float32)
    tn = min(N, TILE)
    tm = max(1, TILE // tn)
    at = np.ascontiguousarray(a32.T)                       # K x M: a step reads one block

    def tile(i0: int, j0: int) -> None:
        acc = np.zeros((min(tm, M - i0), min(tn, N - j0)), np.float32)
        prod = np.empty_like(acc)
        for k in range(K):
            np.multiply(at[k, i0:i0 + tm, None], b32[k, j0:j0 + tn], out=prod)
            np.add(acc, prod, out=acc)
        out[i0:i0 + tm, j0:j0 + tn] = acc

    tiles = [(i0, j0) for i0 in range(0, M, tm) for j0 in range(0, N, tn)]
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(lambda t: tile(*t), tiles))
    return out


def first_calls(k: int, n: int) -> dict:
    """Seconds of the numba engine's first call in this process, per kernel: a compile, or a
    load from numba's disk cache (then well under a second).  Never inside a timed loop."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    out = {}
    for order in ("sequential", "pairwise"):
        t = time.perf_counter()
        fpsim.matmul(a, b, accum="fp16", order=order, backend="numba")
        out[order] = time.perf_counter() - t
    return out


def against_loop(args: argparse.Namespace) -> list[dict]:
    """Headline: the exact engines, NumPy (no compile) and numba (compiled beforehand), against
    the naive loop, same run, interleaved best of --repeat, for each order and several M (cost
    linear in M*K*N).  The numba engine's bits are checked against the NumPy engine's."""
    import torch

    from timing import best_times

    rng = np.random.default_rng(0)
    engines = ("numpy", "numba")
    rows = []
    print(f"{'M':>5} {'order':<11}{'naive loop':>11}{'numpy':>8}{'numba':>8}{'floor':>7}   "
          "(ratios: naive loop time / engine time; > 1: fpsim is faster; floor: NumPy multiply "
          "+ add only, no rounding)   M MAC/s naive / numpy / numba")
    for M in args.sweep_m:
        a = rng.standard_normal((M, args.k)).astype(np.float16)
        b = (rng.standard_normal((args.k, args.n)) * 0.02).astype(np.float16)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        fns = {"naive torch loop": lambda: naive_fp16_loop(ta, tb),
               "numpy floor": lambda: numpy_floor(a, b)}
        for order in ORDERS:
            for engine in engines:
                fns[engine, order] = lambda o=order, e=engine: fpsim.matmul(
                    a, b, accum="fp16", order=o, backend=e)
        t = best_times(fns, args.repeat)
        exact = fpsim.matmul(a, b, accum="fp16", backend="numpy")
        differ = float(np.mean(naive_fp16_loop(ta, tb).numpy() != exact))
        macs = M * args.k * args.n
        for order in ORDERS:
            same = np.array_equal(
                fpsim.matmul(a, b, accum="fp16", order=order, backend="numba").view(np.uint32),
                fpsim.matmul(a, b, accum="fp16", order=order, backend="numpy").view(np.uint32))
            row = {"M": M, "K": args.k, "N": args.n, "order": order,
                   "loop_mac_per_s": macs / t["naive torch loop"],
                   "loop_outputs_differing_from_exact": differ,
                   "numpy_floor_ratio": t["naive torch loop"] / t["numpy floor"],
                   "numba_same_bits_as_numpy": bool(same)}
            for engine in engines:
                row[f"{engine}_mac_per_s"] = macs / t[engine, order]
                row[f"{engine}_ratio"] = t["naive torch loop"] / t[engine, order]
            rows.append(row)
            print(f"{M:5} {order:<11}{1:11.2f}{row['numpy_ratio']:8.2f}{row['numba_ratio']:8.2f}"
                  f"{row['numpy_floor_ratio']:7.2f}"
                  f"   {row['loop_mac_per_s'] / 1e6:6.0f} / {row['numpy_mac_per_s'] / 1e6:5.0f} /"
                  f" {row['numba_mac_per_s'] / 1e6:5.0f}" + ("" if same else "  BITS DIFFER"),
                  flush=True)
    return rows


def speed(args: argparse.Namespace) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    M, K, N = args.m, args.k, args.n
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)                 # activations
    b = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)        # GPT-2 init scale
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    macs = M * K * N
    rows = []

    def row(name: str, seconds: float, same: bool | None, **extra) -> None:
        rows.append({"engine": name, "seconds": seconds, "mac_per_s": macs / seconds,
                     "same_bits_as_numpy": same, **extra})

    t_peer, _ = timed(lambda: torch.matmul(ta, tb), 5)
    t_np, ref = timed(lambda: fpsim.matmul(a, b, backend="numpy", **CASE), args.repeat)
    row("numpy", t_np, True)
    t_nb, got = timed(lambda: fpsim.matmul(a, b, backend="numba", **CASE), args.repeat)
    row("numba", t_nb, bool(np.array_equal(got.view(np.uint32), ref.view(np.uint32))))
    t_torch, got = timed(lambda: fpsim.matmul(ta, tb, backend="torch", **CASE), args.repeat)
    row("torch (eager)", t_torch, bool(np.array_equal(got.numpy(), ref)))
    if not args.no_compile:
        t0 = time.perf_counter()
        fpsim.matmul(a[:8], b[:, :8], backend="compiled", **CASE)         # compile, 2 shapes
        fpsim.matmul(a[:3, :40], b[:40, :5], backend="compiled", **CASE)
        compile_s = time.perf_counter() - t0
        t_c, got = timed(lambda: fpsim.matmul(ta, tb, backend="compiled", **CASE), args.repeat)
        row("compiled", t_c, bool(np.array_equal(got.numpy(), ref)), compile_seconds=compile_s)

    tracemalloc.start()
    fpsim.matmul(a, b, backend="numpy", **CASE)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"shape": {"M": M, "K": K, "N": N}, "case": CASE,
            "torch_threads": torch.get_num_threads(),
            "peer": {"name": "torch.matmul float32", "seconds": t_peer,
                     "mac_per_s": macs / t_peer},
            "rows": [dict(r, slowdown_vs_peer=r["seconds"] / t_peer) for r in rows],
            "numpy_peak_extra_memory_x_output": peak / (M * N * 4),
            "numpy_peak_extra_memory_x_operands": peak / (a.nbytes + b.nbytes)}


def tc_error(K: int, chunk: int | None, dist: str, rng: np.random.Generator) -> dict:
    shape_a, shape_b = (64, K), (K, 64)
    if dist == "uniform[0,1)":
        a, b = rng.random(shape_a), rng.random(shape_b)
    else:
        a, b = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    a, b = fpsim.quantize(a, "e4m3"), fpsim.quantize(b, "e4m3")
    got = fpsim.matmul(a, b, order="tensor_core", tensor_core="hopper_fp8", chunk=chunk)
    exact = a @ b                              # float64: exact for these FP8 products and sums
    err = np.abs(got - exact)
    return {"K": K, "distribution": dist, "promote_every": chunk,
            "max_rel_error": float(np.max(err / np.abs(exact))),
            "median_rel_error": float(np.median(err / np.abs(exact))),
            "norm_rel_error": float(np.linalg.norm(err) / np.linalg.norm(exact)),
            "max_error_over_sum_abs": float(np.max(err / (np.abs(a) @ np.abs(b))))}


def error_study() -> dict:
    rng = np.random.default_rng(1)
    rows = [tc_error(K, chunk, dist, rng) for dist in ("uniform[0,1)", "normal(0,1)")
            for K in (256, 1024, 4096) for chunk in (None, 128)]
    return {"preset": "hopper_fp8", "inputs": "e4m3 (RNE) of the stated distribution",
            "outputs": "64 x 64", "deepseek_v3_k4096_max_rel_error": "nearly 2% (H800)",
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=512)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled engine")
    ap.add_argument("--sweep-m", type=int, nargs="*", default=[64, 256, 1024, 2048],
                    help="M values of the exact-engine vs naive-loop sweep")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "matmul_bench.json"))
    args = ap.parse_args()

    from timing import machine

    result = {"machine": machine(), "numba_first_call_seconds": first_calls(args.k, args.n)}
    print("numba engine, first call in this process (compile or disk-cache load): "
          + ", ".join(f"{k} {v:.1f} s" for k, v in result["numba_first_call_seconds"].items()))
    result |= {"against_naive_loop": against_loop(args),
              "command": "python benchmarks/matmul_bench.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                  if k not in ("out", "no_compile", "sweep_m")),
              "speed": speed(args), "tensor_core_error": error_study()}
    s = result["speed"]
    print(f"M={args.m} K={args.k} N={args.n}, FP16 operands, sequential FP16 accumulation, "
          f"torch threads {s['torch_threads']}")
    print(f"{'engine':<22}{'seconds':>9}{'M MAC/s':>10}{'x peer time':>13}  same bits")
    print(f"{s['peer']['name']:<22}{s['peer']['seconds']:9.3f}"
          f"{s['peer']['mac_per_s'] / 1e6:10.0f}{1:13.0f}")
    for r in s["rows"]:
        print(f"{'fpsim ' + r['engine']:<22}{r['seconds']:9.3f}{r['mac_per_s'] / 1e6:10.0f}"
              f"{r['slowdown_vs_peer']:13.0f}  {r['same_bits_as_numpy']}"
              + (f"  (compile {r['compile_seconds']:.1f} s)" if "compile_seconds" in r else ""))
    print(f"numpy engine peak extra memory: {s['numpy_peak_extra_memory_x_output']:.1f} x the "
          f"float32 output ({s['numpy_peak_extra_memory_x_operands']:.1f} x the operands)")
    e = result["tensor_core_error"]
    print(f"\nHopper FP8 tensor core (E4M3 operands, {e['outputs']} outputs); DeepSeek-V3 at "
          f"K=4096: {e['deepseek_v3_k4096_max_rel_error']}")
    print(f"{'inputs':<14}{'K':>6}{'promote':>9}{'max rel err':>13}{'median':>10}"
          f"{'|err|/|C| (F)':>15}{'max err/sum|ab|':>17}")
    for r in e["rows"]:
        print(f"{r['distribution']:<14}{r['K']:>6}{str(r['promote_every'] or '-'):>9}"
              f"{r['max_rel_error']:13.2%}{r['median_rel_error']:10.3%}"
              f"{r['norm_rel_error']:15.3%}{r['max_error_over_sum_abs']:17.2e}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
