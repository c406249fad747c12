"""A sweep's REPORT.md and figure, generated from ``results.json`` (and ``run.json``'s costs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import bootstrap
from ..report import figure, load_json, num, page, pct, save, table

NAME = "sweep"


def conclusions(data: dict) -> list[str]:
    """Per (model, seed): the recipes by KL with their intervals; failed and missing tasks."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in data["runs"]:
        groups.setdefault((r["model"], r["seed"]), []).append(r)
    for (model, seed), runs in groups.items():
        done = sorted((r for r in runs if "e2e" in r),
                      key=lambda r: r["e2e"]["kl"] if math.isfinite(r["e2e"]["kl"]) else math.inf)
        if done:
            ranked = "; ".join(f"{r['recipe']} {num(r['e2e']['kl'])} "
                               f"{bootstrap.fmt_ci(r['e2e']['ci']['kl'])}" for r in done)
            out.append(f"`{model}`, seed {seed}: KL(FP32 ‖ recipe) in nats/token, lowest first "
                       f"(95% CI over {done[0]['windows']} windows): {ranked}.")
    for f in data["failed"]:
        out.append(f"Task {f['task']} failed: {f['error']}.")
    missing = [f"{r['model']} | {r['recipe']} | seed {r['seed']}" for r in data["runs"]
               if "missing_shards" in r]
    if missing:
        out.append(f"Incomplete (rerun with --resume): {', '.join(missing)}.")
    return out


def plot(data: dict, out: Path) -> str | None:
    """KL of every recipe with its interval, one panel per (model, seed); None when no run
    finished."""
    groups: dict[tuple, list[dict]] = {}
    for r in data["runs"]:
        if "e2e" in r:
            groups.setdefault((r["model"], r["seed"]), []).append(r)
    if not groups:
        return None
    fig, axes = figure(len(groups), 1, width=7, height=0.4 * max(map(len, groups.values())) + 1.2)
    for ax, ((model, seed), runs) in zip(axes[:, 0], groups.items()):
        for y, r in enumerate(runs):
            kl, (lo, hi) = r["e2e"]["kl"], r["e2e"]["ci"]["kl"]
            if math.isfinite(kl) and kl > 0:
                err = [[kl - lo if math.isfinite(lo) else 0], [hi - kl if math.isfinite(hi) else 0]]
                ax.errorbar([kl], [y], xerr=err, fmt="o", color="C0", capsize=3)
            else:                    # no point on a log axis: say what it is at the left edge
                ax.text(0.01, y, num(kl), transform=ax.get_yaxis_transform(), va="center",
                        fontsize=8, color="C3")
        ax.set_yticks(range(len(runs)), [r["recipe"] for r in runs], fontsize=8)
        ax.set_ylim(-0.5, len(runs) - 0.5)
        ax.set_xscale("log")
        ax.set_xlabel("KL(FP32 ‖ recipe), nats/token (95% CI)")
        ax.set_title(f"{model}, seed {seed}", fontsize=9)
        ax.grid(alpha=0.3)
    return save(fig, out / "sweep.png")


def render(data: dict, out: Path, run: dict[str, Any] | None = None) -> str:
    """REPORT.md: conclusions, the figure, one table per (model, seed) and the run's cost."""
    cfg = data["config"]
    keys = [m for m in ("kl", "loss", "top1", "finite") if m in cfg["metrics"]]
    rows = []
    for r in data["runs"]:
        if "e2e" not in r:
            rows.append([r["model"], r["seed"], r["recipe"], "missing shards "
                         + ", ".join(map(str, r["missing_shards"]))] + [""] * (2 * len(keys) - 1))
            continue
        e, cells = r["e2e"], []
        for k in keys:
            cells.append(pct(e[k]) if k in ("top1", "finite") else num(e[k]))
            if k != "finite":
                cells.append(bootstrap.fmt_ci(e["ci"][k]))
        rows.append([r["model"], r["seed"], r["recipe"], *cells])
    header = ["model", "seed", "recipe"]
    for k in keys:
        header += [k] + ([f"{k} 95% CI"] if k != "finite" else [])
    body = [table(header, rows), ""]
    if "sites" in cfg["metrics"]:
        for r in data["runs"]:
            worst = sorted(r.get("sites", []), key=lambda s: s["snr_db"]
                           if s["snr_db"] is not None and not math.isnan(s["snr_db"])
                           else math.inf)[:5]
            if worst:
                body += [f"### {r['model']} | {r['recipe']} | seed {r['seed']}: the five sites "
                         "with the lowest SNR", "",
                         table(["site", "kind", "amax", "overflow", "flushed", "SNR dB"],
                               [[s["site"], s["kind"], num(s["amax"]), s["overflow"],
                                 s["flushed"], num(s["snr_db"])] for s in worst]), ""]
    lead = [f"![KL per recipe]({name})", ""] if (name := plot(data, out)) else []
    if run:
        secs = [s for s in run["task_seconds"].values() if s is not None]
        if secs:
            body += [f"Last run: {run['executor']} executor, {run['computed']} task(s) computed "
                     f"({run['skipped']} already on disk), {run['wall_seconds']} s wall, "
                     f"{num(sum(secs) / len(secs))} s per task on average "
                     f"({run['device']}, load {run['load_after']} on {run['cpus']} CPUs).", ""]
    meta = {"model": ", ".join(cfg["models"])}
    intro = (f"{len(cfg['recipes'])} recipe(s) x {len(cfg['seeds'])} seed(s) on "
             f"{', '.join(cfg['models'])}: every site under the recipe through fpsim.emulate, "
             f"against the FP32 reference (dot products in FP64, rounded once), on about "
             f"{cfg['tokens']} held-out tokens per seed in windows of {cfg['window']} tokens, "
             f"batches of {cfg['batch']}; {data['meta']['tasks']} tasks.")
    return page("sweep", meta, intro, conclusions(data), body, lead)


def write(out: Path, data: dict) -> None:
    """``out/REPORT.md`` (and ``sweep.png``) from ``data`` and ``out/run.json`` when present."""
    run = load_json(out / "run.json") if (out / "run.json").is_file() else None
    (out / "REPORT.md").write_text(render(data, out, run))
