"""Plant small deliberate bugs in fpsim, one at a time, and check that the fast tests catch each.

Every mutant replaces one line of fpsim/ or fpsim_experiments/ (found by its exact text, wherever
it lives in them, so moving code between modules keeps it working) in a temporary copy of the
repository; the working tree is never touched.  The fast tests relevant to that mutant then
run on the copy (``pytest -x -q -m "not slow"``): a failure means the mutant was caught.

Run from the repository root:

    python scripts/mutants.py                 # all mutants; a table, then JSON
    python scripts/mutants.py --only rne-ties --only zp-ties
    python scripts/mutants.py --list          # the mutants and their test selections
    python scripts/mutants.py --json out.json

Exit status: 0 when every mutant is caught, 1 when one survived, 2 when a patch no longer
applies (its line is gone or appears twice: re-anchor it) or the unmutated copy fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fpsim"
PACKAGES = (PACKAGE, "fpsim_experiments")    # where a mutant's line is looked for

CORE = ["tests/test_reference_modes.py", "tests/test_api.py", "tests/test_formats.py",
        "tests/test_properties.py"]
STOCHASTIC = ["tests/test_stochastic.py"]
ARITH = ["tests/test_arith.py"]
MX = ["tests/test_mx.py"]
PACKING = ["tests/test_packing.py", "tests/test_mx.py"]
SCALING = ["tests/test_scaling.py", "tests/test_scaling_chunks.py"]
MX_CHUNKS = ["tests/test_mx_chunks.py"]
TENSOR_CORE = ["tests/test_arith_tensor_core.py"]
FMA = ["tests/test_fma.py"]
JIT = ["tests/test_jit_matmul.py"]
JIT_TC = ["tests/test_jit_matmul.py::test_tensor_core_models_random_and_edge_operands",
          "tests/test_jit_matmul.py::test_statistics_of_the_compiled_engine",
          "tests/test_jit_matmul.py::test_tensor_core_accumulator_overflow_with_finite_operands"]
JIT_TAME = ["tests/test_jit_matmul.py::test_tensor_core_fast_paths_and_their_limits"]
SWAMPED_ZEROS = ["tests/test_jit_matmul.py::test_statistics_on_operands_full_of_zeros"]
HALF_SUMS = ["tests/test_jit_matmul.py::test_binary16_sums_on_the_binary16_unit"]
HALF_QUICK = ["tests/test_jit_matmul.py::test_binary16_quick_swamped_counts"]
SWAMPED_ONLY = ["tests/test_jit_matmul.py::test_swamped_counts_after_an_overflow_in_one_chunk",
                "tests/test_jit_matmul.py::test_swamped_counts_from_an_infinite_addend_c",
                "tests/test_jit_matmul.py::test_return_stats_refuses_other_words"]
SR_BITS = ["tests/test_stochastic_bits.py"]
CAPTURE_STATS = ["tests/test_capture_stats.py"]
SR_MATMUL = ["tests/test_matmul_random_bits.py"]
COVERAGE = ["tests/test_emulate_coverage.py"]
CONV_BACKWARD = ["tests/test_emulate_conv_backward.py"]
TRAINING = ["tests/test_training_presets.py"]
ACCUMULATOR = ["tests/test_accumulator.py"]
WRONG_WAY = ["tests/test_wrong_way.py"]
WATCH = ["tests/test_emulate_watch.py"]
RUNS = ["tests/test_attention_semantics.py", "tests/test_emulate_watch.py"]
CAPTURE = ["tests/test_replay.py",
           "tests/test_gpt2_model.py::test_capture_sees_every_site_once_in_forward_order",
           "tests/test_gpt2_model.py::test_capture_refuses_a_site_called_twice"]
SEEDS = ["tests/test_seeds.py"]
SWEEP_PLAN = ["tests/test_sweep.py::test_plan_shards_whole_batches_and_seeds_draw_windows"]
SWEEP_JOIN = ["tests/test_sweep.py::test_combined_numbers_are_one_pass_over_all_windows"]
SWEEP_RESUME = ["tests/test_sweep.py::test_pool_gives_the_same_bytes_and_resume_computes_nothing"]
SWEEP_RETRY = ["tests/test_sweep.py::test_attempts_count_retries"]
SWEEP_ORDER = ["tests/test_sweep.py::test_failures_are_listed_in_plan_order"]
SWEEP_ORPHANS = ["tests/test_sweep.py::test_a_killed_pool_driver_leaves_no_worker_running"]
SWEEP_CODE = ["tests/test_sweep.py::"
              "test_pool_workers_refuse_tasks_when_the_code_changed_after_the_driver_started"]
PROGRESS = ["tests/test_progress.py"]
MODEL_STUDY = ["tests/test_model_study.py"]
RESUMED_REFERENCE = ["tests/test_model_study.py::"
                     "test_resume_reads_the_reference_a_killed_run_saved"]
ACROSS = ["tests/test_across_models.py"]
ATTRIBUTION = ["tests/test_model_study.py::test_attribution_splits_the_ratio_order_free_by_hand",
               "tests/test_likewise.py"]
STUDY_ATTRIBUTION = ["tests/test_model_study.py::test_the_study_attributes_and_reports_it"]
STUDY_ARMS = ["tests/test_model_study.py::test_every_comparison_is_like_with_like",
              "tests/test_model_study.py::test_attribution_arms_and_their_family"]
EXPERIMENT_DOCS = ["tests/test_docs.py::test_experiment_docstring_examples_print_what_they_show"]
STUDY_SITE = ["tests/test_model_study.py::test_per_site_arms_are_calibrated_on_the_reference_run"]
SITE_SCALING = ["tests/test_emulate_site_scaling.py"]
SWEEP_RUNS = ["tests/test_sweep.py::test_experiment_runs_are_their_direct_computation",
              "tests/test_sweep.py::test_experiment_run_specs_name_everything_their_numbers_depend_on",
              "tests/test_sweep.py::test_experiment_runs_resume_and_compute_only_the_missing"]


@dataclass(frozen=True)
class Mutant:
    """One planted bug: the code of one line of fpsim/ (no indentation, no trailing comment)
    and what replaces it."""

    name: str
    what: str
    line: str
    new: str
    tests: list[str]


MUTANTS = [
    # stochastic rounding and accumulation
    Mutant("stochastic-bits", "stochastic rounding draws W-3 random bits, not W-2",
           "nbits = src.width - 2 if srbits is None else srbits",
           "nbits = src.width - 3 if srbits is None else srbits",
           STOCHASTIC + CORE),
    Mutant("stochastic-twosum", "stochastic accumulation ignores the TwoSum error term",
           "return xp.where(u < ((s - lo) + e) / width, hi, lo)",
           "return xp.where(u < (s - lo) / width, hi, lo)", STOCHASTIC + ARITH),
    # the rounding routine
    Mutant("rne-ties", "ties-to-even rounds every tie down",
           "q = (sig + ((mask >> 1) + (low & mask & 1))) >> shift",
           "q = (sig + (mask >> 1)) >> shift", CORE),
    Mutant("rna-ties", "ties-away rounds ties toward zero",
           "q = (sig + ((mask + 1) >> 1)) >> shift", "q = (sig + (mask >> 1)) >> shift", CORE),
    Mutant("rto-sticky", "round-to-odd ignores the dropped bits (becomes truncation)",
           "q = q + (xp.astype((sig & mask) != 0, q.dtype) & ~low & 1)", "q = q", CORE),
    Mutant("subnormal-exponent", "subnormal targets keep one exponent too many",
           "tt = xp.clamp_min(t, fmt.min_biased_exp)",
           "tt = xp.clamp_min(t, fmt.min_biased_exp + 1)", CORE),
    Mutant("flush-threshold", "subnormals=False also flushes the least normal value",
           "code = xp.where(code < (1 << m), 0, code)",
           "code = xp.where(code <= (1 << m), 0, code)", CORE),
    Mutant("overflow-directed", "rup overflows to -inf instead of +inf",
           "to_inf = over & ~neg", "to_inf = over & neg", CORE),
    Mutant("overflow-rto", "round-to-odd overflows to infinity",
           'and (mode != "rto" or fmt.p3109)):', "and True):", CORE),
    Mutant("saturate-rup", "saturate=True is ignored by rup",
           'if (not saturate and (fmt.inf or fmt.has_nan) and mode != "rtz"',
           'if ((not saturate or mode == "rup") and (fmt.inf or fmt.has_nan) and mode != "rtz"',
           CORE),
    Mutant("saturate-inf-input", "an infinite input becomes NaN even when saturating",
           "return nan if (fmt.has_nan and not saturate) else big",
           "return nan if fmt.has_nan else big", CORE),
    Mutant("fnuz-negative-zero", "fnuz formats keep -0 (their NaN code)",
           "sign = xp.where((code == 0) | (code == fmt.nan_code), 0, sign)",
           "sign = xp.where(code == fmt.nan_code, 0, sign)", CORE),
    Mutant("fn-nan-code", "fn formats (E4M3FN) lose their NaN code to a finite value",
           "return all_ones - 1 - self.inf", "return all_ones - self.inf", CORE),
    # lookup tables and integer inputs
    Mutant("table-sticky", "the lookup table forgets the sticky bit",
           "idx += below", "idx &= 0", CORE),
    Mutant("table-sticky-chunked", "long arrays index the table without the sticky bit",
           'table.take(index(part, idx[:part.size]), out=out[lo:lo + part.size], mode="wrap")',
           "table.take(np.right_shift(part, shift, out=idx[:part.size]), "
           'out=out[lo:lo + part.size], mode="wrap")', CORE),
    Mutant("float64-round-to-odd", "float64 inputs reach float32 by nearest, not rounded to odd",
           "fix = (back != x) & ((u & 1) == 0) & (x == x)",
           "fix = (back != x) & ((u & 1) == 0) & (x == x) & False", CORE),
    Mutant("float64-nearest-midpoint", "float64 casts landing on a target midpoint are kept",
           "np.equal(np.bitwise_and(u, low, out=tmp), half, out=hit)",
           "np.equal(np.bitwise_and(u, low, out=tmp), half + 1, out=hit)", CORE),
    Mutant("float64-nearest-subnormal", "float64 casts below the target's normals are kept",
           "np.less(np.bitwise_and(u, mag, out=tmp), floor, out=low_mag)",
           "np.less(np.bitwise_and(u, mag, out=tmp), 0, out=low_mag)", CORE),
    Mutant("cast-jit-round-to-odd", "the compiled float64 kernel keeps float32's nearest value",
           "return np.uint32(b + (step if fix else _ZERO))", "return b", CORE),
    Mutant("cast-jit-table-sticky", "the compiled table lookup forgets the sticky bit",
           "out[i] = table[(((v & below) + below) | v) >> shift]",
           "out[i] = table[v >> shift]", CORE),
    Mutant("cast-jit-field-nan", "the compiled bf16/tf32 pass lets NaN payloads round",
           "q = np.uint32(nan_code)", "q = q", CORE),
    Mutant("table-low-bits", "the lookup table folds the rounding bit into the sticky bit",
           "low = min(src.width - 16, least_shift - 1)", "low = min(src.width - 16, least_shift)",
           CORE),
    Mutant("int-round-to-odd", "integers beyond 2^53 are rounded to nearest, not to odd",
           "fixed = np.where(inexact & ~odd, np.nextafter(fmag, toward), fmag)",
           "fixed = fmag", CORE),
    # accumulation
    Mutant("sum-round-to-odd", "the exact sum's round-to-odd ignores the error's sign",
           "odd = (sb + ((eb ^ sb) >> self.top)) | 1",
           "odd = sb | 1", ARITH),
    Mutant("pairwise-tree", "pairwise puts the odd last term first in its level",
           "level = xp.concatenate([s, level[n - 1:]]) if n % 2 else s",
           "level = xp.concatenate([level[n - 1:], s]) if n % 2 else s", ARITH),
    Mutant("tensor-core-truncation", "the tensor-core model rounds aligned terms to nearest",
           'total = quantize(p * up, self.trunc, rounding=cut, backend=back).sum(0)',
           'total = quantize(p * up, self.trunc, rounding="rne", backend=back).sum(0)',
           TENSOR_CORE),
    Mutant("tensor-core-chain-order", "instructions (and FP64 fmas) run from the last K group "
           "to the first", "for g0 in range(0, K, step.model.group):",
           "for g0 in reversed(range(0, K, step.model.group)):", TENSOR_CORE),
    Mutant("fma-unfused", "the FP64 fma chain rounds each product before adding it",
           "new = fma(a[k], b[k], acc) if self.unaligned is None else self.unaligned(acc, p[k])",
           "new = p[k] + acc if self.unaligned is None else self.unaligned(acc, p[k])",
           TENSOR_CORE),
    Mutant("tf32-truncation", "TF32 presets round FP32 operands to nearest instead of truncating",
           'return quantize(x, fmt, rounding="rtz")', 'return quantize(x, fmt, rounding="rne")',
           TENSOR_CORE),
    # the FP64 fused multiply-add
    Mutant("fma-ties", "the FP64 fma rounds ties away from zero, not to even",
           "m = m + (rbit & ((sticky | ((m & _U(1)) == 1)).astype(_U)))", "m = m + rbit", FMA),
    Mutant("fma-sticky", "the FP64 fma forgets the bits shifted out of its window",
           "sticky = (below & (k > 0)) | lost", "sticky = below & (k > 0)", FMA),
    Mutant("fma-borrow", "subtracting a term with lost bits takes no extra unit off",
           "dl, dh = dl - small_lost, dh - borrow", "dl, dh = dl, dh", FMA),
    Mutant("fma-window", "the FP64 fma's window is 30 bits narrower (cancellation loses bits)",
           "low = np.maximum(tp, tc) - WINDOW", "low = np.maximum(tp, tc) - WINDOW + 30", FMA),
    # MX, NVFP4, packing, scaling
    Mutant("mx-floor-scale", "the OCP floor rule takes one binade too many",
           "s = e - spec.emax", "s = e - spec.emax + 1", MX),
    Mutant("mx-ceil-scale", "the ceil rule rounds up when amax is exactly max·2^k",
           "return (bits >> 52) - (lim >> 52) + ops.astype((bits & _FRAC) > (lim & _FRAC), "
           "ops.int64)",
           "return (bits >> 52) - (lim >> 52) + ops.astype((bits & _FRAC) >= (lim & _FRAC), "
           "ops.int64)", MX),
    Mutant("mx-nan-scale", "a shared exponent above 127 is clamped instead of NaN",
           "nan = (field == 2047) | (s > 127)", "nan = (field == 2047)", MX),
    Mutant("mxint8-symmetric", "MXINT8 keeps -128 instead of clamping to -127",
           "return ops_for(codes).where(codes == 0x80, 0x81, codes)", "return codes", MX),
    Mutant("nvfp4-tensor-scale", "NVFP4's tensor scale divides by 448·4, not 448·6",
           "return float(max(amax32 / np.float32(448 * 6), np.float32(NVFP4_MIN_TENSOR_SCALE)))",
           "return float(max(amax32 / np.float32(448 * 4), np.float32(NVFP4_MIN_TENSOR_SCALE)))",
           MX),
    Mutant("nvfp4-scale-rounding", "NVFP4's E4M3 block scales truncate instead of rounding",
           'scodes = round_bits(ops, sbits & 0x7FFFFFFF, sbits < 0, F32, spec.scale, "rne",',
           'scodes = round_bits(ops, sbits & 0x7FFFFFFF, sbits < 0, F32, spec.scale, "rtz",',
           MX),
    Mutant("fp4-nibble-order", "packing puts the first code in the high nibble",
           "acc = acc | (ops.astype(padded[:, j], lanes) << (bits * j))",
           "acc = (acc << bits) | ops.astype(padded[:, j], lanes)", PACKING),
    Mutant("zero-point-ties", "asymmetric zero points round ties away from zero",
           "zp = qmin - _round_int(ops.where(bad, 0.0, divide(lo, scale)))",
           'zp = qmin - _round_int(ops.where(bad, 0.0, divide(lo, scale)), "rna")', SCALING),
    Mutant("scaling-chunk-boundary", "scaled_quantize's pieces of a long row skip an element",
           "return [(slice(g, g + 1), slice(c, c + size))",
           "return [(slice(g, g + 1), slice(c, c + size - 1))", SCALING),
    Mutant("scaling-chunk-rows", "scaled_quantize's pieces of whole rows skip the last rows",
           "return [(slice(g, g + step), slice(None)) for g in range(0, groups, step)]",
           "return [(slice(g, g + step), slice(None)) for g in range(0, groups - 1, step)]",
           SCALING),
    Mutant("scaling-chunk-merge", "scaled_quantize's amax keeps only a row's last piece",
           "out[r] = _merge(out[r], red, how)", "out[r] = red", SCALING),
    Mutant("mx-piece-span", "block-format pieces drop the last element of each piece",
           "return (slice(p.k.start * size, min(lay.length, p.k.stop * size)),",
           "return (slice(p.k.start * size, min(lay.length, p.k.stop * size - 1)),", MX_CHUNKS),
    Mutant("mx-pieces-last-b", "block-format pieces of whole rows skip the last range of b",
           "for a in range(na) for b in range(0, nb, step)]",
           "for a in range(na) for b in range(0, nb - 1, step)]", MX_CHUNKS),
    Mutant("mx-pack-carry", "packing in pieces packs a split group instead of carrying it",
           "whole = flat.shape[0] - flat.shape[0] % n_codes", "whole = flat.shape[0]", MX_CHUNKS),
    Mutant("mx-unpack-range", "unpacking a range that starts inside a group starts a group late",
           "first = lo // n_codes", "first = -(-lo // n_codes)",
           MX_CHUNKS),
    Mutant("mx-padding-offset", "unpack checks the padding of the wrong blocks past the first piece",
           "last = rows.reshape(-1, lay.block_size)[(lay.nblocks - 1 - first) % lay.nblocks::lay.nblocks]",
           "last = rows.reshape(-1, lay.block_size)[(lay.nblocks - 1) % lay.nblocks::lay.nblocks]",
           MX_CHUNKS),
    Mutant("thread-pieces", "large jobs split over threads lose their last piece",
           "last = job(*parts[-1])",
           "last = None",
           ["tests/test_parallel.py"]),
    Mutant("decode-table", "the decode table is built one code off",
           "codes = np.arange(fmt.num_codes, dtype=np.int64)",
           "codes = np.arange(1, fmt.num_codes + 1, dtype=np.int64) % fmt.num_codes", CORE),
    # the compiled (Numba) matmul engine
    Mutant("jit-round-to-odd", "the compiled TwoSum adder drops its round-to-odd step",
           "s = _float((sb + ((_bits(e) ^ sb) >> 63)) | 1)", "s = _float(sb)", JIT),
    Mutant("jit-zero-sign", "the compiled nearest rounding loses the sign of a zero result",
           "rb = _bits(r) | sign", "rb = _bits(r)", JIT),
    Mutant("jit-rne-ties", "the compiled integer rounding rounds every tie down",
           "q = (sig + (mask >> 1) + (low & mask & 1)) >> shift",
           "q = (sig + (mask >> 1)) >> shift", JIT),
    Mutant("jit-one-rounding-bound", "the compiled engine trusts one float64 rounding beyond "
           "fused.py's bound (51 - mbits product bits)",
           "acc_prod = _fast(plan, prod.sig <= 51 - acc.mbits)",
           "acc_prod = _fast(plan, prod.sig <= 54 - acc.mbits)", JIT),
    Mutant("jit-tc-subnormal-cut", "the compiled tensor-core kernel cuts results below the "
           "format's least normal exponent to its normal precision",
           "drop = (52 - f[6]) + max((f[0] - (b & _EXP)) >> 52, 0)", "drop = 52 - f[6]", JIT_TC),
    Mutant("jit-tc-unaligned-c", "the compiled tensor-core kernel leaves C out of the alignment",
           "tops[j] = _exponent(acc[j], emin)", "tops[j] = _LOW", JIT_TC),
    Mutant("jit-tc-zero-exponent", "the compiled tensor-core kernel gives a zero operand its "
           "format's least exponent instead of -126", "return -126 if x == 0 else e",
           "return e", JIT_TC),
    Mutant("jit-tc-swamped-zero", "the compiled statistics count a zero addend as swamped",
           "sw[j] += (y != 0) & (new == old) & (abs(old) < np.inf)",
           "sw[j] += (new == old) & (abs(old) < np.inf)", JIT_TC),
    Mutant("jit-pairwise-carry", "the compiled pairwise tree drops an odd last term (K >= 3)",
           "if K % 2:", "if K % 2 and K < 3:", JIT),
    Mutant("jit-pairwise-merge", "the compiled pairwise tree merges its last partial sums left "
           "to right", "_pair(st[q - 1], st[q - 1], st[q], n, finite, fast, rdown, magic, within,",
           "_pair(st[0], st[0], st[q], n, finite, fast, rdown, magic, within,", JIT),
    Mutant("jit-exact-pairs", "the compiled pairwise tree takes sums of two products spanning "
           "55 bits as exact in float64", "exact_pairs = prod.high + 2 - prod.low <= 53",
           "exact_pairs = prod.high + 2 - prod.low <= 55", JIT),
    Mutant("jit-chunk", "the compiled chunked order promotes every chunk + 1 terms",
           "if chunk > 0 and k > 0 and k % chunk == 0:",
           "if chunk > 0 and k > 0 and k % (chunk + 1) == 0:",
           JIT),
    Mutant("jit-quick-zero-addend", "the compiled statistics count as if every addend were "
           "non-zero although b's row holds a zero",
           "within, f, bsw[r], bpk[r], careful, zeros > 0, peak)",
           "within, f, bsw[r], bpk[r], careful, False, peak)",
           ["tests/test_jit_matmul.py::test_statistics_with_zero_operands_and_an_overflow"]),
    Mutant("within-ignores-c", "the compiled engine's bound on partial sums leaves out the "
           "start C", "start = float(np.abs(c).max()) if c is not None else 0.0",
           "start = 0.0", ["tests/test_jit_matmul.py::test_sums_near_the_largest_value_round_as_without_the_bound"]),
    Mutant("within-largest-product", "the compiled engine bounds a sum by its largest product, "
           "not by the sum of their magnitudes",
           "total = min(mag_a.max() * mag_b.sum(axis=1).max(), mag_a.sum(axis=2).max() * "
           "mag_b.max())", "total = mag_a.max() * mag_b.max()", ["tests/test_jit_matmul.py::test_sums_near_the_largest_value_round_as_without_the_bound"]),
    Mutant("nearest-within-no-floor", "the rounding of sums within the bound forgets the "
           "subnormal spacing", "c = _float(max(b & _EXP, f[0]) + f[2])",
           "c = _float((b & _EXP) + f[2])",
           ["tests/test_jit_matmul.py::test_subnormal_partial_sums_overflow_and_cancellation"]),
    Mutant("within-always", "the compiled kernels round every sum as if within the bound",
           "return _nearest_within(s, f) if within else _nearest(s, f)",
           "return _nearest_within(s, f)",
           ["tests/test_jit_matmul.py::test_subnormal_partial_sums_overflow_and_cancellation",
            "tests/test_jit_matmul.py::test_sums_near_the_largest_value_round_as_without_the_bound"]),
    Mutant("jit-narrow-vectors", "the compiled kernels no longer ask LLVM for the host's "
           "widest vectors (the same bits, 1.17-1.32x slower on AVX-512)",
           "set.add(builder.function.attributes, WIDE)", "pass",
           ["tests/test_jit_matmul.py::test_kernels_ask_llvm_for_the_widest_vectors"]),
    Mutant("half-any-rounding", "binary16 sums run on the host's binary16 unit (nearest "
           "even) whatever the plan's rounding",
           'return (plan.accum == FP16 and plan.rounding == "rne" and plan.order in '
           '("sequential", "fma")',
           'return (plan.accum == FP16 and plan.order in ("sequential", "fma")',
           ["tests/test_jit_matmul.py::test_binary16_unit_only_where_it_rounds_as_the_plan"]),
    Mutant("half-zero-x", "the binary16 unit's swamped count takes a zero element of a as a "
           "non-zero addend", "live = (x & _HALF_MAG) != 0", "live = True", HALF_SUMS),
    Mutant("half-signed-zeros", "the binary16 unit's swamped count takes -0 and +0 as "
           "different sums", "same = (new == old) | (((new | old) & _HALF_MAG) == 0)",
           "same = new == old", HALF_SUMS),
    Mutant("half-infinite-sum", "the binary16 unit counts additions to an infinite sum as "
           "swamped", "return np.uint16(live & same & ((b & _HALF_MAG) != 0) & ((old & "
           "_HALF_MAG) < _HALF_INF))", "return np.uint16(live & same & ((b & _HALF_MAG) != 0))",
           HALF_SUMS),
    Mutant("half-peak-sign", "the binary16 unit's largest partial sum compares codes with "
           "their sign bit", "m = np.uint16(new & _HALF_MAG)", "m = new", HALF_SUMS),
    Mutant("half-quick-zero-b", "the binary16 unit's one-compare swamped count runs on a row "
           "of b with a zero (a zero product's step counted as swamped)",
           "nonzero = quick and _half_nonzero(brow, n)", "nonzero = quick", HALF_QUICK),
    Mutant("half-quick-zero-x", "the binary16 unit's one-compare swamped count runs on a zero "
           "element of a", "if nonzero and (x & _HALF_MAG) != 0:", "if nonzero:", HALF_QUICK),
    Mutant("half-quick-overflow", "a block of binary16 sums that overflowed keeps the "
           "one-compare count (steps of an infinite sum counted as swamped)",
           "if stats and not _half_finite(acc, rows, n):", "if False:", HALF_QUICK),
    Mutant("capture-nonfinite-inf", "capture=\"counts\"' compiled count of inf and NaN "
           "results misses inf", "bad += (u[i] & mag) >= inf", "bad += (u[i] & mag) > inf",
           ["tests/test_capture_stats.py::test_count_nonfinite_equals_isfinite"]),
    Mutant("madd-always-fused", "the compiled kernels fuse the product into the sum where "
           "float64's sum is not the one rounding (TwoSum's, round to odd)",
           "if fast and not rdown:", "if True:",
           ["tests/test_jit_matmul.py::test_counted_sums_round_once_where_float64_would_tie"]),
    Mutant("jit-quick-zero-x", "the compiled statistics count a step whose a element is zero "
           "as if its addends were not", "zeros = zeros or x == 0", "zeros = zeros",
           ["tests/test_jit_matmul.py::test_statistics_on_operands_full_of_zeros"]),
    Mutant("jit-quick-zero-swamped", "the compiled swamped count (no largest sums) takes a "
           "zero addend that leaves its sum unchanged as swamped",
           "sw[j] += (row[j] == old) & (p != 0)", "sw[j] += row[j] == old", SWAMPED_ZEROS),
    Mutant("jit-quick-zero-peak", "the compiled statistics with the largest sums take a zero "
           "addend that leaves its sum unchanged as swamped",
           "_tally(sw, pk, j, old, row[j], p != 0)", "_tally(sw, pk, j, old, row[j], True)",
           SWAMPED_ZEROS),
    Mutant("jit-overflow-recount", "the compiled statistics keep the quick counts of a block "
           "whose partial sum overflowed",
           "if stats and _overflowed(bpk, acc, tot, rows, n, chunk, peak):",
           "if False:", ["tests/test_jit_matmul.py::"
                         "test_statistics_with_zero_operands_and_an_overflow"]),
    Mutant("jit-swamped-last-chunk", "return_stats='swamped' keeps the quick counts of a block "
           "whose last chunk overflowed (only the outer sums are checked)",
           "hit += not (abs(acc[r, j]) < np.inf and (chunk == 0 or abs(tot[r, j]) < np.inf))",
           "hit += not (chunk == 0 or abs(tot[r, j]) < np.inf)", SWAMPED_ONLY),
    Mutant("jit-swamped-outer-sum", "return_stats='swamped' keeps the quick counts of a block "
           "whose earlier chunk overflowed (only the running chunk's sums are checked)",
           "hit += not (abs(acc[r, j]) < np.inf and (chunk == 0 or abs(tot[r, j]) < np.inf))",
           "hit += not (abs(acc[r, j]) < np.inf)", SWAMPED_ONLY),
    Mutant("capture-peak-for-watch", "capture asks for swamped additions alone although a "
           "watch sees the events too", "if events is not None and not self.em.watch:",
           "if events is not None:", WATCH),
    Mutant("capture-norm-peak", "capture's norm statistics ask for the largest partial sums "
           "too", "events: dict = {sites.SWAMPED_ONLY: True}", "events: dict = {}", WATCH),
    Mutant("matmul-swamped-peak", "return_stats='swamped' returns the largest partial sums "
           "too", "return True, False", "return True, True", SWAMPED_ONLY),
    Mutant("jit-tc-stats-sums", "the compiled fused groups' statistics leave the products' "
           "sum at zero on finite operands", "if finite and cut == 0 and sums:",
           "if finite and cut == 0 and sums and not finite:", JIT_TC),
    Mutant("jit-tc-fours-unaligned-c", "the compiled tensor-core kernel's four-at-a-time "
           "groups leave C out of the alignment", "tops[j] = _exponent(c, emin)",
           "tops[j] = _LOW", JIT_TC),
    Mutant("jit-tc-raise4-three", "the compiled tensor-core kernel's four-at-a-time exponents "
           "skip the fourth product",
           "tops[j] = max(max(tops[j], max(e0 + r0[j], e1 + r1[j])), "
           "max(e2 + r2[j], e3 + r3[j]))",
           "tops[j] = max(max(tops[j], max(e0 + r0[j], e1 + r1[j])), e2 + r2[j])", JIT_TC),
    Mutant("jit-tc-cut4-floor", "the compiled tensor-core kernel's four-at-a-time groups cut "
           "one product toward -inf",
           "s[j] += ((np.trunc(x0 * r0[j] * u) + np.trunc(x1 * r1[j] * u))",
           "s[j] += ((np.floor(x0 * r0[j] * u) + np.trunc(x1 * r1[j] * u))", JIT_TC),
    Mutant("jit-tc-tame-half-floor", "the compiled CDNA3 halves cut tame products toward -inf",
           "v[j] += np.trunc(x * brow[j] * up[j])", "v[j] += np.floor(x * brow[j] * up[j])",
           JIT_TC + JIT_TAME),
    Mutant("jit-tc-tame-halves-fours", "the compiled CDNA3 halves take four consecutive "
           "products as one run", "fours = step == 1 and (k1 - k0) % 4 == 0",
           "fours = (k1 - k0) % 4 == 0", JIT_TC + JIT_TAME),
    Mutant("jit-tc-tree-tame-two", "the compiled FMA trees of four tame products add only two",
           "if group == 2:", "if group <= 4:", JIT_TC + JIT_TAME),
    Mutant("jit-tame-flushed", "the compiled engine takes products below the result's least "
           "normal as tame (CDNA2 flushes them)",
           "tame = finite and prod.fits(fmt) and (prod.empty or prod.low >= fmt.emin)",
           "tame = finite and prod.fits(fmt)", JIT_TAME),
    Mutant("jit-tame-beyond", "the compiled engine takes products beyond the result format as "
           "tame", "tame = finite and prod.fits(fmt) and (prod.empty or prod.low >= fmt.emin)",
           "tame = finite and (prod.empty or prod.low >= fmt.emin)", JIT_TAME),
    Mutant("jit-tc-rounded-call", "the compiled tensor-core kernel rounds the results of "
           "modes other than its presets' to nearest even", "return _rounded(s, f)",
           "return _nearest(s, f)", JIT_TC),
    Mutant("jit-arg-read-only", "the compiled engine passes read-only arrays on as they are "
           "(numba compiles each kernel again for them)",
           'return np.require(x, dtype, ["C", "W"])', 'return np.require(x, dtype, ["C"])',
           ["tests/test_jit_matmul.py::"
            "test_read_only_and_broadcast_operands_share_one_compiled_kernel"]),
    Mutant("jit-profile-subnormal", "the compiled operand profile puts subnormals one binade "
           "too low", "base = max(e, 1) - 1075", "base = e - 1075",
           ["tests/test_jit_matmul.py::test_compiled_profile_equals_numpy_measure"]),
    Mutant("jit-flushed-least-normal", "the compiled CDNA2 operand flush also zeroes the "
           "least normal value", "fo[i] = 0.0 if abs(v) < _pow2(fe[i]) else v",
           "fo[i] = 0.0 if abs(v) <= _pow2(fe[i]) else v", JIT_TC),
    Mutant("tf32-skip-without-subnormals", "the TF32 read passes operands through unchanged "
           "for a format without subnormals", "if (not is_torch(x) and fmt.subnormals and "
           "profile(x).fits(fmt)", "if (not is_torch(x) and profile(x).fits(fmt)",
           ["tests/test_jit_matmul.py::"
            "test_truncation_to_tf32_skipped_only_where_it_changes_nothing"]),
    Mutant("tf32-skip-non-finite", "the TF32 read passes operands with inf or NaN through "
           "unchanged", "and bool(np.isfinite(x).all())):", "):",
           ["tests/test_jit_matmul.py::"
            "test_truncation_to_tf32_skipped_only_where_it_changes_nothing"]),
    Mutant("capture-counts-reference", "capture='counts' computes the FP64 reference anyway",
           'self.reference = mode is True', 'self.reference = mode is not False',
           ["tests/test_emulate_capture.py::test_capture_counts_is_capture_without_the_reference"]),
    Mutant("capture-counts-nonfinite", "capture='counts' counts no inf/NaN result",
           "nonfinite, signal, noise = count_nonfinite(y), 0.0, 0.0",
           "nonfinite, signal, noise = 0, 0.0, 0.0",
           ["tests/test_emulate_capture.py::test_capture_counts_counts_inf_and_nan_results"]),
    Mutant("jit-stats-empty-sum", "the compiled engine's statistics of an empty sum are left "
           "as allocated (not zeroed)", "sw[...], pk[...] = 0, 0.0", "pass",
           ["tests/test_jit_matmul.py::test_statistics_of_empty_sums"]),
    Mutant("matmul-overflow-mask", "return_stats' overflow mask marks the finite results",
           "overflow = ~(out.isfinite() if is_torch(out) else np.isfinite(out))",
           "overflow = out.isfinite() if is_torch(out) else np.isfinite(out)",
           ["tests/test_arith.py::test_stats_swamping_overflow_underflow"]),
    Mutant("jit-fours-sum-drop", "the fast path's products sum for the statistics drops the "
           "fourth product of each four",
           "ps[j] = (((ps[j] + p0) + p1) + p2) + p3", "ps[j] = ((ps[j] + p0) + p1) + p2",
           ["tests/test_jit_matmul.py::test_tensor_core_statistics_on_the_fast_path"]),
    Mutant("capture-scan-stale", "capture keeps a weight's amax after an in-place update",
           "if found is None or found[0] != x._version:         # in-place updates bump it",
           "if found is None:", CAPTURE_STATS),
    Mutant("capture-energy-nonfinite", "capture's error energy counts an inf result where the "
           "reference is inf too",
           "return fr & (not fy), a * a if ok else 0.0, d * d if ok else 0.0",
           "return not fy, a * a if ok else 0.0, d * d if ok else 0.0", CAPTURE_STATS),
    Mutant("capture-energy-tail", "capture's error energy drops the last result of a tail",
           "for q in range(n - full):", "for q in range(n - full - 1):", CAPTURE_STATS),
    Mutant("capture-scan-nonfinite", "capture's compiled scan takes inf/NaN as the amax",
           "top = max(top, m if m < inf else 0)", "top = max(top, m)", CAPTURE_STATS),
    Mutant("capture-scan-sign", "capture's kernels read the sign bit as part of the magnitude",
           "return (_bits(t.detach()).reshape(-1).numpy(), (1 << (8 * t.element_size() - 1)) - 1,",
           "return (_bits(t.detach()).reshape(-1).numpy(), (1 << (8 * t.element_size())) - 1,",
           CAPTURE_STATS),
    Mutant("capture-events-at-limit", "an operand exactly at the limit is not counted saturated",
           "saturated += fx & fq & (a >= limit)", "saturated += fx & fq & (a > limit)",
           CAPTURE_STATS),
    Mutant("capture-events-flush-inf", "an inf operand quantized to zero counts as flushed",
           "flushed += fx & (a != 0) & (b == 0)", "flushed += (a != 0) & (b == 0)",
           CAPTURE_STATS),
    Mutant("capture-limit-below", "a limit between two values of the operand's dtype is taken "
           "at the nearest, which may lie below it",
           "return bits + 1 if bits_value(bits, dtype) < limit else bits", "return bits",
           CAPTURE_STATS),
    Mutant("capture-energy-finite-path", "capture's torch route takes sums with an inf output "
           "as finite", "if math.isfinite(signal) and math.isfinite(noise):",
           "if math.isfinite(signal):", CAPTURE_STATS),
    # stochastic rounding with n random bits (srbits, random_bits)
    Mutant("sr-align", "n random bits meet the bottom of the dropped bits, not the top",
           "bias = (rand << up) >> xp.clamp_min(-below, 0)",
           "bias = rand >> xp.clamp_min(-below, 0)", SR_BITS),
    Mutant("sr-b-one", "StochasticB adds 2r, not 2r + 1", "rand, n = 2 * rand + 1, n + 1",
           "rand, n = 2 * rand, n + 1", SR_BITS),
    Mutant("sr-c-ties", "StochasticC rounds every tie of the top n dropped bits down",
           'tie = half - 1 + odd if mode == "stochastic_c" else half - odd',
           'tie = half - 1 if mode == "stochastic_c" else half - odd', SR_BITS),
    Mutant("sr-sticky", "float32 lanes forget the dropped bits beyond their 30",
           "cut = cut | xp.astype((cut << excess) != sig, sig.dtype)", "cut = cut", SR_BITS),
    Mutant("sr-given-order", "the caller's random bits meet another element",
           "rand = rbits[lo:lo + CHUNK].astype(itype)",
           "rand = rbits[lo:lo + CHUNK][::-1].astype(itype)", SR_BITS),
    Mutant("sr-bits-range", "random bits up to 2^n pass the check",
           "if lo < 0 or hi >= 1 << srbits:", "if lo < 0 or hi > 1 << srbits:", SR_BITS),
    Mutant("sr-torch-draws", "torch draws 30 random bits whatever srbits says",
           "rand = ops.random_bits(tuple(a.shape), src.width - 2 if srbits is None else srbits,",
           "rand = ops.random_bits(tuple(a.shape), src.width - 2,", SR_BITS),
    Mutant("sr-matmul-lanes", "matmul keeps round-to-odd's 2 guard bits only, not n + 2",
           "extra = 2 if plan.srbits is None else plan.srbits + 2", "extra = 2", SR_BITS),
    Mutant("sr-mx-pieces", "block formats hand each piece its random bits reversed",
           "r = None if r3 is None else blocks.gather(r3, lay, p)",
           "r = None if r3 is None else blocks.gather(r3, lay, p)[:, ::-1]", SR_BITS),
    Mutant("sr-scaled-rows", "scaled_quantize hands each row its random bits reversed",
           "rrows = None if rbits is None else _to_rows(rbits, kind, axis, lay)",
           "rrows = None if rbits is None else _to_rows(rbits, kind, axis, lay)[:, ::-1]",
           SR_BITS),
    # speed: the compiled engine under emulate, host sums, small calls
    Mutant("cpu-tensors-numpy", "CPU tensors never take the compiled engine",
           'if plan.backend != "auto" or why is not None or use_torch:',
           'if plan.backend != "auto" or why is not None or not use_torch:',
           ["tests/test_emulate_compiled.py"]),
    Mutant("host-sums-order", "native_sums='host' is accepted with an explicit order",
           'if self.native_sums == "host" and self.order is not None:',
           'if self.native_sums == "host" and self.order == "tensor_core":',
           ["tests/test_emulate_compiled.py"]),
    Mutant("scalar-f32-sign", "the scalar path reads a float32's bits with the sign flipped",
           "v = read[bisect_right(bounds, int(x.view(np.uint32)))]",
           "v = read[bisect_right(bounds, int(x.view(np.uint32)) ^ (1 << 31))]",
           ["tests/test_small_calls.py"]),
    Mutant("scalar-f64-sticky", "the scalar path reads a double's bits with the last one set",
           "v = read[bisect_right(bounds, _UNPACK(_PACK(x))[0])]",
           "v = read[bisect_right(bounds, _UNPACK(_PACK(x))[0] | 1)]",
           ["tests/test_small_calls.py"]),
    Mutant("scalar-zero-sign", "a Python float zero loses its sign on the scalar path",
           "u = _UNPACK(_PACK(x))[0]", "u = 0", ["tests/test_small_calls.py"]),
    Mutant("small-kernel-shift", "the compiled table lookup shifts one bit too far",
           "jit.table_lookup(u, table, *args, out)",
           "jit.table_lookup(u, table, args[0] + 1, args[1], out)",
           ["tests/test_small_calls.py"]),
    Mutant("table-steps-between", "small arrays read the step of an exact input for the inputs "
           "just above it", "starts = ((change >> 1).astype(utype) << utype(low)) | (change & 1)"
           ".astype(utype)", "starts = ((change >> 1).astype(utype) << utype(low))",
           ["tests/test_small_calls.py"]),
    Mutant("table-steps-side", "small arrays read the step before each step's first input",
           'values.take(starts.searchsorted(u, "right"), out=out, mode="wrap")',
           'values.take(starts.searchsorted(u, "left"), out=out, mode="wrap")',
           ["tests/test_small_calls.py"]),
    Mutant("table-small-side", "quantize's and encode's shortest path reads the step before "
           "each step's first input", 'return values[starts.searchsorted(x.view(utype), "right")]',
           'return values[starts.searchsorted(x.view(utype), "left")]',
           ["tests/test_small_calls.py"]),
    Mutant("scalar-value-side", "a negative Python float on a step's first magnitude reads "
           "the step before", "v = read[npos + bisect_right(neg, -x)]",
           "v = read[npos + bisect_right(neg, -x) - (-x in neg)]", ["tests/test_small_calls.py"]),
    # fpsim.emulate coverage (issue 26)
    Mutant("conv-unflipped", "a transposed convolution keeps its kernel unflipped",
           "wd = wd.flip(list(range(3, 3 + len(k))))", "wd = wd", COVERAGE),
    Mutant("conv-pieces", "convolution pieces of whole images skip every other image",
           "return [(lo, min(n, lo + k), 0, rows) for lo in range(0, n, k)]",
           "return [(lo, min(n, lo + k), 0, rows) for lo in range(0, n, 2 * k)]", COVERAGE),
    Mutant("conv-nvfp4-piece-scale", "NVFP4's tensor scale of a convolution taken per piece",
           "with_limit=count, tensor_scale=ts)", "with_limit=count)", COVERAGE),
    Mutant("conv-gather-groups", "every group of a grouped convolution gathers group 0's channels",
           "o_g = o + g * cg * sc", "o_g = o", COVERAGE),
    Mutant("conv-gather-dilation", "the compiled patch gather ignores dilation",
           "[*(dl * s for dl, s in zip(dilation, sp)), sc])", "[*sp, sc])", COVERAGE),
    Mutant("conv-channel-blocks-straddle", "a convolution quantizes its input along the "
           "channels even where the blocks straddle kernel offsets",
           "and cin_g % get_block_format(recipe.inputs).block_size == 0)",
           "and cin_g % 1 == 0)", COVERAGE),
    Mutant("conv-channel-blocks-axis", "a convolution's input blocks run along its last spatial "
           "axis, not its channels",
           "xq, limit = quantize_operand(per_pixel, recipe.inputs, recipe, axis=2, with_limit=count)",
           "xq, limit = quantize_operand(per_pixel, recipe.inputs, recipe, axis=-1, "
           "with_limit=count)", COVERAGE),
    Mutant("conv-host-unquantized", "host sums of a convolution run on the unquantized weights",
           "wq = weight_of(qw, wd.shape)", "wq = wd", COVERAGE),
    Mutant("conv-dgrad-unquantized-dy", "a convolution's input gradient uses dy unquantized",
           "dxp = _implicit_gemm(acc, spread(qdy), qw, wd.shape[2:], [1] * d, dilation, groups,",
           "dxp = _implicit_gemm(acc, spread(dy), qw, wd.shape[2:], [1] * d, dilation, groups,",
           CONV_BACKWARD),
    Mutant("conv-dgrad-unquantized-w", "a convolution's input gradient uses the weight unquantized",
           "qwd = weight_of(qwm, wd.shape)                   # the forward's values, as hardware",
           "qwd = wd", CONV_BACKWARD),
    Mutant("conv-wgrad-unquantized-x", "a convolution's weight gradient uses x unquantized",
           "saved = {\"qa\": None if xq is None else rows_of(xq), \"sa\": None}",
           "saved = {\"qa\": None if xq is None else rows_of(xp), \"sa\": None}", CONV_BACKWARD),
    Mutant("aten-missed-silent", "an op named as not emulated runs without being counted",
           "self.ic.missed(entry, func._schema.name, *args)", "pass", COVERAGE),
    Mutant("norm-running-var", "batch norm updates its running variance with the biased one",
           "_update(running_var, ssq / max(m - 1, 1), momentum)",
           "_update(running_var, ssq / m, momentum)", COVERAGE),
    # training: the backward GEMMs of fpsim.emulate
    Mutant("dgrad-axis", "dgrad re-quantizes the weight along K instead of its own axis N",
           'qbT, _ = self.operand(bT, wspec, "w", -2, None, "b", saved["sb"])',
           'qbT, _ = self.operand(bT, wspec, "w", -1, None, "b", saved["sb"])', TRAINING),
    Mutant("wgrad-reuse-rowwise", "rowwise casts are reused across GEMMs as if axis-free",
           '"rowwise": Scaling("TE / torchao: one scale per index beside the reduction axis",',
           '"rowwise": Scaling("TE / torchao: one scale per index beside the reduction axis", '
           'axis_free=True,', TRAINING),
    Mutant("delayed-tiny-amax", "a delayed scale that overflows FP32 stays infinite (TE: FP32 max)",
           "self.scale = s if math.isfinite(s) else float(torch.finfo(torch.float32).max)",
           "self.scale = s", TRAINING),
    # fpsim.emulate on real models (issue 40): capture observes, norms only when asked, ...
    Mutant("capture-reroutes", "under capture, sites left to torch are computed by fpsim",
           "return self.em.rules.select(path, kind) is None",
           "return self.em.rules.select(path, kind) is None and not self.em.capture",
           ["tests/test_emulate_capture.py::test_capture_changes_no_result_forward_and_backward"]),
    Mutant("capture-norm-random", "a captured norm statistic draws random bits of the model's",
           "with same_random(x.device):", "with contextlib.nullcontext():",
           ["tests/test_emulate_capture.py::test_capture_changes_no_result_forward_and_backward"]),
    Mutant("norm-default", "the default recipe applies to norm statistics too",
           'return None, None if kind == "norm" else self.default', "return None, self.default",
           ["tests/test_emulate.py::test_gpt2_trains_under_a_plain_recipe"]),
    Mutant("block-not-inferred", "a block format without scaling= is refused again",
           'if self.scaling == "none" and any(_block_name(f) for f in (self.inputs, self.weights)):',
           "if False:", ["tests/test_emulate.py::test_a_block_format_implies_its_block_scaling"]),
    Mutant("report-silent", "a report without capture does not say why it is empty",
           "lines.append(NOT_CAPTURED)", "pass",
           ["tests/test_emulate.py::test_report_without_capture_says_why_it_is_empty"]),
    Mutant("lookup-preset-first", "a preset's name wins over a format's ('nvfp4')",
           "if not slash and not _format_name(name):", "if not slash:",
           ["tests/test_training_presets.py::test_one_registry_the_sweep_names"]),
    Mutant("host-bias-fused", "torchao presets fuse the bias into the GEMM and its FP64 gradient",
           'if recipe.native_sums == "host" and bias is not None and recipe.output is None:',
           "if False:", ["tests/test_training_torchao.py::test_hugging_face_models_bit_identical_"
                         "to_torchao"]),
    Mutant("hadamard-signs", "the random Hadamard transform loses its random signs",
           "return torch.from_numpy(h * signs / math.sqrt(n))",
           "return torch.from_numpy(h / math.sqrt(n))", TRAINING),
    Mutant("delayed-current", "delayed scaling uses no history: scale 1 every call",
           "scale = self.scale", "scale = 1.0", TRAINING),
    Mutant("tensorwise-dequant", "a TE / torchao cast dequantizes with the reciprocal scale",
           "return (codes / s).to(x.dtype), rounding_limit(f) / s.double(), s",
           "return (codes * (1 / s)).to(x.dtype), rounding_limit(f) / s.double(), s", TRAINING),
    # attention semantics: the P·V site that skips masked keys (fpsim.emulation.sites)
    Mutant("causal-diagonal", "the causal P·V skips each query's own key as well",
           "keep = torch.ones(T, S, dtype=torch.bool, device=qp.device).tril(S - T)",
           "keep = torch.ones(T, S, dtype=torch.bool, device=qp.device).tril(S - T - 1)",
           ["tests/test_attention_semantics.py"]),
    Mutant("causal-zero-inf", "the causal P·V forgets that 0 * inf is NaN at a kept key",
           "nan = keep.to(f64) @ torch.isnan(qv).to(f64) + zero_p @ (up + down)",
           "nan = keep.to(f64) @ torch.isnan(qv).to(f64)",
           ["tests/test_attention_semantics.py"]),
    # fpsim sweep (fpsim_experiments/sweep)
    Mutant("sweep-shard-batches", "a sweep task holds task_batches windows, not batches",
           "per_task = sweep.batch * sweep.task_batches", "per_task = sweep.task_batches",
           SWEEP_PLAN),
    Mutant("sweep-seed-windows", "every seed takes the first windows",
           "return sorted(order[:wanted].tolist())", "return list(range(wanted))",
           SWEEP_PLAN),
    Mutant("sweep-join-order", "shards are joined last first",
           "for t in shards:", "for t in reversed(shards):", SWEEP_JOIN),
    Mutant("sweep-resume", "--resume recomputes the tasks already on disk",
           "if files[t].name in on_disk:", "if False:", SWEEP_RESUME),
    Mutant("sweep-retry", "a failing task is not tried again",
           "if not left:", "if True:", SWEEP_RETRY),
    Mutant("sweep-failed-order", "failed tasks listed in the order they ended",
           'order = {t.name: i for i, t in enumerate(tasks)}',
           'order = {t.name: 0 for t in tasks}', SWEEP_ORDER),
    # the built-in experiments' end-to-end runs on the sweep runner (fpsim_experiments/sweep/runs.py)
    Mutant("runs-spec-keywords", "a run's spec leaves out its ops' keyword arguments (weights, "
           "attention): another run's task file would be reused on --resume",
           '"keywords": {k: describe(v) for k, v in sorted(obj.keywords.items())}}',
           '"keywords": {}}', SWEEP_RUNS),
    Mutant("runs-fp64-model", "the FP64 baseline runs the FP32 model",
           "e2e = ctx.end_to_end_ops(ops, ref, ctx.model64 if task.fp64 else None)",
           "e2e = ctx.end_to_end_ops(ops, ref, None)", SWEEP_RUNS),
    Mutant("runner-versions", "a result computed under other versions or CPU kernels is kept",
           'if diff := differing(result["versions"], here):', "if False:",
           ["tests/test_sweep.py::test_a_worker_on_other_cpu_kernels_fails_by_name"]),
    Mutant("runs-reference-handed", "the driver's reference logits are not handed to the runs "
           "(each executor computes them again)",
           "refs={REFERENCE: ctx.ref_logits}, desc=desc or label)",
           "refs=None, desc=desc or label)", SWEEP_RUNS),
    Mutant("sitestats-nonzero", "a site's nonzero count counts every element",
           "return m, int(torch.count_nonzero(x))", "return m, x.numel()",
           ["tests/test_emulate_nonzero.py"]),
    # model-seeds: the shipped model apart, the two-level bootstrap, the overflow's cause
    Mutant("seeds-no-seed-draws", "the bootstrap across seeds resamples windows only",
           "pick = np.random.default_rng(seed).integers(0, n, size=(resamples, n))",
           "pick = np.broadcast_to(np.arange(n), (resamples, n))", SEEDS),
    Mutant("seeds-unpaired", "across seeds, a ratio's two runs are resampled on other windows",
           'ratio = bootstrap.weighted(wa, "kl", weights) / bootstrap.weighted(wb, "kl", weights)',
           'ratio = bootstrap.weighted(wa, "kl", weights) / bootstrap.weighted(wb, "kl", '
           'weights[::-1])', SEEDS),
    Mutant("seeds-shipped-pooled", "the shipped model is pooled with the step-schedule seeds",
           'stepped = [m for m in data["models"] if m["model"] != SHIPPED]',
           'stepped = list(data["models"])', SEEDS),
    Mutant("seeds-overflow-cause", "the overflow is put down to the seed when seed 0 on steps "
           "stays finite",
           "            if 0 in bad:", "            if 0 not in bad:", SEEDS),
    Mutant("seeds-overflow-others", "the overflow is put down to the schedule while other "
           "step-schedule seeds overflow", "            elif others:", "            elif False:",
           SEEDS),
    Mutant("training-step-shares", "the flushed share of a step pools every step",
           'cs = [s["grads"][str(step)] for s in run["seeds"] if str(step) in s["grads"]]',
           'cs = [c for s in run["seeds"] for c in s["grads"].values()]',
           ["tests/test_training.py::test_flushes_are_told_per_step_and_per_gemm_of_the_nonzero_elements"]),
    Mutant("training-gemm-nonzero", "a GEMM's flushed share is of all its elements",
           't[0] += g["nonzero"]', 't[0] += g["elements"]',
           ["tests/test_training.py::test_flushes_are_told_per_step_and_per_gemm_of_the_nonzero_elements"]),
    Mutant("range-weights-part", "the weights' flushed elements are not told apart",
           'mine = round(passes * w[site][fmt]["flushed"] * w[site]["elements"])', "mine = 0",
           ["tests/test_range_findings.py"]),
    Mutant("range-unbounded-bias", "the counterpart without a bottom keeps the real format's "
           "bias (its largest value moves)", "return Format(f\"{f.name}_unbounded_below\", 8, "
           "f.mbits, bias=254 - emax)", "return Format(f\"{f.name}_unbounded_below\", 8, "
           "f.mbits, bias=f.bias)", ["tests/test_range_findings.py"]),
    Mutant("likewise-one-topic", "one topic still gets a (degenerate) topic interval",
           "if self.topics is None or len(set(self.topics[:n])) < 2:",
           "if self.topics is None:", ["tests/test_likewise.py"]),
    Mutant("fp8-ranking-tie", "a ranking orders two formats its interval does not separate",
           'sign = "<" if bootstrap.excludes_one(q.windows) else "≈"', 'sign = "<"',
           ["tests/test_report_findings.py"]),
    Mutant("quick-rvp-budgets", "range-vs-precision --quick runs every budget",
           "plan = {b: splits(b) for b in (QUICK_BUDGETS if ctx.quick else BUDGETS)}",
           "plan = {b: splits(b) for b in BUDGETS}", ["tests/test_quick.py"]),
    Mutant("quick-fp8-recipes", "fp8 --quick runs every recipe",
           "runs = ctx.run([r for r in recipes() if not ctx.quick or r.name in QUICK_RECIPES], "
           "desc=NAME)", "runs = ctx.run(recipes(), desc=NAME)", ["tests/test_quick.py"]),
    Mutant("ci-digits-apart", "a narrow interval prints as a point",
           'while lo != hi and digits < 6 and f"{lo:.{digits}g}" == f"{hi:.{digits}g}":',
           "while False:", ["tests/test_report_findings.py"]),
    Mutant("progress-tty-off", "a progress stream that is not a terminal gets tqdm's carriage "
           "returns", "if not stream.isatty():", "if False:", PROGRESS),
    Mutant("progress-every-step", "a non-terminal progress stream gets a line per step",
           "self.step = max(1, math.ceil(total / 10))", "self.step = 1", PROGRESS),
    # first hour (issue 29): bridges, the CLI's names and blocks, small things users trip on
    Mutant("bridge-fp4-nibbles", "float4_e2m1fn_x2 packs the first element in the high nibble",
           "return codes[..., 0::2] | (codes[..., 1::2] << 4)",
           "return codes[..., 1::2] | (codes[..., 0::2] << 4)", ["tests/test_bridge.py"]),
    Mutant("scaled-dtype", "scaled_quantize returns float32 values for float16 input",
           "vals = _in_dtype(vals, x)", "vals = vals", ["tests/test_first_hour.py"]),
    Mutant("lossscaler-format", "LossScaler(grad_format=) starts one binade too high",
           "init_scale = 2.0 ** min(16, top)", "init_scale = 2.0 ** min(16, top + 1)",
           ["tests/test_first_hour.py"]),
    Mutant("triton-no-gpu", "backend='triton' without a GPU reaches Triton's own error",
           "if os.environ.get(\"TRITON_INTERPRET\") != \"1\":", "if False:",
           ["tests/test_first_hour.py"]),
    Mutant("cli-wider", "fpsim quantize writes a format wider than the data",
           "if fmt.bits <= width or allow:", "if True:", ["tests/test_cli_names_blocks.py"]),
    Mutant("cli-block-scales", "--codes writes E8M0 codes where the scale values belong",
           "scales = q.scale_values(np.float32)",
           "scales = q.scales.astype(np.float32)", ["tests/test_cli_names_blocks.py"]),
    Mutant("explain-block-padding", "explain counts the filled part of the last block as padding",
           "return BlockExplanation(spec, scales, elements, -v.size % size, size, q.tensor_scale,",
           "return BlockExplanation(spec, scales, elements, v.size % size, size, q.tensor_scale,",
           ["tests/test_cli_names_blocks.py"]),
    # fpsim.nn over fpsim.emulate (issue 27, one mechanism)
    Mutant("nn-weights-as-inputs", "activations alone round the weights too (weights=None)",
           "wfmt = _EXACT if weights is None and activations is not None else weights",
           "wfmt = weights", ["tests/test_nn.py"]),
    Mutant("nn-grad-ignored", "GradFormats gives no Backward: gradients never rounded",
           "if self.activation is None:", "if True:", ["tests/test_nn_grad.py"]),
    Mutant("attach-root", "an attached context counts module paths from the first child",
           "self.em._state.enter_module(self.root, args)", "pass", ["tests/test_nn.py"]),
    Mutant("attach-root-only", "a module inside an attached one, called alone, is not emulated",
           "self.hooks = [h for m in root.modules()", "self.hooks = [h for m in [root]",
           ["tests/test_nn.py"]),
    Mutant("cast-srbits", "a plain Cast drops its srbits (every random bit drawn)",
           "q = quantize(x, f, rounding=c.rounding, saturate=c.saturate, srbits=c.srbits,",
           "q = quantize(x, f, rounding=c.rounding, saturate=c.saturate, srbits=None,",
           ["tests/test_nn_grad.py"]),
    # matmul's random_bits= (issue 31): one given n-bit value per rounding of each output
    Mutant("sr-mm-step", "the running sum reads the random bits of its additions reversed",
           "given = (None, None) if bits is None else bits.step(k)",
           "given = (None, None) if bits is None else bits.step(K - 1 - k)", SR_MATMUL),
    Mutant("sr-mm-offset", "additions read the products' random bits (no offset past them)",
           "return (self.bits[k] if self.products else None), self.bits[self.products + k]",
           "return (self.bits[k] if self.products else None), self.bits[k]", SR_MATMUL),
    Mutant("sr-mm-tree", "each level of the pairwise tree restarts at its first random value",
           "done += n // 2", "done += 0", SR_MATMUL),
    Mutant("sr-mm-c", "pairwise C + the tree's sum reuses the tree's first random value",
           "s, st = steps.pair(init[None], s[None], st, given(max(K - 1, 1), 1))",
           "s, st = steps.pair(init[None], s[None], st, given(0, 1))", SR_MATMUL),
    Mutant("sr-mm-count", "a pairwise sum of one term is counted with no rounding",
           "return products, max(K - 1, 1) + with_c", "return products, K - 1 + with_c",
           SR_MATMUL),
    Mutant("sr-mm-axis", "a tile's random bits are reshaped, not moved, rounding first",
           "self.bits = lanes.xp.moveaxis(bits, -1, 0)",
           "self.bits = bits.reshape((bits.shape[-1],) + tuple(bits.shape[:-1]))", SR_MATMUL),
    Mutant("sr-mm-adder", "an addition uses its given random value halved",
           "random_bits=r, backend=lanes.backend)", "random_bits=r // 2, backend=lanes.backend)",
           SR_MATMUL),
    Mutant("sr-mm-product", "a rounded product uses its given random value with the low bit "
           "flipped", "random_bits=r, backend=self.lanes.backend)",
           "random_bits=r ^ 1, backend=self.lanes.backend)", SR_MATMUL),
    Mutant("sr-mm-shape", "random bits of the right rank but wrong length pass the check",
           "if tuple(r.shape) != tuple(shape):", "if r.ndim != len(shape):", SR_MATMUL),
    Mutant("sr-ptx-lanes", "cvt.rs.f16x2's a takes the lower half of rbits, b the upper",
           'PTX_RBITS = {"f16x2": ((16, 13), (0, 13)), "bf16x2": ((16, 16), (0, 16))}',
           'PTX_RBITS = {"f16x2": ((0, 13), (16, 13)), "bf16x2": ((16, 16), (0, 16))}', SR_BITS),
    Mutant("sr-ptx-mask", "cvt.rs.f16x2 keeps all 16 bits of each half, not the low 13",
           "lanes = [(r >> shift) & ((1 << width) - 1) for shift, width in PTX_RBITS[conversion]]",
           "lanes = [(r >> shift) & 0xFFFF for shift, width in PTX_RBITS[conversion]]",
           SR_BITS),
    # one-pass operand quantizers under fpsim.emulate (issue 32)
    Mutant("onepass-sticky", "the per-tensor kernel indexes the table without its sticky bit",
           "out[i] = values[table[(((v & below) + below) | v) >> shift]] * scale",
           "out[i] = values[table[v >> shift]] * scale", ["tests/test_emulate_onepass.py"]),
    Mutant("onepass-block-amax", "the block amax kernel compares signed bits (no |x|)",
           "m = max(m, np.float32(x[r, j]).view(np.int32) & np.int32(0x7FFFFFFF))",
           "m = max(m, np.float32(x[r, j]).view(np.int32))", ["tests/test_emulate_onepass.py"]),
    Mutant("onepass-block-divide", "block elements divided by MX's factor, times NVFP4's",
           "v = np.float32(x[r, j] / f if div else x[r, j] * f).view(np.uint32)",
           "v = np.float32(x[r, j] * f if div else x[r, j] / f).view(np.uint32)",
           ["tests/test_emulate_onepass.py"]),
    # errors, names and blocks that sent a new user the wrong way (issue 43)
    Mutant("scaled-inf-poisons", "one inf makes its group's scale NaN again",
           "if bool((span == math.inf).any()):", "if False:", SCALING),
    Mutant("scaled-inf-kept", "the finite amax keeps +-inf",
           "piece = ops.where(ops.abs(piece) == math.inf, 0.0, piece)",
           "piece = ops.where(ops.abs(piece) == math.inf, piece, piece)", SCALING),
    Mutant("scaled-nan-group", "a NaN no longer gives its group the NaN scale",
           "bad = span != span", "bad = span < 0", SCALING),
    Mutant("block-alias-mxfp8", "mxfp8 means MXFP8 with E5M2 elements",
           'BLOCK_ALIASES = {"mxfp8": "mxfp8_e4m3"}', 'BLOCK_ALIASES = {"mxfp8": "mxfp8_e5m2"}',
           WRONG_WAY),
    Mutant("block-mxfp6-ambiguous", "mxfp6 is not refused with its two choices",
           "choices = AMBIGUOUS.get(names.normalize(fmt))", "choices = None", WRONG_WAY),
    Mutant("names-long-list", "an unknown format lists every known name again",
           "if listing is None or len(known) <= LONGEST:", "if True:", WRONG_WAY),
    Mutant("names-hint-alone", "a listed hint comes with difflib's neighbours",
           "close = [] if hint else difflib.get_close_matches(key, known, n=SHOWN, cutoff=CLOSE)",
           "close = difflib.get_close_matches(key, known, n=SHOWN, cutoff=CLOSE)", WRONG_WAY),
    Mutant("cli-values-block", "fpsim values of a block format gives the Python pointer",
           "if is_block_format_name(args.format):", "if False:", WRONG_WAY),
    Mutant("cli-nan-codes", "NaN into --codes of a format without NaN gives on_nan advice",
           "nans = 0 if fmt.has_nan or args.nan_to_zero else int(np.isnan(x).sum())",
           "nans = 0", WRONG_WAY),
    Mutant("cli-missing-folder", "a missing output folder is reported by the temporary name",
           "if not os.path.exists(folder):", "if False:", WRONG_WAY),
    Mutant("explain-overflow", "explain no longer names an overflow",
           "return math.isfinite(self.x) and not math.isfinite(self.value)", "return False",
           WRONG_WAY),
    Mutant("explain-underflow-nan", "a NaN input into a format without NaN is an underflow",
           "return math.isfinite(self.x) and self.x != 0 and self.value == 0 and not "
           "self.fmt.is_int", "return self.x != 0 and self.value == 0 and not self.fmt.is_int",
           WRONG_WAY),
    Mutant("explain-float32-inputs", "several float32 inputs shown by their float64 repr",
           "many.narrow = _narrow(v)", "many.narrow = False", WRONG_WAY),
    Mutant("lookalike-every-time", "the look-alike notice repeats on every use",
           "if key in LOOKALIKES and key not in _WARNED:", "if key in LOOKALIKES:", WRONG_WAY),
    Mutant("lookalike-line", "the look-alike notice names fpsim's line, not the user's",
           "while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith("
           "package):", "while False:", WRONG_WAY),
    Mutant("scale-values-tensor", "NVFP4's scale values include the tensor scale",
           "None if self.fmt.is_mx else 1.0, wide)", "self.tensor_scale, wide)", WRONG_WAY),
    Mutant("plot-extra", "fpsim.plot without matplotlib: a bare ModuleNotFoundError",
           'if not (exc.name or "").startswith("matplotlib"):', "if True:",
           ["tests/test_plot.py"]),
    # one description of an accumulator (fpsim.Accumulator)
    Mutant("tc-fits-subnormal", "a format with finer subnormals fits a coarser one",
           "and fmt.min_subnormal >= wide.min_subnormal)", ")", ACCUMULATOR),
    Mutant("tc-fits-int", "a float holds every integer up to its largest value",
           "return top <= min(wide.max, 2 ** (wide.mbits + 1))", "return top <= wide.max",
           ACCUMULATOR),
    Mutant("tc-operands-weights", "a tensor core checks the inputs only",
           'for role, fmt in (("inputs", self.inputs), ("weights", self.weight_format)):',
           'for role, fmt in (("inputs", self.inputs),):', ACCUMULATOR),
    Mutant("accum-native-default", "an FP32 accumulator without an order sums sequentially",
           'order = "native" if fmt in (FP32, FP64) else "sequential"', 'order = "sequential"',
           ACCUMULATOR),
    Mutant("accum-name-kept", "an accumulator keeps its format's name as spelled",
           "if isinstance(self.fmt, str) or _registered(fmt):", "if False:", ACCUMULATOR),
    Mutant("accum-chunk-default", "order='chunked' without a chunk is not 128",
           "return _CHUNK", "return None", ACCUMULATOR),
    Mutant("accum-host-format", "order='host' takes any accumulator format",
           'if order == "host" and fmt != FP32:', "if False:", ACCUMULATOR),
    Mutant("accum-beside", "matmul's order beside an Accumulator is ignored",
           "if beside:", "if False:", ACCUMULATOR),
    Mutant("accum-recipe-order", "Recipe(accum=Accumulator(...)) loses the order",
           'fields = {"accum": acc.fmt, "order": acc.order if acc.emulated else None,',
           'fields = {"accum": acc.fmt, "order": None,', ACCUMULATOR),
    Mutant("accum-site", "an emulated site sums with the recipe's format only",
           "accum=recipe.accumulator(),", "accum=recipe.accum,", ACCUMULATOR),
    Mutant("accum-backward", "the backward GEMMs ignore Backward(accum=...)",
           "if bw.accum is None:", "if True:", ACCUMULATOR),
    # the range-vs-precision study on any model
    Mutant("study-unpaired", "a ratio's two arms resampled on different units",
           'samples = np.asarray(fn(*[bootstrap.sums_ratio(m["num"], m["den"], weights)',
           'samples = np.asarray(fn(*[bootstrap.sums_ratio(m["num"], m["den"], '
           "weights[np.random.permutation(len(weights))])", MODEL_STUDY),
    Mutant("study-adjacent", "the range comparison skips a split",
           'if nxt := other(f, ebits=f["ebits"] + 1):', 'if nxt := other(f, ebits=f["ebits"] + 2):',
           MODEL_STUDY),
    Mutant("study-norms-fp32", "the norms-in-FP32 ablation leaves the norms in the format",
           'norms = FP32 if self.factors["norms"] == "fp32" else self.recipe',
           "norms = self.recipe", MODEL_STUDY),
    Mutant("ct2-float16", "the CTranslate2 reader reads float16 as int16",
           "DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, "
           "5: np.uint16}",
           "DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int16, "
           "5: np.uint16}", MODEL_STUDY),
    Mutant("wer-substitution", "a word substitution costs nothing",
           "prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))",
           "prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev)", MODEL_STUDY),
    Mutant("sentences-spread", "the sentences are the first n, not spread over the prose",
           "return [pool[(i * len(pool)) // n] for i in range(n)]",
           "return [pool[i] for i in range(n)]", MODEL_STUDY),
    # the experiments' end-to-end runs through fpsim.emulate (issue 41)
    Mutant("watch-no-events", "a watched call gets no operand events",
           "events: dict | None = {} if self.em.capture or self.em.watch else None",
           "events: dict | None = {} if self.em.capture else None", WATCH),
    Mutant("watch-captures", "watching computes capture's FP64 references and rows too",
           "if events is not None and self.em.capture:", "if events is not None:", WATCH),
    Mutant("sdpa-causal-eager", "a causal SDPA's P.V reads the masked keys",
           "causal=is_causal and dropout_p == 0 and attn_mask is None)", "causal=False)",
           RUNS),
    Mutant("run-weights-ignored", "a run's weights recipe is not applied",
           '[Rule(split(recipe, weights), kind="linear")]', '[Rule(recipe, kind="linear")]', RUNS),
    Mutant("run-causal-mapping", "a per-site mapping leaves a causal kernel's products FP32",
           'by[where[0], "attention"] = r', "pass", RUNS),
    Mutant("run-one-context", "each batch a fresh context: delayed scaling forgets its history",
           "with implementation(model, kernel), self.emulation:",
           "with implementation(model, kernel), fpsim.emulate(self.rules, watch=self.watch):",
           ["tests/test_practice.py::test_a_delayed_run_keeps_its_amax_histories_from_batch_to_batch"]),
    # the per-site capture through fpsim.emulate's watch (issue 41: the ops protocol retired)
    Mutant("watch-no-bias", "a watched product's bias is not among its operands",
           "self.em.watch(name, kind, recipe, (a, b) if bias is None else (a, b, bias), events,",
           "self.em.watch(name, kind, recipe, (a, b), events,", WATCH),
    Mutant("capture-bias-dropped", "the capture keeps no linear site's bias",
           "b, bias = rest if len(rest) == 2 else (rest[0], None)", "b, bias = rest[0], None",
           CAPTURE),
    Mutant("capture-no-mask", "the capture marks no causal part of Q.K^T",
           "mask = torch.ones(y.shape[-2], y.shape[-1], dtype=torch.bool, device=y.device).tril()",
           "mask = None", CAPTURE),
    Mutant("capture-ln-mean", "a captured LayerNorm's output is its row sum, not its sum of "
           "squares", "self.sink(Site(name, kind, a, layernorm_stats(recipe, a)[1]))",
           "self.sink(Site(name, kind, a, layernorm_stats(recipe, a)[0]))", CAPTURE),
    Mutant("capture-twice", "a site called twice in one pass is kept silently",
           "if name in self.seen:", "if False:", CAPTURE),
    Mutant("practice-history", "practice's delayed scaling keeps a history of one call",
           'DELAYED = Recipe(Cast(FP8, "delayed", saturate=True, history=HISTORY), '
           'Cast(FP8, "tensor"),',
           'DELAYED = Recipe(Cast(FP8, "delayed", saturate=True, history=1), Cast(FP8, "tensor"),',
           ["tests/test_practice.py::test_delayed_scaling_is_fpsim_emulates_amax_history"]),
    Mutant("study-arm-order", "the arms' results come back in reverse plan order",
           'return [{k: v for k, v in outcome.results[a].items() if k != "versions"} for a in '
           "planned]",
           'return [{k: v for k, v in outcome.results[a].items() if k != "versions"} for a in '
           "planned[::-1]]", MODEL_STUDY),
    # the emulation's operand caches (issue 41: the study at speed)
    Mutant("recent-unchecked", "a recurring operand's quantization is reused after its bits "
           "changed", "if entry is None or not torch.equal(_bits(entry[0]), _bits(b)):",
           "if entry is None:", ["tests/test_emulate.py::test_only_parameters_are_cached"]),
    Mutant("recent-off", "recurring operands are quantized at every call",
           "cache = self.cache if _parameter(b) else self.recent if _recurring(b) else None",
           "cache = self.cache if _parameter(b) else None",
           ["tests/test_emulate.py::test_recurring_operands_are_quantized_once"]),
    # a Cast's flush=False (issue 40: one description of a cast, nothing dropped)
    Mutant("cast-flush-dropped", "a training Cast's flush=False is ignored",
           "return sites.unflush(x, q, spec), used", "return q, used",
           ["tests/test_training_presets.py::test_a_cast_that_keeps_flushed_values_is_the_recipe_that_does"]),
    Mutant("cast-full-subnormals-scaled", "a scaled Cast takes full_subnormals silently",
           'if self.full_subnormals and (self.scaling != "none" or get_format(self.fmt).is_int):',
           "if False:", ["tests/test_training_presets.py::test_a_casts_ablations_that_do_not_apply_are_refused"]),
    Mutant("widened-by-shape", "weights of one shape share one FP64 widening",
           'key = ("fp64", t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype)',
           'key = ("fp64", t._version, tuple(t.shape), t.stride(), t.dtype)',
           ["tests/test_emulate.py"]),
    Mutant("seeds-legend-model", "the seeds figure's legend leaves out the models",
           'ax.plot([], [], "o", color=colors[model], label=label(model))', "pass",
           ["tests/test_seeds.py::test_the_figure_names_every_model_and_marks_inf_nan"]),
    Mutant("seeds-legend-nan", "the seeds figure does not say what its x marks are",
           'label="inf/NaN logits (x at the right edge, the model\'s colour): no ratio")',
           'label="_")', ["tests/test_seeds.py::test_the_figure_names_every_model_and_marks_inf_nan"]),
    # the cross-model table (issue 42)
    Mutant("across-side-swapped", "a ratio below 1 is called range",
           'side = bootstrap.verdict(ci, "range", "precision", "none")',
           'side = bootstrap.verdict(ci, "precision", "range", "none")', ACROSS),
    Mutant("across-scaling-ignored", "the per-tensor arm is found without its scaling",
           '"tensor": lambda: _run(self.data, 8, ebits, "tensor"),', '"tensor": lambda: None,',
           ACROSS),
    Mutant("across-study-scaling-ignored", "a study's per-tensor arm is its unscaled one",
           'want.update({"tensor": {"scaling": "tensor"}, "saturating": {"encoding": "saturating"},',
           'want.update({"tensor": {}, "saturating": {"encoding": "saturating"},', ACROSS),
    Mutant("across-overflow-unsaid", "the sites that overflow are left out",
           "over, fl, sat, total = study.events(arm)",
           "over, fl, sat, total = {}, *study.events(arm)[1:]", ACROSS),
    Mutant("across-ablation-inverted", "an ablation that stays inf/NaN is said to make it finite",
           "if abl.finite:", "if not abl.finite:", ACROSS),
    # the model study's order-free attribution and per-site scaling (issue 41)
    Mutant("attr-shapley-order", "a factor's Shapley value mixes its two orders' runs",
           'f"{f0} Shapley": ((0, 1, 2, 3), lambda b, x, y, z: ((b / x) * (y / z)) ** 0.5, None),',
           'f"{f0} Shapley": ((0, 1, 2, 3), lambda b, x, y, z: ((b / x) * (x / z)) ** 0.5, None),',
           ATTRIBUTION),
    Mutant("attr-interaction-inverted", "the interaction is its reciprocal",
           '"interaction": ((0, 1, 2, 3), lambda b, x, y, z: (x * y) / (b * z), None),',
           '"interaction": ((0, 1, 2, 3), lambda b, x, y, z: (b * z) / (x * y), None),',
           ATTRIBUTION),
    Mutant("attr-out-of-holm", "the Shapley values and interactions stay out of the Holm family",
           'family = comps + [t for a in attrs for t in a["terms"].values() if t["decides"]]',
           "family = comps", STUDY_ATTRIBUTION),
    Mutant("attr-corner-compared", "an arm with two ablations is compared with the plain one",
           "if ieee is None or sum(f[k] != v for k, v in PLAIN.items()) != 1:",
           "if ieee is None:", STUDY_ARMS),
    Mutant("site-scale-margin", "a site's scale is twice its amax / format max",
           'return float(amax_scale(np.array([c.amax]), f.max, "e8m0" if c.pow2 else "fp32", 0)[0])',
           'return float(amax_scale(np.array([c.amax]), f.max, "e8m0" if c.pow2 else "fp32", 1)[0])',
           SITE_SCALING),
    Mutant("site-saturate-ignored", "a per-site recipe's saturate=True is ignored",
           "q = quantize(x.to(torch.float64) / scale, f, rounding=c.rounding, saturate=c.saturate,",
           "q = quantize(x.to(torch.float64) / scale, f, rounding=c.rounding, saturate=False,",
           SITE_SCALING),
    Mutant("calibration-last-call", "the calibration keeps the last call's amax, not the largest",
           "seen[role] = max(seen.get(role, 0.0), operand_scan(x)[0])",
           "seen[role] = operand_scan(x)[0]", SITE_SCALING),
    Mutant("site-weights-role", "a site's right operand is scaled by its left one's amax",
           'weights=cast(self.weight_format, "b"), scaling="none",',
           'weights=cast(self.weight_format, "a"), scaling="none",', SITE_SCALING),
    Mutant("cast-flush-in-sites", "a Cast operand's flush=False is ignored where sites quantize "
           "it (a norm statistic's input)",
           "return unflush(x, q, recipe.cast(fmt, axis) or recipe), events",
           "return unflush(x, q, recipe), events", SITE_SCALING),
    Mutant("norm-flush-ignored", "a norm statistic's input flushes under flush=False",
           "qx, ev = _quantize_counted(x, recipe.inputs, recipe, -1, events is not None)",
           "qx, ev = _quantize_counted(x, recipe.inputs, dataclasses.replace(recipe, flush=True), "
           "-1, events is not None)", SITE_SCALING),
    Mutant("study-site-saturating-arms", "the per-site saturating arms scale per tensor",
           'out += [arm(8, e, encoding="saturating", scaling="site") for e in SPLITS[8][1:]]',
           'out += [arm(8, e, encoding="saturating", scaling="tensor") for e in SPLITS[8][1:]]',
           STUDY_ARMS),
    Mutant("study-nonfinite-nan-only", "an arm's inf units are not counted among its inf/NaN",
           'return f"{run[\'name\']} ({sum(not math.isfinite(v) for v in num)} of {len(num)} '
           '{unit}s)"',
           'return f"{run[\'name\']} ({sum(math.isnan(v) for v in num)} of {len(num)} '
           '{unit}s)"', EXPERIMENT_DOCS),
    Mutant("study-calibration-unsaved", "the workers' saved reference has no calibration",
           'torch.save({"inputs": inputs, "reference": ref, "amax": amax,',
           'torch.save({"inputs": inputs, "reference": ref, "amax": None,',
           STUDY_SITE),
    # the cost of Whisper's study (issues 41, 42): per-site convolutions, caches, pieces
    Mutant("conv-site-unwatched", "a convolution site is not seen by the watch (no calibration)",
           "if recipe is not None and ic.em.watch is not None:    # as a product site's",
           "if False:", SITE_SCALING),
    Mutant("conv-site-flush", "a per-site convolution flushes its input under flush=False",
           "xp = unflush(xp, xq, recipe.cast(recipe.inputs) or recipe)",
           "xp = unflush(xp, xq, recipe)", SITE_SCALING),
    Mutant("site-through-backward", "a per-site product goes the training way, its weights "
           "quantized again at every call",
           'return any(isinstance(f, Cast) and f.scaling != "site" for f in (recipe.inputs, '
           'recipe.weights))',
           "return any(isinstance(f, Cast) for f in (recipe.inputs, recipe.weights))",
           SITE_SCALING),
    Mutant("recent-widened-anew", "a recurring operand is widened to FP64 again at every call",
           "if entry[1] is q and key in self.recurred:", "if False:",
           ["tests/test_emulate.py::test_recurring_operands_are_quantized_once"]),
    Mutant("softmax-chunk-rows", "the chunked FP64 softmax skips a row chunk's last row",
           "flat[i:i + step] = torch.softmax(rows[i:i + step].double(), dim=-1)",
           "flat[i:i + step - 1] = torch.softmax(rows[i:i + step - 1].double(), dim=-1)",
           ["tests/test_docs.py::test_docstring_examples_print_what_they_show"
            "[fpsim.emulation.sites]"]),
    Mutant("cast-pow2-dropped", "fpsim's own tensor, channel and site scalings ignore pow2=True",
           'scale_dtype = "e8m0" if c.pow2 else "fp32"', 'scale_dtype = "fp32"',
           ["tests/test_training_presets.py::test_pow2_scales_of_fpsims_own_scalings"]),
    Mutant("recipe-pow2-dropped", "a Recipe's pow2=True does not reach its operands' Casts",
           "self.srbits, self.full_subnormals, self.flush, self.pow2)",
           "self.srbits, self.full_subnormals, self.flush)",
           ["tests/test_training_presets.py::test_pow2_is_refused_where_a_cast_has_no_scale_of_its_own"]),
    Mutant("study-piece-denominators", "an arm run piece by piece keeps numerators as "
           "denominators", "kept[1].extend(den)", "kept[1].extend(num_)", MODEL_STUDY),
    Mutant("study-reference-other-inputs", "--resume reads back a reference saved from other "
           "inputs", "or (calibrate and d[\"amax\"] is None) or not same(d[\"inputs\"], inputs):",
           "or (calibrate and d[\"amax\"] is None):", RESUMED_REFERENCE),
    Mutant("study-reference-uncalibrated", "--resume reads back a reference without the "
           "calibration a per-site arm needs",
           "or (calibrate and d[\"amax\"] is None) or not same(d[\"inputs\"], inputs):",
           "or not same(d[\"inputs\"], inputs):", RESUMED_REFERENCE),
    Mutant("pool-orphans", "a pool worker whose driver was killed goes on computing",
           "os._exit(1)", "return", SWEEP_ORPHANS),
    Mutant("pool-code-unchecked", "a pool worker computes with code changed after its driver "
           "started", "if code is not None and code != IMPORTED:", "if False:", SWEEP_CODE),
    Mutant("blas-order-unpinned", "importing fpsim_experiments leaves MKL to pick its summation "
           "order by CPU", 'os.environ.setdefault("MKL_CBWR", REPRODUCIBLE_BLAS)', "pass",
           ["tests/test_sweep.py::test_the_experiments_pin_mkls_summation_order_unless_told"]),
    Mutant("weights-delayed-kept", "a delayed cast's weight is quantized once per context, so "
           "its amax history stops",
           'return cast is None or (cast.scaling != "delayed" and cast.rounding not in STOCHASTIC)',
           "return cast is None or cast.rounding not in STOCHASTIC",
           ["tests/test_emulate.py::test_scaled_cast_weights_are_quantized_once"]),
    Mutant("weights-scaled-key", "a scaled cast's kept weight is found by the cast alone, "
           "not with its scale, so a plain recipe's entry can answer it",
           '(q, scale), ev = sites.cached(cache, b, ("with its scale", how), count, make)',
           "(q, scale), ev = sites.cached(cache, b, how, count, make)",
           ["tests/test_emulate.py::test_a_weight_shared_by_a_plain_and_a_scaled_recipe"]),
    Mutant("resume-versions-unchecked", "--resume mixes in task files computed under other "
           "versions or another BLAS order",
           'if diff := differing(result.get("versions"), here):', "if False:",
           ["tests/test_sweep.py::test_resume_refuses_results_computed_under_other_versions"]),
    Mutant("versions-no-blas-order", "the recorded versions leave out MKL's summation order",
           '"blas_order": os.environ.get("MKL_CBWR", "unpinned"),', "",
           ["tests/test_sweep.py::test_resume_refuses_results_computed_under_other_versions"]),
    Mutant("study-reuse-shadowed", "the study's Holm loop overwrites the flag that says the FP32 "
           "reference was read back", 'c["holm"] = survives', 'c["holm"] = kept = survives',
           RESUMED_REFERENCE),
]


class Stale(Exception):
    """A mutant's line is no longer in the package exactly once."""


