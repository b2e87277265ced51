"""The LSTM and GRU recurrences of :mod:`renyi.dpsgd.decomposed` as compiled loops (numba).

The recurrence is sequential: each step is one small matrix product ``h_{t-1} W_hh^T``
(``[B, H] x [H, 4H]``) and a few element-wise operations on ``[B, 4H]``. Run as a Python
loop of torch operations it costs about ten operator dispatches a step, more than the
arithmetic at the sizes DP-SGD trains (``B = 64``, ``H = 64``: the matrix product is about
20 us). Here one compiled call runs the whole sequence: the products in float32 by
register-blocked tiles of our own on CPUs with AVX-512 (:func:`own_products`: OpenBLAS
runs its AVX2 kernels on processors it does not recognise, 2.7 times slower on these
shapes), else through BLAS (numba's ``np.dot``, scipy's OpenBLAS, its thread count set for
the call, see ``decomposed._blas_threads``), the element-wise work in a few vectorised loops
per step.

Forward (:func:`lstm_forward`): gates ``z_t = gi_t + h_{t-1} W_hh^T + b_hh``, ``i, f, o =
sigmoid``, ``g = tanh``, ``c_t = f c_{t-1} + i g``, ``h_t = o tanh(c_t)`` (torch's equations).
In float64 the activations are the C library's ``exp``/``tanh`` (as torch's CPU kernels,
to rounding). In float32 they are computed by :func:`exp32`-based formulas that the
compiler vectorises (the C library's scalar ``expf``/``tanhf`` would cost more than the
whole step): ``exp`` by Cody–Waite reduction ``x = k ln2 + r``, ``|r| <= ln2 / 2``, and its
Taylor polynomial of degree 7 (truncation below ``2**-27`` relative) scaled by ``2**k``;
``sigmoid(x) = 1 / (1 + exp(-x))``; ``tanh`` by its odd Taylor series to ``x**13`` for
``|x| < 0.4`` (truncation below ``2**-27`` relative) and ``1 - 2 / (exp(2|x|) + 1)`` above.
The loops may contract ``a * b + c`` into fused multiply-adds (numba's
``fastmath={"contract"}``: no reassociation, NaN and infinities kept). Their errors against
the exact functions are a few float32 ulps (tests/test_dpsgd_lstm_scan.py
measures them on a dense grid) where the result is a normal float; NaN propagates, ``+-inf``
saturate. ``exp``'s argument is clamped to ``[-87, 88]``: ``sigmoid(x)`` for ``x < -87`` is
about ``6e-39`` (torch: a subnormal or 0), ``sigmoid(-inf)`` included.

Backward (:func:`lstm_backward`): back-propagation through time from the saved gates, cell
states and ``tanh(c_t)`` (no transcendental function), the gate gradients written
batch-first ``[B, T, 4H]``, ``dh_{t-1} = dz_t W_hh`` through BLAS.

GRU (:func:`gru_forward`, :func:`gru_backward`): the same structure with torch's GRU
equations; the backward returns two gradients, at the input projection and at the hidden
projection, which differ in the ``n`` block by the factor ``r``.

Privacy does not depend on these being exact: the engine's per-example norms and clipped
sums are both computed from the same gate gradients this backward returns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

njit: Any
try:  # pragma: no cover - exercised when numba is installed
    from llvmlite import binding as llvm
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.core import config as numba_config
    from numba.extending import intrinsic, overload
except ImportError:  # pragma: no cover
    njit = None

__all__ = [
    "available",
    "blas_threads",
    "exp32",
    "gram_dots",
    "grams32",
    "gru_backward",
    "gru_forward",
    "lstm_backward",
    "lstm_forward",
    "matmul32",
    "matmul_tn32",
    "own_products",
    "sigmoid32",
    "tanh32",
]

_F = np.float32
# exp: x clamped so that 2**k stays a normal float32 (k in [-126, 127])
_EXP_LO, _EXP_HI = _F(-87.0), _F(88.0)
_LOG2E = _F(1.0 / math.log(2.0))
_HALF = _F(0.5)
# ln 2 split in a part with 9 significant bits (k * _LN2_HI is exact for |k| < 2**15)
# and the float32 rounding of the rest (Cody & Waite 1980)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(math.log(2.0) - 0.693359375)
_E2, _E3, _E4, _E5, _E6, _E7 = (_F(1.0 / math.factorial(k)) for k in range(2, 8))
_ONE, _TWO = _F(1.0), _F(2.0)
_BIAS = np.int32(127)
_SHIFT = np.int32(23)
# tanh's odd Taylor series: x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 - ...
_T3, _T5, _T7 = _F(-1.0 / 3.0), _F(2.0 / 15.0), _F(-17.0 / 315.0)
_T9, _T11, _T13 = _F(62.0 / 2835.0), _F(-1382.0 / 155925.0), _F(21844.0 / 6081075.0)
_TANH_SMALL = _F(0.4)


def available() -> bool:
    """Whether numba is installed (the kernels exist)."""
    return njit is not None


def ir_loop(builder: Any, stop: Any, step: Any, body: Any, carried: Any = ()) -> list[Any]:
    """Emit ``for i in range(0, stop, step): carried = body(i, *carried)`` at ``builder``'s
    position (LLVM IR through llvmlite; ``stop``/``step`` integer values of one type, the
    carried values as phis); returns the carried values after the loop. The loop scaffolding
    of the hand-written kernels here and in :mod:`renyi.dpsgd._conv_kernels`."""
    pre = builder.block
    head = builder.append_basic_block("loop.head")
    bod = builder.append_basic_block("loop.body")
    ext = builder.append_basic_block("loop.exit")
    builder.branch(head)
    builder.position_at_end(head)
    iv = builder.phi(stop.type)
    iv.add_incoming(stop.type(0), pre)
    phis = []
    for init in carried:
        phi = builder.phi(init.type)
        phi.add_incoming(init, pre)
        phis.append(phi)
    builder.cbranch(builder.icmp_signed("<", iv, stop), bod, ext)
    builder.position_at_end(bod)
    new = body(iv, *phis) or []
    iv.add_incoming(builder.add(iv, step), builder.block)
    for phi, value in zip(phis, new, strict=True):
        phi.add_incoming(value, builder.block)
    builder.branch(head)
    builder.position_at_end(ext)
    return phis


def _cached_jit(**options: Any) -> Any:
    """``njit(cache=True, **options)``, or ``njit(**options)`` when numba finds no writable
    place for its cache (neither ``__pycache__`` beside this file nor a user-wide cache
    directory, e.g. a read-only install run by a user without a writable home): numba then
    raises ``RuntimeError`` when the function is defined, which would make ``import
    renyi.dpsgd`` fail. Without a cache the kernels compile once per process."""

    def wrap(func: Any) -> Any:
        try:
            return njit(cache=True, **options)(func)
        except RuntimeError:
            return njit(**options)(func)

    return wrap


def _has_avx512() -> bool:
    """Whether numba compiles for a CPU with AVX-512 (the target's features: the host's, or
    ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` when set)."""
    if njit is None:
        return False
    cpu_name = getattr(numba_config, "CPU_NAME", None)
    if cpu_name:  # a chosen target (e.g. "generic" for portable caches)
        features = getattr(numba_config, "CPU_FEATURES", None) or ""
    else:
        try:
            features = llvm.get_host_cpu_features().flatten()
        except Exception:  # pragma: no cover - llvmlite cannot read the host's features
            return False
    return "+avx512f" in features.split(",")


#: Whether the scans compute their float32 per-step products with the register-blocked
#: kernel below (:func:`matmul32`) rather than BLAS; see :func:`own_products`.
OWN_PRODUCTS = _has_avx512()


def own_products(dtype: Any, blas_threads: int) -> bool:
    """Whether a scan's per-step products run on :func:`matmul32`: float32, one thread
    (products below the size where BLAS's threads pay, see ``decomposed._blas_threads``) and
    a CPU with AVX-512 (the kernel holds 16 vectors of 16 floats as accumulators; with
    narrower vectors they would not fit in registers), unless :data:`OWN_PRODUCTS` is off.

    Why not BLAS: OpenBLAS (0.3.30/0.3.31, numpy's and scipy's) does not recognise recent
    processors (an AMD EPYC of family 26, Zen 5) and runs its AVX2 kernels there. One
    thread, float32, AMD EPYC Zen 5, medians of 300 calls of 32 products: ``[64, 64] x
    [64, 256]`` 8.2 us against 21.9 us by numba's ``np.dot`` (scipy's OpenBLAS), ``[64, 256]
    x [256, 64]`` 8.3 us against 22.1 us, 2 x 32 such products a scan's forward and
    backward."""
    return OWN_PRODUCTS and blas_threads == 1 and np.dtype(dtype) == np.float32


_blas: Any = None


def blas_threads(n: int) -> list[tuple[Any, int]]:
    """Set the OpenBLAS libraries loaded in the process (numba's ``np.dot`` calls scipy's) to
    ``n`` threads; returns what to restore with :func:`restore_blas_threads`.

    Without it OpenBLAS runs the recurrence's small products on every core, whatever
    torch's thread count (and thread-time measurements would not see those threads)."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas = [
                c for c in ThreadpoolController().lib_controllers if c.internal_api == "openblas"
            ]
        except Exception:  # pragma: no cover - threadpoolctl missing or failing
            _blas = []
    old = []
    for lib in _blas:
        have = int(lib.get_num_threads())
        if have != n:
            lib.set_num_threads(n)
            old.append((lib, have))
    return old


def restore_blas_threads(old: list[tuple[Any, int]]) -> None:
    for lib, n in old:
        lib.set_num_threads(n)


exp32: Any = None
gram_dots: Any = None
grams32: Any = None
matmul32: Any = None
matmul_tn32: Any = None
sigmoid32: Any = None
tanh32: Any = None
lstm_forward: Any = None
lstm_backward: Any = None
gru_forward: Any = None
gru_backward: Any = None

if njit is not None:  # the compiled functions, defined only with numba

    @intrinsic
    def _bits_f32(typingctx: Any, x: Any) -> Any:
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return builder.bitcast(args[0], ir.FloatType())

        return types.float32(types.int32), codegen

    @njit(inline="always", error_model="numpy", fastmath={"contract"})
    def _exp32(x):  # type: ignore[no-untyped-def]
        y = x if x > _EXP_LO else _EXP_LO
        y = y if y < _EXP_HI else _EXP_HI
        k = np.floor(y * _LOG2E + _HALF)
        r = (y - k * _LN2_HI) - k * _LN2_LO
        p = _E6 + r * _E7
        p = _E5 + r * p
        p = _E4 + r * p
        p = _E3 + r * p
        p = _E2 + r * p
        p = _ONE + r * p
        p = _ONE + r * p
        scale = _bits_f32((np.int32(k) + _BIAS) << _SHIFT)
        e = p * scale
        return e if x == x else x

    @njit(inline="always", error_model="numpy", fastmath={"contract"})
    def _sigmoid32(x):  # type: ignore[no-untyped-def]
        return _ONE / (_ONE + _exp32(-x))

    @njit(inline="always", error_model="numpy", fastmath={"contract"})
    def _tanh32(x):  # type: ignore[no-untyped-def]
        a = abs(x)
        x2 = x * x
        p = _T11 + x2 * _T13
        p = _T9 + x2 * p
        p = _T7 + x2 * p
        p = _T5 + x2 * p
        p = _T3 + x2 * p
        small = x + (x * x2) * p
        big = _ONE - _TWO / (_exp32(a + a) + _ONE)
        big = big if x > 0 else -big
        return small if a < _TANH_SMALL else big

    def _sig(x):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    def _tanh(x):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    def _one(x):  # type: ignore[no-untyped-def]  # pragma: no cover - the overload's
        raise NotImplementedError

    @overload(_sig)
    def _sig_impl(x):  # type: ignore[no-untyped-def]
        if x == types.float32:
            return lambda x: _sigmoid32(x)
        return lambda x: 1.0 / (1.0 + math.exp(-x))

    @overload(_tanh)
    def _tanh_impl(x):  # type: ignore[no-untyped-def]
        if x == types.float32:
            return lambda x: _tanh32(x)
        return lambda x: math.tanh(x)

    @overload(_one)
    def _one_impl(x):  # type: ignore[no-untyped-def]
        """1 in the precision of the array ``x``."""
        if x.dtype == types.float32:
            return lambda x: np.float32(1.0)
        return lambda x: np.float64(1.0)

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _exp32_array(x, out):  # type: ignore[no-untyped-def]
        for k in range(x.size):
            out[k] = _exp32(x[k])

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _sigmoid32_array(x, out):  # type: ignore[no-untyped-def]
        for k in range(x.size):
            out[k] = _sigmoid32(x[k])

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _tanh32_array(x, out):  # type: ignore[no-untyped-def]
        for k in range(x.size):
            out[k] = _tanh32(x[k])

    exp32, sigmoid32, tanh32 = _exp32_array, _sigmoid32_array, _tanh32_array

    # The per-step products: register-blocked tiles of ``c = a @ b`` in float32. A tile is
    # ``R`` rows by ``V`` vectors of 16 columns; its ``R * V`` accumulators stay in
    # registers over the whole inner dimension ``k`` (one broadcast of ``a[i, k]`` and ``V``
    # loads of ``b[k, j:j + 16]`` for ``R * V`` fused multiply-adds), and are stored once.
    # Each entry is ``fma(a[i, K-1], b[K-1, j], ... fma(a[i, 0], b[0, j], 0))``: the sum in
    # order of ``k``, one rounding per term, as a plain dot product loop.

    _VEC = 16  # floats in one AVX-512 register

    def _make_tile(rows: int, vecs: int, a_t: bool = False, add: bool = False) -> Any:
        @intrinsic
        def tile(typingctx, a, b, c, i0, jb, jc):  # type: ignore[no-untyped-def]
            """``c[i0:i0 + rows, jc:jc + 16 vecs] = a[i0:i0 + rows] @ b[:, jb:jb + 16 vecs]``
            (``a_t``: ``a[:, i0:i0 + rows]^T @ ...``, ``a`` ``[K, M]``), ``a``, ``b``, ``c``
            2-D float32, ``b`` and ``c`` C-contiguous, ``a``'s rows contiguous (any row
            stride: a view ``x[:, t, :]`` of a contiguous ``x``; the caller guarantees it);
            no bounds checks (the caller keeps the tile inside the arrays)."""
            arrays = (a, b, c)
            if not all(
                isinstance(x, types.Array)
                and x.ndim == 2
                and (x.layout == "C" or (x is a and x.layout == "A"))
                and x.dtype == types.float32
                for x in arrays
            ):
                return None
            sig = types.void(a, b, c, types.intp, types.intp, types.intp)

            def codegen(context, builder, sg, args):  # type: ignore[no-untyped-def]
                av, bv, cv = (
                    context.make_array(t)(context, builder, x)
                    for t, x in zip(sg.args[:3], args[:3], strict=True)
                )
                i0, jb, jc = args[3:]
                i64, f32 = ir.IntType(64), ir.FloatType()
                vt = ir.VectorType(f32, _VEC)
                i8p = ir.IntType(8).as_pointer()

                def const(v: int) -> Any:
                    return ir.Constant(i64, v)

                depth = builder.extract_value(av.shape, 0 if a_t else 1)
                sa, sb, sc = (builder.extract_value(x.strides, 0) for x in (av, bv, cv))
                pa, pb, pc = (builder.bitcast(x.data, i8p) for x in (av, bv, cv))
                # a[i0 + r, k] at a_rows[r] + k * a_step (bytes)
                a_step, a_row = (sa, const(4)) if a_t else (const(4), sa)
                a_rows = [
                    builder.gep(pa, [builder.mul(builder.add(i0, const(r)), a_row)])
                    for r in range(rows)
                ]
                b_col = builder.gep(pb, [builder.mul(jb, const(4))])
                fma = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(vt, [vt, vt, vt]), "llvm.fma.v16f32"
                )
                splat = ir.Constant(ir.VectorType(ir.IntType(32), _VEC), [0] * _VEC)
                undef = ir.Constant(vt, ir.Undefined)

                def c_ptr(r: int, v: int) -> Any:
                    row_off = builder.mul(builder.add(i0, const(r)), sc)
                    c_row = builder.gep(pc, [builder.add(row_off, builder.mul(jc, const(4)))])
                    return builder.bitcast(
                        builder.gep(c_row, [const(4 * _VEC * v)]), vt.as_pointer()
                    )

                if add:  # c += the product
                    start = [
                        [builder.load(c_ptr(r, v), align=4) for v in range(vecs)]
                        for r in range(rows)
                    ]
                else:
                    start = [[ir.Constant(vt, [0.0] * _VEC)] * vecs for _ in range(rows)]

                def step(k: Any, *flat: Any) -> list[Any]:
                    acc = [flat[r * vecs : (r + 1) * vecs] for r in range(rows)]
                    b_row = builder.gep(b_col, [builder.mul(k, sb)])
                    bs = []
                    for v in range(vecs):
                        ptr = builder.gep(b_row, [const(4 * _VEC * v)])
                        bs.append(builder.load(builder.bitcast(ptr, vt.as_pointer()), align=4))
                    k4 = builder.mul(k, a_step)
                    nxt = []
                    for r in range(rows):
                        x = builder.load(
                            builder.bitcast(builder.gep(a_rows[r], [k4]), f32.as_pointer())
                        )
                        x = builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
                        x = builder.shuffle_vector(x, undef, splat)
                        nxt += [builder.call(fma, [x, bs[v], acc[r][v]]) for v in range(vecs)]
                    return nxt

                flat = ir_loop(builder, depth, const(1), step, [x for row in start for x in row])
                acc = [flat[r * vecs : (r + 1) * vecs] for r in range(rows)]
                for r in range(rows):
                    for v in range(vecs):
                        builder.store(acc[r][v], c_ptr(r, v), align=4)
                return context.get_dummy_value()

            return sig, codegen

        return tile

    _tile44, _tile14 = _make_tile(4, 4), _make_tile(1, 4)
    _tile41, _tile11 = _make_tile(4, 1), _make_tile(1, 1)
    _tile44ta, _tile14ta = _make_tile(4, 4, True, True), _make_tile(1, 4, True, True)
    _tile41ta, _tile11ta = _make_tile(4, 1, True, True), _make_tile(1, 1, True, True)
    _PANEL = 4 * _VEC  # the columns of a 4-vector tile

    @njit(inline="always", error_model="numpy")
    def _panels(b):  # type: ignore[no-untyped-def]
        """``b`` ``[K, N]``'s full panels of 64 columns, each contiguous: ``[N // 64, K, 64]``
        (the tiles then read their ``b`` rows 256 bytes apart, not ``4 N``: rows ``4 N``
        apart fall in few cache sets and evict each other)."""
        depth, n = b.shape
        bp = np.empty((n // _PANEL, depth, _PANEL), dtype=b.dtype)
        for p in range(n // _PANEL):
            for k in range(depth):
                for j in range(_PANEL):
                    bp[p, k, j] = b[k, p * _PANEL + j]
        return bp

    @njit(inline="always", error_model="numpy", fastmath={"contract"})
    def _matmul_tiles(a, b, bp, c):  # type: ignore[no-untyped-def]
        """``c = a @ b`` in float32 by tiles, ``bp = _panels(b)``; ``a``'s rows must be
        contiguous (checked: the tiles read them as vectors)."""
        m, depth = a.shape
        if depth > 1 and a.strides[1] != 4:
            raise ValueError("matmul tiles: the rows of a must be contiguous")
        n = b.shape[1]
        m4 = m - m % 4
        full = bp.shape[0] * _PANEL
        n16 = n - n % _VEC
        for p in range(bp.shape[0]):
            panel = bp[p]
            for i in range(0, m4, 4):
                _tile44(a, panel, c, i, 0, p * _PANEL)
            for i in range(m4, m):
                _tile14(a, panel, c, i, 0, p * _PANEL)
        for j in range(full, n16, _VEC):
            for i in range(0, m4, 4):
                _tile41(a, b, c, i, j, j)
            for i in range(m4, m):
                _tile11(a, b, c, i, j, j)
        for i in range(m):
            for j in range(n16, n):
                acc = np.float32(0.0)
                for k in range(depth):
                    acc += a[i, k] * b[k, j]
                c[i, j] = acc

    def _transpose_tree() -> tuple[list[tuple[list[int], list[int]]], list[int]]:
        """Shuffle masks that reduce 16 vectors of 16 lanes to one vector of their 16 sums
        (each level adds the two halves of every lane group of a pair of vectors, after
        placing them side by side: 4 levels, 15 vector additions and 30 shuffles, against 16
        separate reductions of 4 levels each), and the lane order that puts the sums in the
        order of the vectors."""
        masks = []
        ids = [[v] * _VEC for v in range(_VEC)]  # the sum each lane of each vector adds to
        g = _VEC
        while len(ids) > 1:
            lo: list[int] = []
            hi: list[int] = []
            for q in range(_VEC // g):
                half = range(g // 2)
                lo += [q * g + i for i in half] + [_VEC + q * g + i for i in half]
                hi += [q * g + g // 2 + i for i in half] + [_VEC + q * g + g // 2 + i for i in half]
            masks.append((lo, hi))
            ids = [[(u + v)[i] for i in lo] for u, v in zip(ids[::2], ids[1::2], strict=True)]
            g //= 2
        return masks, [ids[0].index(v) for v in range(_VEC)]

    _TREE_MASKS, _TREE_ORDER = _transpose_tree()

    def undef_v(vt: Any) -> Any:
        return ir.Constant(vt, ir.Undefined)

    def _make_gram_tile(rows: int) -> Any:
        @intrinsic
        def gram_tile(typingctx, x, g, i0, j0):  # type: ignore[no-untyped-def]
            """``g[i0 + r, j0 + c] = x[i0 + r] . x[j0 + c]`` over the first ``16 (K // 16)``
            entries of the rows (``r, c < rows``), ``x`` ``[T, K]`` and ``g`` ``[T, T]`` 2-D
            C-contiguous float32: ``rows**2`` vector accumulators over ``k``, each reduced
            to its sum at the end. No bounds checks."""
            if not all(
                isinstance(t, types.Array)
                and t.ndim == 2
                and t.layout == "C"
                and t.dtype == types.float32
                for t in (x, g)
            ):
                return None
            sig = types.void(x, g, types.intp, types.intp)

            def codegen(context, builder, sg, args):  # type: ignore[no-untyped-def]
                xv, gv = (
                    context.make_array(t)(context, builder, v)
                    for t, v in zip(sg.args[:2], args[:2], strict=True)
                )
                i0, j0 = args[2:]
                i64, f32 = ir.IntType(64), ir.FloatType()
                vt = ir.VectorType(f32, _VEC)
                i8p = ir.IntType(8).as_pointer()

                def const(v: int) -> Any:
                    return ir.Constant(i64, v)

                blocks = builder.udiv(builder.extract_value(xv.shape, 1), const(_VEC))
                sx, sg_ = (builder.extract_value(t.strides, 0) for t in (xv, gv))
                px, pg = (builder.bitcast(t.data, i8p) for t in (xv, gv))
                left = [
                    builder.gep(px, [builder.mul(builder.add(i0, const(r)), sx)])
                    for r in range(rows)
                ]
                right = [
                    builder.gep(px, [builder.mul(builder.add(j0, const(c)), sx)])
                    for c in range(rows)
                ]
                fma = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(vt, [vt, vt, vt]), "llvm.fma.v16f32"
                )

                def step(k: Any, *flat: Any) -> list[Any]:
                    off = builder.mul(k, const(4 * _VEC))

                    def load(base: Any) -> Any:
                        ptr = builder.bitcast(builder.gep(base, [off]), vt.as_pointer())
                        return builder.load(ptr, align=4)

                    ls = [load(p) for p in left]
                    rs = [load(p) for p in right]
                    return [
                        builder.call(fma, [ls[r], rs[c], flat[r * rows + c]])
                        for r in range(rows)
                        for c in range(rows)
                    ]

                zeros = [ir.Constant(vt, [0.0] * _VEC)] * (rows * rows)
                flat = ir_loop(builder, blocks, const(1), step, zeros)
                acc = [flat[r * rows : (r + 1) * rows] for r in range(rows)]
                if rows * rows == _VEC:  # 16 sums at once: the transposing tree below
                    i32 = ir.IntType(32)
                    vs = [acc[r][c] for r in range(rows) for c in range(rows)]
                    for lo, hi in _TREE_MASKS:
                        vs = [
                            builder.fadd(
                                builder.shuffle_vector(
                                    u, v, ir.Constant(ir.VectorType(i32, _VEC), lo)
                                ),
                                builder.shuffle_vector(
                                    u, v, ir.Constant(ir.VectorType(i32, _VEC), hi)
                                ),
                            )
                            for u, v in zip(vs[::2], vs[1::2], strict=True)
                        ]
                    sums = builder.shuffle_vector(
                        vs[0], undef_v(vt), ir.Constant(ir.VectorType(i32, _VEC), _TREE_ORDER)
                    )
                    row_t = ir.VectorType(f32, rows)
                    for r in range(rows):
                        part = builder.shuffle_vector(
                            sums,
                            undef_v(vt),
                            ir.Constant(
                                ir.VectorType(i32, rows), list(range(r * rows, (r + 1) * rows))
                            ),
                        )
                        off_g = builder.add(
                            builder.mul(builder.add(i0, const(r)), sg_), builder.mul(j0, const(4))
                        )
                        ptr = builder.bitcast(builder.gep(pg, [off_g]), row_t.as_pointer())
                        builder.store(part, ptr, align=4)
                    return context.get_dummy_value()
                reduce = cgutils.get_or_insert_function(
                    builder.module,
                    ir.FunctionType(f32, [f32, vt]),
                    "llvm.vector.reduce.fadd.v16f32",
                )
                for r in range(rows):
                    for c in range(rows):
                        total = builder.call(
                            reduce, [ir.Constant(f32, 0.0), acc[r][c]], fastmath=("reassoc",)
                        )
                        off_g = builder.add(
                            builder.mul(builder.add(i0, const(r)), sg_),
                            builder.mul(builder.add(j0, const(c)), const(4)),
                        )
                        ptr = builder.bitcast(builder.gep(pg, [off_g]), f32.as_pointer())
                        builder.store(total, ptr)
                return context.get_dummy_value()

            return sig, codegen

        return gram_tile

    _gram44, _gram11 = _make_gram_tile(4), _make_gram_tile(1)

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _grams32(x, g):  # type: ignore[no-untyped-def]
        """``g[b] = x[b] x[b]^T`` (float32, C-contiguous ``x`` ``[B, T, K]``, ``g`` ``[B, T,
        T]``): the upper triangle of 4 x 4 blocks by tiles, mirrored."""
        batch, steps, depth = x.shape
        t4 = steps - steps % 4
        k16 = depth - depth % _VEC
        for b in range(batch):
            xb, gb = x[b], g[b]
            for i in range(0, t4, 4):
                for j in range(i, t4, 4):
                    _gram44(xb, gb, i, j)
            for i in range(steps):
                for j in range(t4 if i < t4 else i, steps):
                    _gram11(xb, gb, i, j)
            if k16 < depth:
                for i in range(steps):
                    for j in range(i if i >= t4 else (i - i % 4), steps):
                        acc = gb[i, j]
                        for k in range(k16, depth):
                            acc += xb[i, k] * xb[j, k]
                        gb[i, j] = acc
            for i in range(steps):
                for j in range(i + 1, steps):
                    gb[j, i] = gb[i, j]

    grams32 = _grams32

    @_cached_jit(error_model="numpy", fastmath={"reassoc", "contract"})
    def _gram_dots(ga, gb, out):  # type: ignore[no-untyped-def]
        """``out[b] = sum_ij ga[b, i, j] gb[b, i, j]`` in float64 (``ga``, ``gb`` float32
        ``[B, T, T]``, C-contiguous): a per-example squared norm from two Gram matrices,
        in float64 so that products past float32's range stay finite. The sum in any order
        (vectorised); NaN and infinities propagate."""
        batch = ga.shape[0]
        n = ga.shape[1] * ga.shape[2]
        fa, fb = ga.reshape(batch, n), gb.reshape(batch, n)
        for b in range(batch):
            acc = 0.0
            for k in range(n):
                acc += np.float64(fa[b, k]) * np.float64(fb[b, k])
            out[b] = acc

    gram_dots = _gram_dots

    _TN_DEPTH = 128  # rows of a and b per pass: b's 64-column panel (32 KiB) stays in L1

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _matmul_tn32(a, b, c, w):  # type: ignore[no-untyped-def]
        """``c = a^T diag(s) b`` (float32, C-contiguous ``a`` ``[K, M]``, ``b`` ``[K, N]``,
        ``c`` ``[M, N]`` not overlapping them; ``s[k] = w[k // (K / len(w))]``: the rows in
        ``len(w)`` equal groups, each scaled by one ``w``, e.g. the positions of each example
        by its clipping weight; ``len(w)`` divides ``K``) by tiles, in passes over 128 rows
        of ``a`` and ``b`` that add into ``c``. Each pass's rows of ``b`` are scaled first,
        into a scratch block that all its tiles read (``128 N`` products against the
        tiles' ``128 N M``), so each entry is ``sum_k a[k, i] fl(b[k, j] s[k])`` in order of
        ``k``, one rounding per term."""
        depth, m = a.shape
        n = b.shape[1]
        m4 = m - m % 4
        n64 = n - n % _PANEL
        n16 = n - n % _VEC
        c[:, :] = 0
        if depth == 0:
            return
        period = depth // w.shape[0]
        block = np.empty((min(depth, _TN_DEPTH), n), dtype=np.float32)
        for k0 in range(0, depth, _TN_DEPTH):
            rows = min(_TN_DEPTH, depth - k0)
            ak, bk = a[k0 : k0 + rows], block[:rows]
            for k in range(rows):
                sk = w[(k0 + k) // period]
                for j in range(n):
                    bk[k, j] = b[k0 + k, j] * sk
            for j in range(0, n64, _PANEL):
                for i in range(0, m4, 4):
                    _tile44ta(ak, bk, c, i, j, j)
                for i in range(m4, m):
                    _tile14ta(ak, bk, c, i, j, j)
            for j in range(n64, n16, _VEC):
                for i in range(0, m4, 4):
                    _tile41ta(ak, bk, c, i, j, j)
                for i in range(m4, m):
                    _tile11ta(ak, bk, c, i, j, j)
            for i in range(m):
                for j in range(n16, n):
                    acc = c[i, j]
                    for k in range(rows):
                        acc += ak[k, i] * bk[k, j]
                    c[i, j] = acc

    matmul_tn32 = _matmul_tn32

    def _product(a, b, bp, c, own):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise NotImplementedError

    def _panels_for(b, own):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise NotImplementedError

    @overload(_panels_for)
    def _panels_for_impl(b, own):  # type: ignore[no-untyped-def]
        """:func:`_panels` of ``b`` when the products are our own (float32), else an empty
        array."""
        if b.dtype == types.float32:

            def impl(b, own):  # type: ignore[no-untyped-def]
                if own:
                    return _panels(b)
                return np.empty((0, b.shape[0], _PANEL), dtype=b.dtype)

            return impl
        return lambda b, own: np.empty((0, b.shape[0], _PANEL), dtype=b.dtype)

    def _product_at(x, t, s, b, bp, c, own):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise NotImplementedError

    @overload(_product_at)
    def _product_at_impl(x, t, s, b, bp, c, own):  # type: ignore[no-untyped-def]
        """``c = x[:, t, :] @ b`` for ``x`` ``[B, T, K]`` C-contiguous: with ``own`` in
        float32 the tiles read the rows of ``x[:, t, :]`` where they are (no copy); else
        they are copied into the scratch ``s`` ``[B, K]`` for BLAS (``np.dot`` takes
        contiguous arrays only)."""
        if x.dtype == types.float32 and x.layout == "C" and b.layout == "C" and c.layout == "C":

            def impl(x, t, s, b, bp, c, own):  # type: ignore[no-untyped-def]
                if own:
                    _matmul_tiles(x[:, t, :], b, bp, c)
                else:
                    for i in range(x.shape[0]):
                        for k in range(x.shape[2]):
                            s[i, k] = x[i, t, k]
                    np.dot(s, b, c)

            return impl

        def blas(x, t, s, b, bp, c, own):  # type: ignore[no-untyped-def]
            for i in range(x.shape[0]):
                for k in range(x.shape[2]):
                    s[i, k] = x[i, t, k]
            np.dot(s, b, c)

        return blas

    @overload(_product)
    def _product_impl(a, b, bp, c, own):  # type: ignore[no-untyped-def]
        """``c = a @ b``: by tiles with ``own`` in float32 (C-contiguous arrays), else BLAS
        (``np.dot``)."""
        if all(x.dtype == types.float32 and x.layout == "C" for x in (a, b, c)):

            def impl(a, b, bp, c, own):  # type: ignore[no-untyped-def]
                if own:
                    _matmul_tiles(a, b, bp, c)
                else:
                    np.dot(a, b, c)

            return impl
        return lambda a, b, bp, c, own: np.dot(a, b, c)

    @_cached_jit(error_model="numpy", fastmath={"contract"})
    def _matmul32(a, b, c):  # type: ignore[no-untyped-def]
        """``c = a @ b`` (float32, C-contiguous; ``c`` does not overlap ``a`` or ``b``) by
        the scans' tiles."""
        _matmul_tiles(a, b, _panels(b), c)

    matmul32 = _matmul32

    @njit(inline="always", error_model="numpy")
    def _copy_rows(src, dst, t):  # type: ignore[no-untyped-def]
        """``dst[:, t, :] = src`` row by row (vectorised; numba's strided slice assignment
        is slower)."""
        for b in range(src.shape[0]):
            sb, db = src[b], dst[b, t]
            for k in range(sb.shape[0]):
                db[k] = sb[k]

    @njit(inline="always", error_model="numpy")
    def _zero_invalid(hs, valid, t):  # type: ignore[no-untyped-def]
        """Outputs of the invalid steps ``t`` are zero."""
        for b in range(hs.shape[0]):
            if valid[b, t] == 0:
                hs[b, t, :] = 0

    @njit(inline="always", error_model="numpy")
    def _previous(prev, hs, h0, valid, masked, t):  # type: ignore[no-untyped-def]
        """``prev[:, t]`` = the state before step ``t``: ``h0``, then the previous output;
        with ``masked``, ``h0`` also after an invalid step (``decomposed._previous_states``:
        each example's valid steps are consecutive)."""
        for b in range(hs.shape[0]):
            if t > 0 and (not masked or valid[b, t - 1] != 0):
                for j in range(hs.shape[2]):
                    prev[b, t, j] = hs[b, t - 1, j]
            else:
                for j in range(hs.shape[2]):
                    prev[b, t, j] = h0[b, j]

    @njit(inline="always", error_model="numpy")
    def _add_valid(dh, go, valid, masked, t):  # type: ignore[no-untyped-def]
        """``dh += go[:, t]`` on the valid rows (an invalid step's output is a constant)."""
        for b in range(dh.shape[0]):
            if not masked or valid[b, t] != 0:
                db, gb = dh[b], go[b, t]
                for j in range(db.shape[0]):
                    db[j] += gb[j]

    # Each loop below writes one array: LLVM vectorises a loop only when it can rule out
    # overlap between the arrays it writes and reads, by a bounded number of run-time checks.

    @_cached_jit(nogil=True, error_model="numpy", fastmath={"contract"})
    def _lstm_forward(gi, b_hh, h0, c0, wt, valid, masked, acts, cs, tcs, hs, prev, h, z, own):  # type: ignore[no-untyped-def]
        """``gi`` ``[B, T, 4H]``, ``b_hh`` ``[4H]``, ``h0``/``c0`` ``[B, H]``, ``wt`` =
        ``W_hh^T`` ``[H, 4H]``; writes the gates ``acts`` ``[T, B, 4H]``, cell states ``cs``
        ``[T + 1, B, H]``, ``tanh(c_t)`` ``tcs`` ``[T, B, H]``, outputs ``hs`` ``[B, T, H]``,
        the state before each step ``prev`` ``[B, T, H]`` (:func:`_previous`);
        ``h`` ``[B, H]`` and ``z`` ``[B, 4H]`` are scratch (``h`` ends as ``h_T``). With
        ``masked``, a step ``t`` of example ``b`` with ``valid[b, t] == 0`` keeps the states
        and outputs zero (its gates are zero), as torch's packed sequences. ``own``: the
        products by :func:`_matmul_tiles` (float32), else BLAS."""
        batch, steps, g4 = gi.shape
        hid = g4 // 4
        h[:, :] = h0
        cs[0, :, :] = c0
        bp = _panels_for(wt, own)
        for t in range(steps):
            _previous(prev, hs, h0, valid, masked, t)
            _product(h, wt, bp, z, own)
            # indexed in full rather than through row views (z[b], ...): each view costs
            # reference counting in numba; 2-D/3-D indices do not (forward 410 -> 350 us of
            # element-wise work, B = 64, T = 32, H = 64)
            for b in range(batch):
                if masked and valid[b, t] == 0:
                    acts[t, b, :] = 0
                    tcs[t, b, :] = 0
                    cs[t + 1, b, :] = cs[t, b]
                    continue
                for k in range(g4):
                    z[b, k] += gi[b, t, k] + b_hh[k]
                for k in range(2 * hid):
                    acts[t, b, k] = _sig(z[b, k])
                for k in range(2 * hid, 3 * hid):
                    acts[t, b, k] = _tanh(z[b, k])
                for k in range(3 * hid, g4):
                    acts[t, b, k] = _sig(z[b, k])
                for j in range(hid):
                    cs[t + 1, b, j] = (
                        acts[t, b, hid + j] * cs[t, b, j] + acts[t, b, j] * acts[t, b, 2 * hid + j]
                    )
                for j in range(hid):
                    tcs[t, b, j] = _tanh(cs[t + 1, b, j])
                for j in range(hid):
                    h[b, j] = acts[t, b, 3 * hid + j] * tcs[t, b, j]
            _copy_rows(h, hs, t)
            if masked:
                _zero_invalid(hs, valid, t)

    @njit(inline="always", error_model="numpy")
    def _sums_and_squares(acc, out, sq):  # type: ignore[no-untyped-def]
        """``out = float64(acc)`` and ``sq[b] = sum_k out[b, k]^2`` (four float64 partial
        sums, not one serial chain)."""
        cols = acc.shape[1]
        whole = cols - cols % 4
        for b in range(acc.shape[0]):
            s0 = s1 = s2 = s3 = 0.0
            for k in range(whole, cols):
                x = np.float64(acc[b, k])
                out[b, k] = x
                s0 += x * x
            for k in range(0, whole, 4):
                x0, x1 = np.float64(acc[b, k]), np.float64(acc[b, k + 1])
                x2, x3 = np.float64(acc[b, k + 2]), np.float64(acc[b, k + 3])
                out[b, k], out[b, k + 1], out[b, k + 2], out[b, k + 3] = x0, x1, x2, x3
                s0 += x0 * x0
                s1 += x1 * x1
                s2 += x2 * x2
                s3 += x3 * x3
            sq[b] = (s0 + s1) + (s2 + s3)

    @_cached_jit(nogil=True, error_model="numpy", fastmath={"contract"})
    def _lstm_backward(  # type: ignore[no-untyped-def]
        acts, cs, tcs, w, go, has_go, valid, masked, dh, dc, dz, s, tmp, own, sums, acc, dzsum, dzsq
    ):
        """Back-propagation through time: ``go`` ``[B, T, H]`` the gradients at the outputs
        (read when ``has_go``), ``dh``/``dc`` ``[B, H]`` those at ``h_T``/``c_T`` on entry and
        at ``h_0``/``c_0`` on return; writes the gate gradients ``dz`` ``[B, T, 4H]`` and,
        with ``sums``, their sums over the steps (the per-example bias gradients of both maps
        that feed the gates): each row added into ``acc`` ``[B, 4H]`` while it is in cache
        (``dz``'s dtype, one step after another as ``dz.sum(1)`` adds them, last step
        first), then ``dzsum`` (a float64 copy) and their squared norms ``dzsq`` ``[B]``
        (float64 products and sums). Benchmark LSTM step: the engine's own sum of ``dz`` and
        float32 norms with their range check cost ~90 us, these ~30 us; ``w`` =
        ``W_hh`` ``[4H, H]``, ``s`` ``[B, 4H]``, ``tmp`` ``[B, H]`` scratch. With ``masked``,
        an invalid step passes the state gradients through and has zero gate gradients.
        ``own``: as :func:`lstm_forward`'s."""
        steps, batch, g4 = acts.shape
        hid = g4 // 4
        one = _one(acts)
        bp = _panels_for(w, own)
        if sums:
            acc[:, :] = 0
        for t in range(steps - 1, -1, -1):
            if has_go:
                _add_valid(dh, go, valid, masked, t)
            # the gate gradients go to dz[:, t] directly; the product reads them there
            for b in range(batch):  # full indices, no row views (see the forward)
                if masked and valid[b, t] == 0:
                    dz[b, t, :] = 0
                    continue
                for j in range(hid):  # dc_t += dh_t o (1 - tanh(c_t)^2)
                    tc = tcs[t, b, j]
                    dc[b, j] += dh[b, j] * acts[t, b, 3 * hid + j] * (one - tc * tc)
                for j in range(hid):  # d i
                    i = acts[t, b, j]
                    dz[b, t, j] = dc[b, j] * acts[t, b, 2 * hid + j] * (i - i * i)
                for j in range(hid):  # d f
                    f = acts[t, b, hid + j]
                    dz[b, t, hid + j] = dc[b, j] * cs[t, b, j] * (f - f * f)
                for j in range(hid):  # d g
                    g = acts[t, b, 2 * hid + j]
                    dz[b, t, 2 * hid + j] = dc[b, j] * acts[t, b, j] * (one - g * g)
                for j in range(hid):  # d o
                    o = acts[t, b, 3 * hid + j]
                    dz[b, t, 3 * hid + j] = dh[b, j] * tcs[t, b, j] * (o - o * o)
                for j in range(hid):  # dc_{t-1}
                    dc[b, j] *= acts[t, b, hid + j]
                if sums:
                    for k in range(g4):
                        acc[b, k] += dz[b, t, k]
            if masked:  # dh_{t-1} = dz_t W_hh where the step is valid, else dh_t
                _product_at(dz, t, s, w, bp, tmp, own)
                for b in range(batch):
                    if valid[b, t] != 0:
                        dh[b, :] = tmp[b]
            else:
                _product_at(dz, t, s, w, bp, dh, own)
        if sums:
            _sums_and_squares(acc, dzsum, dzsq)

    @_cached_jit(nogil=True, error_model="numpy", fastmath={"contract"})
    def _gru_forward(gi, b_hh, h0, wt, valid, masked, acts, ghn, hs, prev, h, z, own):  # type: ignore[no-untyped-def]
        """GRU: ``gi`` ``[B, T, 3H]``, ``b_hh`` ``[3H]``, ``h0`` ``[B, H]``, ``wt`` =
        ``W_hh^T`` ``[H, 3H]``; writes the gates ``r, z, n`` ``acts`` ``[T, B, 3H]``, the
        hidden part of ``n``'s pre-activation ``W_hn h + b_hn`` ``ghn`` ``[T, B, H]`` and the
        outputs ``hs`` ``[B, T, H]``, ``prev`` as :func:`lstm_forward`'s; ``h`` ``[B, H]``,
        ``z`` ``[B, 3H]`` scratch. ``valid``,
        ``masked``, ``own``: as :func:`lstm_forward`'s."""
        batch, steps, g3 = gi.shape
        hid = g3 // 3
        h[:, :] = h0
        bp = _panels_for(wt, own)
        for t in range(steps):
            _previous(prev, hs, h0, valid, masked, t)
            _product(h, wt, bp, z, own)
            for b in range(batch):  # full indices, no row views (see lstm_forward)
                if masked and valid[b, t] == 0:
                    acts[t, b, :] = 0
                    ghn[t, b, :] = 0
                    continue
                for k in range(2 * hid):
                    acts[t, b, k] = _sig(gi[b, t, k] + z[b, k] + b_hh[k])
                for j in range(hid):
                    ghn[t, b, j] = z[b, 2 * hid + j] + b_hh[2 * hid + j]
                # n's pre-activation in z's n block (read above), then its tanh: a loop
                # that reads and writes acts would not be vectorised (possible overlap)
                for j in range(hid):
                    z[b, 2 * hid + j] = gi[b, t, 2 * hid + j] + acts[t, b, j] * ghn[t, b, j]
                for j in range(hid):
                    acts[t, b, 2 * hid + j] = _tanh(z[b, 2 * hid + j])
                for j in range(hid):
                    zj, nj = acts[t, b, hid + j], acts[t, b, 2 * hid + j]
                    h[b, j] = (_one(acts) - zj) * nj + zj * h[b, j]
            _copy_rows(h, hs, t)
            if masked:
                _zero_invalid(hs, valid, t)

    @_cached_jit(nogil=True, error_model="numpy", fastmath={"contract"})
    def _gru_backward(  # type: ignore[no-untyped-def]
        acts, ghn, hs, h0, w, go, has_go, valid, masked, dh, dgi, dgh, s, tmp, own, sums, ac, gs, sq
    ):
        """GRU back-propagation through time: ``go`` ``[B, T, H]`` the gradients at the
        outputs (read when ``has_go``), ``dh`` ``[B, H]`` that at ``h_T`` on entry and at
        ``h_0`` on return; writes the gradients at the input projection ``dgi`` and at the
        hidden projection ``dgh`` (``[B, T, 3H]``; they differ in the ``n`` block by the factor
        ``r``); ``w`` = ``W_hh`` ``[3H, H]``, ``s`` ``[B, 3H]``, ``tmp`` ``[B, H]`` scratch.
        With ``masked`` the valid steps of each example are consecutive (packed sequences, in
        either direction): an invalid step passes ``dh`` through, and the state before a
        valid step is the previous output or, after invalid steps, ``h0``. ``own``: as
        :func:`lstm_forward`'s. With ``sums``, the per-example sums over the steps of
        ``dgi`` and ``dgh`` (the two maps' bias gradients), as :func:`lstm_backward`'s:
        accumulated in ``ac`` ``[2, B, 3H]`` (``dgi``'s dtype), then ``gs`` ``[2, B, 3H]``
        (float64) and their squared norms ``sq`` ``[2, B]``."""
        steps, batch, g3 = acts.shape
        hid = g3 // 3
        one = _one(acts)
        bp = _panels_for(w, own)
        if sums:
            ac[:, :, :] = 0
        for t in range(steps - 1, -1, -1):
            if has_go:
                _add_valid(dh, go, valid, masked, t)
            for b in range(batch):  # full indices, no row views (see lstm_forward)
                if masked and valid[b, t] == 0:
                    s[b, :] = 0
                    continue
                after = t > 0 and (not masked or valid[b, t - 1] != 0)
                hp = hs[b, t - 1] if after else h0[b]
                for j in range(hid):  # d n_pre, kept in the n block of s for now
                    n = acts[t, b, 2 * hid + j]
                    s[b, 2 * hid + j] = dh[b, j] * (one - acts[t, b, hid + j]) * (one - n * n)
                for j in range(hid):  # d z_pre
                    zj = acts[t, b, hid + j]
                    s[b, hid + j] = dh[b, j] * (hp[j] - acts[t, b, 2 * hid + j]) * (zj - zj * zj)
                for j in range(hid):  # d r_pre (d n_pre recomputed: a loop reading and
                    # writing s would not be vectorised)
                    r, n = acts[t, b, j], acts[t, b, 2 * hid + j]
                    dn = dh[b, j] * (one - acts[t, b, hid + j]) * (one - n * n)
                    s[b, j] = dn * ghn[t, b, j] * (r - r * r)
                for j in range(hid):  # the direct path h_{t-1} -> h_t
                    dh[b, j] *= acts[t, b, hid + j]
                if sums:
                    for k in range(g3):
                        ac[0, b, k] += s[b, k]
            _copy_rows(s, dgi, t)
            for b in range(batch):  # the hidden map's n block is scaled by r
                for j in range(hid):
                    s[b, 2 * hid + j] *= acts[t, b, j]
                if sums:
                    for k in range(g3):
                        ac[1, b, k] += s[b, k]
            _copy_rows(s, dgh, t)
            _product(s, w, bp, tmp, own)
            dh += tmp
        if sums:
            _sums_and_squares(ac[0], gs[0], sq[0])
            _sums_and_squares(ac[1], gs[1], sq[1])

    lstm_forward, lstm_backward = _lstm_forward, _lstm_backward
    gru_forward, gru_backward = _gru_forward, _gru_backward
