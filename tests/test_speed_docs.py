"""The speed numbers quoted in docs/emulate.md (once the README's) and docs/speed.md are those of the committed
benchmark JSON (benchmarks/results/emulate_bench.json, small_calls.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def section(doc: str, title: str) -> str:
    """The text of ``doc`` from the heading ``title`` to the next heading of its level or
    above."""
    level = title.split()[0]
    start = doc.index(title + "\n")
    rest = doc[start + len(title):]
    end = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return title + (rest[:end.start()] if end else rest)


def assert_two_ways(doc: str, table: dict, ways: tuple[str, str]) -> None:
    """``doc``'s two tables of a side-by-side benchmark table (rates with gain and bits, then
    MiniLM's forwards) are ``table``'s rows, every result and count the same both ways."""
    (u, v) = ways
    assert all(r["same_bits"] for r in table["rows"])
    rows = re.findall(r"^\| (\d+x\d+x\d+) \| ([\w ,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+)× \| "
                      r"(yes|no) \|$", doc, re.M)
    assert rows == [(r["shape"], r["sums"], f"{r[f'mac_per_s_{u}'] / 1e6:,.0f}",
                     f"{r[f'mac_per_s_{v}'] / 1e6:,.0f}", f"{r['gain']:.2f}", "yes")
                    for r in table["rows"]]
    cell = r"([\d,]+) ms \(([\d.]+)×\)"
    model = re.findall(rf"^\| ([^|]+?) \| (yes|counts|no) \| {cell} \| {cell} \| ([\d.]+)× \|$",
                       doc, re.M)
    cap = {True: "yes", False: "no", "counts": "counts"}
    assert model == [(r["recipe"], cap[r["capture"]], f"{r[f'forward_s_{u}'] * 1e3:,.0f}",
                      f"{r[f'ratio_{u}']:.2f}", f"{r[f'forward_s_{v}'] * 1e3:,.0f}",
                      f"{r[f'ratio_{v}']:.2f}", f"{r['gain']:.2f}")
                     for r in table["model_rows"]]


def test_emulate_page_sentence_quotes_the_benchmark():
    bench = load("emulate_bench.json")
    text = " ".join((ROOT / "docs" / "emulate.md").read_text().split())
    cases = [c[k] for c in bench["cases"] for k in ("ratio", "ratio_cached")]
    assert f"operands is {min(cases):.2f}–{max(cases):.2f}× on" in text
    rows = {r["recipe"]: r["ratio"] for r in bench["model"]["rows"]}
    exact = rows.pop("E4M3 operands, exact FP16 sequential sums")
    rows.pop("native FP32 (no emulation)")
    assert (f"costs {min(rows.values()):.2f}–{max(rows.values()):.2f}× the native one with "
            f"FP8/MX/NVFP4 operands and FP32 sums, {exact:.2f}× with exact FP16 sums") in text
    conv = [r["conv_over_linear"] for r in bench["conv_sites"]["rows"]
            if not r["recipe"].startswith("native")]
    assert f"a convolution site costs {min(conv):.2f}–{max(conv):.2f}× a linear site" in text


def test_docs_speed_tables_quote_the_benchmarks():
    doc = (ROOT / "docs" / "speed.md").read_text()
    model = {r["recipe"]: r["ratio"] for r in load("emulate_bench.json")["model"]["rows"]}
    quoted = dict(re.findall(r"^\| ([^|]+?) \| ([\d.]+)×(?: \([^)]*\))? \|$", doc, re.M))
    assert {k: model[k] for k in quoted} == {k: float(v) for k, v in quoted.items()}
    assert len(quoted) == len(model) - 1
    gemm64 = load("emulate_bench.json")["model"]["fp64_gemm_over_fp32"]
    assert f"it is {gemm64:.2f}× slower" in " ".join(doc.split())
    bench = load("emulate_bench.json")
    net = {r["recipe"]: r["ratio"] for r in bench["conv_model"]["rows"]}
    sites = {}
    for r in bench["conv_sites"]["rows"]:
        sites.setdefault(r["recipe"], []).append(r["conv_over_linear"])
    conv = re.findall(r"^\| ([^|]+?) \| ([\d.]+)× \| ([\d.]+)× \| ([\d.]+)× \|$", doc, re.M)
    assert len(conv) == len(net)
    for name, ratio, *per_site in conv:
        assert float(ratio) == net[name] and [float(v) for v in per_site] == sites[name]
    small = {r["call"]: r for r in load("small_calls.json")["rows"]}
    names = {"quantize, Python float": "quantize Python float",
             "quantize, np.float32": "quantize np.float32",
             "quantize, np.float64": "quantize np.float64",
             "encode, Python float": "encode Python float",
             "quantize, 16 float32": "quantize 16 float32",
             "encode, 16 float32": "encode 16 float32"}
    text = " ".join(doc.split())
    ratios = [r["ratio"] for k, r in small.items() if "not loaded" not in k]
    fresh = [r["fpsim_us"] for k, r in small.items() if "not loaded" in k]
    assert f"({min(fresh):.2f}–{max(fresh):.2f} µs for 16 float32)" in text
    assert f"the ratio is {min(ratios):.2f}–{max(ratios):.2f}×" in text
    assert max(r["fpsim_us"] for r in small.values()) < 3
    rows = re.findall(r"^\| ([^|]+?) \| ([\d.]+) µs \| ([\d.]+)× \|$", doc, re.M)
    assert len(rows) == len(names)
    for call, us, ratio in rows:
        r = small[names[call]]
        assert (us, float(ratio)) == (f"{r['fpsim_us']:.2f}", r["ratio"])


def test_docs_speed_backward_table_quotes_the_benchmark():
    doc = (ROOT / "docs" / "speed.md").read_text()
    rows = re.findall(r"^\| (\d+)×(\d+)×(\d+) \| ([\d.]+) ms \| ([\d.]+) ms \| ([\d.]+)× "
                      r"\| ([\d.]+) ms \| ([\d.]+)× \|$", doc, re.M)
    cases = load("training_backward.json")["cases"]
    assert len(rows) == len(cases)
    for (m, k, n, *quoted), c in zip(rows, cases):
        assert (int(m), int(k), int(n)) == (c["M"], c["K"], c["N"])
        assert quoted == [f"{c['native_s'] * 1e3:.2f}", f"{c['emulated_s'] * 1e3:.2f}",
                          f"{c['ratio']:.2f}", f"{c['host_s'] * 1e3:.2f}",
                          f"{c['ratio_host']:.2f}"]


def test_docs_accumulation_tables_quote_the_benchmark():
    """The tensor-core engine table (docs/speed-tables.md) and the MiniLM table and sentences
    (docs/speed.md) are those of benchmarks/results/accumulation_bench.json."""
    bench = load("accumulation_bench.json")
    tables = (ROOT / "docs" / "speed-tables.md").read_text()
    rows = re.findall(r"^\| (`\w+`|sequential \w+) \| (\d+|–) \| ([\d,]+) \| ([\d.]+)× \| "
                      r"([\d.]+)× \|$", tables, re.M)
    want = [(f"`{r['model']}`" if r["order"] == "tensor_core" else f"sequential {r['model']}",
             str(r["promote_every"] or "–"), f"{r['mac_per_s'] / 1e6:,.0f}",
             f"{r['over_sequential_fp16']:.2f}", f"{r['over_sequential_fp32']:.2f}")
            for r in bench["engine"]["rows"]]
    assert rows == want
    assert all(r["same_bits_as_numpy"] for r in bench["engine"]["rows"])
    doc = (ROOT / "docs" / "speed.md").read_text()
    model = re.findall(r"^\| ([^|]+?) \| (yes|counts|no) \| ([\d,]+) ms \| ([\d.]+)× \|$", doc,
                       re.M)
    assert model == [(r["recipe"], {True: "yes", False: "no"}.get(r["capture"], r["capture"]),
                      f"{r['forward_s'] * 1e3:,.0f}", f"{r['ratio']:.2f}")
                     for table in ("model", "model_xeon") for r in bench[table]["rows"]]
    text = " ".join(doc.split())
    tc = [r for r in bench["engine"]["rows"] if r["order"] == "tensor_core"]
    lo16, hi16 = (f(r["over_sequential_fp16"] for r in tc) for f in (min, max))
    lo32, hi32 = (f(r["over_sequential_fp32"] for r in tc) for f in (min, max))
    assert (f"{lo16:.2f}–{hi16:.2f}× the sequential engine's rate with FP16 sums and "
            f"{lo32:.2f}–{hi32:.2f}× with FP32 sums") in text
    families = {"NVIDIA presets": lambda m: not m.startswith("cdna"),
                "CDNA3's": lambda m: m.startswith("cdna3"),
                "CDNA1/2's": lambda m: m.startswith(("cdna1", "cdna2"))}
    spans = {k: [r["over_sequential_fp32"] for r in tc if fam(r["model"])]
             for k, fam in families.items()}
    assert ("the NVIDIA presets run at {:.2f}–{:.2f}×, CDNA3's at {:.2f}–{:.2f}× and CDNA1/2's "
            "at {:.2f}–{:.2f}×".format(*(f(v) for v in spans.values() for f in (min, max)))
            in text)
    numpy_rate = bench["engine"]["numpy_hopper_fp8_mac_per_s"] / 1e6
    hopper = next(r for r in tc if r["model"] == "hopper_fp8" and not r["promote_every"])
    faster = hopper["mac_per_s"] / bench["engine"]["numpy_hopper_fp8_mac_per_s"]
    assert (f"NumPy engine ran `hopper_fp8` at {numpy_rate:.1f} M multiply-adds/s, "
            f"{faster:.0f}× slower") in text
    assert f"and {faster:.0f}× for `hopper_fp8`" in text
    for mode, words in ((True, "capture=True` costs "), ("counts", 'capture="counts"` costs ')):
        over = [r["capture_over_without"] for r in bench["model"]["rows"] if r["capture"] == mode]
        assert over and words + ", ".join(f"{v:.2f}×" for v in over) in text, mode
    spans = {mode: [r["capture_over_without"] for r in bench["model"]["rows"]
                    if r["capture"] == mode] for mode in (True, "counts")}
    emulate = " ".join((ROOT / "docs" / "emulate.md").read_text().split())
    assert ("costs {:.2f}–{:.2f}× the run without it this way, against {:.2f}–{:.2f}× with the "
            "SNR".format(*(f(spans[m]) for m in ("counts", True) for f in (min, max)))
            in emulate)


def test_docs_statistics_table_quotes_the_benchmark():
    """What return_stats costs the compiled engine (docs/speed.md), now and before a zero
    addend was counted quickly, is benchmarks/results/accumulation_bench.json's; every count
    was the NumPy engine's."""
    bench = load("accumulation_bench.json")
    doc = (ROOT / "docs" / "speed.md").read_text()
    rows = re.findall(r"^\| ([\w ]+) \| (as drawn|a third zero) \| (none|swamped|all) \| "
                      r"([\d,]+) \| ([\d.]+)× \|$", doc, re.M)
    assert rows == [(r["sums"], r["operands"], r["statistics"], f"{r['mac_per_s'] / 1e6:,.0f}",
                     f"{r['over_without']:.2f}") for r in bench["statistics"]["rows"]]
    for table in ("statistics", "statistics_before"):
        assert all(r["same_counts_as_numpy"] for r in bench[table]["rows"]
                   if r["statistics"] != "none"), table
    swamped = {(r["sums"], r["operands"]): r["over_without"]
               for r in bench["statistics_before"]["rows"] if r["statistics"] == "swamped"}
    text = " ".join(doc.split())
    assert ("with the swamped count alone, sequential FP16 sums ran at {:.2f}× and {:.2f}× the "
            "rate without statistics, as drawn and a third zero, sequential FP32 sums at {:.2f}× "
            "and {:.2f}×".format(*(swamped[s, o] for s in ("sequential fp16", "sequential fp32")
                                   for o in ("as drawn", "a third zero")))) in text


