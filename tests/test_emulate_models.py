"""fpsim.emulate on models written by others, built here from tiny configs with random weights
(nothing downloaded): every ``nn.Linear`` / ``nn.Conv*`` is a site, the FP64 recipe gives the
model's own float64 output (rounded to FP32: FP64 sums differ from torch's only in order), an
FP4 recipe changes it, and ``strict=True`` passes (nothing that sums products escapes)."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

import fpsim  # noqa: E402
from fpsim import Recipe  # noqa: E402

FP64 = Recipe(accum="fp64")
FP4 = Recipe("e2m1")


def _lm(cfg_cls, model_cls, **kw):
    def build():
        cfg = cfg_cls(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=61,
                      max_position_embeddings=32, **kw)
        return getattr(transformers, model_cls)(cfg)
    return build


def _ids(vocab: int = 61, length: int = 9):
    return {"input_ids": torch.randint(0, vocab, (2, length),
                                       generator=torch.Generator().manual_seed(1))}


def bert():
    cfg = transformers.BertConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, vocab_size=61,
                                  max_position_embeddings=32)
    return transformers.BertModel(cfg)


def bart():
    cfg = transformers.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                  encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=61,
                                  max_position_embeddings=32, pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2, decoder_start_token_id=2)
    return transformers.BartForConditionalGeneration(cfg)


def vit():
    cfg = transformers.ViTConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, image_size=16, patch_size=4,
                                 num_channels=3)
    return transformers.ViTModel(cfg)


def wav2vec2():
    cfg = transformers.Wav2Vec2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, conv_dim=(16, 16),
                                      conv_stride=(5, 2), conv_kernel=(10, 3),
                                      num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
                                      vocab_size=20)
    return transformers.Wav2Vec2Model(cfg)


def whisper():
    cfg = transformers.WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                     encoder_ffn_dim=48, num_mel_bins=8,
                                     max_source_positions=10, decoder_layers=1,
                                     decoder_attention_heads=4, decoder_ffn_dim=48,
                                     vocab_size=61, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=1)
    return transformers.WhisperModel(cfg).get_encoder()


def mamba():
    cfg = transformers.MambaConfig(hidden_size=32, state_size=4, num_hidden_layers=2,
                                   vocab_size=61, expand=2, conv_kernel=4, use_mambapy=True)
    return transformers.MambaForCausalLM(cfg)


class ResNet(nn.Module):
    """A small ResNet: conv-BN-ReLU stem, two residual blocks (one strided, with a 1x1
    projection), global pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.block1 = self._block(8, 8, 1)
        self.block2 = self._block(8, 16, 2)
        self.proj = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 5)

    @staticmethod
    def _block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1, padding_mode="reflect",
                                                  bias=False, groups=2), nn.BatchNorm2d(cout))

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.block1(x))
        x = torch.relu(self.proj(x) + self.block2(x))
        return self.head(x.mean((2, 3)))


def resnet():
    return ResNet()


def torch_encoder():
    layer = nn.TransformerEncoderLayer(32, 4, 48, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _seq2seq():
    return {**_ids(), "decoder_input_ids": _ids(length=5)["input_ids"]}


def _pixels():
    return {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))}


def _audio():
    return {"input_values": torch.randn(2, 200, generator=torch.Generator().manual_seed(3))}


def _mel():
    return {"input_features": torch.randn(2, 8, 20, generator=torch.Generator().manual_seed(4))}


def _image():
    return (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(5)),)


def _seq():
    return (torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(6)),)


MODELS = {
    "llama": (_lm(transformers.LlamaConfig, "LlamaForCausalLM"), _ids),
    "mistral (sliding window)": (_lm(transformers.MistralConfig, "MistralForCausalLM",
                                     sliding_window=4), _ids),
    "gemma2 (soft-capping)": (_lm(transformers.Gemma2Config, "Gemma2ForCausalLM", head_dim=8,
                                  sliding_window=4, final_logit_softcapping=30.0,
                                  attn_logit_softcapping=50.0), _ids),
    "qwen2": (_lm(transformers.Qwen2Config, "Qwen2ForCausalLM"), _ids),
    "bert": (bert, _ids),
    "bart (encoder-decoder)": (bart, _seq2seq),
    "vit (conv patches)": (vit, _pixels),
    "wav2vec2 (conv1d)": (wav2vec2, _audio),
    "whisper encoder": (whisper, _mel),
    "mamba": (mamba, _ids),
    "resnet (BatchNorm)": (resnet, _image),
    "torch TransformerEncoder": (torch_encoder, _seq),
}


class Float64Throughout(torch.overrides.TorchFunctionMode):
    """Casts of float64 tensors to float32 (HF norms and softmaxes upcast to float32 whatever the
    model's dtype) keep float64, so that a float64 model is float64 throughout."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        f32, f64 = torch.float32, torch.float64
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dtype == f64:
            if func is torch.Tensor.float:
                return x
            if func is torch.Tensor.to and (f32 in args[1:] or kwargs.get("dtype") == f32):
                return x
            if kwargs.get("dtype") == f32:
                kwargs["dtype"] = f64
        return func(*args, **kwargs)


def _run(model, inputs, recipe=None, keep64=True, **kw):
    """The model's output tensor (logits or last hidden state) on ``inputs()``, natively or
    under ``recipe``, and the emulation context."""
    given = inputs()
    args, kwargs = ((), given) if isinstance(given, dict) else (given, {})
    em = None
    with torch.no_grad(), Float64Throughout() if keep64 else contextlib.nullcontext():
        if recipe is None:
            y = model(*args, **kwargs)
        else:
            with fpsim.emulate(recipe, **kw) as em:
                y = model(*args, **kwargs)
    if not isinstance(y, torch.Tensor):
        y = y.logits if getattr(y, "logits", None) is not None else y.last_hidden_state
    return y, em


def _double(inputs):
    def dbl():
        given = inputs()
        cast = lambda v: v.double() if v.is_floating_point() else v  # noqa: E731
        if isinstance(given, dict):
            return {k: cast(v) for k, v in given.items()}
        return tuple(cast(v) for v in given)
    return dbl


@pytest.mark.parametrize("name", list(MODELS))
def test_model_is_emulated_site_by_site(name):
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    if name.startswith("resnet"):
        model.train()                                   # batch statistics: norm sites
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.double()
    ref, _ = _run(model, _double(inputs))
    model.load_state_dict(state)                       # running statistics as they were
    got, em = _run(model, _double(inputs), FP64, capture=True, strict=True)
    assert torch.equal(got.float(), ref.float()), float((got - ref).abs().max())
    layers = {n for n, m in model.named_modules()
              if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))}
    seen = {s.rsplit(":", 1)[0] for s in em.sites}
    assert layers and layers <= seen, sorted(layers - seen)
    assert not em.missed
    model.load_state_dict(state)
    model.float()
    low, _ = _run(model, inputs, FP4, keep64=False)
    assert not torch.equal(low, ref.float())
