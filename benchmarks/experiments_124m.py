"""Time and peak memory of each experiment on a GPT-2 124M-shaped checkpoint, to plan a real run.

Builds a *random* Hugging Face ``GPT2LMHeadModel`` with GPT-2 small's shape (12 layers, width 768,
12 heads, 1024 positions, 50257-token vocabulary), saved with ``save_pretrained`` beside a
byte-level BPE ``tokenizer.json`` trained locally (nothing is downloaded), then runs
``fpsim experiment NAME --model DIR`` for each experiment in its own process and records wall
time, CPU time and peak resident memory (GNU time's maximum resident set size of the child).
The numbers say what a run costs, not what the formats do: the weights are random.

    python benchmarks/experiments_124m.py --quick --tokens 2048 --only activations fp16-vs-bf16

Writes a table and ``--out`` JSON with the machine and its load average.  ``--combine A.json
B.json ...`` makes one table of several such runs (e.g. one experiment rerun with fewer
tokens): per experiment the last row that finished, each row with its own run's settings,
date and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from timing import machine  # noqa: E402  (beside this file)

EXPERIMENTS = ("activations", "range-vs-precision", "fp16-vs-bf16", "fp8", "practice",
               "accumulation", "histograms", "deepseek-accumulation")


def build(out: Path, vocab: int = 2000) -> Path:
    """Random GPT-2 124M-shaped checkpoint and a local BPE tokenizer in ``out``."""
    import torch
    import transformers

    from fpsim_experiments.gpt2.data import split_topics
    from fpsim_experiments.gpt2.tokenizer import train_byte_bpe
    from pydoc_data.topics import topics

    tok = train_byte_bpe([topics[k] for k in split_topics()[0]], vocab)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config()          # GPT-2 small: 12 x 768, 50257 tokens
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(out)
    return out


def run(name: str, model: Path, args: argparse.Namespace, out: Path) -> dict:
    """One experiment in a child process: wall/CPU seconds, peak RSS, exit status."""
    cmd = ["/usr/bin/time", "-f", "maxrss_kb=%M", sys.executable, "-m", "fpsim.cli",
           "experiment", name, "--model", str(model), "--out", str(out),
           "--threads", str(args.threads)]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--tokens", str(args.tokens)] if args.tokens else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.limit)
        lines = proc.stderr.strip().splitlines()
        rss = [int(x.split("=")[1]) for x in lines if x.startswith("maxrss_kb=")]
        status, peak = proc.returncode, (rss[-1] / 2**20 if rss else float("nan"))
        tail = next((x for x in reversed(lines) if not x.startswith("maxrss_kb=")), "")
    except subprocess.TimeoutExpired:
        status, peak, tail = "timeout", float("nan"), f"stopped after {args.limit} s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"experiment": name, "status": status, "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "peak_rss_gib": round(peak, 2), "last_line": tail[-200:]}


def combine(paths: list[Path]) -> dict:
    """One table from runs of this script: per experiment the last row with status 0 (else the
    last row), carrying its run's settings, date, load average and file name."""
    rows: dict[str, dict] = {}
    for path in paths:
        data = json.loads(path.read_text())
        meta = data["meta"]
        before = meta.get("load_average_1_5_15", meta.get("load_average_before"))
        run = {"quick": meta["quick"], "tokens": meta["tokens"], "threads": meta["threads"],
               "cpu": meta["cpu"], "date": meta.get("date"), "load_average_before_after": [before[0],
                                                                       meta["load_average_after"][0]],
               "source": path.name}
        for row in data["rows"]:
            if row["status"] == 0 or rows.get(row["experiment"], {}).get("status") != 0:
                rows[row["experiment"]] = {**row, **run}
    last = json.loads(paths[-1].read_text())["meta"]
    meta = {k: last[k] for k in ("cpu", "cores", "model")}
    return {"meta": {**meta, "combined_from": [p.name for p in paths]},
            "rows": [rows[n] for n in EXPERIMENTS if n in rows]}


def table(data: dict) -> str:
    """The rows as a text table (settings per row when they differ)."""
    lines = [f"{'experiment':<24}{'status':>8}{'wall s':>9}{'CPU s':>9}{'peak GiB':>10}"
             f"{'tokens':>8}{'threads':>8}"]
    for r in data["rows"]:
        tokens, threads = r.get("tokens", data["meta"].get("tokens")), r.get(
            "threads", data["meta"].get("threads"))
        lines.append(f"{r['experiment']:<24}{r['status']!s:>8}{r['wall_s']:>9}{r['cpu_s']:>9}"
                     f"{r['peak_rss_gib']:>10}{tokens!s:>8}{threads!s:>8}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=list(EXPERIMENTS), choices=EXPERIMENTS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--limit", type=int, default=1800, help="seconds per experiment")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "experiments_124m.json"))
    ap.add_argument("--combine", nargs="+", type=Path, metavar="JSON",
                    help="make one table of these runs' JSON (nothing is run)")
    args = ap.parse_args()
    if args.combine:
        data = combine(args.combine)
        print(table(data))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
        return 0
    meta = machine()
    with tempfile.TemporaryDirectory() as tmp:
        model = build(Path(tmp) / "gpt2-124m-random")
        rows = [run(n, model, args, Path(tmp) / "results") for n in args.only]
    meta.update({"load_average_after": os.getloadavg(), "quick": args.quick,
                 "tokens": args.tokens, "threads": args.threads,
                 "model": "random GPT-2 124M shape (12 x 768, 50257 tokens), BPE tokenizer 2000"})
    print(table({"meta": meta, "rows": rows}))
    print(f"{meta['cpu']}, {meta['cores']} cores, load average before "
          f"{meta['load_average_1_5_15'][0]:.2f}, after {meta['load_average_after'][0]:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0 if all(r["status"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
