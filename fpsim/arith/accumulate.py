"""Rounded additions and the summation orders, vectorised over a tile of outputs.

A correctly rounded sum RN_fmt(x + y) is computed without wide integers: the lanes' float sum
``s`` and its exact error ``e`` (TwoSum, Knuth) give the exact value; where ``e`` is non-zero
and ``s`` has an even last bit, ``s`` steps one unit toward ``e``, which makes ``s`` the sum
rounded to odd.  Rounding to odd with at least two more bits than the target, followed by one
rounding with ``fpsim.quantize``, equals rounding the exact sum once (Boldo & Melquiond,
"Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE
Trans. Computers 57(4), 2008) for every directed and nearest mode.

The loop bodies (``Steps``) are pure functions of arrays, so that ``backend="compiled"``
can fuse each into one kernel with ``torch.compile``.
"""

from __future__ import annotations

from typing import Any, Callable

from ..backend import ops_for
import numpy as np

from ..convert import quantize
from ..formats import Format
from ..rounding import STOCHASTIC
from .lanes import Lanes, lane_max

#: Per-output statistics carried through a loop: (swamped, underflow, peak), or () when unused.
Stats = tuple


class Adder:
    """``x + y`` rounded once to ``fmt`` with ``rounding``, elementwise in ``lanes``.

    ``plain`` adds in the lanes' own arithmetic (``fmt`` is the lanes' float, round to nearest
    even).  ``may_overflow`` guards sums beyond the lanes' range, which TwoSum cannot split.
    ``srbits``: random bits of the stochastic modes (None: every dropped bit); a call's ``r``:
    the caller's n-bit values for these additions (shaped like the sum), else drawn from ``rng``.
    """

    def __init__(self, fmt: Format, rounding: str, lanes: Lanes, rng: Any, *, plain: bool,
                 may_overflow: bool, srbits: int | None = None) -> None:
        self.fmt, self.rounding, self.lanes, self.rng = fmt, rounding, lanes, rng
        self.srbits = srbits
        self.plain, self.may_overflow = plain, may_overflow
        self.top = lanes.src.width - 1
        self.big = lane_max(lanes.src)
        self.top_ulp = 2.0 ** (fmt.emax - fmt.mbits)    # the step from max to inf, stochastically

    def __call__(self, x: Any, y: Any, r: Any = None) -> Any:
        # IEEE 754 section 6.3: an exact zero sum of opposite signs is +0, but -0 under rdown;
        # -((-x) - y) has the same value as x + y and that sign of zero (x + x keeps x's sign)
        s = -((-x) - y) if self.rounding == "rdown" else x + y
        if self.plain:
            return s
        xp = self.lanes.xp
        t = s - x
        e = (x - (s - t)) + (y - t)                  # exact: x + y == s + e (NaN at inf)
        if self.may_overflow:                        # a finite exact sum beyond the lanes:
            out = xp.isinf(s) & xp.isfinite(x) & xp.isfinite(y)      # its round-to-odd is
            s = xp.where(out, xp.clip(s, -self.big, self.big), s)      # +-max (odd)
        sb, eb = self.lanes.bits(s), self.lanes.bits(e)
        odd = (sb + ((eb ^ sb) >> self.top)) | 1     # toward e: |s|+1 or |s|-1, made odd
        s_odd = self.lanes.floats(xp.where(abs(e) > 0, odd, sb))
        if self.rounding in STOCHASTIC:
            return self._stochastic(s, e, s_odd, r)
        return quantize(s_odd, self.fmt, rounding=self.rounding, backend=self.lanes.backend)

    def _stochastic(self, s: Any, e: Any, s_odd: Any, r: Any) -> Any:
        """Stochastic rounding of the exact sum s + e.  Round-to-odd is exact only for the
        deterministic modes, so the two neighbours come from it (``rdown``/``rup``) and the
        probability of the upper one from the exact distance: (s - lo) + e over hi - lo.
        ``s - lo`` and ``hi - lo`` are exact; the quotient carries one lane rounding.  With
        ``srbits`` n the exact sum's round-to-odd, n + 2 bits below the accumulator's (the lanes
        are chosen so), has the exact sum's top n + 1 dropped bits and whether any other is set:
        all that the n-bit rules read, so it is rounded with n random bits as it stands."""
        xp, lanes = self.lanes.xp, self.lanes
        if self.srbits is not None:
            if r is None:
                r = random_ints(lanes, self.rng, s.shape, self.srbits)
            return quantize(s_odd, self.fmt, rounding=self.rounding, srbits=self.srbits,
                            random_bits=r, backend=lanes.backend)
        lo = quantize(s_odd, self.fmt, rounding="rdown", backend=lanes.backend)
        hi = quantize(s_odd, self.fmt, rounding="rup", backend=lanes.backend)
        width = xp.where(xp.isinf(hi) & xp.isfinite(lo), self.top_ulp, hi - lo)
        width = xp.where(width == 0, 1.0, width)        # exact sums: lo == hi
        if lanes.torch:
            u = xp.rand(s.shape, generator=self.rng, device=lanes.device, dtype=lanes.fdt)
        else:
            u = self.rng.random(s.shape, dtype=lanes.fdt)
        return xp.where(u < ((s - lo) + e) / width, hi, lo)


