"""range-vs-precision's sentences that compare like with like: scope, the weights at the bottom
of the range, order-free attribution, finite encodings, attention semantics, where overflow
happens, the deployed scalings and what more exponent bits do.

Every ratio goes through ``.likewise.Ratios`` (which refuses runs that differ in more than
the factor named) and carries its window and topic intervals; the cases come from
``range-vs-precision/cases/*.json`` (``.range_cases``), and a sentence whose runs are
missing says so instead of being written from other runs.
"""

from __future__ import annotations

import math
from collections import Counter

from fpsim import Format

from .gpt2.data import window_topics
from .endtoend import compact
from .likewise import Ratios, attribution, finite, label
from .report import in_forward_order, num, pct

INTERACT_ABOVE = ("removing both gains more than removing each alone multiplied: each loss hides "
                  "part of the other's cost")
INTERACT_BELOW = "removing both gains less than removing each alone multiplied: they overlap"


def budgets(data: dict) -> tuple[int, ...]:
    """The bit budgets the run covered (``--quick``: 8 only)."""
    return tuple(int(b) for b in data["budgets"])


def _e(budget: int, ebits: int) -> str:
    return f"e{ebits}m{budget - 1 - ebits}"


def heldout_topics(meta: dict, n: int) -> list[str] | None:
    """The held-out topic of each of the first ``n`` windows, when the windows are the
    byte-level held-out text of this Python (the topics' text ships with CPython and changes
    between versions); else None."""
    import platform

    if meta["config"].get("vocab_size") != 256 or meta.get("python") != \
            platform.python_version():
        return None
    found = window_topics(meta["window"], n)
    return found if len(found) == n else None


def ratios_for(data: dict) -> Ratios:
    """The report's ``Ratios``: windows, and their topics where known."""
    n = len(data["baseline"]["fp32"]["windows"]["kl"])
    return Ratios(n, heldout_topics(data["meta"], n))


def scope(data: dict, ratios: Ratios) -> str:
    """What the numbers were measured on, in one sentence."""
    meta, c = data["meta"], data["meta"]["config"]
    n = ratios.windows
    text = (f"a {meta['parameters'] / 1e6:.1f}M-parameter byte-level GPT-2 ({c['n_layer']} "
            f"layers, width {c['n_embd']}, one training seed) trained on the text of Python's "
            f"help topics (CPython's pydoc_data)")
    if ratios.topics is None:
        return text + f", evaluated on {n} held-out windows of {meta['window']} bytes"
    from .gpt2.data import split_topics
    train, held = split_topics()
    counts = Counter(ratios.topics).most_common()
    text = text.replace("help topics", f"{len(train)} help topics")
    if len(counts) < 2:
        return (text + f", evaluated on {n} windows of {meta['window']} bytes from one of its "
                f"{len(held)} held-out topics ({counts[0][0]})")
    top2 = counts[0][1] + counts[1][1]
    which = (f"its {len(held)}" if len(counts) == len(held)
             else f"{len(counts)} of its {len(held)}")
    return (text + f", evaluated on {n} windows of {meta['window']} bytes from {which} held-out "
            f"topics, two of which ({counts[0][0]} {counts[0][1]}, {counts[1][0]} "
            f"{counts[1][1]}) give {top2} of the {n} windows")


def _case(data: dict, name: str) -> dict | None:
    return data.get("cases", {}).get(name)


def _ln(data: dict, budget: int, ebits: int) -> dict | None:
    return next((r for r in data.get("ln_fp32_runs", []) if r["budget"] == budget
                 and r["ebits"] == ebits), None)


def _run(data: dict, budget: int, ebits: int, scaling: str = "none") -> dict | None:
    return next((r for r in data["runs"] if r["budget"] == budget and r["ebits"] == ebits
                 and r["scaling"] == scaling), None)


def _abl(data: dict, budget: int, name: str) -> dict | None:
    return next((r for r in data.get("ablation_runs", []) if r["budget"] == budget
                 and r["ablation"] == name), None)


def _missing(what: str, names: list[str]) -> str:
    return (f"{what}: not run yet ({', '.join(names)} missing from cases/*.json; "
            "`fpsim experiment range-cases` runs them).")