def test_docs_xeon_model_table_sentences_quote_the_benchmark():
    """The MiniLM table rerun on an Intel Xeon: its ratios, capture's costs, the run before
    and the engine rates beside the EPYC's in docs/speed.md are
    benchmarks/results/accumulation_bench.json's."""
    bench = load("accumulation_bench.json")
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    rows, before = ({(r["recipe"], r["capture"]): r for r in bench[t]["rows"]}
                    for t in ("model_xeon", "model_xeon_before"))
    native = {t: next(r["forward_s"] for r in bench[t]["rows"] if r["recipe"].startswith("native"))
              for t in ("model", "model_xeon", "model_xeon_before")}
    seq_here = next(r["mac_per_s_512"] for r in bench["vectors"]["rows"]
                    if (r["shape"], r["sums"]) == ("64x384x384", "sequential fp16"))
    seq_there = next(r["mac_per_s"] for r in bench["engine"]["rows"]
                     if (r["order"], r["model"]) == ("sequential", "fp16"))
    fp16, deepseek = ("FP16 operands, FP16 sequential sums",
                      "deepseek-v3 preset (Hopper FP8 tensor core, promotion every 128)")
    assert (f"the FP16 row runs at {rows[fp16, False]['ratio']:.2f}× native and `deepseek-v3` at "
            f"{rows[deepseek, False]['ratio']:.2f}×: `deepseek-v3` is under the 30×") in text
    assert rows[deepseek, False]["ratio"] <= 30 < before[deepseek, False]["ratio"]
    assert (f"Native FP32 is faster here ({native['model_xeon'] * 1e3:,.0f} ms against "
            f"{native['model'] * 1e3:,.0f})") in text
    assert (f"at {seq_here / 1e6:,.0f} M/s here, {seq_there / 1e6:,.0f} M/s there") in text
    for mode, words in ((True, "capture=True` costs "), ("counts", 'capture="counts"` ')):
        over = [r["capture_over_without"] for r in bench["model_xeon"]["rows"]
                if r["capture"] == mode]
        assert words + ", ".join(f"{v:.2f}×" for v in over) in text, mode
    assert (f"gave the FP16 row {before[fp16, False]['ratio']:.2f}× and `deepseek-v3` "
            f"{before[deepseek, False]['ratio']:.2f}×, against a native forward of "
            f"{native['model_xeon_before'] * 1e3:,.0f} ms") in text
    assert (f"`capture=True`: {before[fp16, True]['capture_over_without']:.2f}× then, "
            f"{rows[fp16, True]['capture_over_without']:.2f}× now") in text
    adds = [1e3 * (t[fp16, True]["forward_s"] - t[fp16, False]["forward_s"])
            for t in (before, rows)]
    faster = before[fp16, False]["forward_s"] / rows[fp16, False]["forward_s"]
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine"}[round(faster)]
    assert (f"became {words} times faster while what capture adds (the FP64 reference GEMM, the "
            f"counted kernel, the statistics' arrays) fell less, from {adds[0]:,.0f} ms to "
            f"{adds[1]:,.0f} ms a forward") in text
    for t in ("model_xeon", "model_xeon_before", "statistics", "vectors"):
        assert bench[t]["machine"]["cpu"].startswith("Intel"), t