def code_of(text: str) -> str:
    """A line without indentation and trailing comment (comments may change freely)."""
    return re.sub(r"\s+#[^\"']*$", "", text.strip())


def locate(root: Path, line: str) -> tuple[Path, int]:
    """The file and 0-based index of the one line of the package whose code is ``line``."""
    hits = []
    for path in [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]:
        for i, text in enumerate(path.read_text().splitlines()):
            if code_of(text) == code_of(line):
                hits.append((path, i))
    if len(hits) != 1:
        where = ", ".join(f"{p.relative_to(root)}:{i + 1}" for p, i in hits) or "nowhere"
        raise Stale(f"patch no longer applies: the line {line!r} is found {len(hits)} times "
                    f"({where}) in {'/, '.join(PACKAGES)}/; re-anchor the mutant on a unique line")
    return hits[0]


def apply(root: Path, m: Mutant) -> str:
    """Replace the mutant's line in the copy at ``root`` (indentation kept); returns where."""
    path, i = locate(root, m.line)
    lines = path.read_text().splitlines(keepends=True)
    old = lines[i]
    indent = old[:len(old) - len(old.lstrip())]
    lines[i] = indent + m.new + "\n"
    path.write_text("".join(lines))
    return f"{path.relative_to(root)}:{i + 1}"