def weights_line(data: dict) -> list[str]:
    """Where the weights sit against the smallest normals (they are not what mostly flushes:
    ``flushed_by_operand``)."""
    w = data.get("weights")
    if not w:
        return []
    conv = {k: v for k, v in w.items() if k != "lm_head"}
    amax = [v["amax"] for v in conv.values()]
    below = lambda f, k: [v[f][k] for v in conv.values()]      # noqa: E731
    e3, e4 = Format("e3m4", 3, 4), Format("e4m3", 4, 3)     # IEEE-style, as split_format
    lm = w.get("lm_head")
    def span(values: list[float]) -> str:
        lo, hi = pct(min(values)), pct(max(values))
        return ("all" if lo == "100%" else lo) if lo == hi else f"{lo}–{hi}"

    return [
        f"The weights sit below e3m4's normal range: every linear (Conv1D) weight's largest "
        f"magnitude is {num(min(amax))}–{num(max(amax))}, below e3m4's smallest normal "
        f"{num(e3.min_normal)}, so without scaling {span(below('e3m4', 'below_normal'))} of "
        f"each weight's non-zero elements are subnormal or zero in e3m4 and "
        f"{span(below('e3m4', 'flushed'))} flush to zero; in e4m3 (smallest normal "
        f"{num(e4.min_normal)}) {span(below('e4m3', 'below_normal'))} are below normal and "
        f"{span(below('e4m3', 'flushed'))} flush"
        + (f" (the tied embedding / lm_head: amax {num(lm['amax'])}, "
           f"{pct(lm['e3m4']['below_normal'])} below e3m4's normal range)" if lm else "")
        + ". They are not most of what flushes (next conclusion)."]


#: (rows, columns) of each linear site's weight in units of the width C, the MLP's inner
#: width I and the vocabulary V, as GPT-2's Conv1D stores them (inputs first)
_WEIGHT_SHAPE = {"attn.c_attn": ("C", "3C"), "attn.c_proj": ("C", "C"),
                 "mlp.c_fc": ("C", "I"), "mlp.c_proj": ("I", "C"), "lm_head": ("C", "V")}


def flushed_by_operand(data: dict, run: dict, fmt: str) -> dict[str, int] | None:
    """``run``'s flushed operand elements end to end split into weights, attention's Q·K and
    P·V operands and the linear layers' activations (None when it cannot be told).

    The events count both operands of a site together; the weights' part is their own flushed
    count (``weights``, per forward pass) times the passes, which a linear site's element count
    gives: tokens x inputs for the activations plus passes x the weight's size."""
    w, c, ev = data.get("weights"), data["meta"]["config"], run["e2e"].get("events")
    if not w or not ev:
        return None
    width = {"C": c["n_embd"], "3C": 3 * c["n_embd"], "I": c.get("n_inner") or 4 * c["n_embd"],
             "V": c["vocab_size"]}
    tokens = len(run["e2e"]["windows"]["kl"]) * data["meta"]["window"]
    out = {"weights": 0, "attention": 0, "activations": 0}
    for site, e in ev.items():
        kind = site.split(".", 1)[-1]
        if kind in ("attn.qk", "attn.av"):
            out["attention"] += e["flushed"]
            continue
        if kind not in _WEIGHT_SHAPE or site not in w:
            return None
        k, n = (width[d] for d in _WEIGHT_SHAPE[kind])
        passes, rest = divmod(e["elements"] - tokens * k, k * n)
        if rest or passes < 1:
            return None
        mine = round(passes * w[site][fmt]["flushed"] * w[site]["elements"])
        out["weights"] += mine
        out["activations"] += e["flushed"] - mine
    return out


