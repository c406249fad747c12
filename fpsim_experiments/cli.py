"""``fpsim experiment NAME [options]``: run an experiment and write ``OUT/NAME/``.

Each experiment writes ``results.json`` (every number, with what it was measured on and how
long it took), PNG figures and ``REPORT.md`` generated from the JSON.  ``all`` runs every
experiment on one shared capture and writes ``OUT/REPORT.md`` with every conclusion.
``--quick`` is a first try (about a minute per experiment on 2 idle cores; docs/experiments.md
says what each leaves out).  ``--device cuda`` (the default when torch
sees a GPU) runs the model and the emulation on the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from . import (accumulation, activations, anymodel, context, deepseek, fp8, fp16_vs_bf16,
               histograms, model_study, practice, range_cases, range_findings, range_vs_precision,
               seeds, training)
from fpsim.cliparse import OneLineParser

from .report import IEEE_NAMES, load_json, quick_note, write_json
from .sweep import executors, runner, runs as e2e_runs

EXPERIMENTS: dict[str, ModuleType] = {m.NAME: m for m in (
    activations, range_vs_precision, fp16_vs_bf16, fp8, practice, accumulation, histograms,
    deepseek)}
# train their own models; not in all
STANDALONE: dict[str, ModuleType] = {training.NAME: training, seeds.NAME: seeds,
                                     anymodel.NAME: anymodel, range_cases.NAME: range_cases}
#: run their models in this process (no --executor)
IN_PROCESS = (training.NAME, anymodel.NAME)
#: Where a run writes when ``--out`` is not given: a folder git ignores, never the committed
#: ``results/`` (which only ``--out results`` rewrites, on purpose); ``--quick`` runs go below it.
DEFAULT_OUT = Path("runs")
QUICK_OUT = DEFAULT_OUT / "quick"


def limits(out: Path) -> str:
    """What the tiny model cannot tell about GPT-2 124M, with its largest residual value read
    from the activations experiment's JSON when it ran."""
    act = out / activations.NAME / "results.json"
    top = "measured by the activations experiment"
    if act.exists():
        ln = activations._ln(load_json(act))
        top = f"{max(s['a_amax'] for s in ln.values()):.3g}"
    return ("What a tiny model cannot tell about GPT-2 124M: these numbers come from one training "
            "seed of a 3.3M-parameter, 4-layer, width-256 byte-level GPT-2 trained on Python's "
            f"help text, whose largest residual value is {top}; GPT-2 124M has outlier channels "
            "in the thousands, 12 layers and a 50k vocabulary, so where its overflow cliff lies, "
            "which tensor hits it first and how much flushing costs must be measured on it "
            "(`--model gpt2`); the bootstraps cover the choice of held-out windows (and of "
            "held-out topics, where a report says so), not the choice of model; `model-seeds` "
            "reruns the comparisons on tiny models from six training seeds trained alike.")


def _tokens(text: str) -> int:
    """argparse type of ``--tokens``: a positive integer, or ``all`` (every held-out window)."""
    return context.ALL_TOKENS if text == "all" else _positive(text)


