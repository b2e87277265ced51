"""Compiled loops for the convolutions of the capture path (CPU).

* :func:`col2im_nhwc` (numba) adds columns back into an image: ``dx[b, y, x, c] += cols[b, i,
  j, p, q, c]`` for ``y = i sh + p dh``, ``x = j sw + q dw``, the scatter half of a
  convolution's input gradient once its product ``g W`` has been formed (see
  :func:`renyi.dpsgd._onednn.conv2d`). Channels-last on both sides, so the innermost loop
  adds ``C`` contiguous values. torch has no CPU kernel for it in this layout (``F.fold``
  works channels-first: 3.3 ms on the benchmark CNN's second convolution against 0.27 ms
  here; ``kh kw`` strided ``add_`` calls 0.5 ms). Additions only, in a fixed order: the
  result equals torch's input gradient up to the order of the additions.
* :func:`conv_pe_kernel` (LLVM IR through llvmlite) forms the per-example weight gradients
  of a one-group convolution from its padded input and output gradients (see below and
  ``ghost._ConvGrads``, strategy ``direct``).
"""

from __future__ import annotations

import ctypes
from typing import Any

from renyi.dpsgd._scan_kernels import _cached_jit, ir_loop

njit: Any
try:  # pragma: no cover - exercised when numba is installed
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None

__all__ = ["ENABLED", "available", "col2im_nhwc", "conv_pe_kernel"]


def available() -> bool:
    """Whether numba is installed (the kernels exist)."""
    return njit is not None


col2im_nhwc: Any = None

if njit is not None:  # pragma: no branch

    @_cached_jit(error_model="numpy", boundscheck=False)
    def col2im_nhwc(cols, dx, sh, sw, dh, dw):  # type: ignore[no-untyped-def]
        """``dx[b, i sh + p dh, j sw + q dw, :] += cols[b, i, j, p, q, :]`` (``cols``
        ``[B, Ho, Wo, kh, kw, C]``, ``dx`` ``[B, H, W, C]``, both C-contiguous, every
        target inside ``dx``)."""
        nb, oh, ow, kh, kw, nc = cols.shape
        for b in range(nb):
            for i in range(oh):
                for p in range(kh):
                    y = i * sh + p * dh
                    for j in range(ow):
                        for q in range(kw):
                            src = cols[b, i, j, p, q]
                            dst = dx[b, y, j * sw + q * dw]
                            for c in range(nc):
                                dst[c] += src[c]


# -- per-example weight gradients of a convolution, vectorised over output channels ----------
#
# ``out[b, c, f, o] = sum_l x[b, c, pos[l] + offs[f]] * g[b, l, o]``: the input plane ``x[b,
# c]`` (padded, flattened), ``pos[l]`` the offset of output position ``l``'s window, ``offs[f]``
# that of kernel tap ``f``, ``g`` the output gradients channels-last. One machine function,
# written in LLVM IR (llvmlite, numba's own compiler back end) and compiled once per vector
# width for this processor: for each example, input channel, block of ``fb`` taps and block
# of ``lanes`` output channels, ``fb`` vector accumulators stay in registers over all output
# positions (one vector load of ``g`` and ``fb`` broadcasts per position). numba's loop
# vectoriser kept the accumulators in memory (8-36 ms on the benchmark CNN's shapes) and its
# SLP vectoriser is off by default; torch's CPU kernels for the same product (MKL's batched
# product, oneDNN's grouped convolution) take their AVX2 paths on AMD processors. Measured on
# the benchmark CNN (one thread, AVX-512 EPYC): conv1 (1 -> 16 channels, 8 x 8, 196
# positions) 0.56 ms against 1.9 ms (grouped convolution) and 1.85 ms (batched product);
# conv2 (16 -> 32, 4 x 4, 25 positions) 0.63 ms against 1.6 ms plus 0.7 ms of patch copies.
#
# Fused multiply-adds in a fixed order (position by position): the result equals the
# per-example gradient up to the rounding of that order.

#: Whether ``ghost._ConvGrads`` may use :func:`conv_pe_kernel` (switched off to compare).
ENABLED = True

_llvm: Any = None
try:  # pragma: no cover - exercised when llvmlite (a dependency of numba) is installed
    import llvmlite.binding as _llvm_binding
    import llvmlite.ir as _ir

    _llvm = _llvm_binding
except ImportError:  # pragma: no cover
    _ir = None

#: Compiled kernels by (dtype name, taps per block, lanes); None where compiling failed.
_KERNELS: dict[tuple[str, int, int], Any] = {}
_ENGINES: list[Any] = []  # the JIT engines own the machine code: kept for the process
_TARGET: list[Any] = []