def bottom_lines(data: dict, ratios: Ratios) -> list[str]:
    """What flushes at the bottom of e3m4's range (with the LayerNorms in FP32, nothing
    overflows), and what scaling the weights alone buys."""
    out = []
    run = _ln(data, 8, 3)
    split = None if run is None else flushed_by_operand(data, run, "e3m4")
    if split:
        total = sum(split.values())
        shares = operand_shares(run)
        out.append(
            f"B=8, e3m4 without scaling, LayerNorms in FP32: {pct(shares[1])} of all operand "
            f"elements flush to zero end to end; of those, {pct(split['weights'] / total)} are "
            f"weights, {pct(split['attention'] / total)} attention's Q·K and P·V operands "
            f"({shares[2]} alone flushes {pct(shares[3])} of its elements) and "
            f"{pct(split['activations'] / total)} the linear layers' activations (the weights' "
            "part is their flushed elements per forward pass times the passes).")
    parts = []
    for f in ("e3m4", "e4m3"):
        a = _case(data, f"{f} A/tensor")
        b = _run(data, 8, int(f[1]), "tensor")
        if a is None or b is None or not finite(a, b):
            continue
        parts.append(f"{f} {ratios.ratio(a, b, 'weights', decides=False).text()}")
    if parts:
        out.append("B=8, activations per tensor in both runs, what scaling the weights per tensor "
                   "too does (KL with weights unscaled / scaled): " + "; ".join(parts) + ".")
    return out


def attribution_lines(data: dict, ratios: Ratios) -> list[str]:
    """Flush and subnormal width, order-free, on the LayerNorm-in-FP32 runs (nothing overflows
    there), for e3 and, where run, e4; then the formats compared with both removed."""
    out = []
    for budget in budgets(data):
        e3, e4 = _e(budget, 3), _e(budget, 4)
        corners = {
            3: (_ln(data, budget, 3), _abl(data, budget, "LN FP32, no flush"),
                _abl(data, budget, "LN FP32, full subnormals"),
                _abl(data, budget, "LN FP32, no flush, full subnormals")),
            4: (_ln(data, budget, 4), _case(data, f"{e4} LN FP32, no flush"),
                _case(data, f"{e4} LN FP32, full subnormals"),
                _case(data, f"{e4} LN FP32, no flush, full subnormals")),
        }
        parts = []
        for x, runs in corners.items():
            if any(r is None for r in runs) or not finite(*runs):
                parts.append(f"{_e(budget, x)}: runs missing")
                continue
            a = attribution(ratios, *runs, factors=("flush", "full_subnormals"))
            parts.append(
                f"{_e(budget, x)} (KL {num(runs[0]['e2e']['kl'])} -> {num(runs[3]['e2e']['kl'])}, "
                f"{a['total'].text()}): flush removed first {a['flush first'].text()}, then "
                f"subnormal width {a['full_subnormals after'].text()}; subnormal width first "
                f"{a['full_subnormals first'].text()}, then flush {a['flush after'].text()}; "
                f"order-free (Shapley, geometric mean of the two orders) flush "
                f"{a['flush Shapley'].text()}, subnormal width {a['full_subnormals Shapley'].text()}"
                f", interaction {a['interaction'].text()} "
                f"({a['interaction'].side(INTERACT_ABOVE, INTERACT_BELOW, 'no measurable interaction')})")
        out.append(f"B={budget}, no scaling, LayerNorms in FP32 (no operand overflows), what "
                   f"the bottom of the range costs, as KL factors: " + "; ".join(parts) + ".")
        wide = f"{e3} LN FP32, unbounded below", f"{e4} LN FP32, unbounded below"
        pairs = [("LayerNorms in FP32", _ln(data, budget, 3), _ln(data, budget, 4)),
                 ("LayerNorms in FP32, no flush", corners[3][1], corners[4][1]),
                 ("LayerNorms in FP32, no flush, full subnormals", corners[3][3], corners[4][3])]
        bits = []
        for what, a, b in pairs:
            if a is None or b is None:
                bits.append(f"{what}: {e4} run missing")
                continue
            r = ratios.ratio(a, b, "format")
            bits.append(f"{what} in both: {r.text()}, {r.side('e3 worse', 'e3 better')}")
            if "no flush" in what:
                bits[-1] += (f" (without flush the values that would flush keep their FP32 value: "
                             f"{pct(operand_shares(a)[1])} of {e3}'s operand elements, "
                             f"{pct(operand_shares(b)[1])} of {e4}'s, so this pair differs in "
                             "more than the mantissa bit)")
        a, b = (_case(data, n) for n in wide)
        what = ("exponent range unbounded below in both, LayerNorms in FP32 (every operand "
                "rounded at the format's mantissa width, none flushed or kept exact: the "
                "mantissa bit alone)")
        if a is None or b is None:
            bits.append(f"{what}: not run yet (`fpsim experiment range-cases --only mantissa`)")
        elif finite(a, b):
            r = ratios.ratio(a, b, "format")
            bits.append(f"{what}: {r.text()}, {r.side('e3 worse', 'e3 better')}")
        out.append(f"B={budget}, {e3} / {e4}, each pair differing in the format only: "
                   + "; ".join(bits) + ".")
    return out