def random_ints(lanes: Lanes, rng: Any, shape: tuple, nbits: int) -> Any:
    """Uniform ``nbits``-bit integers of ``shape`` from the lanes' generator."""
    if lanes.torch:
        return lanes.xp.randint(0, 1 << nbits, shape, generator=rng, device=lanes.device,
                                dtype=lanes.xp.int32)
    return rng.integers(0, 1 << nbits, shape, dtype=np.int32)


def new_stats(lanes: Lanes, shape: tuple, wanted: bool) -> Stats:
    if not wanted:
        return ()
    xp = lanes.xp
    return (lanes.zeros(shape, xp.int64), lanes.zeros(shape, xp.int64),
            lanes.zeros(shape, xp.float64))


def counted(lanes: Lanes, acc: Any, y: Any, s: Any, st: Stats) -> Stats:
    """After ``s = round(acc + y)``: was a non-zero ``y`` swallowed; how large did sums get."""
    if not st:
        return st
    xp = lanes.xp
    lost = lanes.count((y != 0) & (s == acc) & xp.isfinite(acc))
    return st[0] + lost, st[1], xp.fmax(st[2], abs(s))


class Steps:
    """The loop bodies of every order, as pure functions of arrays and statistics."""

    def __init__(self, add: Adder, product: Format | None, rounding: str, rng: Any,
                 compiled: bool) -> None:
        self.add, self.product, self.rounding, self.rng = add, product, rounding, rng
        self.lanes = add.lanes
        self.identity = 0.0 if rounding == "rdown" else -0.0   # z + p == p, signed zeros too
        wrap = compile_step if compiled else (lambda f: f)
        self.seq, self.pair = wrap(self._seq), wrap(self._pair)

    def products(self, a: Any, b: Any, st: Stats, r: Any = None) -> tuple[Any, Stats]:
        """Exact products, rounded to the product format when there is one (stochastically:
        with the random bits ``r`` when given, shaped like the products)."""
        p = a * b
        if self.product is None:
            return p, st
        if self.add.srbits is None:
            q = quantize(p, self.product, rounding=self.rounding, seed=self.rng,
                         backend=self.lanes.backend)
        else:
            if r is None:
                r = random_ints(self.lanes, self.rng, p.shape, self.add.srbits)
            q = quantize(p, self.product, rounding=self.rounding, srbits=self.add.srbits,
                         random_bits=r, backend=self.lanes.backend)
        if st:
            miss = self.lanes.count((q == 0) & (p != 0))
            st = st[0], st[1] + (miss.sum(0) if miss.ndim > st[1].ndim else miss), st[2]
        return q, st

    def _seq(self, acc: Any, a: Any, b: Any, st: Stats, r: tuple = (None, None)
             ) -> tuple[Any, Stats]:
        """One term: ``r`` the given random bits of its product and its addition (or None)."""
        p, st = self.products(a, b, st, r[0])
        s = self.add(acc, p, r[1])
        return s, counted(self.lanes, acc, p, s, st)

    def _pair(self, x: Any, y: Any, st: Stats, r: Any = None) -> tuple[Any, Stats]:
        """Additions stacked on axis 0, either operand possibly the one swallowed."""
        s = self.add(x, y, r)
        if not st:
            return s, st
        xp = self.lanes.xp
        lost = ((y != 0) & (s == x) & xp.isfinite(x)) | ((x != 0) & (s == y) & xp.isfinite(y))
        mag = abs(s)
        peak = xp.amax(xp.where(mag == mag, mag, 0 * mag), 0)
        return s, (st[0] + self.lanes.count(lost).sum(0), st[1], xp.fmax(st[2], peak))