def copy_repository(dest: Path) -> None:
    """Tracked and untracked (not ignored) files of the repository, nothing else."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run_tests(root: Path, tests: list[str]) -> tuple[bool, str]:
    """(passed, first failing test) of ``pytest -x -q -m "not slow"`` on the copy."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-m", "not slow", "-p", "no:cacheprovider",
           *tests]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    failed = [ln.split(" ")[1] for ln in out.stdout.splitlines() if ln.startswith(("FAILED ",
                                                                                   "ERROR "))]
    if out.returncode not in (0, 1):                     # collection or usage errors
        return False, failed[0] if failed else f"pytest exit {out.returncode}"
    return out.returncode == 0, failed[0] if failed else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this mutant (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    known = {m.name for m in MUTANTS}
    unknown = [n for n in args.only if n not in known]
    if unknown:
        print(f"mutants.py: unknown mutant {unknown[0]!r}; see --list", file=sys.stderr)
        return 2
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name:24} {m.what}\n{'':24} tests: {' '.join(m.tests)}")
        return 0
    try:
        for m in chosen:                                 # every anchor first: fail before running
            locate(ROOT, m.line)
    except Stale as err:
        print(f"mutants.py: {m.name}: {err}", file=sys.stderr)
        return 2

    results = []
    with tempfile.TemporaryDirectory(prefix="fpsim-mutants-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        copy_repository(base)
        selection = sorted({t for m in chosen for t in m.tests})
        ok, first = run_tests(base, selection)
        if not ok:
            print(f"mutants.py: the unmutated copy fails {first}; fix the tests first",
                  file=sys.stderr)
            return 2
        print(f"{'mutant':24} {'where':28} {'result':9} {'s':>5}  first failing test")
        for m in chosen:
            work = Path(tmp) / m.name
            shutil.copytree(base, work)
            where = apply(work, m)
            start = time.monotonic()
            passed, first = run_tests(work, m.tests)
            secs = time.monotonic() - start
            shutil.rmtree(work)
            result = "survived" if passed else "caught"
            results.append(dict(name=m.name, what=m.what, where=where, result=result,
                                seconds=round(secs, 1), failed=first))
            print(f"{m.name:24} {where:28} {result:9} {secs:5.0f}  {first}", flush=True)
    caught = sum(r["result"] == "caught" for r in results)
    report = dict(caught=caught, survived=len(results) - caught, total=len(results),
                  mutants=results)
    print(f"\n{caught} of {len(results)} mutants caught")
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
