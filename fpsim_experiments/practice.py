"""Experiment ``practice``: FP8 recipes as deployed, beside the sweeps.

* Transformer Engine style: E4M3 (OCP, max 448) on the linear layers only (QKV, attention
  output, MLP up and down; LayerNorms, attention products and the LM head stay FP32), per-tensor
  scaling either *current* (amax of the tensor itself, cannot overflow) or *delayed* on the
  activations (``fpsim.emulate``'s TE delayed cast, ``fpsim.emulation.quantizers.AmaxHistory``:
  the scale ``fmax / max(amax of the previous calls)`` over a history of ``HISTORY``, 1 on a
  site's first call as on TE's first step; values past the scaled range saturate) with current
  scaling on the weights.
* DeepSeek-V3 fine-grained scaling on the linear layers: E4M3, one scale per 1 x 128 tile of
  activations and per 128 x 128 block of weights, FP32 accumulation end to end; per site also
  with the ``hopper_fp8`` tensor-core accumulator, with and without promotion to FP32 every
  128 products (emulated, on the subsampled sites).
* MXFP8 E4M3 on every site with the OCP "floor" and the round-up "ceil" scale rule.
* Attention in low precision: Q.K^T and P.V in E4M3 with per-tensor scaling, everything else
  FP32 (the softmax input stays FP32: its masked entries are -3.4e38, which no amax scale of
  the scores could hold).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fpsim.emulation.casts import Cast

from . import bootstrap, replay
from .bootstrap import fmt_ci
from .context import Context
from .recipes import Recipe
from .report import OCP_NAMES, figure, num, page, pct, save, table
from .sweep import runs as e2e_runs

NAME = "practice"
LINEAR = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
ATTENTION = ("attn.qk", "attn.av")
HISTORY = 16
FP8 = "e4m3"
#: TE-style delayed scaling: activations scaled by their amax history (1 on a site's first
#: call), weights by their own amax
DELAYED = Recipe(Cast(FP8, "delayed", saturate=True, history=HISTORY), Cast(FP8, "tensor"),
                 name="TE E4M3 delayed")


def sites_of(ctx: Context, kinds: tuple[str, ...]) -> list[str]:
    """Names of the model's sites whose per-block name is in ``kinds``."""
    return [n for n in ctx.site_names if n.split(".", 1)[-1] in kinds]


def end_to_end_runs(ctx: Context) -> list[e2e_runs.Run]:
    """The deployed recipes' end-to-end runs: per-site recipe mappings."""
    linear, attention = sites_of(ctx, LINEAR), sites_of(ctx, ATTENTION)
    te = Recipe(FP8, scaling="tensor", name="TE E4M3 current")
    ds = Recipe(FP8, scaling="tile", name="DeepSeek-V3 E4M3 tiles")
    att = Recipe(FP8, scaling="tensor", name="attention E4M3")
    run = e2e_runs.recipe_run
    return [
        run("TE-style E4M3 linear, current scaling", {n: te for n in linear}),
        run(f"TE-style E4M3 linear, delayed scaling (history {HISTORY})",
            {n: DELAYED for n in linear}),
        run("DeepSeek-V3 E4M3 linear, 1x128 / 128x128 tiles", {n: ds for n in linear}),
        run("MXFP8 E4M3 every site, floor scale", Recipe("mxfp8_e4m3", scaling="block",
                                                         name="mxfp8 floor")),
        run("MXFP8 E4M3 every site, ceil scale", Recipe("mxfp8_e4m3", scaling="block",
                                                        scale_rounding="ceil", name="mxfp8 ceil")),
        run("attention Q.K^T and P.V E4M3, per-tensor", {n: att for n in attention}),
    ]


#: what ``--quick`` leaves out
QUICK_SKIPS = "no MXFP8 runs (4 of the 6 end-to-end runs)"


def accumulator_recipes() -> list[Recipe]:
    """DeepSeek-V3 tiles with the hopper_fp8 tensor-core accumulator, without and with
    promotion to FP32 every 128 products, and with FP32 accumulation on the same rows."""
    return [Recipe(FP8, scaling="tile", order="sequential", name="tiles, fp32 accumulation"),
            Recipe(FP8, scaling="tile", order="tensor_core", tensor_core="hopper_fp8",
                   name="tiles, hopper_fp8, no promotion"),
            Recipe(FP8, scaling="tile", order="tensor_core", tensor_core="hopper_fp8", chunk=128,
                   name="tiles, hopper_fp8, promoted every 128")]


