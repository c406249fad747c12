"""Train the tiny byte-level GPT-2 on pydoc topics, on CPU, within a wall-clock budget.

Usage: ``python -m fpsim_experiments.gpt2.train_tiny [--minutes 25] [--out fpsim_experiments/gpt2/tiny]``

The learning-rate schedule (linear warm-up, cosine decay) follows training progress,
the larger of steps/max_steps and elapsed/budget, so a run always ends on a decayed
learning rate at the budget. Writes ``config.json``, ``model.safetensors``,
``train_log.json`` and ``loss_curve.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import save_gpt2
from .data import heldout_bytes, random_windows, train_bytes, windows
from .evaluate import window_loss
from .model import GPT2, GPT2Config

DEFAULT_OUT = Path(__file__).resolve().parent / "tiny"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=25.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=20000)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CPU is shared)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def learning_rate(args: argparse.Namespace, step: int, progress: float) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (
        1 + math.cos(math.pi * min(progress, 1.0))
    )


def make_optimizer(model: GPT2, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, LayerNorm gains or embeddings)."""

    def decays(name: str, p: torch.Tensor) -> bool:
        return p.dim() == 2 and "wte" not in name and "wpe" not in name

    decay = [p for n, p in model.named_parameters() if decays(n, p)]
    no_decay = [p for n, p in model.named_parameters() if not decays(n, p)]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def plot_curve(log: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [r["step"] for r in log["train"]],
        [r["loss"] for r in log["train"]],
        lw=0.8,
        label="train (batch)",
    )
    ax.plot(
        [r["step"] for r in log["eval"]],
        [r["heldout_loss"] for r in log["eval"]],
        "o-",
        label="held-out",
    )
    ax.axhline(math.log(256), ls=":", c="gray", label="uniform, ln 256")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_title("tiny byte-level GPT-2 on pydoc topics")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def train(args: argparse.Namespace) -> dict:
    """Run training, save the model and its log into ``args.out``; returns the log."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=4, n_head=4, n_embd=256, n_positions=args.block_size, vocab_size=256)
    model = GPT2(cfg)
    opt = make_optimizer(model, args)
    data, held = train_bytes(), heldout_bytes()
    held_wins = windows(held, args.block_size)
    gen = torch.Generator().manual_seed(args.seed)
    train_eval_wins = random_windows(data, args.block_size, len(held_wins), gen)
    log = {
        "config": cfg.to_hf_dict(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "seed": args.seed,
        "python": sys.version,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "train_bytes": data.numel(),
        "heldout_bytes": held.numel(),
        "train": [],
        "eval": [],
    }
    budget, start, step = args.minutes * 60.0, time.time(), 0

    def evaluate() -> None:
        model.eval()
        loss = window_loss(model, held_wins)
        model.train()
        log["eval"].append({"step": step, "heldout_loss": loss, "elapsed_s": time.time() - start})
        print(f"step {step:5d}  held-out {loss:.4f}  {time.time() - start:7.1f}s", flush=True)

    model.train()
    while True:
        progress = max(step / args.max_steps, (time.time() - start) / budget)
        if progress >= 1.0:
            break
        lr = learning_rate(args, step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = random_windows(data, args.block_size, args.batch_size, gen)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log["train"].append({"step": step, "loss": loss.item(), "lr": lr})
        if step % args.eval_every == 0:
            evaluate()
        step += 1

    evaluate()
    model.eval()
    log.update(
        steps=step,
        wall_time_s=time.time() - start,
        final_heldout_loss=log["eval"][-1]["heldout_loss"],
        final_train_loss=window_loss(model, train_eval_wins),
    )
    print(
        f"done: {step} steps, train {log['final_train_loss']:.4f}, held-out "
        f"{log['final_heldout_loss']:.4f}, "
        f"{log['wall_time_s']:.0f}s",
        flush=True,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    save_gpt2(model, args.out)
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    plot_curve(log, args.out / "loss_curve.png")
    return log


if __name__ == "__main__":
    train(parse_args())