def test_docs_capture_reference_floor_quotes_the_benchmark():
    """The FP64 reference's cost alone and the floor it puts under capture=True's ratio, in
    docs/speed.md, are accumulation_bench.json's (model_xeon), and the claim that two rows
    cannot reach 1.5× holds there."""
    bench = load("accumulation_bench.json")["model_xeon"]
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    rows = {(r["recipe"], r["capture"]): r for r in bench["rows"]}
    det, fp16 = ("E4M3 per tensor, deterministic FP32 sums", "FP16 operands, FP16 sequential sums")
    floors = [rows[n, True]["floor_over_without"] for n in (det, fp16)]
    counts = [rows[n, "counts"]["capture_over_without"] for n in (det, fp16)]
    assert (f"{bench['reference_s'] * 1e3:,.0f} ms a forward, "
            f"{bench['reference_over_native']:.2f}× a native forward") in text
    assert (f"would make `capture=True` cost {floors[0]:.2f}× and {floors[1]:.2f}× on the "
            f"deterministic-FP32 and FP16 rows") in text
    assert min(floors) > 1.5
    assert all(rows[n, True]["capture_over_without"] >= f for n, f in zip((det, fp16), floors))
    assert f"computes no reference, costs {counts[0]:.2f}× and {counts[1]:.2f}× on them" in text
    both = [(rows[n, "counts"]["forward_s"] + bench["reference_s"]) / rows[n, False]["forward_s"]
            for n in (det, fp16)]
    assert (f"that run plus the reference alone comes to {both[0]:.2f}× and {both[1]:.2f}× the "
            f"run without capture") in text
    assert min(both) > 1.5


