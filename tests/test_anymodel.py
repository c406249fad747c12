"""``fpsim experiment any-model --model DIR`` on a tiny Llama saved here with save_pretrained and
a BPE tokenizer.json trained here (nothing downloaded)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from fpsim_experiments import anymodel, cli  # noqa: E402
from fpsim_experiments.gpt2.data import heldout_text  # noqa: E402
from fpsim_experiments.gpt2.tokenizer import train_byte_bpe  # noqa: E402

VOCAB = 300


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("llama")
    tok = train_byte_bpe([heldout_text()[:20000]], VOCAB, special_tokens=("[UNK]",))
    tok.save(str(d / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_any_model_runs_a_llama_directory(llama_dir: Path, tmp_path: Path) -> None:
    assert cli.main(["any-model", "--model", str(llama_dir), "--quick", "--tokens", "256",
                     "--threads", "1", "--out", str(tmp_path)]) == 0
    out = tmp_path / "any-model"
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["model_type"] == "llama" and data["meta"]["window"] == 64
    assert data["meta"]["tokens"] == 4 * 64           # four windows of 64 inputs
    assert [r["name"] for r in data["runs"]] == list(anymodel.recipes())
    for run in data["runs"]:
        assert math.isfinite(run["e2e"]["kl"]) and run["e2e"]["kl"] > 0
        sites = {s["site"]: s for s in run["sites"]}
        assert {"model.layers.1.self_attn:qk", "model.norm:rms_norm",
                "lm_head:linear"} <= set(sites)
        assert all(s["calls"] == 1 for s in run["sites"])
    linear_only = {s["site"]: s["recipe"] for s in data["runs"][0]["sites"]}
    assert linear_only["model.layers.0.mlp.up_proj:linear"] == "E4M3 per-tensor"
    assert linear_only["model.layers.0.self_attn:qk"] == "fp32"
    assert "any-model: recipes on any causal LM" in (out / "REPORT.md").read_text()


def test_gpt2_experiments_name_the_way_to_other_models(llama_dir: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["fp8", "--model", str(llama_dir)])
    assert exc.value.code == 2


def test_any_model_needs_a_tokenizer(llama_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in llama_dir.iterdir():
        if f.name != "tokenizer.json":
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(SystemExit, match="no tokenizer.json"):
        anymodel.load(bare)
    with pytest.raises(SystemExit, match="no config.json"):
        anymodel.load(tmp_path)
