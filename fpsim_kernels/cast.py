"""Generic Triton cast kernels: quantize, encode (packed or not) and decode, one pass each.

One kernel per direction serves every format: the format, rounding mode and flags are
compile-time constants, so Triton builds (and caches) a branch-free specialisation per
combination from the single rounding routine in ``fpsim_kernels.rounding``.  Each program handles
``BLOCK`` contiguous elements, viewed as ``BLOCK // PER`` groups of ``PER`` elements where
``PER`` codes share ``PER * bits / 8`` output bytes (FP4: 2 per byte, FP6: 4 per 3 bytes,
the layout of ``fpsim.packing.pack_codes``).  All rounding is integer arithmetic on float32
bits, so results are bit-identical on a GPU and in ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from fpsim.backend import code_dtype as fpsim_code_dtype, on_nan_keyword
from fpsim.formats import Format, get_format
from fpsim.rounding import F32, STOCHASTIC, Source, check_mode, check_saturate
from fpsim.stochastic import check_random_bits, check_srbits
from fpsim.packing import packed_size

from .rounding import _stochastic, decode_bits, format_spec, round_bits

BLOCK = 4096        # elements per program: 16 float32 per thread at 8 warps, 128-bit accesses
NUM_WARPS = 8
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BF16 = tl.constexpr(format_spec(get_format("bf16")))
_FP16 = tl.constexpr(format_spec(get_format("fp16")))


@triton.constexpr_function
def _bf16_holds(spec: tuple) -> bool:
    """Every value of the format ``spec`` is exact in bfloat16."""
    return Source(8, 7).holds(Format("", *spec))


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------
@triton.jit
def load_bits(ptr, offs, mask):
    """Float32 bits (int32) of float32/float16/bfloat16 elements: exact integer widening, NaN
    signs included (a hardware conversion may canonicalise a NaN's sign)."""
    x = tl.load(ptr + offs, mask=mask, other=0)
    ty: tl.constexpr = ptr.dtype.element_ty
    if ty == tl.float32:
        bits = x.to(tl.int32, bitcast=True)
    else:
        half = x.to(tl.int16, bitcast=True).to(tl.int32)
        if ty == tl.bfloat16:
            bits = half << 16
        else:
            bits = decode_bits(half & 0xFFFF, _FP16)
    return bits


@triton.jit
def store_bits(ptr, offs, bits, mask, FMT: tl.constexpr):
    """Store float32 bits of values of ``FMT`` as the pointer's float type.

    Narrower types round to nearest even, unless every value of ``FMT`` is exact in bfloat16,
    whose codes are then the top 16 bits.
    """
    ty: tl.constexpr = ptr.dtype.element_ty
    if ty == tl.float32:
        tl.store(ptr + offs, bits.to(tl.float32, bitcast=True), mask=mask)
    else:
        if ty == tl.bfloat16 and _bf16_holds(FMT):
            code = bits >> 16
        else:
            spec: tl.constexpr = _BF16 if ty == tl.bfloat16 else _FP16
            code = round_bits(bits & 0x7FFFFFFF, bits < 0, spec, "rne", False, True, None, "code")
        tl.store(ptr + offs, code.to(tl.int16).to(ty, bitcast=True), mask=mask)


@triton.jit
def stochastic_bits(seed, rbits_ptr, offs, mask, ROWS: tl.constexpr, COLS: tl.constexpr,
                    SRBITS: tl.constexpr, GIVEN: tl.constexpr):
    """The random bits of a stochastic rounding (int32, ``[ROWS, COLS]``): the caller's from
    ``rbits_ptr`` (``GIVEN``), else Philox's 30 bits (``SRBITS`` None) or their top ``SRBITS``."""
    if GIVEN:
        r = tl.load(rbits_ptr + offs, mask=mask, other=0).to(tl.int32)
    else:
        r = random_bits(seed, ROWS, COLS)
        if SRBITS is not None:
            r = r >> (30 - SRBITS)
    return r


@triton.jit
def random_bits(seed, ROWS: tl.constexpr, COLS: tl.constexpr):
    """30 uniform bits per element of this program's ``[ROWS, COLS]`` tile (row-major).

    Element e (counted from 0 over all programs) draws word ``e % 4`` of Philox at counter
    ``e // 4``: one call serves four elements, and the stream does not depend on the tiling.
    """
    q = tl.program_id(0).to(tl.int64) * (ROWS * COLS // 4) + tl.arange(0, ROWS * COLS // 4)
    r0, r1, r2, r3 = tl.randint4x(seed, q)
    r = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (ROWS, COLS))
    return (r >> 2).to(tl.int32)


@triton.jit
def group_index(BLOCK: tl.constexpr, PER: tl.constexpr):
    """This program's groups (int64, ``[BLOCK // PER]``) and their elements (``[G, PER]``)."""
    G: tl.constexpr = BLOCK // PER
    rows = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
    return rows, rows[:, None] * PER + tl.arange(0, PER)[None, :]


@triton.jit
def store_packed(ptr, rows, codes, n_bytes, BITS: tl.constexpr, PER: tl.constexpr):
    """Pack rows of ``PER`` codes of ``BITS`` bits into ``PER*BITS/8`` bytes, little-endian.

    Bytes at or beyond ``n_bytes`` (the padding of a last, partial group) are not written.
    """
    NBYTES: tl.constexpr = PER * BITS // 8
    lanes: tl.constexpr = tl.int64 if PER * BITS > 31 else tl.int32
    word = tl.sum(codes.to(lanes) << (tl.arange(0, PER)[None, :] * BITS).to(lanes), axis=1)
    for b in tl.static_range(NBYTES):
        at = rows * NBYTES + b
        tl.store(ptr + at, ((word >> (8 * b)) & 255).to(tl.uint8), mask=at < n_bytes)


@triton.jit
def load_packed(ptr, rows, n_bytes, BITS: tl.constexpr, PER: tl.constexpr):
    """The inverse of ``store_packed``: ``[G, PER]`` int32 codes (missing bytes read 0)."""
    NBYTES: tl.constexpr = PER * BITS // 8
    lanes: tl.constexpr = tl.int64 if PER * BITS > 31 else tl.int32
    cols = tl.arange(0, triton.next_power_of_2(NBYTES))
    at = rows[:, None] * NBYTES + cols[None, :]
    byte = tl.load(ptr + at, mask=(cols[None, :] < NBYTES) & (at < n_bytes), other=0)
    word = tl.sum(byte.to(lanes) << (8 * cols[None, :]).to(lanes), axis=1)
    shifts = (tl.arange(0, PER)[None, :] * BITS).to(lanes)
    return ((word[:, None] >> shifts) & ((1 << BITS) - 1)).to(tl.int32)


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["seed"])
def _round_kernel(x_ptr, y_ptr, nan_ptr, rbits_ptr, n, n_bytes, seed, FMT: tl.constexpr,
                  MODE: tl.constexpr, SATURATE: tl.constexpr, SUBNORMALS: tl.constexpr,
                  WANT: tl.constexpr, COUNT_NAN: tl.constexpr, BITS: tl.constexpr,
                  PER: tl.constexpr, BLOCK: tl.constexpr, SRBITS: tl.constexpr,
                  GIVEN: tl.constexpr):
    rows, idx = group_index(BLOCK, PER)
    inside = idx < n
    bits = load_bits(x_ptr, idx, inside)
    a = bits & 0x7FFFFFFF
    rand = None
    if _stochastic(MODE):
        rand = stochastic_bits(seed, rbits_ptr, idx, inside, BLOCK // PER, PER, SRBITS, GIVEN)
    if COUNT_NAN:
        tl.atomic_add(nan_ptr, tl.sum((a > 0x7F800000).to(tl.int32)))
    res = round_bits(a, bits < 0, FMT, MODE, SATURATE, SUBNORMALS, rand, WANT, SRBITS)
    if WANT == "value":
        store_bits(y_ptr, idx, res, inside, FMT)
    elif PER == 1:                                    # unsigned codes, as fpsim gives them
        tl.store(y_ptr + idx, res.to(tl.uint32, bitcast=True).to(y_ptr.dtype.element_ty),
                 mask=inside)
    else:                                             # padding codes are 0, as pack_codes
        store_packed(y_ptr, rows, tl.where(inside, res, 0), n_bytes, BITS, PER)


@triton.jit
def _decode_kernel(c_ptr, y_ptr, n, n_bytes, FMT: tl.constexpr, BITS: tl.constexpr,
                   PER: tl.constexpr, BLOCK: tl.constexpr):
    rows, idx = group_index(BLOCK, PER)
    inside = idx < n
    if PER == 1:
        c = tl.load(c_ptr + idx, mask=inside, other=0).to(tl.int32)
    else:
        c = load_packed(c_ptr, rows, n_bytes, BITS, PER)
    if BITS < 32:
        c = c & ((1 << BITS) - 1)
    store_bits(y_ptr, idx, decode_bits(c, FMT), inside, FMT)


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------
def supports(fmt: str | Format) -> bool:
    """Whether the kernels round to ``fmt``: its values and the rounding fit float32's bits."""
    return F32.holds(get_format(fmt))


def kernel_format(fmt: str | Format) -> Format:
    """Resolve ``fmt``, refusing the formats fpsim rounds through float64 (fp64, e8m0, ...)."""
    fmt = get_format(fmt)
    if not supports(fmt):
        raise NotImplementedError(
            f"{fmt.name}: the Triton kernels round through float32 bits, which do not hold this "
            "format exactly (fpsim rounds it through float64); use fpsim.quantize/encode with "
            "backend='torch'")
    return fmt


def codes_per_group(fmt: Format) -> int:
    """Codes that fill whole bytes when packed: ``lcm(bits, 8) / bits`` below 8 bits, else 1."""
    return 8 // math.gcd(fmt.bits, 8) if fmt.bits < 8 else 1


def code_dtype(fmt: Format) -> torch.dtype:
    """Torch dtype of unpacked codes, as ``fpsim.encode`` gives them for tensors (the one rule,
    ``fpsim.backend.code_dtype``)."""
    return fpsim_code_dtype(fmt, torch=True)


def _float_input(x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        what = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"expected a float32, float16 or bfloat16 torch tensor, got {what}")
    return x.contiguous()


def philox_seed(seed: Any) -> int:
    """A Philox key: ``seed`` itself, or drawn from a torch generator (the global one for None)."""
    if seed is None or isinstance(seed, torch.Generator):
        device = "cpu" if seed is None else seed.device
        return int(torch.randint(0, 2**62, (), generator=seed, device=device).item())
    seed = int(seed)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must lie in [0, 2^63), got {seed}")
    return seed


def _grid(n: int) -> tuple[int]:
    return (max(1, triton.cdiv(n, BLOCK)),)


def stochastic_args(x: torch.Tensor, rounding: str, seed: Any, srbits: Any,
                    random_bits: Any) -> tuple[int, int | None, torch.Tensor | None]:
    """(Philox key, srbits, the caller's random bits as a contiguous int32 tensor or None),
    checked as ``fpsim.quantize`` checks them."""
    srbits = check_srbits(srbits, rounding)
    rbits = check_random_bits(random_bits, x, rounding, srbits, seed)
    if rbits is not None:
        rbits = rbits.to(device=x.device, dtype=torch.int32).contiguous()
    draw = rounding in STOCHASTIC and rbits is None
    return (philox_seed(seed) if draw else 0), srbits, rbits


def _round(x: torch.Tensor, y: torch.Tensor, fmt: Format, rounding: str, saturate: bool,
           subnormals: bool, seed: Any, want: str, per: int, count_nan: bool,
           srbits: Any = None, random_bits: Any = None) -> None:
    rounding = check_mode(rounding)
    seed, srbits, rbits = stochastic_args(x, rounding, seed, srbits, random_bits)
    nan_count = torch.zeros(1, dtype=torch.int32, device=x.device) if count_nan else y
    _round_kernel[_grid(x.numel())](
        x, y, nan_count, y if rbits is None else rbits, x.numel(), y.numel(), seed,
        FMT=format_spec(fmt), MODE=rounding, SATURATE=saturate, SUBNORMALS=subnormals,
        WANT=want, COUNT_NAN=count_nan, BITS=fmt.bits, PER=per, BLOCK=BLOCK, SRBITS=srbits,
        GIVEN=rbits is not None, num_warps=NUM_WARPS)
    if count_nan and (count := int(nan_count.item())):
        raise ValueError(f"{count} NaN input(s) cannot be encoded: {fmt.name} has no NaN code. "
                         "Pass on_nan='zero' to map them to zero as ml_dtypes does.")


def quantize(x: torch.Tensor, fmt: str | Format, *, rounding: str = "rne",
             saturate: bool | str = False, subnormals: bool = True, seed: Any = None,
             srbits: int | None = None, random_bits: Any = None) -> torch.Tensor:
    """``fpsim.quantize`` for float32/float16/bfloat16 tensors: same dtype, same bits.

    16-bit inputs are rounded once to ``fmt`` and the result to the input's dtype (to nearest
    even), as fpsim does.  ``seed`` (int or ``torch.Generator``; None: torch's global generator)
    keys the Philox stream of stochastic rounding; ``srbits`` keeps the top bits of each 30-bit
    draw, and ``random_bits`` (a tensor of ``x``'s shape) replaces the draws: the same random
    bits give fpsim's NumPy and torch results bit for bit.
    """
    fmt, x = kernel_format(fmt), _float_input(x)
    saturate = check_saturate(saturate)
    y = torch.empty_like(x)
    _round(x, y, fmt, rounding, saturate, subnormals, seed, "value", 1, False, srbits,
           random_bits)
    return y


def encode(x: torch.Tensor, fmt: str | Format, *, rounding: str = "rne",
           saturate: bool | str = False, subnormals: bool = True, seed: Any = None,
           srbits: int | None = None, random_bits: Any = None, on_nan: str = "raise",
           pack: bool = True, **deprecated: Any) -> torch.Tensor:
    """The codes of ``quantize(x, fmt, ...)``, as ``fpsim.encode`` gives them.

    With ``pack`` (default), formats under 8 bits come packed into a flat uint8 tensor, as
    ``fpsim.packing.pack_codes`` packs them: code i at bits ``bits*i ..`` of one
    little-endian bit stream (FP4: two codes a byte, the first in the low nibble; FP6: four codes
    in three bytes), a last partial byte zero-padded.  Other formats, or ``pack=False``, give
    codes of ``x``'s shape: uint8, or int32/int64 lanes above 8 bits, as ``fpsim.encode``.
    NaN into a format without a NaN code raises ``ValueError`` unless ``on_nan="zero"`` (counted
    inside the kernel; the old keyword ``nan=`` warns).  ``srbits``, ``random_bits``: as
    ``quantize``.
    """
    on_nan = on_nan_keyword(on_nan, deprecated, "kernels.encode")
    fmt, x = kernel_format(fmt), _float_input(x)
    saturate = check_saturate(saturate)
    count_nan = not fmt.has_nan and _nan_policy(on_nan) == "raise"
    per = codes_per_group(fmt) if pack else 1
    if per == 1:
        y = torch.empty(x.shape, dtype=code_dtype(fmt), device=x.device)
    else:
        y = torch.empty(packed_size(x.numel(), fmt.bits), dtype=torch.uint8, device=x.device)
    _round(x, y, fmt, rounding, saturate, subnormals, seed, "code", per, count_nan, srbits,
           random_bits)
    return y


def _nan_policy(on_nan: str) -> str:
    if on_nan not in ("raise", "zero"):
        raise ValueError(f"on_nan={on_nan!r}: choose 'raise' or 'zero'")
    return on_nan


def decode(codes: torch.Tensor, fmt: str | Format, *, count: int | None = None,
           dtype: torch.dtype = torch.float32, packed: bool = True) -> torch.Tensor:
    """Values of ``codes`` (the inverse of ``encode``), in ``dtype``.

    Packed codes (formats under 8 bits, ``packed=True``) give a flat tensor of ``count`` values
    (default: as many as the bytes hold); unpacked codes keep their shape.  Bits above the
    format's width are ignored.  ``float16``/``bfloat16`` results are rounded to nearest even.
    """
    fmt = kernel_format(fmt)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    per = codes_per_group(fmt) if packed else 1
    codes = codes.contiguous()
    if per == 1:
        n = codes.numel()
        y = torch.empty(codes.shape, dtype=dtype, device=codes.device)
    else:
        if codes.dtype != torch.uint8:
            raise TypeError(f"packed {fmt.name} codes are uint8 bytes, got {codes.dtype}")
        slots = codes.numel() * 8 // fmt.bits
        n = slots if count is None else count
        if not 0 <= n <= slots:
            raise ValueError(f"count={count}: {codes.numel()} bytes hold {slots} {fmt.name} codes")
        y = torch.empty(n, dtype=dtype, device=codes.device)
    _decode_kernel[_grid(n)](codes, y, n, codes.numel(), FMT=format_spec(fmt), BITS=fmt.bits,
                             PER=per, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return y
