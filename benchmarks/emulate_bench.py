"""fpsim.emulate: what the interception costs over calling fpsim.matmul on the same operands,
and what emulating a whole model costs over running it natively.

Each case is one ``nn.Linear`` (no bias) run under ``fpsim.emulate`` with a recipe whose
accumulator is emulated (operands rounded to ``inputs``, sums in ``accum`` with ``order``),
against ``fpsim.matmul(x, W.T, inputs=..., accum=..., order=...)`` called directly on the same
tensors: the same bits (checked), so the ratio is the overhead of the TorchFunctionMode, the
module hooks, the recipe lookup and the operand handling.  Two emulated variants: the context
entered for every call (hooks registered each time, weights quantized each time; interleaved
with the direct calls), and one context around all calls (its weight cache quantizes W once;
timed in that context after the others, as contexts do not nest).  Best-of-N in one process;
the machine and its load average are recorded.  Target: ratio <= 2.

The model table (``model_rows``): a Llama-shaped Hugging Face model built here from a config
with random weights (4 layers, width 512, MLP 1408, vocabulary 2048), one forward pass of 256
tokens, natively in FP32 and under each recipe of ``MODEL_RECIPES`` (interleaved rounds, best
of N; each timed forward runs in a context whose weights are already quantized, as in any
loop over batches).  Operand-only recipes sum in FP32 either deterministically (FP64 sums
rounded once: the default, the same bits on every machine) or with the host's own FP32 GEMM
(``native_sums="host"``: fast, not reproducible).  The exact FP16 row runs fpsim's compiled
engine (:mod:`fpsim.arith.jit`) on every core; its physical bound: each product is one
float64 multiply-add and one rounding to the accumulator (a few dependent scalar operations
per product, no SIMD across K), against a few FLOPs per cycle-lane of FP32 BLAS, so a
2-core machine cannot get below about 10x the native forward.  ``benchmarks/gpu_check.py``
runs the same rows on CUDA.

The conv tables: a ResNet-style conv net (:func:`conv_net`, BatchNorm in eval mode) timed as
the model table, and each 3 x 3 convolution shape of ``CONV_SITES`` against an ``nn.Linear`` on
the same GEMM (M = images x positions, K = 9 x C_in, N = C_out): ``conv_over_linear`` is what
the implicit GEMM (patches built and quantized piece by piece) costs over a linear site of the
same multiply-adds, natively and under each recipe.  The JSON also records ``fp64_gemm_over_fp32``: torch's float64
GEMM time over its float32 one on the model's MLP shape, the bound of the deterministic rows.

    PYTHONPATH=. python benchmarks/emulate_bench.py [--repeat 5] [--model-repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import fpsim
from fpsim import Recipe, Rules

from timing import best_times, machine

BOUND = ("exact FP16 sums: one float64 multiply-add and one rounding per product on each core, "
         "about 10x the native FP32 forward at best on 2 cores")
CASES = [  # (M, K, N, inputs, accum, order)
    (8, 64, 64, "e4m3", "fp16", "sequential"),
    (64, 256, 256, "e4m3", "fp16", "sequential"),
    (256, 256, 256, "e4m3", "fp16", "sequential"),
    (128, 768, 768, "bf16", "bf16", "pairwise"),
    (512, 256, 1024, "e5m2", "fp16", "chunked"),
]


def run_case(m: int, k: int, n: int, inputs: str, accum: str, order: str,
             repeat: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    layer = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=g) / k ** 0.5)
    recipe = Recipe(inputs, accum=accum, order=order, name="bench")
    w = layer.weight.detach()

    def direct() -> torch.Tensor:
        return fpsim.matmul(x, w.t(), inputs=inputs, accum=accum, order=order)

    def per_call() -> torch.Tensor:
        with torch.no_grad(), fpsim.emulate(recipe):
            return layer(x)

    with torch.no_grad():
        want = direct().to(x.dtype)
        same = torch.equal(per_call(), want)
        best = best_times({"direct": direct, "emulate": per_call}, repeat)
        # contexts do not nest: the cached variant runs its rounds inside one context, after
        with fpsim.emulate(recipe):
            same = same and torch.equal(layer(x), want)
            best.update(best_times({"emulate_cached": lambda: layer(x)}, repeat))
    return {"M": m, "K": k, "N": n, "inputs": inputs, "accum": accum, "order": order,
            "same_bits": same, **{f"{k}_s": v for k, v in best.items()},
            "ratio": best["emulate"] / best["direct"],
            "ratio_cached": best["emulate_cached"] / best["direct"]}


#: The model table's recipes (None: the native forward); fpsim.Recipe arguments by keyword.
MODEL_RECIPES: dict[str, dict | None] = {
    "native FP32 (no emulation)": None,
    "E4M3 per-tensor operands, FP32 sums (deterministic)": dict(inputs="e4m3",
                                                                scaling="tensor"),
    "E4M3 per-tensor operands, host FP32 sums": dict(inputs="e4m3", scaling="tensor",
                                                     native_sums="host"),
    "MXFP8 blocks, FP32 sums (deterministic)": dict(inputs="mxfp8_e4m3", scaling="block"),
    "MXFP8 blocks, host FP32 sums": dict(inputs="mxfp8_e4m3", scaling="block",
                                         native_sums="host"),
    "NVFP4 blocks, host FP32 sums": dict(inputs="nvfp4", scaling="block", native_sums="host"),
    "E4M3 operands, exact FP16 sequential sums": dict(inputs="e4m3", accum="fp16",
                                                      order="sequential"),
}
LLAMA = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=8, vocab_size=2048)
DRY_LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2, vocab_size=64)


def llama(config: dict, tokens: int, device: str = "cpu") -> tuple[torch.nn.Module, torch.Tensor]:
    """A Llama-shaped causal LM with random weights (nothing downloaded) and ``tokens`` ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**config, max_position_embeddings=max(tokens, 16))
    model = LlamaForCausalLM(cfg).eval().to(device)
    ids = torch.randint(0, config["vocab_size"], (1, tokens), device=device)
    return model, ids


