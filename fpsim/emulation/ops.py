"""The ops of torch that sum products or compute norm statistics, and what fpsim does with each:
the one table a reader checks to see what ``fpsim.emulate`` catches.

Two levels see a model's ops (``fpsim.emulation.intercept``):

- ``PYTHON``: torch functions as the model calls them (``F.linear``, ``F.scaled_dot_product_
  attention``, ``F.batch_norm``...), handled by the ``Interceptor`` method named here.  Here a
  site keeps its meaning: a layer, the two products of attention, a norm's statistics.
- ``ATEN``: the aten ops that every spelling decomposes to (``torch.tensordot``,
  ``linalg.multi_dot``, ``einsum`` of three operands, ``nn.MultiheadAttention``, convolutions all
  reach ``aten::mm``, ``aten::bmm``, ``aten::convolution``...), seen by a ``TorchDispatchMode``
  when no Python-level handler computed them.  An entry with a ``handler`` is emulated as a
  site; one without is *named*: each call is counted as "not emulated" in ``em.report()``,
  warned about at exit, and raises under ``strict=True``.

Keys of ``ATEN`` are schema names (``func._schema.name``), so this module needs no torch
until ``python_handlers`` is called.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AtenOp:
    """One aten op that sums products: the Rule ``kind`` of its sites, the op in the site
    name (``"<module path>:<site>"``), the ``Dispatcher`` method that emulates it (None: named,
    not emulated) and ``training``: the name of a flag argument without which the op sums
    nothing (``native_batch_norm`` with running statistics is elementwise)."""

    kind: str
    site: str
    handler: str | None = None
    training: str | None = None


def _named(kind: str, *names: str, training: str | None = None) -> dict[str, AtenOp]:
    return {f"aten::{n}": AtenOp(kind, n.lstrip("_"), None, training) for n in names}


#: aten ops (schema name) -> what fpsim does with them.
ATEN: dict[str, AtenOp] = {
    # emulated: products, convolutions, fused attention
    "aten::mm": AtenOp("matmul", "mm", "mm"),
    "aten::bmm": AtenOp("matmul", "bmm", "mm"),
    "aten::addmm": AtenOp("matmul", "addmm", "addmm"),
    "aten::baddbmm": AtenOp("matmul", "baddbmm", "addmm"),
    "aten::addbmm": AtenOp("matmul", "addbmm", "addbmm"),
    "aten::dot": AtenOp("matmul", "dot", "dot"),
    "aten::vdot": AtenOp("matmul", "vdot", "dot"),
    "aten::mv": AtenOp("matmul", "mv", "mv"),
    "aten::addmv": AtenOp("matmul", "addmv", "addmv"),
    "aten::convolution": AtenOp("conv", "conv", "convolution"),
    **{f"aten::{n}": AtenOp("attention", "sdpa", "attention") for n in (
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable")},
    # named, not emulated: products below the ops above, or fused kernels
    **_named("matmul", "_int_mm", "_scaled_mm", "_addmm_activation", "_grouped_mm",
             "_scaled_grouped_mm", "mkldnn_linear", "_trilinear", "_cdist_forward",
             "_euclidean_dist"),
    **_named("conv", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
             "mkldnn_convolution", "_slow_conv2d_forward", "slow_conv3d_forward",
             "slow_conv_transpose2d", "slow_conv_transpose3d", "slow_conv_dilated2d",
             "slow_conv_dilated3d", "_conv_depthwise2d", "conv_depthwise3d",
             "miopen_convolution", "miopen_depthwise_convolution"),
    **_named("attention", "_native_multi_head_attention", "_transformer_encoder_layer_fwd",
             "_flash_attention_forward", "_efficient_attention_forward"),
    **_named("norm", "native_layer_norm", "native_group_norm", "_fused_rms_norm", "var",
             "var_mean", "std", "std_mean", "linalg_vector_norm", "norm",
             "_batch_norm_with_update"),
    **_named("norm", "native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm",
             "miopen_batch_norm", training="training"),
}


def python_handlers() -> dict[Any, str]:
    """torch function -> name of the ``Interceptor`` method that handles it (imports torch).

    Names, not bound methods: a dict of bound methods on the instance would be a reference
    cycle, and every interceptor (with its cache of quantized weights) would then live until
    the cyclic garbage collector ran.
    """
    import torch
    import torch.nn.functional as F
    from torch import Tensor

    return {
        F.linear: "linear",
        torch.addmm: "addmm", Tensor.addmm: "addmm",
        torch.matmul: "matmul", Tensor.matmul: "matmul", torch.linalg.matmul: "matmul",
        Tensor.__matmul__: "matmul", Tensor.__rmatmul__: "rmatmul",
        torch.mm: "matmul", Tensor.mm: "matmul",
        torch.bmm: "matmul", Tensor.bmm: "matmul",
        torch.baddbmm: "baddbmm", Tensor.baddbmm: "baddbmm",
        torch.einsum: "einsum",
        torch.linalg.vecdot: "vecdot",
        F.bilinear: "bilinear",
        F.conv1d: "conv", F.conv2d: "conv", F.conv3d: "conv",
        F.conv_transpose1d: "conv_transpose", F.conv_transpose2d: "conv_transpose",
        F.conv_transpose3d: "conv_transpose",
        F.scaled_dot_product_attention: "attention",
        torch.softmax: "softmax", Tensor.softmax: "softmax", F.softmax: "softmax",
        F.layer_norm: "layer_norm",
        F.rms_norm: "rms_norm",
        F.batch_norm: "batch_norm",
        F.instance_norm: "instance_norm",
        F.group_norm: "group_norm",
        Tensor.pow: "pow", torch.pow: "pow", Tensor.__pow__: "pow",
        Tensor.mean: "mean", torch.mean: "mean",
    }