def test_docs_vector_width_tables_quote_the_benchmark():
    """The kernels at 256- and 512-bit vectors (docs/speed.md): the tables and ranges are
    benchmarks/results/accumulation_bench.json's, every result the same bits at both widths."""
    bench = load("accumulation_bench.json")["vectors"]
    doc = (ROOT / "docs" / "speed.md").read_text()
    assert all(r["same_bits"] for r in bench["rows"])
    rows = re.findall(r"^\| (\d+x\d+x\d+) \| ([\w ,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+)× \|$",
                      doc, re.M)
    assert rows == [(r["shape"], r["sums"], f"{r['mac_per_s_256'] / 1e6:,.0f}",
                     f"{r['mac_per_s_512'] / 1e6:,.0f}", f"{r['gain']:.2f}")
                    for r in bench["rows"]]
    cell = r"([\d,]+) ms \(([\d.]+)×\)"
    model = re.findall(rf"^\| ([^|]+?) \| {cell} \| {cell} \|$", doc, re.M)
    assert model == [(r["recipe"], f"{r['forward_s_256'] * 1e3:,.0f}", f"{r['ratio_256']:.2f}",
                      f"{r['forward_s_512'] * 1e3:,.0f}", f"{r['ratio_512']:.2f}")
                     for r in bench["model_rows"]]
    text = " ".join(doc.split())
    tc = ("volta", "hopper", "cdna")
    spans = [[r["gain"] for r in bench["rows"] if r["sums"].startswith(tc) == want]
             for want in (False, True)]
    assert ("The sequential and pairwise kernels run {:.2f}–{:.2f}× faster, the tensor-core "
            "kernels {:.2f}–{:.2f}×".format(*(f(g) for g in spans for f in (min, max)))) in text
    fp16, deepseek = bench["model_rows"]
    assert (f"the FP16 row falls from {fp16['ratio_256']:.2f}× native to {fp16['ratio_512']:.2f}× "
            f"and `deepseek-v3` from {deepseek['ratio_256']:.2f}× to "
            f"{deepseek['ratio_512']:.2f}×") in text


