"""Experiment ``any-model``: FP8 and BF16 recipes on any Hugging Face causal LM, through
fpsim.emulate.

Loads a local Hugging Face causal-LM directory (``config.json``, weights, and ``tokenizer.json``
unless the vocabulary is the 256 bytes) with ``transformers``; nothing is downloaded.  The
held-out text is tokenized with the directory's tokenizer and cut into windows.  Each recipe
of ``recipes`` runs end to end under ``fpsim.emulate`` against the deterministic FP32
reference (every site's dot products in FP64, rounded once to FP32): loss, KL, top-1 with
bootstrap CIs over windows.  On the first batch the context also captures every site (operand
amax, overflowed / flushed operand elements, SNR against FP64 on the same operands), so the
report names where a recipe loses range or precision, whatever the architecture.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import fpsim
from fpsim import Rules
from fpsim.emulation.recipe import FP32 as REFERENCE

from . import bootstrap, context
from .endtoend import compare_logits
from .gpt2.data import heldout_bytes, heldout_text, windows
from .gpt2.tokenizer import load_bpe
from .report import finish, num, page, pct, table, versions
from .sweep.config import named_recipes as recipes

NAME = "any-model"
FP32 = Rules.of(REFERENCE)


def load(model_dir: str | Path) -> tuple[Any, Tensor]:
    """The causal LM in ``model_dir`` (FP32, eval mode) and the held-out text as its token ids.

    Raises a one-line error naming what is missing: transformers, the directory, its
    tokenizer.
    """
    d = Path(model_dir).expanduser()
    if not (d / "config.json").is_file():
        raise SystemExit(f"{NAME}: {d} has no config.json; pass a local Hugging Face causal-LM "
                         "directory (save_pretrained writes one); nothing is downloaded")
    try:
        import transformers
    except ImportError:
        raise SystemExit(f"{NAME}: needs transformers to load {d} (pip install transformers)") \
            from None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, local_files_only=True, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    if (d / "tokenizer.json").is_file():
        ids = torch.tensor(load_bpe(d).encode(heldout_text()).ids, dtype=torch.long)
    elif vocab == 256:
        ids = heldout_bytes()
    else:
        raise SystemExit(f"{NAME}: {d} has no tokenizer.json and its vocabulary ({vocab}) is not "
                         "the 256 bytes; save the tokenizer beside the model")
    if int(ids.max()) >= vocab:
        raise SystemExit(f"{NAME}: {d}/tokenizer.json gives token id {int(ids.max())} but the "
                         f"model's vocabulary has {vocab}; save the model's own tokenizer")
    return model, ids


def context_length(model: Any) -> int:
    """Tokens per window: the model's positions, at most context.BLOCK."""
    cfg = model.config
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return min(context.BLOCK, limit or context.BLOCK)


@torch.no_grad()
def batch_logits(model: Any, wins: Tensor, rules: Rules, batch_size: int) -> list[Tensor]:
    """Logits of every batch of windows under ``rules`` (one emulation context: its weight
    cache serves every batch)."""
    with fpsim.emulate(rules):
        return [model(chunk[:, :-1]).logits.cpu() for chunk in wins.split(batch_size)]


@torch.no_grad()
def site_table(model: Any, wins: Tensor, rules: Rules) -> list[dict[str, Any]]:
    """The capture table (``fpsim.emulation.Emulation.table``) of one batch under ``rules``."""
    with fpsim.emulate(rules, capture=True) as em:
        model(wins[:, :-1])
    return em.table()


def run(model: Any, wins: Tensor, batch_size: int) -> dict[str, Any]:
    """Every recipe end to end against the FP32 reference, and its sites on the first batch."""
    ref = batch_logits(model, wins, FP32, batch_size)
    host = wins.cpu()
    runs = []
    for name, rules in recipes().items():
        e2e = compare_logits(host, ref, batch_logits(model, wins, rules, batch_size), batch_size)
        e2e["ci"] = bootstrap.intervals(e2e["windows"])
        runs.append({"name": name, "e2e": e2e,
                     "sites": site_table(model, wins[:batch_size], rules)})
    return {"runs": runs}


def conclusions(data: dict) -> list[str]:
    """Per recipe: its KL with the CI, and where operands overflowed or flushed."""
    out = []
    for r in data["runs"]:
        e = r["e2e"]
        bad = [s["site"] for s in r["sites"] if s["overflow"]]
        flushed = sum(s["flushed"] for s in r["sites"])
        elements = sum(s["elements"] for s in r["sites"]) or 1
        out.append(f"{r['name']}: KL {num(e['kl'])} {bootstrap.fmt_ci(e['ci']['kl'])}, top-1 "
                   f"{pct(e['top1'])}; {pct(flushed / elements)} of operand elements flushed to "
                   "zero" + (f"; operands overflowed at {', '.join(bad[:3])}" if bad else "")
                   + ".")
    return out


def render(data: dict, out: Path) -> str:
    """REPORT.md: conclusions, the end-to-end table and each recipe's worst sites by SNR."""
    meta = data["meta"]
    rows = [[r["name"], num(r["e2e"]["kl"]), bootstrap.fmt_ci(r["e2e"]["ci"]["kl"]),
             num(r["e2e"]["loss"]), pct(r["e2e"]["top1"]), pct(r["e2e"]["finite"])]
            for r in data["runs"]]
    body = [table(["recipe", "KL", "95% CI", "loss", "top-1", "finite"], rows), ""]
    for r in data["runs"]:
        worst = sorted(r["sites"], key=lambda s: s["snr_db"]
                       if s["snr_db"] is not None and not math.isnan(s["snr_db"]) else math.inf)
        body += [f"### {r['name']}: the five sites with the lowest SNR (first batch)", "",
                 table(["site", "kind", "amax", "overflow", "flushed", "SNR dB"],
                       [[s["site"], s["kind"], num(s["amax"]), s["overflow"], s["flushed"],
                         num(s["snr_db"])] for s in worst[:5]]), ""]
    intro = (f"`{meta['model_type']}` model, {meta['parameters']} parameters, {meta['tokens']} "
             f"held-out tokens in windows of {meta['window']}, {meta['seconds']} s. Every "
             "dot-product site runs through fpsim.emulate; the reference is the FP32 recipe.")
    return page(f"{NAME}: recipes on any causal LM", meta, intro, conclusions(data), body)


def main(args: argparse.Namespace) -> int:
    """``fpsim experiment any-model --model DIR``: run (or ``--render``) and write
    ``OUT/any-model/``."""
    data = None
    if not args.render:
        torch.set_num_threads(args.threads)
        sizes = context.QUICK if args.quick else context.SUBSET
        tokens = args.tokens or sizes.tokens
        start = time.perf_counter()
        model, ids = load(args.model)
        block = context_length(model)
        model = model.to(args.device)
        wins = windows(ids, block, max(1, tokens // block)).to(args.device)
        data = run(model, wins, batch_size=8)
        data["meta"] = {"model": context.display_name(args.model),
                        "model_type": model.config.model_type,
                        "parameters": sum(p.numel() for p in model.parameters()),
                        "tokens": wins.shape[0] * (wins.shape[1] - 1), "window": block,
                        "quick": args.quick, "device": args.device, **versions(),
                        "seconds": round(time.perf_counter() - start, 1)}
    finish(NAME, args.out / NAME, data, render)
    return 0


def model_type(model_dir: str | Path) -> str | None:
    """``model_type`` of a local checkpoint's config.json (None when there is none to read)."""
    path = Path(model_dir).expanduser() / "config.json"
    try:
        return json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