def encoding_lines(data: dict, ratios: Ratios) -> list[str]:
    """One exponent bit fewer vs one mantissa bit fewer when overflow is finite (saturation,
    the fn encoding), beside the IEEE-encoding result, and e3 saturating with bias moved up."""
    out = []
    for budget in budgets(data):
        e3, e4, e5 = (_e(budget, x) for x in (3, 4, 5))
        plain = _run(data, budget, 3)
        variants = [("saturating", "saturate", f"{e4} saturating", f"{e5} saturating"),
                    ("saturating without flush", "saturate, no flush", f"{e4} sat, no flush",
                     f"{e5} sat, no flush"),
                    ("fn encoding", "fn encoding", f"{e4}fn", f"{e5}fn")]
        parts, missing = [], []
        for what, abl, four, five in variants:
            a, b, c = _abl(data, budget, abl), _case(data, four), _case(data, five)
            if a is None or b is None or c is None or not finite(a, b, c):
                missing += [four, five]
                continue
            steep = ratios.ratio(a, c, "format")
            vs4 = ratios.ratio(a, b, "format", decides=False)
            held = sum(e["saturated"] for e in a["e2e"]["events"].values())
            parts.append(f"{what} ({label(a)}: max {num(a['max'])}, {held} operand elements "
                         f"saturated): {label(a)} / {label(c)} {steep.text()} "
                         f"({steep.side('range is the steeper side', 'precision is the steeper side')}); "
                         f"{label(a)} / {label(b)} {vs4.text()}")
        ieee = "inf/NaN logits" if plain is None or not math.isfinite(plain["e2e"]["kl"]) \
            else f"KL {num(plain['e2e']['kl'])}"
        if missing:
            parts.append("not run yet: " + ", ".join(missing))
        text = (f"B={budget}, no scaling, with overflow made finite (beside the IEEE encoding, "
                f"where {e3} gives {ieee}; saturating keeps the IEEE codes and clamps, the fn "
                "encoding's top binade holds finite values, so its largest value is about twice "
                "as large and they are different formats): " + "; ".join(parts))
        moved, sat4, sat3 = (_case(data, f"e3m{budget - 4}b4 saturating"),
                             _case(data, f"{e4} saturating"), _abl(data, budget, "saturate"))
        if moved and sat4 and sat3 and finite(moved, sat4, sat3):
            r4 = ratios.ratio(moved, sat4, "format")
            r3 = ratios.ratio(moved, sat3, "format")
            text += (f"; e3 saturating with its bias moved up one (bias 4, as P3109 k8p5; max "
                     f"{num(moved['max'])}, smallest subnormal {num(moved['min_subnormal'])}): "
                     f"KL {num(moved['e2e']['kl'])}, {r4.text()} {label(sat4)} "
                     f"({r4.side('worse', 'better')}), {r3.text()} {label(sat3)} "
                     f"({r3.side('worse', 'better')})")
        out.append(text + ".")
    return out