def _positive(text: str) -> int:
    """argparse type: a positive integer (argparse names the option in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    everything = {**EXPERIMENTS, **STANDALONE}
    w = max(map(len, everything)) + 2
    listing = "\n".join(f"  {name:<{w}}{_summary(m)}" for name, m in everything.items())
    p = OneLineParser(
        prog="fpsim experiment",
        description=__doc__.splitlines()[0].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"experiments:\n{listing}\n  {'all':<{w}}every experiment above but "
        f"{', '.join(STANDALONE)}, on one shared capture, and OUT/REPORT.md",
    )
    p.add_argument("name", choices=[*EXPERIMENTS, *STANDALONE, "all"], help="experiment to run")
    p.add_argument(
        "--model",
        default=str(context.DEFAULT_MODEL),
        help="checkpoint directory or Hugging Face name in the offline cache "
        f"(default: the tiny byte-level model); {anymodel.NAME} takes any local Hugging Face "
        f"causal-LM directory; {range_vs_precision.NAME} also takes "
        f"{'|'.join(model_study.models.NAMES)} or any Hugging Face directory (the study "
        "through fpsim.emulate, into OUT/range-vs-precision-MODEL)",
    )
    p.add_argument(
        "--tokens",
        type=_tokens,
        help="held-out tokens for end-to-end metrics, or 'all' for every held-out window "
        f"(default all; --quick {context.QUICK.tokens}; {anymodel.NAME} {context.SUBSET_TOKENS})",
    )
    p.add_argument(
        "--out", type=Path,
        help=f"output directory (default {DEFAULT_OUT}/, with --quick {QUICK_OUT}/; the committed "
             "results/ is rewritten only when named here: --out results)"
    )
    p.add_argument(
        "--quick", action="store_true",
        help=f"a first try, not a result: {context.QUICK.tokens} held-out tokens (2 windows of one "
             "topic), subsampled sites and fewer runs (range-vs-precision B=8 only; fp8 9 of 19 "
             "recipes; practice no MXFP8; training 6 steps, 2 seeds, 5 recipes; range-cases one "
             "case per group); its intervals resample those windows only and say nothing beyond "
             "them; each report says what it left out")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   help="where the model, the captured sites and the emulation run (default: "
                        "cuda when torch sees a GPU, else cpu); the emulation gives the same "
                        "bits on both")
    p.add_argument(
        "--threads",
        type=_positive,
        default=os.cpu_count() or 1,
        help="CPU threads of torch and of fpsim's casts (default: all cores); fpsim's "
             "emulated arithmetic does not depend on it, torch's own FP32 ops can (training's "
             "held-out losses move in their 3rd-4th digit; results.json records it)",
    )
    p.add_argument(
        "--render",
        action="store_true",
        help="only regenerate figures and REPORT.md from an existing results.json",
    )
    p.add_argument("--executor", choices=executors.EXECUTORS, default="inprocess",
                   help="where the end-to-end runs are computed: this process (default), a "
                        "local process pool, or Ray (as fpsim sweep; the same numbers); each "
                        "is kept in OUT/NAME/tasks until the results are written")
    p.add_argument("--workers", type=_positive, help="pool processes, or CPUs of the local Ray "
                   "cluster started for the run (default: all cores)")
    p.add_argument("--address", help="with --executor ray: the cluster to join (ray://host:port "
                   "or auto) instead of starting a local one")
    p.add_argument("--resume", action="store_true",
                   help="keep the end-to-end runs an interrupted run left in OUT/NAME/tasks and "
                        "compute only the others")
    range_cases.add_arguments(p)
    p.add_argument("--units", type=_positive, metavar="N",
                   help="range-vs-precision --model MODEL: its inputs, in the model's own "
                        "units (windows; sentences, which Whisper packs into clips); default "
                        "the model's full size, or its --quick size")
    seeds.add_arguments(p)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device; use --device cpu")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.seeds is not None and args.name != seeds.NAME:
        p.error(f"--seeds chooses the models of {seeds.NAME}: drop it for {args.name}")
    if args.address and args.executor != "ray":
        p.error("--address joins a Ray cluster: add --executor ray")
    if args.name in IN_PROCESS and (args.executor != "inprocess" or args.resume):
        p.error(f"{args.name} runs in this process only: drop --executor and --resume")
    try:
        runner.check_executor(args.executor)           # Ray installed, before the model loads
    except ValueError as exc:
        p.error(str(exc))
    study = args.name == range_vs_precision.NAME and model_study.selected(args.model)
    if args.only and args.name != range_cases.NAME:
        p.error(f"--only chooses groups of {range_cases.NAME}: drop it from {args.name}")
    if args.units and not study:
        p.error(f"--units sizes the study of range-vs-precision --model MODEL: drop it from "
                f"{args.name}")
    if args.cases and not (args.name == range_cases.NAME or study):
        p.error(f"--cases chooses cases of {range_cases.NAME} or arms of {args.name} --model "
                f"MODEL: drop it from {args.name}")
    # --- range-vs-precision --model tiny|whisper-tiny.en|minilm|DIR: model_study ---
    if study:
        if args.tokens:
            p.error(f"{args.name} --model {args.model} runs on its own inputs (--quick for a "
                    "few): drop --tokens")
        return args
    # ---
    kind = anymodel.model_type(args.model)
    if args.name != anymodel.NAME and kind not in (None, "gpt2"):
        p.error(f"--model {args.model}: a {kind} model; {args.name} studies GPT-2's sites, "
                f"run `fpsim experiment {anymodel.NAME} --model {args.model}` for any causal LM")
    return args


def _summary(module: ModuleType) -> str:
    """An experiment's one-line description: its docstring's first line after the name."""
    first = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
    return first.split(": ", 1)[-1]


def _load(module: ModuleType, out: Path) -> dict:
    """An experiment's results as its report reads them (its own ``load`` when it has one)."""
    return module.load(out) if hasattr(module, "load") else load_json(out / "results.json")


