"""Build a SYNTHETIC stress variant of the tiny GPT-2 whose residual stream carries massive
activations at the first token.

Usage: ``python -m fpsim_experiments.gpt2.massive [--out fpsim_experiments/gpt2/massive_synthetic]``

GPT-2 124M's residual stream holds values in the thousands in a few fixed channels at the first
token (Sun et al. 2024, "Massive activations in large language models", arXiv 2402.17762); the
tiny byte-level model peaks at about 18.5, so it cannot show what such values do to 16-bit
formats.  This script makes a model that can, and says so: it is not a trained model.

How (both steps deterministic: fixed seed, one thread):

1. **Edit.** The tiny model already writes its largest position-0 values into a few channels
   (``--channels``, default 2: those with the largest mean |value| at position 0 after block 0,
   on training windows; 211 and 230, both positive).  Add ``--value`` (default 2000) with that
   sign to those channels of the position embedding of position 0, so the residual stream at
   the first token carries about 2000 there at every LayerNorm input, from ``h0.ln_1`` to
   ``ln_f`` (in GPT-2 they appear after the first few blocks).  Every LayerNorm at the first
   token then sees a variance dominated by those channels, which erases that token's content
   and turns it into a nearly fixed vector: the FP32 function changes (held-out loss 1.4457 ->
   1.7002 nats/byte).
2. **Repair fine-tune.** ``--steps`` (400) steps of AdamW (lr 3e-4, no weight decay) towards
   the tiny model's next-byte distributions (KL distillation) on training windows, the edited
   entries of the position embedding frozen, so the other weights adapt to the constant first
   token (as a model trained with massive activations has): held-out loss 1.4753, +2.0% over
   the tiny model.  ``--steps 0`` keeps the bare edit.  About 3.5 minutes on one thread; a
   rerun gives a bit-identical ``model.safetensors`` on the same machine.

It writes ``config.json`` and ``model.safetensors`` (the tiny model's format; ``config.json``
also carries ``"fpsim_synthetic"``, a one-line description the experiment reports print next to
the model name) and ``build_log.json``: the channels, the residual peaks at every LayerNorm
input, and the held-out loss of the tiny model, of the bare edit and of the result.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..context import display_name
from .checkpoint import SYNTHETIC_KEY, load_gpt2, save_gpt2
from .data import heldout_bytes, random_windows, train_bytes, windows
from .evaluate import window_loss
from .model import GPT2, site_name

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "massive_synthetic"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, default=HERE / "tiny", help="model to edit (the tiny one)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output checkpoint directory")
    p.add_argument("--value", type=float, default=2000.0,
                   help="magnitude added to each massive channel at position 0")
    p.add_argument("--channels", type=int, default=2, help="how many massive channels (1-3)")
    p.add_argument("--steps", type=int, default=400, help="repair fine-tune steps (0: bare edit)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=128, help="fine-tune window length")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CPU is shared)")
    args = p.parse_args(argv)
    if not 1 <= args.channels <= 3:
        p.error(f"--channels {args.channels}: use 1 to 3 (massive activations sit in a few "
                "channels)")
    return args


@torch.no_grad()
def residuals(model: GPT2, idx: Tensor) -> dict[str, Tensor]:
    """The residual stream ``[B, T, C]`` entering each LayerNorm, by LayerNorm site name."""
    seen: dict[str, Tensor] = {}
    hooks = [module.register_forward_pre_hook(
        lambda _, args, name=site_name(f"{path}:layer_norm"): seen.__setitem__(name, args[0]))
        for path, module in model.named_modules() if isinstance(module, nn.LayerNorm)]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def pick_channels(model: GPT2, idx: Tensor, k: int) -> tuple[list[int], list[float]]:
    """The ``k`` channels with the largest mean |value| at position 0 after block 0, and the
    sign of their mean there."""
    mean = residuals(model, idx)["h1.ln_1"][:, 0].mean(0)
    top = mean.abs().topk(k).indices
    return [int(c) for c in top], [float(torch.sign(mean[c])) for c in top]


def edit(model: GPT2, channels: list[int], signs: list[float], value: float) -> GPT2:
    """A copy of ``model`` with ``sign * value`` added to ``wpe[0, channel]``."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for c, s in zip(channels, signs):
            out.transformer.wpe.weight[0, c] += s * value
    return out