def forward_macs(config: dict, tokens: int) -> int:
    """Multiply-adds of one forward pass: the linear layers, LM head and attention's Q.K^T and
    P.V (causal masking not subtracted: the emulation computes every score)."""
    d, f, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = d * config["num_key_value_heads"] // config["num_attention_heads"]
    per_layer = d * (d + 2 * kv + d) + 3 * d * f + 2 * tokens * d
    return tokens * (layers * per_layer + d * config["vocab_size"])


def model_rows(repeat: int, device: str = "cpu", config: dict = LLAMA,
               tokens: int = 256) -> list[dict]:
    """Best forward time of the Llama-shaped model natively and under each of
    ``MODEL_RECIPES``, rounds interleaved; ratios to the native forward of the same run."""
    model, ids = llama(config, tokens, device)
    return forward_rows(model, ids, forward_macs(config, tokens), repeat, device)


def forward_rows(model: torch.nn.Module, inputs: torch.Tensor, macs: int, repeat: int,
                 device: str = "cpu", recipes: dict | None = None) -> list[dict]:
    """Best time of ``model(inputs)`` natively and under each of ``recipes`` (Recipe arguments
    or a Rules; default ``MODEL_RECIPES``; each timed forward in a context whose weights are
    already quantized), rounds interleaved."""
    recipes = MODEL_RECIPES if recipes is None else recipes
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def once() -> float:
        model(inputs)
        sync()
        t = time.perf_counter()
        model(inputs)
        sync()
        return time.perf_counter() - t

    def timed(name: str) -> float:
        spec = recipes[name]
        with torch.no_grad():
            if spec is None:
                return once()
            with fpsim.emulate(spec if isinstance(spec, Rules) else Recipe(name=name, **spec)):
                return once()                   # the first call fills the weight cache

    best = {name: float("inf") for name in recipes}
    for _ in range(repeat):
        for name in recipes:
            best[name] = min(best[name], timed(name))
    native = best["native FP32 (no emulation)"]
    return [{"recipe": name, "spec": recipes[name] if isinstance(recipes[name], dict | None)
             else str(recipes[name]), "forward_s": round(t, 5),
             "ratio": round(t / native, 2), "mac_per_s": round(macs / t)}
            for name, t in best.items()]


