"""The synthetic massive-activation checkpoint: it loads, carries its massive values where its
build log says, and is labelled synthetic everywhere a reader meets it."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fpsim_experiments.context import DEFAULT_MODEL, synthetic_note  # noqa: E402
from fpsim_experiments.gpt2.checkpoint import load_gpt2  # noqa: E402
from fpsim_experiments.gpt2.data import heldout_bytes, windows  # noqa: E402
from fpsim_experiments.gpt2.massive import DEFAULT_OUT, edit, residuals  # noqa: E402
from fpsim_experiments.report import page  # noqa: E402

MASSIVE = DEFAULT_OUT
LOG = json.loads((MASSIVE / "build_log.json").read_text())


def _first_tokens() -> torch.Tensor:
    return windows(heldout_bytes(), 64, 4)[:, :-1]


def test_checkpoint_is_small_and_labelled_synthetic():
    assert (MASSIVE / "model.safetensors").stat().st_size <= 15 * 2**20
    assert "synthetic" in (MASSIVE / "README.md").read_text().lower()
    note = synthetic_note(MASSIVE)
    assert note is not None and "SYNTHETIC" in note
    assert synthetic_note(Path(DEFAULT_MODEL)) is None          # the trained model is not


@pytest.mark.parametrize("model_dir, massive", [(MASSIVE, True), (DEFAULT_MODEL, False)])
def test_first_token_residual_is_massive_in_the_named_channels(model_dir, massive):
    model = load_gpt2(model_dir)
    channels = LOG["channels"]
    assert 1 <= len(channels) <= 3
    seen = residuals(model, _first_tokens())
    assert list(seen) == [f"h{i}.ln_{j}" for i in range(4) for j in (1, 2)] + ["ln_f"]
    for name, x in seen.items():
        first = x[:, 0, channels].abs()
        elsewhere = x[:, 1:].abs().max()
        if massive:      # every LayerNorm input, every window: > 500, while the rest stays small
            assert first.min() > 500 and elsewhere < 100, name
        else:            # the tiny model it was made from has nothing of the kind
            assert first.max() < 100, name


def test_reports_name_the_model_synthetic():
    meta = {"model": "fpsim_experiments/gpt2/massive_synthetic [SYNTHETIC]",
            "synthetic": synthetic_note(MASSIVE)}
    text = page("Title", meta, "intro", ["a conclusion"], [])
    assert text.startswith("# Title (fpsim_experiments/gpt2/massive_synthetic [SYNTHETIC])")
    assert "**Synthetic model:** SYNTHETIC stress variant" in text
    assert "Synthetic model" not in page("Title", {"model": "tiny"}, "intro", [], [])


def test_edit_changes_only_the_named_first_position_entries():
    base = load_gpt2(DEFAULT_MODEL)
    edited = edit(base, [3, 7], [-1.0, 1.0], 100.0)
    delta = {k: edited.state_dict()[k] - v for k, v in base.state_dict().items()}
    changed = {k: d.nonzero().tolist() for k, d in delta.items() if d.any()}
    assert changed == {"transformer.wpe.weight": [[0, 3], [0, 7]]}
    wpe = delta["transformer.wpe.weight"]
    assert torch.allclose(wpe[0, [3, 7]], torch.tensor([-100.0, 100.0]), rtol=0, atol=1e-5)
