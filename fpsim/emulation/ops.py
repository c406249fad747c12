"""The ops of torch that sum products or compute norm statistics, and what fpsim does with each:
the one table a reader checks to see what ``fpsim.emulate`` catches.

Two levels see a model's ops (``fpsim.emulation.intercept``):

- torch functions as the model calls them (``F.linear``, ``F.scaled_dot_product_attention``,
  ``F.batch_norm``...), each handled by the ``Interceptor`` method registered for it with
  ``@handles(...)`` in ``fpsim.emulation.intercept``, where it is written.  Here a site
  keeps its meaning: a layer, the two products of attention, a norm's statistics.
- ``ATEN``: the aten ops that every spelling decomposes to (``torch.tensordot``,
  ``linalg.multi_dot``, ``einsum`` of three operands, ``nn.MultiheadAttention``, convolutions all
  reach ``aten::mm``, ``aten::bmm``, ``aten::convolution``...), seen by a ``TorchDispatchMode``
  when no Python-level handler computed them.  An entry with a method registered for it in
  ``fpsim.emulation.aten`` (``@emulates``) is emulated as a site; one without is *named*:
  each call is counted as "not emulated" in ``em.report()``, warned about at exit, and raises
  under ``strict=True``.

Keys of ``ATEN`` are schema names (``func._schema.name``), so this module needs no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AtenOp:
    """One aten op that sums products: the Rule ``kind`` of its sites, the op in the site
    name (``"<module path>:<site>"``) and ``training``: the name of a flag argument without
    which the op sums nothing (``native_batch_norm`` with running statistics is elementwise).
    It is emulated where a method of ``fpsim.emulation.aten.AtenMode`` is registered for
    it (``@emulates(...)``), else named, not emulated."""

    kind: str
    site: str
    training: str | None = None


def _named(kind: str, *names: str, training: str | None = None) -> dict[str, AtenOp]:
    return {f"aten::{n}": AtenOp(kind, n.lstrip("_"), training) for n in names}


#: The fused scaled-dot-product-attention kernels (emulated as their ``qk`` and ``pv``).
ATTENTION_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_fused_attention_overrideable")

#: aten ops (schema name) -> what fpsim does with them.
ATEN: dict[str, AtenOp] = {
    # emulated: products, convolutions, fused attention
    "aten::mm": AtenOp("matmul", "mm"),
    "aten::bmm": AtenOp("matmul", "bmm"),
    "aten::addmm": AtenOp("matmul", "addmm"),
    "aten::baddbmm": AtenOp("matmul", "baddbmm"),
    "aten::addbmm": AtenOp("matmul", "addbmm"),
    "aten::dot": AtenOp("matmul", "dot"),
    "aten::vdot": AtenOp("matmul", "vdot"),
    "aten::mv": AtenOp("matmul", "mv"),
    "aten::addmv": AtenOp("matmul", "addmv"),
    "aten::convolution": AtenOp("conv", "conv"),
    **{f"aten::{n}": AtenOp("attention", "sdpa") for n in ATTENTION_KERNELS},
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
