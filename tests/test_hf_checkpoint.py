"""Real Hugging Face checkpoints, proven without downloading: a random transformers GPT-2 saved with
save_pretrained loads through fpsim's loader with the same logits, and a BPE tokenizer.json made
with the tokenizers library goes through the experiments' text path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers not installed "
                                   "(pip install 'fpsim[test]')")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed "
                                 "(pip install 'fpsim[test]')")

from fpsim_experiments.context import heldout_tokens  # noqa: E402
from fpsim_experiments.gpt2.checkpoint import load_gpt2  # noqa: E402
from fpsim_experiments.gpt2.data import heldout_text, split_topics  # noqa: E402
from fpsim_experiments.gpt2.tokenizer import train_byte_bpe  # noqa: E402
from pydoc_data.topics import topics  # noqa: E402

VOCAB = 320


def bpe_tokenizer() -> "tokenizers.Tokenizer":
    """A byte-level BPE (GPT-2's scheme) trained on a few training topics."""
    return train_byte_bpe([topics[k] for k in split_topics()[0][:20]], VOCAB)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-gpt2")
    tok = bpe_tokenizer()
    tok.save(str(d / "tokenizer.json"))
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32,
                                  n_layer=2, n_head=4)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(d)
    return d, hf, tok


def test_save_pretrained_checkpoint_loads_with_the_same_logits(checkpoint):
    d, hf, tok = checkpoint
    model = load_gpt2(d)
    assert model.config.n_layer == 2 and model.config.vocab_size == tok.get_vocab_size()
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, model.config.vocab_size, (2, 64), generator=gen)
    with torch.no_grad():
        want = hf(idx).logits
        got = model(idx)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert want.abs().max() > 1e-3                      # the comparison is not between zeros


def test_bpe_tokenizer_json_goes_through_the_text_path(checkpoint):
    d, hf, tok = checkpoint
    model = load_gpt2(d)
    ids = heldout_tokens(model, d)
    assert ids.dtype == torch.long and ids.numel() > 0
    assert ids.tolist() == tok.encode(heldout_text()).ids
    assert int(ids.max()) < model.config.vocab_size and ids.numel() < len(heldout_text())
    assert tok.decode(ids[:200].tolist()) == heldout_text()[:len(tok.decode(ids[:200].tolist()))]
    with torch.no_grad():
        assert torch.isfinite(model(ids[None, :64])).all()
