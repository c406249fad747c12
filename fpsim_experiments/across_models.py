"""The answer across models: per model, which side of an 8-bit float fails first (range or
precision), where, and why, generated from each model's committed study.

The models are the tiny GPT-2 (``results/range-vs-precision``, its own study:
``.range_vs_precision``) and the models of ``.model_study`` (``results/range-vs-precision-NAME``:
all-MiniLM-L6-v2, Whisper tiny.en); a model whose results are not committed is left out, and an
arm a study did not run is said to be "not run".  At 8 bits, unscaled, per tensor and
saturating, two pairs that trade one exponent bit for one mantissa bit are compared: e3m4 / e4m3
and e4m3 / e5m2 (IEEE-style, ``e4m3_ieee``: max 240).  Each ratio is the model's own metric of
the arm with fewer exponent bits over the other's, with a 95% paired interval over the model's
units; a side is called only when the interval excludes 1 and the ratio survives Holm's
correction over this table's ratios of that model; an arm whose metric is inf/NaN fails by
range (its neighbour with one exponent bit more is finite).  "Where" is what the JSON counts:
the sites that overflow and the operand elements flushed or saturated; "why" quotes only an
ablation the JSON holds (saturating, the norms in FP32), and otherwise says the mechanism is not
isolated.

    python -m fpsim_experiments.across_models                 # print the region
    python -m fpsim_experiments.across_models --write         # rewrite it in README.md and docs/results.md

``tests/test_across_models.py`` checks that both files show what the committed JSON gives.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from pathlib import Path

from . import bootstrap, model_study
from .bootstrap import fmt_ci
from .range_findings import _abl, _case, _ln, _run, ratios_for
from .range_vs_precision import load
from .report import load_json, num, pct

REPO = Path(__file__).resolve().parents[1]
#: (display name, folder under results/, shape: "tiny" for range-vs-precision's own JSON,
#: "study" for model_study's)
MODELS = (("tiny GPT-2", "range-vs-precision", "tiny"),
          ("all-MiniLM-L6-v2", "range-vs-precision-minilm", "study"),
          ("Whisper tiny.en", "range-vs-precision-whisper-tiny.en", "study"))
SETTINGS = ("unscaled", "per tensor", "saturating")
BEGIN, END = "<!-- across models -->", "<!-- /across models -->"
PAGES = ("README.md", "docs/results.md")
COMMAND = "python -m fpsim_experiments.across_models --write"


@dataclass
class Arm:
    """One 8-bit run as the table needs it: its metric, interval and the study's run."""

    value: float
    ci: list[float]
    run: dict

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)

    def cell(self) -> str:
        return f"{num(self.value)} {fmt_ci(self.ci)}" if self.finite else "inf/NaN"


class Study:
    """A model's study in ``.model_study``'s shape: arms found by their factors."""

    def __init__(self, name: str, data: dict) -> None:
        self.name, self.data = name, data
        self.primary = data["primary"]
        m = data["model"]
        self.metric = (f"`{self.primary}` ({data['metrics'][self.primary]}), {m['units']} "
                       f"{m['unit']}s")
        self.where_basis = f"capture of {data['capture_units']} {m['unit']}s"

    def arm(self, ebits: int, variant: str) -> Arm | None:
        """The 8-bit split with ``ebits`` exponent bits: unscaled (``none``), per ``tensor``,
        ``saturating`` or with the ``norms`` in FP32."""
        want = {"budget": 8, "ebits": ebits, "encoding": "ieee", "scaling": "none",
                "flush": True, "subnormals": "format", "norms": "format"}
        want.update({"tensor": {"scaling": "tensor"}, "saturating": {"encoding": "saturating"},
                     "norms": {"norms": "fp32"}, "none": {}}[variant])
        for r in self.data["runs"]:
            if all(r["factors"].get(k) == v for k, v in want.items()):
                m = r["metrics"][self.primary]
                return Arm(m["value"], m["ci"], r)
        return None

    def ratio(self, a: Arm, b: Arm) -> tuple[float, list[float], float]:
        """metric(a) / metric(b), its paired interval over units and p-value."""
        r = model_study.ratio(a.run["metrics"][self.primary], b.run["metrics"][self.primary])
        return r["ratio"], r["ci"], r["p"]

    def events(self, arm: Arm) -> tuple[dict[str, int], int, int, int]:
        """Overflowing elements by site, and the elements flushed, saturated and in all."""
        over, flushed, saturated, elements = model_study.trouble(arm.run)
        return {s["site"]: s["overflow"] for s in over}, flushed, saturated, elements


