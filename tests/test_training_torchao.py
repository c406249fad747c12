"""Peer check: fpsim's torchao-float8-tensorwise preset against torchao's own emulation,
``convert_to_float8_training(model, config=Float8LinearConfig(emulate=True))`` (torchao 0.18.0).

torchao casts each GEMM operand to float8 (codes and an FP32 scale), divides the codes by the
scale in FP32 and sums with torch's FP32 ``mm``; fpsim sums the same FP32 operands in FP64 and
rounds once.  So: (1) with fpsim's sum replaced by torch's FP32 ``mm`` (the only difference),
every cast torchao makes has a bit-identical fpsim cast (codes and scale), and losses, outputs
and all three GEMMs' gradients are bit-identical over optimizer steps, on an MLP and a tiny
Llama (the bias gradient, a plain FP32 sum in torch and an FP64 one in fpsim, likewise); (2) with fpsim's own sum, each GEMM differs from torchao's by no more than torch's FP32
summation error allows, (K + 1) u sum|a||b| with u = 2^-24.
"""

import copy

import pytest
import torch

import fpsim
from fpsim.emulation import backward, presets, quantizers, sites

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


def torch_sum(recipe, a, b, bias, events):
    """torchao's emulated GEMM: FP32 torch matmul, the bias added after."""
    y = torch.matmul(a.float(), b.float())
    return y if bias is None else y + bias


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
def test_same_codes_and_scales_and_bit_identical_training_when_summed_alike(
        build, batch, monkeypatch):
    ours = build()
    theirs = torchao_model(ours)
    ao_seen, fp_seen = record_torchao(monkeypatch), record_fpsim(monkeypatch)
    monkeypatch.setattr(sites, "_product", torch_sum)
    monkeypatch.setattr(backward, "bias_gradient",      # torch's FP32 sum_to_size
                        lambda dy: dy.sum(tuple(range(dy.dim() - 1))))
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
    """fpsim's FP32 sums round once from FP64; torchao's torch.mm rounds at every step: on
    identical quantized operands every result differs by at most (K + 1) u sum|a||b|."""
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(64, 48)
    theirs = torchao_model(torch.nn.Sequential(lin))[0]
    x = torch.randn(96, 64, generator=g)
    G = torch.randn(96, 48, generator=g)
    fp_seen = record_fpsim(monkeypatch)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with fpsim.emulate(presets.rules(NAME)):
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
