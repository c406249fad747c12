"""Load and save GPT-2 checkpoints in the Hugging Face directory layout, strictly offline.

A checkpoint directory holds ``config.json`` plus ``model.safetensors`` (preferred)
or ``pytorch_model.bin``. The same code serves the tiny byte-level model and the
real GPT-2 124M from a local Hugging Face cache; nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from .model import GPT2, GPT2Config

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: config.json key marking a synthetic checkpoint (e.g. fpsim_experiments/gpt2/massive_synthetic); its
#: value, a one-line description, is printed in every report on that model.
SYNTHETIC_KEY = "fpsim_synthetic"
# HF stores these alongside the weights; they are constants (causal mask) or tied to wte.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def _is_checkpoint_dir(d: Path) -> bool:
    return (d / "config.json").is_file() and any((d / f).is_file() for f in WEIGHT_FILES)


def _hub_caches() -> list[Path]:
    """Hugging Face hub cache roots, in the order ``huggingface_hub`` would consult them."""
    roots = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]) / "hub")
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    roots.append(xdg / "huggingface" / "hub")
    return list(dict.fromkeys(roots))


def _cached_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot ``refs/main`` points to, else the newest complete snapshot."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if _is_checkpoint_dir(snap):
            return snap
    snaps = [s for s in (repo_dir / "snapshots").glob("*") if _is_checkpoint_dir(s)]
    return max(snaps, key=lambda s: s.stat().st_mtime) if snaps else None


def resolve_checkpoint(path_or_name: str | os.PathLike) -> Path:
    """Checkpoint directory for a local path or a hub name such as ``gpt2`` (offline cache only)."""
    looked = []
    p = Path(path_or_name).expanduser()
    if p.exists():
        if _is_checkpoint_dir(p):
            return p
        looked.append(f"{p} (exists but lacks config.json and one of {', '.join(WEIGHT_FILES)})")
    else:
        looked.append(f"{p} (no such directory)")
    name = str(path_or_name)
    hub_name = not (p.is_absolute() or name.startswith((".", "~")))  # paths are not hub names
    repo = "models--" + name.replace("/", "--")
    for root in _hub_caches() if hub_name else []:
        repo_dir = root / repo
        snap = _cached_snapshot(repo_dir) if repo_dir.is_dir() else None
        if snap is not None:
            return snap
        looked.append(f"{repo_dir}/snapshots/*/")
    raise FileNotFoundError(
        f"GPT-2 checkpoint {str(path_or_name)!r} not found; nothing is downloaded. Looked in:\n  "
        + "\n  ".join(looked)
        + "\nPass a directory containing config.json and model.safetensors (or pytorch_model.bin), "
        "or set HF_HOME to a Hugging Face cache that already holds the model."
    )


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: one line naming the file and the problem."""


#: config.json keys that change the model's arithmetic: required, never defaulted.
REQUIRED_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "layer_norm_epsilon")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def read_config(path: Path) -> GPT2Config:
    """The GPT2Config of a ``config.json``; CheckpointError unless every model key is there."""
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON file ({_first_line(exc)})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object of GPT-2 settings, got a "
                              f"{type(d).__name__}")
    if "n_positions" not in d and "n_ctx" in d:              # older HF configs
        d = {**d, "n_positions": d["n_ctx"]}
    missing = [k for k in REQUIRED_KEYS if k not in d]
    if missing:
        raise CheckpointError(f"{path}: missing {', '.join(missing)}; these keys change the "
                              "model, so there is no default")
    for k in REQUIRED_KEYS:
        kind = (int, float) if k == "layer_norm_epsilon" else int
        if isinstance(d[k], bool) or not isinstance(d[k], kind) or d[k] <= 0:
            raise CheckpointError(f"{path}: {k}={d[k]!r} must be a positive number")
    if d["n_embd"] % d["n_head"]:
        raise CheckpointError(f"{path}: n_embd={d['n_embd']} is not a multiple of "
                              f"n_head={d['n_head']}")
    try:
        return GPT2Config.from_hf_dict(d)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: {_first_line(exc)}") from None


def _read_weights(d: Path) -> dict[str, Tensor]:
    """The tensors of the weight file; CheckpointError for a corrupt, truncated or unsafe one."""
    path = d / "model.safetensors"
    try:
        if path.is_file():
            return load_file(path)
        path = d / "pytorch_model.bin"
        with warnings.catch_warnings():                      # pickle-protocol notes
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path}: refused: it pickles objects other than tensors, which "
                              "are never unpickled (weights_only); convert it to "
                              "model.safetensors") from None
    except Exception as exc:  # noqa: BLE001 - safetensors, zip and torch errors alike
        raise CheckpointError(f"{path}: corrupt or truncated weight file "
                              f"({_first_line(exc)[:200]})") from None
    if not (isinstance(raw, dict) and all(isinstance(t, Tensor) for t in raw.values())):
        raise CheckpointError(f"{path}: expected a dict of named tensors, got a "
                              f"{type(raw).__name__}")
    return raw


def _check_shapes(weights: dict[str, Tensor], model: GPT2, d: Path) -> None:
    """Every parameter present with the shape config.json implies, and nothing else."""
    name = "model.safetensors" if (d / "model.safetensors").is_file() else "pytorch_model.bin"
    want = model.state_dict()
    missing = [k for k in want if k not in weights]
    extra = [k for k in weights if k not in want]
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has unexpected {extra[0]}"
        raise CheckpointError(f"{d / name}: {what} ({len(missing)} missing, {len(extra)} "
                              f"unexpected tensors) for the model {d / 'config.json'} describes")
    for k, t in want.items():
        if tuple(weights[k].shape) != tuple(t.shape):
            raise CheckpointError(f"{d / name}: {k} has shape {tuple(weights[k].shape)} but "
                                  f"{d / 'config.json'} implies {tuple(t.shape)}")


def _to_model_keys(raw: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map HF keys (with or without ``transformer.``) to model keys; drop buffers and a tied lm_head."""
    out = {}
    for key, t in raw.items():
        if key.endswith(_IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue
        out[key if key.startswith("transformer.") else "transformer." + key] = t
    lm_head = raw.get("lm_head.weight")
    if lm_head is not None and not torch.equal(lm_head, out.get("transformer.wte.weight", lm_head)):
        raise ValueError("lm_head.weight differs from transformer.wte.weight; untied heads are not supported")
    return out


def load_gpt2(path_or_name: str | os.PathLike, dtype: torch.dtype = torch.float32) -> GPT2:
    """Load a GPT-2 checkpoint (directory or offline-cached hub name) as an eval-mode model in ``dtype``."""
    d = resolve_checkpoint(path_or_name)
    model = GPT2(read_config(d / "config.json"))
    weights = _to_model_keys(_read_weights(d))
    _check_shapes(weights, model, d)
    model.load_state_dict(weights, strict=True)
    return model.to(dtype).eval()


def save_gpt2(model: GPT2, path: str | os.PathLike) -> None:
    """Write ``config.json`` and float32 ``model.safetensors`` in HF layout (tied lm_head not stored)."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