class Tiny:
    """The tiny GPT-2's own study (``.range_vs_precision``), with its range-cases."""

    def __init__(self, name: str, data: dict) -> None:
        self.name, self.data = name, data
        self.ratios = ratios_for(data)
        self.metric = (f"KL(FP32 ‖ format) of the next byte, nats/token, "
                       f"{self.ratios.windows} windows")
        self.where_basis = f"end to end on all {self.ratios.windows} windows"

    def arm(self, ebits: int, variant: str) -> Arm | None:
        """As ``Study.arm``: the splits, the LayerNorms-in-FP32 runs, the saturating ablation
        (e3) and range-cases' saturating runs (e4, e5)."""
        fmt = f"e{ebits}m{7 - ebits}"
        run = {"none": lambda: _run(self.data, 8, ebits),
               "tensor": lambda: _run(self.data, 8, ebits, "tensor"),
               "norms": lambda: _ln(self.data, 8, ebits),
               "saturating": lambda: (_abl(self.data, 8, "saturate") if ebits == 3
                                      else _case(self.data, f"{fmt} saturating"))}[variant]()
        return None if run is None else Arm(run["e2e"]["kl"], run["e2e"]["ci"]["kl"], run)

    def ratio(self, a: Arm, b: Arm) -> tuple[float, list[float], float]:
        r = self.ratios.ratio(a.run, b.run, "format", decides=False)
        return r.point, r.windows, r.p

    def events(self, arm: Arm) -> tuple[dict[str, int], int, int, int]:
        ev = arm.run["e2e"]["events"]
        over = {s: e["overflow"] for s, e in ev.items() if e["overflow"]}
        return (dict(sorted(over.items(), key=lambda kv: -kv[1])),
                sum(e["flushed"] for e in ev.values()), sum(e["saturated"] for e in ev.values()),
                sum(e["elements"] for e in ev.values()) or 1)


@dataclass
class Pair:
    """Fewer exponent bits / one more at the same budget: the side it calls."""

    fewer: str
    more: str
    side: str            # "range", "precision", "none" (no side called), "nan", "not run"
    text: str
    short: str = ""      # the evidence in a few words: the ratio and interval, or what is inf/NaN
    p: float = math.nan
    ci: tuple[float, float] | None = None
    holm: bool | None = None

    def called(self) -> str:
        """The side, once Holm's correction is known (``none`` when it is not called)."""
        if self.ci is None or self.side == "none" or self.holm:
            return self.side
        return "none"

    def words(self) -> str:
        if self.ci is None:
            return self.text
        side = {"range": "range", "precision": "precision", "none": "no side"}[self.called()]
        note = ", exploratory: not significant after Holm" if self.side != "none" and \
            not self.holm else ""
        return f"{self.text}: {side}{note}"


def pair(study: Study | Tiny, fewer: Arm | None, more: Arm | None, names: tuple[str, str]
         ) -> Pair:
    """The pair ``names`` (fewer exponent bits first) of one setting."""
    if fewer is None or more is None:
        missing = [n for n, a in zip(names, (fewer, more)) if a is None]
        text = f"{' and '.join(missing)} not run"
        return Pair(*names, "not run", text, text)
    if not fewer.finite:
        if not more.finite:
            text = f"{names[0]} and {names[1]} inf/NaN"
            return Pair(*names, "nan", text, text)
        return Pair(*names, "range", f"{names[0]} inf/NaN, {names[1]} {more.cell()}: range",
                     f"{names[0]} inf/NaN")
    if not more.finite:
        return Pair(*names, "precision", f"{names[1]} inf/NaN, {names[0]} {fewer.cell()}: "
                    "precision", f"{names[1]} inf/NaN")
    point, ci, p = study.ratio(fewer, more)
    side = bootstrap.verdict(ci, "range", "precision", "none")
    short = f"{point:.3g}× {fmt_ci(ci)}"
    return Pair(*names, side, f"{names[0]} / {names[1]} {short}", short, p, tuple(ci))


