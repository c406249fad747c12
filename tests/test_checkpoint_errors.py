"""``fpsim experiment`` on broken checkpoints: one line naming the file and the problem,
exit status 2."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fpsim_experiments.gpt2.checkpoint import load_gpt2, save_gpt2  # noqa: E402
from fpsim_experiments.gpt2.model import GPT2, GPT2Config  # noqa: E402
from fpsim import cli  # noqa: E402


@pytest.fixture
def ckpt(tmp_path) -> Path:
    torch.manual_seed(0)
    d = tmp_path / "ckpt"
    save_gpt2(GPT2(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=256)), d)
    return d


def experiment(capsys, d: Path, *extra: str) -> tuple[int, str]:
    code = cli.main(["experiment", "activations", "--model", str(d), "--quick",
                     "--out", str(d.parent / "out"), *extra])
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def edit_config(d: Path, change) -> None:
    path = d / "config.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_valid_checkpoint_loads(ckpt):
    assert load_gpt2(ckpt).config.n_embd == 16


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_safetensors(capsys, ckpt, damage):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:len(data) // 2], "garbage": b"\x01" * 200,
                      "empty": b""}[damage])
    code, err = experiment(capsys, ckpt)
    assert code == 2
    assert f"{path}: corrupt or truncated weight file" in one_line(err)


def test_pickle_bin_is_refused_and_not_executed(capsys, ckpt, tmp_path):
    (ckpt / "model.safetensors").unlink()
    marker = tmp_path / "executed"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps({"wte.weight": Evil()}))
    code, err = experiment(capsys, ckpt)
    assert code == 2 and not marker.exists()
    line = one_line(err)
    assert f"{ckpt / 'pytorch_model.bin'}: " in line and "safetensors" in line


def test_truncated_bin(capsys, ckpt):
    sd = {k: v for k, v in GPT2(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32,
                                          vocab_size=256)).state_dict().items()}
    (ckpt / "model.safetensors").unlink()
    torch.save(sd, ckpt / "pytorch_model.bin")
    data = (ckpt / "pytorch_model.bin").read_bytes()
    (ckpt / "pytorch_model.bin").write_bytes(data[:len(data) // 3])
    code, err = experiment(capsys, ckpt)
    assert code == 2 and "pytorch_model.bin: corrupt or truncated" in one_line(err)


@pytest.mark.parametrize("key, value", [("n_embd", 32), ("vocab_size", 300), ("n_layer", 2),
                                        ("n_positions", 64)])
def test_config_and_weights_disagree(capsys, ckpt, key, value):
    edit_config(ckpt, lambda c: {**c, key: value})
    code, err = experiment(capsys, ckpt)
    line = one_line(err)
    assert code == 2 and "model.safetensors: " in line and "config.json" in line


def test_config_is_a_list(capsys, ckpt):
    (ckpt / "config.json").write_text("[1, 2]")
    code, err = experiment(capsys, ckpt)
    assert code == 2 and "config.json: expected a JSON object" in one_line(err)


def test_config_is_not_json(capsys, ckpt):
    (ckpt / "config.json").write_text("{n_layer: 1")
    code, err = experiment(capsys, ckpt)
    assert code == 2 and "config.json: not a readable JSON file" in one_line(err)


@pytest.mark.parametrize("key", ["n_head", "n_layer", "layer_norm_epsilon", "vocab_size"])
def test_config_missing_a_model_key(capsys, ckpt, key):
    edit_config(ckpt, lambda c: {k: v for k, v in c.items() if k != key})
    code, err = experiment(capsys, ckpt)
    assert code == 2 and f"config.json: missing {key}" in one_line(err)


@pytest.mark.parametrize("change", [{"n_head": 3}, {"n_head": 0}, {"n_embd": "16"},
                                    {"activation_function": "relu"}])
def test_config_bad_values(capsys, ckpt, change):
    edit_config(ckpt, lambda c: {**c, **change})
    code, err = experiment(capsys, ckpt)
    assert code == 2 and "config.json: " in one_line(err)


def test_n_ctx_stands_for_n_positions(ckpt):
    edit_config(ckpt, lambda c: {k: v for k, v in c.items() if k != "n_positions"})
    assert load_gpt2(ckpt).config.n_positions == 32


@pytest.mark.parametrize("option", ["--threads", "--tokens"])
@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_non_positive_counts_are_one_line(capsys, ckpt, option, value):
    with pytest.raises(SystemExit) as exit_:
        experiment(capsys, ckpt, option, value)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and option in one_line(err)