def attention_lines(data: dict) -> list[str]:
    """The finite share of the runs that give inf/NaN, under both attention semantics."""
    rows = []
    for eager, causal in [(_case(data, f"{_e(b, 3)} eager"), _case(data, f"{_e(b, 3)} causal"))
                          for b in budgets(data)] + [
            (_abl(data, 8, "no flush"), _case(data, "e3m4 no flush causal")),
            (_abl(data, 8, "bias 4"), _case(data, "e3m4b4 causal"))] + [
            (next((r for r in data.get("p3109_runs", []) if r["format"] == f), None),
             _case(data, f"{f} causal")) for f in ("p3109_k8p5se", "p3109_k8p5sf")]:
        if eager is None or causal is None:
            continue
        e, c = eager["e2e"], causal["e2e"]
        rows.append(f"{label(eager)} {pct(e['finite'])} -> {pct(c['finite'])}"
                    + (f" (KL {num(c['kl'])})" if math.isfinite(c["kl"]) else
                       f" (KL over finite positions {num(c['kl_finite'])})"))
    if not rows:
        return [_missing("Attention semantics", ["the attention group"])]
    return ["Where NaN spreads depends on the attention kernel: the eager P·V sums over every "
            "key with the masked probabilities at 0, so an inf/NaN value at a later position "
            "reaches every earlier query through 0·NaN; a causal kernel skips masked keys. "
            "Share of positions with finite logits, eager -> masked keys skipped: "
            + "; ".join(rows) + "."]


def overflow_lines(data: dict) -> list[str]:
    """Where the unscaled e3 splits overflow: every element, window and channel, and the other
    training seeds."""
    out = []
    for budget in budgets(data):
        run = _case(data, f"{_e(budget, 3)} eager")
        if run is None:
            continue
        ev = run["e2e"]["events"]
        total = sum(e["elements"] for e in ev.values())
        over = sum(e["overflow"] for e in ev.values())
        where = compact(run["overflows"])
        windows = where["windows"]
        channels = Counter()
        for key, n in where["by_channel"].items():
            site, _, channel = key.split("|")
            channels[site, int(channel)] += n
        chan = ", ".join(f"{s} channel {c} ({n})" for (s, c), n in sorted(
            channels.items(), key=lambda kv: (-kv[1], kv[0])))
        first = in_forward_order(run["e2e"]["nonfinite_sites"])
        out.append(
            f"B={budget}, {_e(budget, 3)} without scaling: {over} of {total:.3g} operand elements "
            f"overflow, in {len(windows)} of {len(run['e2e']['windows']['kl'])} windows "
            f"({pct(run['e2e']['finite'])} of positions finite, first inf/NaN at "
            f"{first[0] if first else '-'}); every overflowing element (site, channel, count): "
            f"{chan or '-'}"
            + (f" (first {where['recorded']} recorded)" if where["recorded"] < over else "")
            + ".")
    seeds = data.get("model_seeds")
    if seeds and "models" not in seeds:
        out.append("model-seeds' results.json beside this one is of an older layout (seeds 0-2 "
                   "on the first 32 windows): rerun `fpsim experiment model-seeds` to cite the "
                   "seeds trained alike here.")
    elif seeds:
        # imported here: seeds imports the context, which the findings do not need
        from . import seeds as model_seeds
        out.append(f"The same unscaled e3 splits on other tiny models trained alike (model-seeds, "
                   f"{seeds['meta']['tokens']} held-out tokens each): "
                   + " ".join(model_seeds.overflow_lines(seeds))
                   + " The cost at the bottom of the range (next conclusions) does not need "
                   "the overflow.")
    return out