def first_to_fail(p34: Pair, p45: Pair) -> str:
    """Walking from e5m2 towards e3m4 (one exponent bit traded for one mantissa bit at each
    step), the side that fails first and where: range where the step makes things worse,
    precision where every step run makes them better."""
    s45, s34 = p45.called(), p34.called()
    if s45 in ("not run", "nan"):
        return {"not run": "not run", "nan": "every split run is inf/NaN"}[s45]
    if s45 == "range":
        return "range, at e4m3 (worse than e5m2)"
    if s45 == "none":
        return "no side called between e5m2 and e4m3"
    return {"range": "range, at e3m4 (e4m3 best)",
            "precision": "precision (e3m4 best: no range failure down to 3 exponent bits)",
            "none": "precision down to e4m3; no side called between e4m3 and e3m4",
            "not run": "precision down to e4m3 (e3m4 not run)",
            "nan": "range, at e3m4 (e4m3 best)"}[s34]


def where(study: Study | Tiny, arms: dict[str, Arm | None], saturating: bool) -> str:
    """Sites that overflow (or saturate) and the shares of operand elements flushed."""
    parts, flushed = [], []
    for name, arm in arms.items():
        if arm is None:
            continue
        over, fl, sat, total = study.events(arm)
        if over:
            parts.append(f"{name} overflows at " + ", ".join(
                f"{s} ({n})" for s, n in list(over.items())[:3])
                + (f" and {len(over) - 3} more" if len(over) > 3 else ""))
        if saturating and sat:
            parts.append(f"{name} saturates {sat} operand elements")
        flushed.append(f"{name} {pct(fl / total)}")
    if flushed:
        parts.append("flushed: " + ", ".join(flushed))
    return "; ".join(parts) or "-"


def why(study: Study | Tiny, setting: str, arms: dict[str, Arm | None]) -> str:
    """The mechanism an ablation in the JSON shows for an unscaled split that is inf/NaN:
    saturating it, or keeping the norms in FP32, makes it finite (or not); no ablation
    separates the mantissa bit from the exponent bit in a ratio of finite splits."""
    failed = [(n, a) for n, a in arms.items() if a is not None and not a.finite]
    if setting != "unscaled":
        return "not isolated (no ablation runs in this setting)"
    out = []
    for name, a in failed:
        ebits = int(name[1])
        shown = False
        for variant, what, then in (("saturating", "saturating", "overflow makes the inf/NaN"),
                                    ("norms", "with the norms in FP32",
                                     "the overflow that makes it is at the norms' inputs")):
            abl = study.arm(ebits, variant)
            if abl is None:
                continue
            if abl.finite:
                out.append(f"{name} {what} is finite ({abl.cell()}): {then}")
                shown = True
            else:
                out.append(f"{name} {what} stays inf/NaN")
        if not shown:
            out.append(f"{name}: not isolated")
    return "; ".join(out + ["ratios of finite splits: not isolated"])


@dataclass
class Row:
    """One model and setting of the table."""

    model: str
    setting: str
    pairs: tuple[Pair, Pair]
    where: str
    why: str

    def fails(self) -> str:
        return first_to_fail(*self.pairs)


def rows_of(study: Study | Tiny) -> list[Row]:
    """The model's three rows, with Holm's correction over its decided ratios."""
    rows = []
    for setting in SETTINGS:
        variant = {"unscaled": "none", "per tensor": "tensor", "saturating": "saturating"}[setting]
        arms = {f"e{e}m{7 - e}": study.arm(e, variant) for e in (3, 4, 5)}
        p34 = pair(study, arms["e3m4"], arms["e4m3"], ("e3m4", "e4m3"))
        p45 = pair(study, arms["e4m3"], arms["e5m2"], ("e4m3", "e5m2"))
        rows.append(Row(study.name, setting, (p34, p45),
                        where(study, arms, setting == "saturating"), why(study, setting, arms)))
    decided = [p for r in rows for p in r.pairs if p.ci is not None]
    for p, kept in zip(decided, bootstrap.holm([p.p for p in decided])):
        p.holm = kept
    return rows