def repair(model: GPT2, teacher: GPT2, channels: list[int], args: argparse.Namespace
           ) -> list[float]:
    """Fine-tune ``model`` in place towards ``teacher``'s next-byte distributions (KL), the
    edited ``wpe`` entries frozen; returns the training losses (KL, nats/token)."""
    frozen = torch.zeros_like(model.transformer.wpe.weight, dtype=torch.bool)
    frozen[0, channels] = True
    model.transformer.wpe.weight.register_hook(lambda g: g.masked_fill(frozen, 0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    data, gen = train_bytes(), torch.Generator().manual_seed(args.seed)
    losses = []
    model.train()
    for step in range(args.steps):
        batch = random_windows(data, args.block_size, args.batch_size, gen)
        with torch.no_grad():
            target = F.log_softmax(teacher(batch[:, :-1]).flatten(0, 1), -1)
        loss = F.kl_div(F.log_softmax(model(batch[:, :-1]).flatten(0, 1), -1), target,
                        log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0:
            print(f"step {step:4d}  KL to the base model {loss.item():.4f}", flush=True)
    model.eval()
    return losses


def peaks(model: GPT2, idx: Tensor, channels: list[int]) -> dict[str, dict[str, float]]:
    """Per LayerNorm input over windows ``idx``: the smallest and largest |value| of the massive
    channels at position 0, the largest |value| anywhere else, and the median |value|."""
    out = {}
    for name, x in residuals(model, idx).items():
        massive = x[:, 0, channels].abs()
        rest = x.abs().clone()
        rest[:, 0, channels] = 0
        out[name] = {"massive_min": float(massive.min()), "massive_max": float(massive.max()),
                     "other_max": float(rest.max()), "median": float(x.abs().median())}
    return out


def build(args: argparse.Namespace) -> dict:
    """Edit and repair the base model, save it into ``args.out``; returns the build log."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.time()
    base = load_gpt2(args.base)
    probe = windows(train_bytes(), 256, 32)[:, :-1]
    channels, signs = pick_channels(base, probe, args.channels)
    edited = edit(base, channels, signs, args.value)
    held = windows(heldout_bytes(), 256)
    log = {"base": display_name(args.base),
           "args": {k: display_name(v) if isinstance(v, Path) else v
                    for k, v in vars(args).items()},
           "channels": channels,
           "signs": signs, "heldout_windows": int(held.shape[0]),
           "heldout_loss": {"base": window_loss(base, held), "edit": window_loss(edited, held)}}
    print(f"channels {channels} signs {signs}; held-out loss {log['heldout_loss']}", flush=True)
    log["train_losses"] = repair(edited, base, channels, args) if args.steps else []
    log["heldout_loss"]["result"] = window_loss(edited, held)
    log["peaks"] = peaks(edited, held[:, :-1], channels)
    log |= {"seconds": round(time.time() - start, 1), "python": sys.version.split()[0],
            "torch": torch.__version__, "machine": platform.machine()}
    print(f"held-out loss {log['heldout_loss']}; ln_f peaks {log['peaks']['ln_f']}", flush=True)
    save_gpt2(edited, args.out)
    cfg = json.loads((args.out / "config.json").read_text())
    added = ", ".join(f"{s * args.value:+g} in channel {c}" for c, s in zip(channels, signs))
    cfg[SYNTHETIC_KEY] = (f"SYNTHETIC stress variant of {log['base']}: {added} added at position "
                          f"0, then a {args.steps}-step repair fine-tune; not a trained model")
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (args.out / "build_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


if __name__ == "__main__":
    build(parse_args())