def _target_machine() -> Any:
    if not _TARGET:
        _llvm.initialize_native_target()
        _llvm.initialize_native_asmprinter()
        target = _llvm.Target.from_default_triple()
        _TARGET.append(
            target.create_target_machine(
                cpu=_llvm.get_host_cpu_name(),
                features=_llvm.get_host_cpu_features().flatten(),
                opt=3,
            )
        )
    return _TARGET[0]


def _build(double: bool, fb: int, lanes: int) -> Any:
    """The IR module of ``pe(x, pos, offs, g, out, B, C, plane, L, F, O)`` (see above);
    requires ``F % fb == 0`` and ``O % lanes == 0``."""
    ir = _ir
    ft = ir.DoubleType() if double else ir.FloatType()
    vt = ir.VectorType(ft, lanes)
    i64, i32 = ir.IntType(64), ir.IntType(32)
    mod = ir.Module(name="renyi_conv_pe")
    fnty = ir.FunctionType(
        ir.VoidType(), [ft.as_pointer(), i64.as_pointer(), i64.as_pointer()]
        + [ft.as_pointer()] * 2 + [i64] * 6,
    )  # fmt: skip
    fn = ir.Function(mod, fnty, name="pe")
    for arg in fn.args[:5]:
        arg.add_attribute("noalias")
    x, pos, offs, g, out, nb, nc, plane, nl, nf, no = fn.args
    fma = ir.Function(
        mod,
        ir.FunctionType(vt, [vt, vt, vt]),
        name=f"llvm.fma.v{lanes}{'f64' if double else 'f32'}",
    )
    one = ir.Constant(i64, 1)
    align = 8 if double else 4  # one element's: rows of g and out start anywhere
    zvec = ir.Constant(vt, [0.0] * lanes)
    splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def loop(stop: Any, step: Any, body: Any, carried: Any = ()) -> list[Any]:
        return ir_loop(b, stop, step, body, carried)

    def per_example(bi: Any) -> None:
        def per_channel(ci: Any) -> None:
            bc = b.add(b.mul(bi, nc), ci)
            xplane = b.gep(x, [b.mul(bc, plane)])
            gb = b.gep(g, [b.mul(bi, b.mul(nl, no))])
            ob = b.gep(out, [b.mul(bc, b.mul(nf, no))])

            def per_taps(f0: Any) -> None:
                taps = [b.add(f0, ir.Constant(i64, k)) for k in range(fb)]
                offk = [b.load(b.gep(offs, [t])) for t in taps]

                def per_lanes(o0: Any) -> None:
                    def per_position(li: Any, *accs: Any) -> list[Any]:
                        gptr = b.bitcast(b.gep(gb, [b.add(b.mul(li, no), o0)]), vt.as_pointer())
                        gv = b.load(gptr, align=align)
                        base = b.load(b.gep(pos, [li]))
                        new = []
                        for k in range(fb):
                            s = b.load(b.gep(xplane, [b.add(base, offk[k])]))
                            sv = b.insert_element(
                                ir.Constant(vt, ir.Undefined), s, ir.Constant(i32, 0)
                            )
                            sv = b.shuffle_vector(sv, ir.Constant(vt, ir.Undefined), splat)
                            new.append(b.call(fma, [sv, gv, accs[k]]))
                        return new

                    accs = loop(nl, one, per_position, [zvec] * fb)
                    for t, acc in zip(taps, accs, strict=True):
                        optr = b.bitcast(b.gep(ob, [b.add(b.mul(t, no), o0)]), vt.as_pointer())
                        b.store(acc, optr, align=align)

                loop(no, ir.Constant(i64, lanes), per_lanes)

            loop(nf, ir.Constant(i64, fb), per_taps)

        loop(nc, one, per_channel)

    loop(nb, one, per_example)
    b.ret_void()
    return mod


def conv_pe_kernel(double: bool, fb: int, lanes: int) -> Any:
    """The compiled kernel (a ctypes function) for float64 (``double``) or float32 data,
    ``fb`` taps and ``lanes`` output channels per block; None where llvmlite is missing or
    compiling failed (the caller then uses torch's kernels)."""
    key = ("float64" if double else "float32", fb, lanes)
    if key not in _KERNELS:
        _KERNELS[key] = None
        if _llvm is not None:
            try:
                tm = _target_machine()
                mod = _llvm.parse_assembly(str(_build(double, fb, lanes)))
                mod.verify()
                pb = _llvm.create_pass_builder(
                    tm, _llvm.create_pipeline_tuning_options(speed_level=3)
                )
                pb.getModulePassManager().run(mod, pb)
                engine = _llvm.create_mcjit_compiler(mod, tm)
                engine.finalize_object()
                _ENGINES.append(engine)
                proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 5 + [ctypes.c_int64] * 6))
                _KERNELS[key] = proto(engine.get_function_address("pe"))
            except Exception:  # pragma: no cover - an llvmlite without this API
                _KERNELS[key] = None
    return _KERNELS[key]