def compile_step(fn: Callable) -> Callable:
    """``fn`` fused by torch.compile, its tensors' sizes symbolic from the first call on (so
    tiles of any shape share one kernel; integers such as format fields stay constants)."""
    import torch

    ops_for(torch.zeros(0))          # create the core's torch ops now, not inside the trace
    fused = torch.compile(fn, dynamic=None)

    def run(*args: Any) -> Any:
        for x in _tensors(args):
            for d, n in enumerate(x.shape):
                if n > 1:
                    torch._dynamo.maybe_mark_dynamic(x, d)
        return fused(*args)

    return run


def _tensors(args: Any) -> list:
    out = []
    for x in args:
        out.extend(_tensors(x) if isinstance(x, tuple) else [] if x is None else [x])
    return out


Operands = Callable[[int, int], tuple[Any, Any]]  # (k0, k1) -> (a, b) terms k0..k1-1, axis 0


def sequential(operands: Operands, K: int, steps: Steps, st: Stats, shape: tuple,
               chunk: int | None = None, promote: Callable | None = None,
               init: Any = None, bits: Any = None) -> tuple[Any, Stats]:
    """Left to right, one rounding per addition, starting from ``init`` (C) when given; with
    ``chunk``, the running sum restarts every ``chunk`` terms after ``promote(outer,
    block_sum, st)`` folds it into an outer sum.  ``bits``: the caller's random bits (a
    ``fpsim.arith.given_bits.TileBits``), or None to draw them."""
    lanes = steps.lanes
    acc = lanes.full(shape, steps.identity) if init is None else init
    outer = None
    for k in range(K):
        if chunk and k and k % chunk == 0:
            outer, st = promote(outer, acc, st)
            acc = lanes.full(shape, steps.identity)
        a, b = operands(k, k + 1)
        given = (None, None) if bits is None else bits.step(k)
        acc, st = steps.seq(acc, a[0], b[0], st, given)
    return promote(outer, acc, st) if chunk else (acc, st)


def pairwise(operands: Operands, K: int, steps: Steps, st: Stats, shape: tuple,
             init: Any = None, bits: Any = None) -> tuple[Any, Stats]:
    """A balanced tree: neighbours are added level by level (an odd last term moves up as is),
    so every product passes through at most ceil(log2 K) roundings; ``init`` (C), when given,
    is added to the tree's sum with one more rounding.  ``bits``: the caller's random bits,
    the tree's additions numbered level by level, left to right (given_bits.py)."""
    def given(i: int, n: int) -> Any:
        return None if bits is None else bits.additions(i, n)

    if init is not None:
        s, st = pairwise(operands, K, steps, st, shape, bits=bits)
        s, st = steps.pair(init[None], s[None], st, given(max(K - 1, 1), 1))
        return s[0], st
    xp = steps.lanes.xp
    a, b = operands(0, K)
    level, st = steps.products(a, b, st, None if bits is None else bits.product_bits())
    if K == 1:                                       # level: (K, *shape)
        s, st = steps.pair(steps.lanes.full((1,) + shape, steps.identity), level, st,
                           given(0, 1))
        return s[0], st
    done = 0                                         # additions so far
    while level.shape[0] > 1:
        n = level.shape[0]
        s, st = steps.pair(level[0:n - 1:2], level[1:n:2], st, given(done, n // 2))
        done += n // 2
        level = xp.concatenate([s, level[n - 1:]]) if n % 2 else s
    return level[0], st