class Block(torch.nn.Module):
    """A ResNet basic block: two 3x3 convolutions with BatchNorm, the input added back."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
            torch.nn.ReLU(), torch.nn.Conv2d(c, c, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def conv_net(width: int = 32) -> torch.nn.Module:
    """A small ResNet-style net for 32 x 32 images: a stem, a block, a stride-2 convolution to
    twice the width, a block, pooling and a linear classifier (random weights, eval mode)."""
    torch.manual_seed(0)
    w = width
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, w, 3, padding=1, bias=False), torch.nn.BatchNorm2d(w),
        torch.nn.ReLU(), Block(w),
        torch.nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(2 * w), torch.nn.ReLU(), Block(2 * w),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(2 * w, 10)).eval()


def conv_macs(width: int, batch: int, side: int = 32) -> int:
    """Multiply-adds of :func:`conv_net`'s forward on ``batch`` images of ``side`` pixels."""
    w, full, half = width, side * side, (side // 2) ** 2
    return batch * (full * 27 * w + 2 * full * 9 * w * w + half * 9 * w * 2 * w
                    + 2 * half * 9 * 4 * w * w + 2 * w * 10)


def conv_model_rows(repeat: int, width: int = 32, batch: int = 16,
                    device: str = "cpu") -> list[dict]:
    """:func:`forward_rows` of :func:`conv_net` on ``batch`` random 32 x 32 images."""
    x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return forward_rows(conv_net(width).to(device), x.to(device), conv_macs(width, batch),
                        repeat, device)


#: Convolution sites against linear sites of the same GEMM: (batch, C_in, side, C_out); a
#: 3 x 3 convolution with padding 1 is M = batch * side^2 rows, K = 9 * C_in, N = C_out.
CONV_SITES = [(16, 32, 32, 32), (16, 64, 16, 64)]


def site_rows(repeat: int, sites: list = CONV_SITES) -> list[dict]:
    """Per convolution shape and recipe: the best time of the ``nn.Conv2d`` site and of an
    ``nn.Linear`` site on the same GEMM (one context each, weights already quantized,
    interleaved), natively and under each recipe."""
    rows = []
    for n, cin, side, cout in sites:
        g = torch.Generator().manual_seed(0)
        conv = torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        lin = torch.nn.Linear(9 * cin, cout, bias=False)
        x = torch.randn(n, cin, side, side, generator=g)
        a = torch.randn(n * side * side, 9 * cin, generator=g)
        for name, spec in MODEL_RECIPES.items():
            ctx = (lambda: torch.no_grad()) if spec is None else (
                lambda: fpsim.emulate(Recipe(name=name, **spec)))
            with torch.no_grad(), ctx():
                best = best_times({"conv": lambda: conv(x), "linear": lambda: lin(a)}, repeat)
            rows.append({"M": n * side * side, "K": 9 * cin, "N": cout, "recipe": name,
                         "conv_s": round(best["conv"], 5), "linear_s": round(best["linear"], 5),
                         "conv_over_linear": round(best["conv"] / best["linear"], 2)})
    return rows


def fp64_gemm_ratio(repeat: int, tokens: int = 256, config: dict = LLAMA) -> float:
    """How much slower torch's float64 GEMM is than its float32 one on the model's MLP
    up-projection (tokens x width @ width x MLP), best of ``repeat`` each, interleaved: the
    bound of the deterministic FP32-sum rows, which sum in FP64."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, config["hidden_size"], generator=g)
    w = torch.randn(config["hidden_size"], config["intermediate_size"], generator=g)
    xd, wd = x.double(), w.double()
    best = best_times({"fp32": lambda: x @ w, "fp64": lambda: xd @ wd}, repeat)
    return best["fp64"] / best["fp32"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model-repeat", type=int, default=3)
    ap.add_argument("--skip-cases", action="store_true", help="the model table only")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch's and fpsim's threads (default: every core); on a loaded "
                         "machine 1 keeps OpenMP's spinning threads from inflating the native time")
    ap.add_argument("--json", type=Path,
                    default=Path(__file__).parent / "results" / "emulate_bench.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["FPSIM_THREADS"] = str(args.threads)
    info = machine()
    rows = [] if args.skip_cases else [run_case(*c, repeat=args.repeat) for c in CASES]
    model = model_rows(args.model_repeat)
    convs = conv_model_rows(args.model_repeat)
    sites = site_rows(args.model_repeat)
    gemm64 = fp64_gemm_ratio(max(args.repeat, 10))
    info["load_average_after"] = machine()["load_average_1_5_15"]
    print(f"machine: {info['cpu']}, {info['cores']} cores, load {info['load_average_1_5_15']}, "
          f"torch threads {torch.get_num_threads()}")
    head = (f"{'M x K x N':>16} {'inputs':>6} {'accum':>5} {'order':>10} {'direct ms':>10} "
            f"{'emulate ms':>11} {'ratio':>6} {'cached ms':>10} {'ratio':>6} bits")
    print(head)
    for r in rows:
        print(f"{r['M']:>5}x{r['K']:>4}x{r['N']:>5} {r['inputs']:>6} {r['accum']:>5} "
              f"{r['order']:>10} {r['direct_s'] * 1e3:>10.2f} {r['emulate_s'] * 1e3:>11.2f} "
              f"{r['ratio']:>6.2f} {r['emulate_cached_s'] * 1e3:>10.2f} "
              f"{r['ratio_cached']:>6.2f} {'same' if r['same_bits'] else 'DIFFER'}")
    print(f"\nLlama-shaped model ({LLAMA}), one forward of 256 tokens, "
          f"{forward_macs(LLAMA, 256) / 1e9:.2f} G multiply-adds, best of {args.model_repeat}:")
    for r in model:
        print(f"{r['recipe']:>55} {r['forward_s'] * 1e3:>10.1f} ms {r['ratio']:>7.2f}x "
              f"{r['mac_per_s'] / 1e6:>9.0f} M MAC/s")
    print(f"\nResNet-style conv net (width 32, 16 images of 32 x 32), "
          f"{conv_macs(32, 16) / 1e9:.2f} G multiply-adds, best of {args.model_repeat}:")
    for r in convs:
        print(f"{r['recipe']:>55} {r['forward_s'] * 1e3:>10.1f} ms {r['ratio']:>7.2f}x "
              f"{r['mac_per_s'] / 1e6:>9.0f} M MAC/s")
    print("\nConv2d 3x3 site vs Linear site on the same GEMM:")
    for r in sites:
        print(f"{r['M']:>6}x{r['K']:>4}x{r['N']:>3} {r['recipe']:>55} conv "
              f"{r['conv_s'] * 1e3:>8.1f} ms linear {r['linear_s'] * 1e3:>8.1f} ms "
              f"{r['conv_over_linear']:>5.2f}x")
    print(f"float64 GEMM / float32 GEMM (256 x 512 @ 512 x 1408): {gemm64:.2f}x")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "machine": info, "torch_threads": torch.get_num_threads(),
        "fpsim_threads": os.environ.get("FPSIM_THREADS", "every core"), "repeat": args.repeat,
        "cases": rows, "model": {"config": LLAMA, "tokens": 256, "repeat": args.model_repeat,
                                 "macs": forward_macs(LLAMA, 256), "rows": model,
                                 "bound": BOUND,
                                 "fp64_gemm_over_fp32": round(gemm64, 2)},
        "conv_model": {"width": 32, "batch": 16, "side": 32, "repeat": args.model_repeat,
                       "macs": conv_macs(32, 16), "rows": convs},
        "conv_sites": {"repeat": args.model_repeat, "rows": sites}}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