def test_docs_bound_tables_quote_the_benchmark():
    """The kernels with and without the bound on partial sums (docs/speed.md): tables and
    ranges are benchmarks/results/accumulation_bench.json's, every result and count the
    same both ways."""
    bench = load("accumulation_bench.json")["bound"]
    doc = (ROOT / "docs" / "speed.md").read_text()
    assert all(r["same_bits"] and r["bounded"] for r in bench["rows"])
    rows = re.findall(r"^\| (\d+x\d+x\d+) \| ([\w ,]+) \| (yes|no) \| ([\d,]+) \| ([\d,]+) \| "
                      r"([\d.]+)× \|$", doc, re.M)
    assert rows == [(r["shape"], r["sums"], "yes" if r["bounded"] else "no",
                     f"{r['mac_per_s_unbounded'] / 1e6:,.0f}",
                     f"{r['mac_per_s_bounded'] / 1e6:,.0f}", f"{r['gain']:.2f}")
                    for r in bench["rows"]]
    cell = r"([\d,]+) ms \(([\d.]+)×\)"
    model = re.findall(rf"^\| ([^|]+?) \| (yes|no) \| {cell} \| {cell} \|$", doc, re.M)
    assert model == [(r["recipe"], "yes" if r["capture"] else "no",
                      f"{r['forward_s_unbounded'] * 1e3:,.0f}", f"{r['ratio_unbounded']:.2f}",
                      f"{r['forward_s_bounded'] * 1e3:,.0f}", f"{r['ratio_bounded']:.2f}")
                     for r in bench["model_rows"]]
    text = " ".join(doc.split())
    gains = [r["gain"] for r in bench["rows"]]
    big = [r["gain"] for r in bench["rows"] if r["shape"] == "480x384x1536"]
    assert (f"{min(gains):.2f}–{max(gains):.2f}× on these operands "
            f"({min(big):.2f}–{max(big):.2f}× on MiniLM's layer)") in text
    plain, captured = bench["model_rows"]
    assert (f"the FP16 row falls from {plain['ratio_unbounded']:.2f}× native to "
            f"{plain['ratio_bounded']:.2f}×, and with `capture=True` from "
            f"{captured['ratio_unbounded']:.2f}× to {captured['ratio_bounded']:.2f}×") in text


