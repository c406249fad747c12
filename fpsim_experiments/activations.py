"""Experiment ``activations``: the largest magnitudes each site sees, and LayerNorm sums of
squares vs FP16.

On every end-to-end window (the same held-out tokens as the end-to-end metrics of the other
experiments, not only the windows the replay captures): per site, the largest |value| of each
operand and of the output, the median |value| of the activation operand, and where the largest
activation sits (window, position, channel).  Only the outputs the model uses count: the causal
part of Q.K^T (before the 1/sqrt(d) scaling), and for attention.V the causal part of the
attention probabilities (the masked zeros are not in the median).  "Massive activations" (Sun et
al., 2024, arXiv 2402.17762) are
values above 100 and at least 1000 times the median magnitude of their layer's hidden state;
the LayerNorm inputs are that hidden state (the residual stream).  LayerNorm's per-row sums
of squares, both sum(x^2) and sum((x - mean)^2), are compared with FP16's largest value 65504.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fpsim import get_format

from . import replay
from .capture import Site, stream
from .context import Context
from .report import figure, num, page, save, table

NAME = "activations"
FP16_MAX = get_format("fp16").max
MASSIVE_ABS, MASSIVE_RATIO = 100.0, 1000.0  # Sun et al.'s criterion


def _where(t: Tensor) -> list[int]:
    return [int(i) for i in torch.unravel_index(t.abs().argmax(), t.shape)]


def _causal(t: Tensor) -> Tensor:
    """The causal (lower-triangular) part of the last two axes of ``t``, flattened."""
    keep = torch.ones(t.shape[-2], t.shape[-1], dtype=torch.bool, device=t.device).tril()
    return t[keep.expand_as(t)]


def site_magnitudes(site: Site) -> dict[str, Any]:
    """Largest and median magnitudes of a site's operands and output, and where the largest
    activation is.

    Masked outputs (``site.mask``) and, for attention.V, the masked attention probabilities are
    left out.
    """
    a = (_causal(site.a) if site.name.endswith(".av") else site.a).abs()
    out = {
        "kind": site.kind,
        "a_amax": float(a.max()),
        "a_median": float(a.median()),
        "a_argmax": _where(site.a),
        "output_amax": float(replay.used(site.output, site).abs().max()),
    }
    out["a_ratio"] = out["a_amax"] / out["a_median"] if out["a_median"] > 0 else float("inf")
    if site.b is not None:
        out["b_amax"] = float(site.b.abs().max())
    if site.kind == "layernorm":
        x = site.a.double()
        raw = (x * x).sum(-1)
        centred = site.output.double()
        out |= {
            "sum_x2_max": float(raw.max()),
            "sum_centred_max": float(centred.max()),
            "rows_x2_over_fp16": int((raw > FP16_MAX).sum()),
            "rows_centred_over_fp16": int((centred > FP16_MAX).sum()),
            "rows": raw.numel(),
        }
    return out


def run(ctx: Context) -> dict[str, Any]:
    """Magnitudes of every site on every end-to-end window (captured again here, all windows
    in one pass, each site measured and dropped as it is computed)."""
    sites: dict[str, dict] = {}
    stream(ctx.model, ctx.wins[:, :-1], lambda s: sites.__setitem__(s.name, site_magnitudes(s)))
    return {
        "sites": sites,
        "fp16_max": FP16_MAX,
        "massive": {"abs": MASSIVE_ABS, "ratio": MASSIVE_RATIO},
        "windows": int(ctx.wins.shape[0]),
        "window_tokens": int(ctx.wins.shape[1] - 1),
    }


def _over_windows(data: dict) -> str:
    """How many windows and tokens the maxima are over (older JSON: the captured windows)."""
    meta = data["meta"]
    if "windows" in data:
        tokens = data["windows"] * data["window_tokens"]
        return f"over all {data['windows']} end-to-end windows ({tokens} tokens)"
    return f"over the {meta['capture_tokens']} captured tokens only"


def _ln(data: dict) -> dict[str, dict]:
    return {n: s for n, s in data["sites"].items() if s["kind"] == "layernorm"}


def conclusions(data: dict) -> list[str]:
    """Largest activation, whether it is massive by Sun et al.'s criterion, and LayerNorm vs
    FP16."""
    model = data["meta"]["model"]
    ln = _ln(data)
    name, top = max(ln.items(), key=lambda kv: kv[1]["a_amax"])
    massive = top["a_amax"] > MASSIVE_ABS and top["a_ratio"] >= MASSIVE_RATIO
    w, t, c = top["a_argmax"]
    span = _over_windows(data)
    out = [
        f"On `{model}`, {span}, the largest residual-stream value (LayerNorm input) is "
        f"{num(top['a_amax'])} at "
        f"{name} (window {w}, position {t}, channel {c}), {num(top['a_ratio'])}× the median "
        f"magnitude "
        f"there: {'massive' if massive else 'not massive'} by Sun et al.'s criterion (> "
        f"{num(MASSIVE_ABS)} and "
        f">= {num(MASSIVE_RATIO)}× the median)."
    ]
    big = max(ln.items(), key=lambda kv: kv[1]["sum_x2_max"])
    over = sum(s["rows_x2_over_fp16"] for s in ln.values())
    over_c = sum(s["rows_centred_over_fp16"] for s in ln.values())
    rows = sum(s["rows"] for s in ln.values())
    out.append(
        f"The largest LayerNorm sum of squares is {num(big[1]['sum_x2_max'])} (sum x², at "
        f"{big[0]}), "
        f"{num(big[1]['sum_x2_max'] / FP16_MAX)}× FP16's largest value 65504; {over} of {rows} "
        f"LayerNorm rows have sum x² above it and {over_c} have sum (x - mean)² above it, so an "
        f"FP16 "
        f"sum of squares {'would overflow' if over_c or over else 'would not overflow'} on these "
        f"windows."
    )
    other = {n: s for n, s in data["sites"].items() if s["kind"] != "layernorm"}
    name, top = max(other.items(), key=lambda kv: kv[1]["output_amax"])
    qk = max(
        (kv for kv in other.items() if kv[0].endswith(".qk")), key=lambda kv: kv[1]["output_amax"]
    )
    out.append(
        f"The largest dot-product output is {num(top['output_amax'])} at {name}"
        + (
            " (causal part, before the 1/sqrt(d) scaling)"
            if name.endswith(".qk")
            else f"; the largest causal Q.K^T (before the 1/sqrt(d) scaling) is "
                 f"{num(qk[1]['output_amax'])} at {qk[0]}"
        )
        + "."
    )
    return out


def figures(data: dict, out: Path) -> list[str]:
    """Largest operand and output magnitudes per site, log scale."""
    names = list(data["sites"])
    fig, axes = figure(1, 1, width=12, height=4.5)
    ax = axes[0, 0]
    x = range(len(names))
    ax.semilogy(
        x, [data["sites"][n]["a_amax"] for n in names], "o", label="activation operand, max |a|"
    )
    ax.semilogy(
        x,
        [data["sites"][n]["a_median"] for n in names],
        ".",
        label="activation operand, median |a|",
    )
    ax.semilogy(
        x,
        [data["sites"][n]["output_amax"] for n in names],
        "s",
        mfc="none",
        label="output, max |y| (LayerNorm: sum (x - mean)²; Q.K^T: causal, before 1/sqrt(d))",
    )
    ax.axhline(FP16_MAX, ls="--", color="gray", label="FP16 max 65504")
    ax.set_xticks(list(x), names, rotation=90, fontsize=7)
    ax.set_ylabel("magnitude")
    ax.set_title(f"largest magnitudes per site, {_over_windows(data)}")
    ax.grid(alpha=0.3)
    ax.set_ylim(top=FP16_MAX * 1e3)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    return [save(fig, out / "magnitudes.png")]


def render(data: dict, out: Path) -> str:
    """Figure and Markdown report."""
    meta = data["meta"]
    names = figures(data, out)
    rows = []
    for n, s in data["sites"].items():
        rows.append(
            [
                n,
                num(s["a_amax"]),
                num(s["a_median"]),
                num(s["a_ratio"]),
                num(s.get("b_amax")),
                num(s["output_amax"]),
                num(s.get("sum_x2_max")),
                "-" if "rows" not in s else f"{s['rows_x2_over_fp16']}/{s['rows']}",
            ]
        )
    intro = (
        f"Maxima and medians {_over_windows(data)} of `{meta['model']}`, the same tokens as the "
        "end-to-end metrics of the other experiments. For LayerNorm sites the "
        "output column is the per-row sum of squares about the mean; for Q.K^T sites it is the "
        "causal "
        "part before the 1/sqrt(d) scaling, and attention.V's activation operand (the attention "
        "probabilities) counts only its causal part."
    )
    body = [
        f"![magnitudes]({names[0]})",
        "",
        table(
            [
                "site",
                "max |a|",
                "median |a|",
                "max/median",
                "max |b|",
                "max |output|",
                "max sum x²",
                "rows with sum x² > 65504",
            ],
            rows,
        ),
    ]
    return page("Activation magnitudes", meta, intro, conclusions(data), body)