def deployed_lines(data: dict, ratios: Ratios) -> list[str]:
    """Weights scaled per output channel with activations unscaled, and the converse."""
    out = []
    for tag, what in (("W/channel", "weights per output channel, activations unscaled"),
                      ("A/tensor", "activations per tensor, weights unscaled")):
        for budget in budgets(data):
            series = [r for r in data.get("cases", {}).values()
                      if r["budget"] == budget and r["name"].endswith(tag)]
            series.sort(key=lambda r: r["ebits"])
            ok = [r for r in series if math.isfinite(r["e2e"]["kl"])]
            if not ok:
                continue
            best = min(ok, key=lambda r: r["e2e"]["kl"])
            by_e = {r["ebits"]: r for r in series}
            text = (f"B={budget}, {what} ({len(series)} splits run): best {best['format']} "
                    f"(KL {num(best['e2e']['kl'])})")
            less, more = by_e.get(best["ebits"] - 1), by_e.get(best["ebits"] + 1)
            for side, r in (("one exponent bit fewer", less), ("one mantissa bit fewer", more)):
                if r is None:
                    continue
                if not math.isfinite(r["e2e"]["kl"]):
                    text += f"; {side} ({r['format']}) inf/NaN ({pct(r['e2e']['finite'])} finite)"
                else:
                    q = ratios.ratio(r, best, "format", decides=False)
                    text += f"; {side} ({r['format']}) {q.text()}"
            if less and more and finite(less, more):
                q = ratios.ratio(less, more, "format")
                text += (f"; exponent-bit-fewer / mantissa-bit-fewer {q.text()}: " + q.side(
                    "range is the steeper side", "precision is the steeper side"))
            out.append(text + ".")
    return out


def operand_shares(run: dict) -> tuple[float, float, str, float, str]:
    """End to end over all operand elements: overflow share, flush share, worst sites' shares."""
    ev = run["e2e"].get("events", {})
    total = sum(e["elements"] for e in ev.values()) or 1
    over = sum(e["overflow"] for e in ev.values()) / total
    flush = sum(e["flushed"] for e in ev.values()) / total
    worst_o = max(ev, key=lambda n: ev[n]["overflow"] / ev[n]["elements"], default="-")
    worst_f = max(ev, key=lambda n: ev[n]["flushed"] / ev[n]["elements"], default="-")
    flushed = ev[worst_f]["flushed"] / ev[worst_f]["elements"] if worst_f in ev else 0.0
    return over, flush, worst_f, flushed, worst_o


def same_mantissa_lines(data: dict, ratios: Ratios) -> list[str]:
    """What more exponent bits do at a fixed mantissa width, without scaling, each ratio with
    its intervals and the flush shares that explain it."""
    runs = [r for r in data["runs"] if r["scaling"] == "none" and math.isfinite(r["e2e"]["kl"])]
    parts = []
    for m in sorted({r["mbits"] for r in runs}):
        group = sorted((r for r in runs if r["mbits"] == m), key=lambda r: r["ebits"])
        if len(group) < 2:
            continue
        narrow, wide = group[0], group[-1]
        r = ratios.ratio(wide, narrow, "format")
        parts.append(f"{wide['format']} / {narrow['format']} {r.text()} "
                     f"({r.side('more range costs', 'more range helps')}; operand elements "
                     f"flushed end to end {pct(operand_shares(narrow)[1])} -> "
                     f"{pct(operand_shares(wide)[1])})")
    if not parts:
        return []
    return ["Without scaling, at a fixed mantissa width, the widest exponent run against the "
            "narrowest that stays finite: " + "; ".join(parts) + "."]


def extra(data: dict, ratios: Ratios) -> list[str]:
    """All of the above, in report order."""
    return (weights_line(data) + bottom_lines(data, ratios) + overflow_lines(data)
            + attention_lines(data)
            + attribution_lines(data, ratios) + encoding_lines(data, ratios)
            + deployed_lines(data, ratios) + same_mantissa_lines(data, ratios))


def cases_table(data: dict) -> list[str]:
    """The runs of ``range-cases`` in this report: what each is, on how many windows, its KL."""
    from .report import table

    runs = sorted(data.get("cases", {}).values(),
                  key=lambda r: (r["budget"], r["describe"]["format"], r["name"]))
    if not runs:
        return []
    rows = [[r["budget"], r["name"], label(r), len(r["e2e"]["windows"]["kl"]),
             num(r["e2e"]["kl"]), pct(r["e2e"]["finite"]), num(r["e2e"]["kl_finite"]),
             r["seconds"]] for r in runs]
    return ["", "## Like-with-like runs (`fpsim experiment range-cases`)", "",
            "End to end. Runs on fewer than all windows ran on the first ones (`--tokens`) and "
            "pair with the other runs' first windows; seconds are wall time on a shared machine.",
            "", table(["B", "case", "what", "windows", "KL", "finite positions",
                       "KL over finite", "seconds"], rows)]