def test_docs_binary16_unit_tables_quote_the_benchmark():
    """Binary16 sums on the host's binary16 unit beside the float64 kernels (docs/speed.md):
    tables and sentences are benchmarks/results/accumulation_bench.json's, every result and
    count the same both ways."""
    bench = load("accumulation_bench.json")
    half = bench["half"]
    whole = (ROOT / "docs" / "speed.md").read_text()
    doc = section(whole, "### Binary16 sums on the host's binary16 unit")
    assert_two_ways(doc, half, ("float64", "half"))
    text = " ".join(doc.split())
    plain = [r["gain"] for r in half["rows"] if r["sums"] == "sequential fp16"]
    counted = [r["gain"] for r in half["rows"] if r["sums"] != "sequential fp16"]
    m = {r["capture"]: r for r in half["model_rows"]}
    assert (f"Plain sums run {min(plain):.2f}–{max(plain):.2f}× faster, counted ones "
            f"{min(counted):.2f}–{max(counted):.2f}×; MiniLM's FP16 row falls from "
            f"{m[False]['ratio_float64']:.2f}× native to {m[False]['ratio_half']:.2f}×, with "
            f"`capture=True` from {m[True]['ratio_float64']:.2f}× to {m[True]['ratio_half']:.2f}× "
            f"and with `capture=\"counts\"` from {m['counts']['ratio_float64']:.2f}× to "
            f"{m['counts']['ratio_half']:.2f}×") in text
    assert (f"`capture=True` costs {m[True]['forward_s_half'] / m[False]['forward_s_half']:.2f}× "
            "the run without it here") in text
    added = [(m[True][f"forward_s_{w}"] - m[False][f"forward_s_{w}"]) * 1e3
             for w in ("half", "float64")]
    assert ("in the binary16 table below it adds {:,.0f} ms to the binary16 unit's forward and "
            "{:,.0f} ms to the float64 kernels'".format(*added)) in " ".join(whole.split())
    assert half["machine"]["cpu"].startswith("Intel")
    xeon = {(r["recipe"], r["capture"]): r for r in bench["model_xeon"]["rows"]}
    assert xeon["FP16 operands, FP16 sequential sums", False]["ratio"] <= 10


def test_docs_swamped_count_tables_quote_the_benchmark():
    """The binary16 unit's swamped count in one compare beside the careful tests
    (docs/speed.md): tables and sentences are benchmarks/results/accumulation_bench.json's,
    every result and count the same both ways."""
    bench = load("accumulation_bench.json")
    count = bench["count"]
    doc = section((ROOT / "docs" / "speed.md").read_text(),
                  "### The swamped count in one compare")
    assert_two_ways(doc, count, ("careful", "quick"))
    text = " ".join(doc.split())
    counted = [r["gain"] for r in count["rows"] if r["sums"] != "sequential fp16"]
    plain = [r["gain"] for r in count["rows"] if r["sums"] == "sequential fp16"]
    m = {r["capture"]: r for r in count["model_rows"]}
    assert (f"`capture=\"counts\"` falls from {m['counts']['ratio_careful']:.2f}× native to "
            f"{m['counts']['ratio_quick']:.2f}× ({m['counts']['gain']:.2f}×) and `capture=True` "
            f"from {m[True]['ratio_careful']:.2f}× to {m[True]['ratio_quick']:.2f}× "
            f"({m[True]['gain']:.2f}×)") in text
    assert (f"the counted rates moved by {min(counted):.2f}–{max(counted):.2f}×, no more than "
            f"the uncounted rows, the same code in both copies, moved "
            f"({min(plain):.2f}–{max(plain):.2f}×)") in text
    stats = bench["statistics"]["operands"]
    share = re.search(r"a step whose row of b holds a zero: ([\d.]+) of them", stats).group(1)
    assert f"a row of b holds a zero at {share} of the steps" in text
    assert count["machine"]["cpu"].startswith("Intel")