def _render(module: ModuleType, out: Path) -> None:
    (out / "REPORT.md").write_text(module.render(_load(module, out), out))


def index(out: Path, names: list[str]) -> str:
    """``OUT/REPORT.md`` for ``all``: every experiment's conclusions, linked to its report."""
    lines = ["# Experiment results", ""]
    if names:
        lines += quick_note(_load(EXPERIMENTS[names[0]], out / names[0])["meta"],
                            "each report below says what its experiment left out")
    if range_vs_precision.NAME in names:
        rvp = _load(range_vs_precision, out / range_vs_precision.NAME)
        lines += [
            f"![range vs precision]({range_vs_precision.NAME}/range_vs_precision.png)",
            "",
            "End-to-end KL(FP32 ‖ format) in nats/token of every IEEE-style eXmY split of B bits "
            f"(**{IEEE_NAMES}**) "
            f"(`{rvp['meta']['model']}`: {range_findings.scope(rvp, range_findings.ratios_for(rvp))}"
            f"; {rvp['meta']['tokens']} held-out tokens; NaN: inf/NaN logits):",
            "",
            range_vs_precision.headline(rvp),
            "",
        ]
    if fp16_vs_bf16.NAME in names:
        lines += [
            "FP16 vs BF16: "
            + fp16_vs_bf16.headline(load_json(out / fp16_vs_bf16.NAME / "results.json")),
            "",
        ]
    lines += [limits(out), "",
              "Multiple comparisons: range-vs-precision's verdicts form one family, corrected "
              "with Holm (its last conclusion says how many survive); the verdicts of the other "
              "experiments below are each called at 95% without a correction across the page "
              "and are exploratory. Intervals say what was resampled: windows (and topics) "
              "end to end, trials or token rows in deepseek-accumulation, seeds in training.",
              ""]
    for name in names:
        data = _load(EXPERIMENTS[name], out / name)
        meta = data["meta"]
        lines += [
            f"## [{name}]({name}/REPORT.md)",
            "",
            f"`{meta['model']}`, {meta['tokens']} tokens end to end, {meta['seconds']} s.",
            "",
        ]
        lines += [f"- {c}" for c in EXPERIMENTS[name].conclusions(data)] + [""]
    return "\n".join(lines)


def out_folder(out: Path | None, quick: bool) -> Path:
    """Where a run writes: ``--out`` when given, else ``runs/`` (``runs/quick/`` with --quick).

    >>> out_folder(None, quick=True), out_folder(Path("results"), quick=True)
    (PosixPath('runs/quick'), PosixPath('results'))
    """
    return out if out is not None else QUICK_OUT if quick else DEFAULT_OUT


def main(argv: list[str]) -> int:
    """Run (or re-render) the named experiment(s); returns the exit status (1 when end-to-end
    runs failed: each is named on one line, the finished ones kept for ``--resume``)."""
    args = parse_args(argv)
    args.out = out_folder(args.out, args.quick)
    try:
        with e2e_runs.cluster(args):
            return _run(args)
    except e2e_runs.RunsFailed as exc:
        print(f"fpsim experiment: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.name == range_vs_precision.NAME and model_study.selected(args.model):
        return model_study.main(args)
    if args.name in STANDALONE:
        return STANDALONE[args.name].main(args)
    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    if args.render:
        for name in names:
            _render(EXPERIMENTS[name], args.out / name)
        if args.name == "all":
            (args.out / "REPORT.md").write_text(index(args.out, names))
        return 0
    torch.set_num_threads(args.threads)
    os.environ["FPSIM_THREADS"] = str(args.threads)      # fpsim.parallel reads it per call
    sizes = context.QUICK if args.quick else context.FULL
    if args.tokens:
        sizes = dataclasses.replace(sizes, tokens=args.tokens)
    ctx = context.build(args.model, sizes, args.quick, device=args.device)
    for name in names:
        ctx.execution = e2e_runs.execution(args, name)
        start = time.perf_counter()
        data = EXPERIMENTS[name].run(ctx)
        data["meta"] = {**ctx.meta(), "seconds": round(time.perf_counter() - start, 1)}
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", data)
        _render(EXPERIMENTS[name], out)
        ctx.execution.finish()
        print(f"{name}: {out / 'REPORT.md'} ({data['meta']['seconds']} s)")
    if args.name == "all":
        (args.out / "REPORT.md").write_text(index(args.out, names))
    return 0
