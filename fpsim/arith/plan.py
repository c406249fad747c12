"""The options of an emulated matrix product, checked once and gathered in a ``Plan``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formats import Format, get_format
from ..names import resolve
from ..rounding import STOCHASTIC, check_mode
from ..stochastic import check_srbits
from .accumulator import ORDERS, Accumulator, accumulator
from .tensor_core import TensorCoreModel

#: ``backend=`` values of matmul and dot.
MATMUL_BACKENDS = ("auto", "numpy", "numba", "torch", "compiled")
ENGINES = MATMUL_BACKENDS          # the old name
FP32, FP64 = get_format("fp32"), get_format("fp64")


@dataclass(frozen=True)
class Plan:
    """What to emulate: formats, order and roundings (see ``fpsim.matmul``)."""

    inputs: tuple[Format | None, Format | None]
    accum: Format
    order: str
    chunk: int | None
    product: Format | None      # format products are rounded to; None: exact (or native fp64)
    native_product: bool        # product="fp64": a float64 multiply
    rounding: str
    output: Format | None
    model: TensorCoreModel | None
    backend: str
    srbits: int | None = None   # random bits of stochastic rounding (None: every dropped bit)

    @property
    def plain(self) -> bool:
        """fp64 accumulation: float64's own additions."""
        return self.accum == FP64

    @property
    def sum_format(self) -> Format:
        """The format of the finished sums, before ``output`` rounds them."""
        if self.chunk:
            return FP32
        return self.model.accum_format if self.model else self.accum

    @property
    def c_format(self) -> Format:
        """The format the addend C of D = A·B + C is rounded to: the tensor core's register
        (FP32, or FP16 for FP16 results), FP32 with chunk promotion, else the accumulator."""
        if self.chunk:
            return FP32
        return self.model.c_format if self.model else self.accum

    @property
    def result_format(self) -> Format:
        return self.sum_format if self.output is None else self.output


def _fmt(value: Any, what: str) -> Format:
    try:
        return get_format(value)
    except (ValueError, TypeError) as err:
        raise type(err)(f"{what}: {err}") from None


def _inputs(inputs: Any) -> tuple[Format | None, Format | None]:
    if isinstance(inputs, (tuple, list)):
        if len(inputs) != 2:
            raise ValueError("inputs: give one format, or a pair (format of a, format of b)")
        return tuple(None if f is None else _fmt(f, "inputs") for f in inputs)
    return (None, None) if inputs is None else (_fmt(inputs, "inputs"),) * 2


def make_plan(inputs: Any, accum: Any, order: str | None, chunk: Any, product: Any,
              rounding: str, output: Any, tensor_core: Any, backend: str,
              keyword: str = "backend", srbits: Any = None) -> Plan:
    """Check every option; errors name the problem and the fix (``keyword``: the name the
    caller used for ``backend``, "engine" being the deprecated one).  The accumulator is an
    ``Accumulator`` (``accum``), or its keywords (``order`` None: "sequential")."""
    rounding = check_mode(rounding)
    srbits = check_srbits(srbits, rounding)
    if not isinstance(accum, Accumulator):
        order = "sequential" if order is None else order
    acc = accumulator(accum, order, chunk, tensor_core, "matmul: ")
    if not acc.emulated:
        raise ValueError(f"order={acc.order!r} is torch's own sum, a Recipe's inside "
                         "fpsim.emulate; fpsim.matmul emulates an order: choose one of "
                         f"{', '.join(ORDERS)}")
    backend = resolve(keyword, backend, {b: b for b in MATMUL_BACKENDS})
    if backend == "compiled" and rounding in STOCHASTIC:
        raise ValueError(f"{keyword}='compiled' cannot draw random bits inside a compiled step; "
                         f"use {keyword}='torch' or 'numpy' for stochastic rounding")
    if acc.format == FP64 and rounding != "rne":
        raise ValueError("accum='fp64' means float64's own additions (round to nearest even); "
                         f"rounding={rounding!r} needs a narrower accumulator")
    exact = isinstance(product, str) and product == "exact"
    native = not exact and _fmt(product, "product") == FP64
    prod = None if (exact or native) else _fmt(product, "product")
    model = acc.model
    if model is not None:
        if rounding != "rne":
            raise ValueError("order='tensor_core' takes its accumulator format and rounding "
                             "from the TensorCoreModel (accum=, rounding=); leave accum and "
                             "rounding at their defaults")
        if not exact:
            raise ValueError("tensor cores form products exactly: use product='exact'")
    if acc.order == "fma" and not exact:
        raise ValueError("order='fma' rounds product and sum once, so the product is exact: "
                         "use product='exact', or order='sequential' to round products first")
    return Plan(_inputs(inputs), acc.format, acc.order, acc.chunk, prod, native,
                rounding, None if output is None else _fmt(output, "output"), model, backend,
                srbits)
