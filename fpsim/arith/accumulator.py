"""How the products of a dot product are summed: ``Accumulator``, the one description.

``fpsim.matmul`` (``accum=``, ``order=``, ``chunk=``, ``tensor_core=``), a
``fpsim.Recipe`` (the same keywords and ``native_sums=``) and a recipe's
``fpsim.emulation.casts.Backward`` (``accum=``) all build or take one; its checks are here
and nowhere else.  A new order or tensor-core model is added in ``ORDERS`` (and the driver's
loop, ``fpsim.arith.driver``) or in ``fpsim.arith.tc_models.TENSOR_CORES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats import Format, get_format
from .tc_models import TENSOR_CORES, TensorCoreModel, get_model

#: The orders ``fpsim.matmul`` emulates, one rounding per addition (see ``fpsim.matmul``).
ORDERS = ("sequential", "pairwise", "chunked", "fma", "tensor_core")
#: Sums left to torch inside ``fpsim.emulate`` (not emulated): ``native`` is torch's matmul
#: in FP64, rounded once to the accumulator (FP32 or FP64): the same bits on every machine;
#: ``host`` is torch's own FP32 GEMM: as fast as the host's BLAS, its bits depend on the
#: machine, the library and the thread count (a Recipe's ``native_sums="host"``).
NATIVE_ORDERS = ("native", "host")
FP32, FP64 = get_format("fp32"), get_format("fp64")
_CHUNK = 128        # order="chunked" without a chunk: DeepSeek-V3's promotion interval


@dataclass(frozen=True)
class Accumulator:
    """How products are summed: the one description of an accumulator (frozen, hashable),
    which ``fpsim.matmul``, recipes, backward settings and presets use.

    ``fmt``: the accumulator's float format (a name or a ``Format``; "fp64": float64's own
    additions).  ``order``: one of ``ORDERS`` (emulated, every addition rounded to ``fmt``) or
    ``NATIVE_ORDERS`` (torch's sum inside ``fpsim.emulate``); None: "native" for an FP32 or
    FP64 accumulator, else "sequential".  ``chunk``: with "chunked" (default 128) or
    "tensor_core", partial sums are promoted to an FP32 sum every ``chunk`` products
    (DeepSeek-V3).  ``tensor_core``: with order "tensor_core", a preset name of
    ``fpsim.arith.TENSOR_CORES`` or a ``TensorCoreModel``, which gives the format (leave
    ``fmt`` at "fp32").  Names are stored canonical, so equal descriptions compare equal.

    >>> from fpsim import Accumulator
    >>> Accumulator("fp16").describe(), Accumulator(order="chunked").describe()
    ('fp16 sequential', 'fp32 chunked/128')
    >>> Accumulator("FP32") == Accumulator("fp32", "native")
    True
    """

    fmt: str | Format = "fp32"
    order: str | None = None
    chunk: int | None = None
    tensor_core: str | TensorCoreModel | None = None

    def __post_init__(self) -> None:
        try:
            fmt = get_format(self.fmt)
        except (ValueError, TypeError) as err:
            raise type(err)(f"accum: {err}") from None
        if fmt.is_int:
            raise ValueError(f"accum {fmt.name!r} is an integer format; choose a float format")
        if fmt != FP64 and fmt.mbits > 50:
            raise ValueError(f"accum {fmt.name!r} has {fmt.mbits} mantissa bits; at most 50 (or "
                             "exactly 'fp64') can be emulated")
        if isinstance(self.fmt, str) or _registered(fmt):
            object.__setattr__(self, "fmt", fmt.name)
        order = self.order
        if order is None:
            order = "native" if fmt in (FP32, FP64) else "sequential"
            object.__setattr__(self, "order", order)
        if order not in ORDERS + NATIVE_ORDERS:
            raise ValueError(f"unknown order {order!r}: choose one of "
                             f"{', '.join(ORDERS + NATIVE_ORDERS)}")
        if order == "native" and fmt not in (FP32, FP64):
            raise ValueError(f"order='native' is torch's FP64 matmul rounded once to FP32 or "
                             f"FP64, not {fmt.name}: use order='sequential' (or another of "
                             f"{', '.join(ORDERS)}) to emulate a {fmt.name} accumulator")
        if order == "host" and fmt != FP32:
            raise ValueError("order='host' (native_sums='host') is torch's own FP32 matmul: "
                             "it needs accum='fp32' and order=None")
        model = self._model(order)
        object.__setattr__(self, "chunk", self._chunk(order, model))

    def _model(self, order: str) -> TensorCoreModel | None:
        """The tensor-core model (its name made canonical), checked against ``order``."""
        if order != "tensor_core":
            if self.tensor_core is not None:
                raise ValueError(f"tensor_core={self.tensor_core!r} needs order='tensor_core'")
            return None
        if self.tensor_core is None:
            raise ValueError("order='tensor_core' needs tensor_core=: a preset name "
                             f"({', '.join(TENSOR_CORES)}) or a TensorCoreModel")
        model = get_model(self.tensor_core)
        if isinstance(self.tensor_core, str):
            object.__setattr__(self, "tensor_core", model.name)
        if self.format != FP32:
            raise ValueError("order='tensor_core' takes its accumulator format and rounding from "
                             "the TensorCoreModel (accum=, rounding=); leave accum and rounding "
                             "at their defaults")
        return model

    def _chunk(self, order: str, model: TensorCoreModel | None) -> int | None:
        """``chunk`` checked (and 128 for a chunked order without one)."""
        chunk = self.chunk
        if order == "chunked" and chunk is None:
            return _CHUNK
        if chunk is None:
            return None
        if order not in ("chunked", "tensor_core"):
            raise ValueError(f"chunk applies to order='chunked' or 'tensor_core', not {order!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
        if model is not None and model.accum_format == FP64:
            raise ValueError(f"chunk promotes partial sums to FP32; tensor_core={model.name!r} "
                             "accumulates in FP64 already: leave chunk=None")
        if model is not None and chunk % model.group:
            raise ValueError(f"chunk={chunk} must be a multiple of the tensor core's group "
                             f"({model.group}): promotion happens between instructions")
        return int(chunk)

    @property
    def format(self) -> Format:
        """The accumulator's ``Format``."""
        return get_format(self.fmt)

    @property
    def name(self) -> str:
        """The format's name."""
        return self.format.name

    @property
    def model(self) -> TensorCoreModel | None:
        """The ``TensorCoreModel`` of order "tensor_core" (else None)."""
        return None if self.tensor_core is None else get_model(self.tensor_core)

    @property
    def emulated(self) -> bool:
        """True when ``fpsim.matmul`` emulates the sum (not torch's own, ``NATIVE_ORDERS``)."""
        return self.order not in NATIVE_ORDERS

    def describe(self) -> str:
        """A short label: format, order, tensor-core model and chunk.

        >>> Accumulator(order="tensor_core", tensor_core="hopper_fp8", chunk=128).describe()
        'fp32 tensor_core=hopper_fp8/128'
        """
        label = f"{self.name} {self.order}"
        if self.tensor_core is not None:
            label += f"={self.model.name}"
        return label if self.chunk is None else f"{label}/{self.chunk}"


def _registered(fmt: Format) -> bool:
    """True when ``fmt`` is the format its name gives (stored by name, so it compares equal)."""
    try:
        return get_format(fmt.name) == fmt
    except ValueError:
        return False


def accumulator(accum: Any = "fp32", order: str | None = None, chunk: Any = None,
                tensor_core: Any = None, where: str = "") -> Accumulator:
    """The ``Accumulator`` of the shorthand keywords (``accum`` may be one already: then the
    others stay None).  ``where``: the caller, for the error message."""
    if isinstance(accum, Accumulator):
        beside = [k for k, v in (("order", order), ("chunk", chunk),
                                 ("tensor_core", tensor_core)) if v is not None]
        if beside:
            raise ValueError(f"{where}accum= is an Accumulator, which carries the order, chunk "
                             f"and tensor core; give {', '.join(beside)} inside it "
                             f"(Accumulator(..., {beside[0]}=...)), not beside it")
        return accum
    return Accumulator(accum, order, chunk, tensor_core)
