"""GPT-2 model and checkpoint tests: forward checked against an independent numpy float64 reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from fpsim_experiments.capture import stream
from fpsim_experiments.endtoend import RecipeRun
from fpsim_experiments.gpt2.checkpoint import load_gpt2, save_gpt2
from fpsim_experiments.gpt2.data import heldout_bytes, split_topics, windows
from fpsim_experiments.gpt2.evaluate import window_loss
from fpsim_experiments.gpt2.tokenizer import decode_bytes, encode_bytes, load_bpe
from fpsim_experiments.recipes import FP32

CFG = {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": 16, "vocab_size": 50,
       "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "model_type": "gpt2"}
TINY_DIR = Path(__file__).resolve().parents[1] / "fpsim_experiments" / "gpt2" / "tiny"


def random_hf_state(seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under HF GPT-2 keys (no ``transformer.`` prefix), buffers excluded."""
    rng = np.random.default_rng(seed)
    C, V, P = CFG["n_embd"], CFG["vocab_size"], CFG["n_positions"]

    def r(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    sd = {"wte.weight": r(V, C), "wpe.weight": r(P, C), "ln_f.weight": 1 + r(C), "ln_f.bias": r(C)}
    for i in range(CFG["n_layer"]):
        p = f"h.{i}."
        sd |= {p + "ln_1.weight": 1 + r(C), p + "ln_1.bias": r(C), p + "ln_2.weight": 1 + r(C), p + "ln_2.bias": r(C),
               p + "attn.c_attn.weight": r(C, 3 * C), p + "attn.c_attn.bias": r(3 * C),
               p + "attn.c_proj.weight": r(C, C), p + "attn.c_proj.bias": r(C),
               p + "mlp.c_fc.weight": r(C, 4 * C), p + "mlp.c_fc.bias": r(4 * C),
               p + "mlp.c_proj.weight": r(4 * C, C), p + "mlp.c_proj.bias": r(C)}
    return sd


def write_checkpoint(d: Path, sd: dict[str, np.ndarray], prefix: str, fmt: str) -> Path:
    """Write ``sd`` as an HF-style checkpoint, with the attention buffers and tied lm_head HF files may carry."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(CFG))
    P = CFG["n_positions"]
    tensors = {prefix + k: torch.from_numpy(v) for k, v in sd.items()}
    for i in range(CFG["n_layer"]):
        tensors[f"{prefix}h.{i}.attn.bias"] = torch.ones(P, P, dtype=torch.bool).tril().view(1, 1, P, P)
        tensors[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    tensors["lm_head.weight"] = tensors[prefix + "wte.weight"].clone()
    if fmt == "safetensors":
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    else:
        torch.save(tensors, d / "pytorch_model.bin")
    return d


def reference_logits(sd: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Straightforward float64 GPT-2 forward written from the paper/HF description."""
    w = {k: v.astype(np.float64) for k, v in sd.items()}
    H, eps = CFG["n_head"], CFG["layer_norm_epsilon"]

    def ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    def gelu(x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    B, T = ids.shape
    C = w["wte.weight"].shape[1]
    hd = C // H
    x = w["wte.weight"][ids] + w["wpe.weight"][np.arange(T)]
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    for i in range(CFG["n_layer"]):
        p = f"h.{i}."
        qkv = ln(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"]) @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        out = np.zeros((B, T, C))
        for h in range(H):
            q, k, v = (qkv[:, :, j * C + h * hd: j * C + (h + 1) * hd] for j in range(3))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            s[:, future] = -np.inf
            e = np.exp(s - s.max(-1, keepdims=True))
            out[:, :, h * hd:(h + 1) * hd] = (e / e.sum(-1, keepdims=True)) @ v
        x = x + out @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = gelu(ln(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"]) @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T


@pytest.fixture(scope="module")
def sd() -> dict[str, np.ndarray]:
    return random_hf_state()


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.random.default_rng(1).integers(0, CFG["vocab_size"], size=(3, CFG["n_positions"]))


@pytest.mark.parametrize("prefix,fmt", [("transformer.", "safetensors"), ("", "safetensors"), ("", "bin")])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_forward_matches_numpy_reference(tmp_path, sd, ids, prefix, fmt, dtype, rtol):
    model = load_gpt2(write_checkpoint(tmp_path / "ckpt", sd, prefix, fmt), dtype=dtype)
    got = model(torch.from_numpy(ids)).detach().double().numpy()
    want = reference_logits(sd, ids)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_save_roundtrip_uses_hf_layout(tmp_path, sd, ids):
    model = load_gpt2(write_checkpoint(tmp_path / "a", sd, "", "safetensors"))
    save_gpt2(model, tmp_path / "b")
    keys = load_file(tmp_path / "b" / "model.safetensors").keys()
    assert all(k.startswith("transformer.") for k in keys) and "lm_head.weight" not in keys
    assert "transformer.h.1.attn.c_attn.weight" in keys
    x = torch.from_numpy(ids)
    assert torch.equal(load_gpt2(tmp_path / "b")(x), model(x))


def test_untied_lm_head_rejected(tmp_path, sd):
    d = write_checkpoint(tmp_path / "c", sd, "", "bin")
    tensors = torch.load(d / "pytorch_model.bin", weights_only=True)
    tensors["lm_head.weight"] += 1
    torch.save(tensors, d / "pytorch_model.bin")
    with pytest.raises(ValueError, match="lm_head"):
        load_gpt2(d)


def _isolated_caches(monkeypatch, tmp_path: Path) -> Path:
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "hf" / "hub"


def test_missing_model_error_lists_places(monkeypatch, tmp_path):
    hub = _isolated_caches(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        load_gpt2("no-such-gpt2")
    msg = str(err.value)
    assert "no-such-gpt2" in msg and "nothing is downloaded" in msg
    assert str(hub / "models--no-such-gpt2") in msg
    assert str(tmp_path / "xdg" / "huggingface" / "hub" / "models--no-such-gpt2") in msg
    assert "config.json" in msg and "model.safetensors" in msg


def test_loads_from_offline_hub_cache(monkeypatch, tmp_path, sd):
    repo = _isolated_caches(monkeypatch, tmp_path) / "models--gpt2"
    write_checkpoint(repo / "snapshots" / "abc123", sd, "", "safetensors")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    assert load_gpt2("gpt2").config.n_embd == CFG["n_embd"]


def test_capture_sees_every_site_once_in_forward_order(tmp_path, sd, ids):
    """The capture's watch hands over each site once, in forward order, its kind told by its
    operands (a LayerNorm's input alone, a linear layer's 2-D weight, a matmul's batched
    operands), and changes no result of the FP32 reference run."""
    model = load_gpt2(write_checkpoint(tmp_path / "d", sd, "", "safetensors"))
    x = torch.from_numpy(ids)
    seen = []

    def kind(site):
        return "layernorm" if site.b is None else "linear" if site.b.dim() == 2 else "matmul"

    logits = stream(model, x, lambda site: seen.append((kind(site), site.name)))
    assert torch.equal(logits, RecipeRun(FP32)(model, x))
    want = []
    for i in range(CFG["n_layer"]):
        want += [("layernorm", f"h{i}.ln_1"), ("linear", f"h{i}.attn.c_attn"), ("matmul", f"h{i}.attn.qk"),
                 ("matmul", f"h{i}.attn.av"), ("linear", f"h{i}.attn.c_proj"), ("layernorm", f"h{i}.ln_2"),
                 ("linear", f"h{i}.mlp.c_fc"), ("linear", f"h{i}.mlp.c_proj")]
    assert seen == want + [("layernorm", "ln_f"), ("linear", "lm_head")]


def test_capture_refuses_a_site_called_twice(tmp_path, sd, ids):
    """A block that calls its LayerNorm twice in one forward pass: the capture names the site
    instead of keeping one call of it silently."""
    model = load_gpt2(write_checkpoint(tmp_path / "d", sd, "", "safetensors"))
    block = model.transformer.h[1]

    def twice(x):
        block.ln_1(x)
        return type(block).forward(block, x)

    block.forward = twice
    with pytest.raises(ValueError, match=r"'h1.ln_1' \(transformer.h.1.ln_1:layer_norm#2\) seen twice"):
        stream(model, torch.from_numpy(ids), lambda site: None)


def test_byte_tokenizer_and_split():
    text = "héllo, world\n"
    assert decode_bytes(encode_bytes(text)) == text
    train, held = split_topics()
    assert held and train and not set(train) & set(held)
    assert split_topics() == (train, held)


def test_bpe_without_tokenizer_json_says_to_pass_ids(tmp_path):
    with pytest.raises(FileNotFoundError, match="pre-tokenized"):
        load_bpe(tmp_path)


@pytest.mark.skipif(not (TINY_DIR / "model.safetensors").is_file(), reason="tiny checkpoint not trained yet")
def test_committed_tiny_checkpoint_is_trained():
    model = load_gpt2(TINY_DIR)
    cfg = model.config
    assert (cfg.vocab_size, cfg.n_layer, cfg.n_embd) == (256, 4, 256)
    assert window_loss(model, windows(heldout_bytes(), cfg.n_positions, limit=4)) < 3.0