def studies(root: Path = REPO / "results") -> list[Study | Tiny]:
    """Every model whose study is committed under ``root``."""
    out: list[Study | Tiny] = []
    for name, folder, shape in MODELS:
        path = root / folder
        if not (path / "results.json").exists():
            continue
        if shape == "tiny":
            out.append(Tiny(name, load(path)))
        else:
            out.append(Study(name, load_json(path / "results.json")))
    return out


def holds(rows: list[Row]) -> str:
    """What holds across the models and what does not: per setting and pair, the side each
    model's ratio calls."""
    models = list(dict.fromkeys(r.model for r in rows))
    parts = []
    for setting in SETTINGS:
        said = []
        for k in (1, 0):
            ran = [r for r in rows if r.setting == setting and r.pairs[k].side != "not run"]
            sides = {r.model: r.pairs[k].called() for r in ran}
            shown = {r.model: r.model if r.pairs[k].side == "nan"       # says it all
                     else f"{r.model} {r.pairs[k].short}" for r in ran}
            if not sides:
                continue
            name = " / ".join((rows[0].pairs[k].fewer, rows[0].pairs[k].more))
            words = {s: ", ".join(shown[m] for m, v in sides.items() if v == s)
                     for s in dict.fromkeys(sides.values())}
            side = {"range": "range", "precision": "precision", "none": "no side",
                    "nan": "both inf/NaN"}
            if len(words) == 1:
                ((called, which),) = words.items()
                said.append(f"{name} calls {side[called]} on "
                            + ("every model that ran it" if len(sides) > 1 else
                               "the one model that ran it") + f" ({which})")
            else:
                said.append(f"{name} differs (" + "; ".join(
                    f"{side[s]} on {m}" for s, m in words.items()) + ")")
        parts.append(f"{setting}, " + ", and ".join(said))
    return (f"Across {len(models)} models ({', '.join(models)}), at 8 bits: "
            + "; ".join(parts) + ".")


def markdown(items: list[Study | Tiny]) -> str:
    """The region of README.md and docs/results.md: what holds, the table and its notes."""
    rows = [r for s in items for r in rows_of(s)]
    head = ["model", "8 bits", "e3m4 / e4m3", "e4m3 / e5m2", "fails first", "where", "why"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r.model, r.setting, r.pairs[0].words(),
                                         r.pairs[1].words(), r.fails(), r.where, r.why]) + " |")
    notes = ["Metrics (lower is better; a ratio above 1: the split with fewer exponent bits is "
             "worse): " + "; ".join(f"{s.name}: {s.metric}" for s in items) + ". Where: "
             + "; ".join(f"{s.name} {s.where_basis}" for s in items) + ". Formats are "
             "IEEE-style (`e4m3_ieee`: max 240, not OCP E4M3's 448). A pair calls range when "
             "the split with fewer exponent bits is worse, or inf/NaN beside a finite one, and "
             "precision when it is better; a side is called from a ratio when its interval "
             "excludes 1 and it survives Holm's correction over the model's ratios in this "
             "table. Generated from each model's results.json by "
             f"`{COMMAND}`."]
    return "\n".join([holds(rows), "", *lines, "", *notes])


def replace(text: str, region: str, page: str) -> str:
    """``text`` with its marked region replaced by ``region``."""
    pattern = re.compile(re.escape(BEGIN) + r"\n(?:.*?\n)?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{page} has no region {BEGIN} ... {END}: add the two lines where the "
                         "table belongs")
    return pattern.sub(lambda _: f"{BEGIN}\n{region}\n{END}", text)


def shown(text: str) -> str | None:
    """The region a page shows, or None."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=REPO / "results")
    ap.add_argument("--write", action="store_true",
                    help="rewrite the region in " + " and ".join(PAGES))
    args = ap.parse_args(argv)
    region = markdown(studies(args.results))
    if not args.write:
        print(region)
        return 0
    for page in PAGES:
        path = REPO / page
        path.write_text(replace(path.read_text(encoding="utf-8"), region, page),
                        encoding="utf-8")
        print(f"{page}: region rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