def run(ctx: Context) -> dict[str, Any]:
    """End-to-end metrics of each deployed recipe; per-site accumulator statistics."""
    todo = [r for r in end_to_end_runs(ctx) if not ctx.quick or "MXFP8" not in r.name]
    runs = [{"name": r.name, "e2e": result["e2e"]}
            for r, result in zip(todo, ctx.end_to_end_runs(todo, "runs", desc=NAME))]
    linear = set(sites_of(ctx, LINEAR))
    rs = accumulator_recipes()
    acc = [{"recipe": r.to_json(), "summary": replay.summary(stats), "sites": stats}
           for r, stats in zip(rs, ctx.replay(rs, where=linear.__contains__))]
    return {"runs": runs, "accumulators": acc, "baseline": ctx.baseline}


def _by_name(data: dict) -> dict[str, dict]:
    return {r["name"]: r for r in data["runs"]}


def conclusions(data: dict) -> list[str]:
    """Each recipe's KL with its CI, and the paired comparisons that matter."""
    r = _by_name(data)
    out = []
    for name, run in r.items():
        e = run["e2e"]
        sat = sum(v["saturated"] for v in e.get("events", {}).values())
        out.append(f"{name}: KL {num(e['kl'])} {fmt_ci(e['ci']['kl'])}, top-1 {pct(e['top1'])}"
                   + (f", {sat} activation elements saturated" if sat else "") + ".")
    pairs = [("TE-style E4M3 linear, delayed scaling (history 16)",
              "TE-style E4M3 linear, current scaling", "delayed vs current scaling"),
             ("TE-style E4M3 linear, current scaling",
              "DeepSeek-V3 E4M3 linear, 1x128 / 128x128 tiles", "per-tensor vs 128-tiles"),
             ("MXFP8 E4M3 every site, floor scale", "MXFP8 E4M3 every site, ceil scale",
              "MXFP8 floor vs ceil scale rule")]
    for a, b, what in pairs:
        if a in r and b in r and math.isfinite(r[a]["e2e"]["kl"]) \
                and math.isfinite(r[b]["e2e"]["kl"]):
            q, ci = bootstrap.ratio(r[a]["e2e"], r[b]["e2e"])
            out.append(f"{what}: KL ratio {num(q)} {fmt_ci(ci)}, "
                       + bootstrap.verdict(ci, "the first is worse", "the first is better") + ".")
    acc = {x["recipe"]["name"]: x for x in data["accumulators"]}
    med = {n: _median_snr(x) for n, x in acc.items()}
    out.append("Linear sites with DeepSeek-V3 tiles, per-site median SNR against FP64 on FP32 "
               "operands: " + "; ".join(f"{n} {num(v)} dB" for n, v in med.items()) + ".")
    return out


def _median_snr(run: dict) -> float:
    vals = sorted(s["snr_db"] for s in run["sites"].values() if math.isfinite(s["snr_db"]))
    return vals[len(vals) // 2] if vals else math.nan


def figures(data: dict, out: Path) -> list[str]:
    """KL of each recipe with its bootstrap interval."""
    fig, axes = figure(1, 1, width=8, height=3.8)
    ax = axes[0, 0]
    runs = data["runs"]
    for i, run in enumerate(runs):
        e = run["e2e"]
        if math.isfinite(e["kl"]):
            lo, hi = e["ci"]["kl"]
            ax.errorbar(e["kl"], i, xerr=[[e["kl"] - lo], [hi - e["kl"]]], fmt="o", capsize=3)
        else:
            ax.text(1.0, i, f"inf/NaN ({pct(e['finite'])} finite)", va="center",
                    transform=ax.get_yaxis_transform(), ha="right", fontsize=7)
    ax.set_yticks(range(len(runs)), [r["name"] for r in runs], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("KL(FP32 ‖ recipe), nats/token (bars: 95% bootstrap CI)")
    ax.grid(alpha=0.3)
    return [save(fig, out / "practice.png")]


def render(data: dict, out: Path) -> str:
    """Figure and Markdown report."""
    meta = data["meta"]
    names = figures(data, out)
    rows = [[r["name"], f"{num(r['e2e']['kl'])} {fmt_ci(r['e2e']['ci']['kl'])}",
             num(r["e2e"]["loss"], 4), pct(r["e2e"]["top1"]), pct(r["e2e"]["finite"])]
            for r in data["runs"]]
    acc = [[x["recipe"]["name"], num(_median_snr(x)), num(x["summary"]["snr_db_min"])]
           for x in data["accumulators"]]
    intro = (f"{meta['tokens']} held-out tokens end to end against the deterministic FP32 "
             f"reference; brackets are 95% bootstrap intervals over windows. {OCP_NAMES} "
             f"Accumulator runs: linear sites, {meta['emulation_rows']} rows per site, "
             "against FP64 on the FP32 operands.")
    body = [f"![practice]({names[0]})", "",
            table(["recipe", "KL [95% CI]", "loss", "top-1", "finite"], rows), "",
            table(["accumulator (DeepSeek-V3 tiles)", "median site SNR dB", "worst site SNR dB"],
                  acc)]
    return page("FP8 recipes as deployed", meta, intro, conclusions(data), body,
                skipped=QUICK_SKIPS)
