"""Exact per-example gradients of recurrent and attention layers, by decomposing their forward.

``nn.RNN``/``nn.GRU``/``nn.LSTM`` run fused kernels that expose neither their gates nor
their intermediate layers, and ``nn.MultiheadAttention`` applies parameters owned by itself
and by its ``out_proj`` child inside one functional call. Neither can be read by a per-layer
hook, and ``torch.func.vmap`` has no batching rule for the fused RNN kernels.

While the clipping engine records a batch, such a module runs an equivalent forward written
in plain tensor operations (:func:`rnn_forward`, :func:`mha_forward`), in which every use of
a parameter is an affine map ``y = x W^T + b`` called through a :class:`Recorder`. Every
parameter of these layers enters only through such maps, so example ``i``'s gradient is
``sum_t b_it x_it^T`` over the map's calls (``b`` = the gradient at the map's output): the
sequence rule of :mod:`renyi.dpsgd.ghost` gives its norm from ``x`` and ``b`` and the clipped
sum by book-keeping, with no per-example gradient tensor and no second backward pass. The
decomposed forward is the forward that trains (dropout masks included), so nothing is
recomputed or approximated; it equals torch's fused result up to rounding
(tests/test_dpsgd_layers.py checks per-example gradients against torch's own modules run on
one example at a time).

Supported: all RNN/GRU/LSTM options except unbatched (2-D) inputs (``num_layers``, ``bias``,
``batch_first``, ``dropout``, ``bidirectional``, ``proj_size``, given or default initial
states, outputs and final states both usable), and ``PackedSequence`` inputs (unpacked; every
step past an example's length keeps its state and outputs zero, as torch's packed kernels:
masked steps of the compiled LSTM/GRU scans, else a per-step loop);
``nn.MultiheadAttention`` with packed or separate projections (``kdim``/``vdim``),
``batch_first``, ``bias``, ``add_zero_attn``, ``key_padding_mask``/``attn_mask`` (bool or
float), ``is_causal``, ``need_weights``/``average_attn_weights`` and dropout;
``add_bias_kv=True`` is refused.

Example:
    >>> import torch
    >>> from torch import nn
    >>> lstm = nn.LSTM(3, 4, batch_first=True)
    >>> x = torch.randn(2, 5, 3)
    >>> rec = Recorder(lambda t: None)
    >>> out, (h, c) = rnn_forward(lstm, rec, x)
    >>> bool(torch.allclose(out, lstm(x)[0], atol=1e-6)), sorted({k[0] for k in rec.calls})
    (True, ['weight_hh_l0', 'weight_ih_l0'])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from renyi.dpsgd import _onednn, _scan_kernels
from renyi.dpsgd.grad_sample import UnsupportedModelError

__all__ = [
    "DECOMPOSED_LAYER_TYPES",
    "LinearKey",
    "Recorder",
    "mha_forward",
    "rnn_forward",
    "supports_decomposed",
]

#: One affine map of a decomposed layer: (weight name, weight rows, bias name or None, bias
#: rows); rows are ``(start, stop)`` along dim 0 of the parameter (``None``: all rows).
LinearKey = tuple[str, tuple[int, int] | None, str | None, tuple[int, int] | None]


class Recorder:
    """Runs the affine maps of a decomposed forward and remembers their inputs.

    ``register(y)`` is called on every map output that requires grad and returns the slot
    its gradient will be delivered to (the engine's gradient-edge list, or a tensor hook);
    ``calls[key]`` lists ``(input, slot)`` per call, inputs detached and batch-first.
    """

    def __init__(
        self, register: Callable[[Tensor], int | None], detach_params: bool = False
    ) -> None:
        self.register = register
        self.calls: dict[LinearKey, list[tuple[Tensor, int | None]]] = {}
        self.last_slot: int | None = None
        #: the capture path: the maps run on detached parameters (no weight gradient is
        #: formed by the user's backward; the output gradients are all the engine needs)
        self.detach_params = detach_params

    def linear(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        key: LinearKey,
    ) -> Tensor:
        if self.detach_params:
            from renyi.dpsgd.ghost import anchored

            wd = weight.detach()
            bd = None if bias is None else bias.detach()
            y = anchored(lambda t: _onednn.linear(t, wd, bd), weight, x)
        else:
            y = F.linear(x, weight, bias)
        slot = self.register(y) if y.requires_grad else None
        self.calls.setdefault(key, []).append((x.detach(), slot))
        self.last_slot = slot
        return y

    def record(self, key: LinearKey, x: Tensor, slot: int | None) -> None:
        """Record a call of the map ``key`` on ``x`` whose output gradient is that of an
        already registered ``slot`` (a map computed inside a fused kernel, see
        :func:`_fused_layer`)."""
        self.calls.setdefault(key, []).append((x.detach(), slot))


def _rows(t: Tensor | None, rows: tuple[int, int]) -> Tensor | None:
    return None if t is None else t[rows[0] : rows[1]]


# ---------------------------------------------------------------- recurrent layers


def rnn_forward(module: nn.RNNBase, rec: Recorder, input: Any, hx: Any = None) -> Any:
    """``module(input, hx)`` for ``nn.RNN``/``nn.GRU``/``nn.LSTM`` in plain tensor operations.

    Same equations as torch (``torch.nn.LSTM`` etc. documentation): LSTM gates ``i, f, g, o``
    with optional projection ``h = W_hr (o * tanh(c))``; GRU ``n = tanh(W_in x + b_in +
    r * (W_hn h + b_hn))``, ``h' = (1 - z) n + z h``; Elman ``h' = tanh|relu(W_ih x + b_ih +
    W_hh h + b_hh)``; dropout on the outputs of every layer but the last, in training mode.
    """
    packed = input if isinstance(input, PackedSequence) else None
    valid: Tensor | None = None  # [B, T]: step t of example b is within its length
    if packed is not None:  # unpacked (original batch order), each step masked past its end
        padded, lengths = pad_packed_sequence(packed, batch_first=True)
        steps_of = torch.arange(int(padded.shape[1]))
        valid = (steps_of[None, :] < lengths[:, None]).to(padded.device)
        input = padded if module.batch_first else padded.transpose(0, 1)
    if not isinstance(input, Tensor) or input.ndim != 3:
        shape = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise UnsupportedModelError(
            f"{type(module).__name__} input of shape {shape}: DP-SGD needs a batched input "
            "(3-D, with a batch dimension)"
        )
    mode = module.mode
    x = input if module.batch_first else input.transpose(0, 1)  # [B, T, I]
    batch, steps = int(x.shape[0]), int(x.shape[1])
    dirs = 2 if module.bidirectional else 1
    hidden = module.hidden_size
    proj = getattr(module, "proj_size", 0) or 0
    out_size = proj if proj > 0 else hidden
    layers = module.num_layers
    if hx is None:
        zeros = torch.zeros(layers * dirs, batch, out_size, dtype=x.dtype, device=x.device)
        h0 = zeros
        c0 = torch.zeros(layers * dirs, batch, hidden, dtype=x.dtype, device=x.device)
    elif mode == "LSTM":
        h0, c0 = hx
    else:
        h0, c0 = hx, None
    for state in (h0,) if c0 is None else (h0, c0):
        if not isinstance(state, Tensor) or state.ndim != 3:
            raise UnsupportedModelError(
                f"{type(module).__name__} initial state must be 3-D [layers * directions, "
                "B, H] for a batched input"
            )
    layer_in = x
    h_last: list[Tensor] = []
    c_last: list[Tensor] = []
    for layer in range(layers):
        outs: list[Tensor] = []
        for d in range(dirs):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            w_ih = getattr(module, "weight_ih" + sfx)
            w_hh = getattr(module, "weight_hh" + sfx)
            b_ih = getattr(module, "bias_ih" + sfx) if module.bias else None
            b_hh = getattr(module, "bias_hh" + sfx) if module.bias else None
            bias_ih = "bias_ih" + sfx if module.bias else None
            bias_hh = "bias_hh" + sfx if module.bias else None
            gi = rec.linear(layer_in, w_ih, b_ih, ("weight_ih" + sfx, None, bias_ih, None))
            h = h0[layer * dirs + d]
            c = c0[layer * dirs + d] if c0 is not None else None
            hh_key: LinearKey = ("weight_hh" + sfx, None, bias_hh, None)
            lstm_scan = mode == "LSTM" and proj == 0 and (valid is None or _compiled(gi))
            if mode == "GRU" and _compiled(gi) and gi.dtype == h.dtype:
                seq_out, h = _gru_layer(rec, gi, h, w_hh, b_hh, d == 1, hh_key, valid)
            elif lstm_scan or (mode[:3] == "RNN" and valid is None):
                seq_out, h, c = _fused_layer(
                    module, rec, gi, rec.last_slot, h, c, w_hh, b_hh, d == 1, hh_key, valid
                )
            else:  # the per-step loop
                seq: list[Tensor | None] = [None] * steps
                order = range(steps) if d == 0 else range(steps - 1, -1, -1)
                for t in order:
                    h_prev, c_prev = h, c
                    gh = rec.linear(h, w_hh, b_hh, hh_key)
                    git = gi[:, t]
                    if mode == "LSTM":
                        i, f, g, o = (git + gh).chunk(4, dim=1)
                        assert c is not None
                        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                        h = torch.sigmoid(o) * torch.tanh(c)
                        if proj > 0:
                            w_hr = getattr(module, "weight_hr" + sfx)
                            h = rec.linear(h, w_hr, None, ("weight_hr" + sfx, None, None, None))
                    elif mode == "GRU":
                        r_i, z_i, n_i = git.chunk(3, dim=1)
                        r_h, z_h, n_h = gh.chunk(3, dim=1)
                        r = torch.sigmoid(r_i + r_h)
                        z = torch.sigmoid(z_i + z_h)
                        n = torch.tanh(n_i + r * n_h)
                        h = (1 - z) * n + z * h
                    elif mode == "RNN_TANH":
                        h = torch.tanh(git + gh)
                    else:
                        h = torch.relu(git + gh)
                    if valid is not None:  # past an example's end its state stays, its output is 0
                        m = valid[:, t : t + 1]
                        h = torch.where(m, h, h_prev)
                        c = None if c is None or c_prev is None else torch.where(m, c, c_prev)
                        seq[t] = torch.where(m, h, torch.zeros_like(h))
                        continue
                    seq[t] = h
                seq_out = torch.stack([s for s in seq if s is not None], dim=1)
            outs.append(seq_out)
            h_last.append(h)
            if c is not None:
                c_last.append(c)
        layer_in = outs[0] if dirs == 1 else torch.cat(outs, dim=2)
        if module.dropout > 0 and module.training and layer < layers - 1:
            layer_in = F.dropout(layer_in, module.dropout, training=True)
    output: Any = layer_in if module.batch_first else layer_in.transpose(0, 1)
    if packed is not None:  # the same packing as torch's (its batch sizes and order)
        idx = packed.sorted_indices
        rows = layer_in if idx is None else layer_in.index_select(0, idx)
        data = pack_padded_sequence(rows, lengths_sorted(packed), batch_first=True).data
        output = PackedSequence(data, packed.batch_sizes, idx, packed.unsorted_indices)
    h_n = torch.stack(h_last, dim=0)
    if mode == "LSTM":
        return output, (h_n, torch.stack(c_last, dim=0))
    return output, h_n


def lengths_sorted(packed: PackedSequence) -> Tensor:
    """The sequence lengths of ``packed`` in its sorted (decreasing) order."""
    sizes = packed.batch_sizes
    return (sizes[None, :] > torch.arange(int(sizes[0]))[:, None]).sum(dim=1)


def _fused_layer(
    module: nn.RNNBase,
    rec: Recorder,
    gi: Tensor,
    gi_slot: int | None,
    h0: Tensor,
    c0: Tensor | None,
    w_hh: Tensor,
    b_hh: Tensor | None,
    reverse: bool,
    hh_key: LinearKey,
    valid: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One layer and direction of an LSTM or Elman RNN from the recorded input projection
    ``gi = x W_ih^T + b_ih``.

    The recurrence gets ``gi`` as its input (LSTM: :class:`_LSTMScan`; Elman: torch's fused
    kernel with an identity input weight), so its gates are ``gi_t + W_hh h_{t-1} + b_hh``,
    exactly the cell's, and the gradient arriving at ``gi`` is the gate gradient ``delta_t``,
    which is also the output gradient of the map ``W_hh h_{t-1} + b_hh`` (the gates add
    both). That map is recorded with the previous hidden states (``h_0`` and the outputs) and
    ``gi``'s gradient slot: per-example gradients ``sum_t delta_t h_{t-1}^T`` with no
    autograd graph over the time steps.

    ``valid`` ``[B, T]`` (packed sequences, LSTM with the compiled scan only): past an
    example's length its states stay and its outputs are zero; the state before each step
    is then ``h_0`` or the previous output (:func:`_previous_states`).
    """
    seq = gi.flip(1) if reverse else gi
    mask = None if valid is None else (valid.flip(1) if reverse else valid)
    if module.mode == "LSTM":
        assert c0 is not None
        prevs: list[Tensor] = []
        out, h_n, c_n = _LSTMScan.apply(seq, h0, c0, w_hh, b_hh, mask, prevs)
        c_last: Tensor | None = c_n
        prev = prevs[0]
    else:
        g = int(gi.shape[-1])
        # the weights enter detached, as in _LSTMScan: their per-example gradients come from
        # the recorded map; a gradient formed by autograd would reach W_hh.grad in the user's
        # backward, which the capture path refuses as a use outside the module
        w = w_hh.detach().to(gi.dtype)
        params: list[Tensor] = [torch.eye(g, dtype=gi.dtype, device=gi.device), w]
        if b_hh is not None:
            zeros = torch.zeros(g, dtype=gi.dtype, device=gi.device)
            params += [zeros, b_hh.detach().to(gi.dtype)]
        fn = torch._VF.rnn_tanh if module.mode == "RNN_TANH" else torch._VF.rnn_relu  # type: ignore[attr-defined]
        # dropout is applied between layers by the caller: train=False here
        out, h_all = fn(
            seq, h0.unsqueeze(0).to(gi.dtype), params, b_hh is not None, 1, 0.0, False, False, True
        )
        h_n, c_last = h_all[0], None
        prev = _previous_states(h0, out, mask)
    if reverse:
        prev, out = prev.flip(1), out.flip(1)
    rec.record(hh_key, prev, gi_slot)
    return out, h_n, c_last


def _previous_states(h0: Tensor, out: Tensor, mask: Tensor | None) -> Tensor:
    """The hidden state before each step, ``[B, T, H]``, from a scan's outputs (in its time
    order): ``h_0``, then the previous output; with a packed ``mask`` (each example's valid
    steps consecutive) ``h_0`` also after invalid steps, whose outputs are zero while the
    state is kept (before a reversed sequence's start; after a sequence's end the gate
    gradients are zero, so what is recorded there does not count)."""
    first = h0.unsqueeze(1).to(out.dtype)
    prev = torch.cat([first, out[:, :-1]], dim=1)
    if mask is not None:
        after = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], dim=1)
        prev = torch.where(after.unsqueeze(2), prev, first)
    return prev


def _gru_layer(
    rec: Recorder,
    gi: Tensor,
    h0: Tensor,
    w_hh: Tensor,
    b_hh: Tensor | None,
    reverse: bool,
    hh_key: LinearKey,
    valid: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One layer and direction of a GRU from the recorded input projection ``gi``, by the
    compiled scan (:class:`_GRUScan`; CPU float32/float64 with numba, else the caller's
    per-step loop).

    The hidden map ``W_hh h_{t-1} + b_hh`` does not share its output gradient with ``gi``
    (``n = tanh(gi_n + r (W_hn h + b_hn))``: its ``n`` block is scaled by ``r``), so the scan
    takes a second input, a slot tensor made from ``gi`` (:class:`_GateSlot`, zeros that
    pass no gradient on), and returns that gradient to it; the map is recorded with the
    previous hidden states and the slot's gradient edge, in the scan's time order.
    ``valid``: packed sequences, as :func:`_fused_layer`'s.
    """
    seq = gi.flip(1) if reverse else gi
    mask = None if valid is None else (valid.flip(1) if reverse else valid)
    slot_t = _GateSlot.apply(seq)
    slot = rec.register(slot_t) if slot_t.requires_grad else None
    prev: list[Tensor] = []
    out, h_n = _GRUScan.apply(seq, slot_t, h0, w_hh, b_hh, mask, prev)
    rec.record(hh_key, prev[0], slot)
    return (out.flip(1) if reverse else out), h_n


class _GateSlot(torch.autograd.Function):
    """Zeros shaped like ``gi``, in the graph: the tensor whose gradient is the GRU hidden
    map's output gradient (:class:`_GRUScan` returns it); nothing flows back to ``gi``."""

    @staticmethod
    def forward(ctx: Any, gi: Tensor) -> Tensor:  # type: ignore[override]
        return torch.zeros((), dtype=gi.dtype, device=gi.device).expand(gi.shape)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> None:  # type: ignore[override]
        return None


class _GRUScan(torch.autograd.Function):
    """The GRU recurrence from precomputed input projections ``gi`` ``[B, T, 3H]`` (torch's
    equations: ``r = sigmoid(gi_r + W_hr h + b_hr)``, ``z = sigmoid(gi_z + W_hz h + b_hz)``,
    ``n = tanh(gi_n + r (W_hn h + b_hn))``, ``h' = (1 - z) n + z h``), compiled
    (:mod:`renyi.dpsgd._scan_kernels`). Returns the outputs ``[B, T, H]`` and ``h_n``, and
    appends the state before each step ``[B, T, H]`` (:func:`_previous_states`, written by
    the kernel) to ``prev_out`` when given; the
    backward returns the gradients at ``gi`` (the input map's output gradient), at ``slot``
    (the hidden map's, see :class:`_GateSlot`) and at ``h0``, none for the weights (the
    engine forms the per-example ones from the maps).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        gi: Tensor,
        slot: Tensor,
        h0: Tensor,
        w_hh: Tensor,
        b_hh: Tensor | None,
        mask: Tensor | None = None,
        prev_out: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        dt = gi.dtype
        batch, steps, g3 = (int(v) for v in gi.shape)
        hid = g3 // 3
        with torch.no_grad():
            w = w_hh.detach().to(dt)
            h0d = h0.detach().to(dt).contiguous()

            def new(*shape: int) -> Tensor:
                return torch.empty(shape, dtype=dt)

            bias = torch.zeros(g3, dtype=dt) if b_hh is None else b_hh.detach().to(dt).contiguous()
            acts, ghn, hs = new(steps, batch, g3), new(steps, batch, hid), new(batch, steps, hid)
            prev = new(batch, steps, hid)
            args = (gi.detach().contiguous(), bias, h0d, w.t().contiguous())
            valid, masked = _mask_arg(mask)
            h = new(batch, hid)
            outs = (acts, ghn, hs, prev, h, new(batch, g3))
            threads = _blas_threads(batch, hid, g3)
            own = _own(dt, threads)
            old = [] if own else _scan_kernels.blas_threads(threads)
            try:
                _scan_kernels.gru_forward(
                    *(_np(a) for a in args),
                    valid,
                    masked,
                    *(_np(a) for a in outs),
                    own,
                )
            finally:
                _scan_kernels.restore_blas_threads(old)
        ctx.save_for_backward(acts, ghn, hs, h0d, w)
        ctx.h0_dtype = h0.dtype
        ctx.mask = (valid, masked)
        if prev_out is not None:
            prev_out.append(prev)
        ctx.set_materialize_grads(False)
        return hs, h

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_out: Tensor | None, g_h: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        acts, ghn, hs, h0, w = ctx.saved_tensors
        steps, batch, g3 = (int(v) for v in acts.shape)
        hid = g3 // 3
        dt = acts.dtype
        dh = torch.zeros(batch, hid, dtype=dt) if g_h is None else g_h.to(dt).contiguous().clone()
        go = torch.zeros(1, 1, 1, dtype=dt) if g_out is None else g_out.to(dt).contiguous()
        dgi, dgh = torch.empty(batch, steps, g3, dtype=dt), torch.empty(batch, steps, g3, dtype=dt)
        s, tmp = torch.empty(batch, g3, dtype=dt), torch.empty(batch, hid, dtype=dt)
        rows = batch if _GATE_SUMS else 1  # the step sums (see _LSTMScan.backward)
        acc = torch.empty(2, rows, g3, dtype=dt)
        sums = torch.empty(2, rows, g3, dtype=torch.float64)
        sq = torch.empty(2, rows, dtype=torch.float64)
        threads = _blas_threads(batch, hid, g3)
        own = _own(dt, threads)
        old = [] if own else _scan_kernels.blas_threads(threads)
        try:
            _scan_kernels.gru_backward(
                _np(acts), _np(ghn), _np(hs), _np(h0), _np(w.contiguous()), _np(go),
                g_out is not None, *ctx.mask, _np(dh), _np(dgi), _np(dgh), _np(s), _np(tmp),
                own, _GATE_SUMS, _np(acc), _np(sums), _np(sq),
            )  # fmt: skip
        finally:
            _scan_kernels.restore_blas_threads(old)
        if _GATE_SUMS:
            attach_step_sums(dgi, (sums[0], sq[0]))
            attach_step_sums(dgh, (sums[1], sq[1]))
        return dgi, dgh, dh.to(ctx.h0_dtype), None, None, None, None


def _tanh_into(x: Tensor, out: Tensor) -> None:
    """``out = tanh(x)``: numpy's vectorised tanh for CPU float32/float64 tensors (about ten
    times faster than torch's CPU tanh on the scan's ``[B, H]`` blocks, accurate to a few
    ulp), torch's elsewhere."""
    if _NUMPY_TANH and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        np.tanh(x.numpy(), out=out.numpy())
    else:
        torch.tanh(x, out=out)


#: numpy's tanh in the scans (see :func:`_tanh_into`); tests switch it off to compare.
_NUMPY_TANH = True


class _LSTMScan(torch.autograd.Function):
    """The LSTM recurrence from precomputed input projections ``gi`` ``[B, T, 4H]``.

    Forward: ``z_t = gi_t + W_hh h_{t-1} + b_hh``, gates ``i, f, g, o``, ``c_t = f c_{t-1} +
    i g``, ``h_t = o tanh(c_t)`` (torch's equations), without autograd. Returns the outputs,
    ``h_n`` and ``c_n``, and appends the state before each step ``[B, T, H]``
    (:func:`_previous_states`: the input of the hidden map the engine records, written by
    the compiled kernel) to ``prev_out`` when given.
    Backward: back-propagation through time by hand, returning ``dL/dgi = dL/dz`` (the gate
    gradients, which the engine reads at ``gi``'s gradient slot), batch-first and contiguous,
    and the gradients of the initial states. The weights' own gradients are not formed (the
    engine computes the per-example ones from the gate gradients): ``W_hh.grad``/``b_hh.grad``
    stay unset.

    On the CPU with numba installed both run as compiled loops
    (:mod:`renyi.dpsgd._scan_kernels`; the forward in float32 only, see
    :func:`_compiled_forward`), elsewhere as loops of batched torch operations
    (:func:`_torch_forward`, :func:`_torch_backward`; any device and dtype). Benchmark LSTM
    (B = 64, T = 32, H = 64, one thread, float32): forward and backward through autograd
    1.3 ms compiled (own AVX-512 products) against 3.4 ms for the torch loops, thread-time
    medians of 30 alternated calls in one process (load 1.2); tests/test_dpsgd_lstm_scan.py
    checks both against autograd in float64.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        gi: Tensor,
        h0: Tensor,
        c0: Tensor,
        w_hh: Tensor,
        b_hh: Tensor | None,
        mask: Tensor | None = None,
        prev_out: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        dt = gi.dtype
        with torch.autocast(gi.device.type, enabled=False), torch.no_grad():
            w = w_hh.detach().to(dt)
            # packed sequences (mask): the compiled kernels only (rnn_forward checks)
            if _compiled(gi) and (dt == torch.float32 or mask is not None):
                hs, acts, cs, tcs, h_n, prev = _compiled_forward(gi, h0, c0, w, b_hh, mask)
            else:
                hs, acts, cs, tcs = _torch_forward(gi, h0, c0, w, b_hh)
                h_n = hs[:, -1].clone()
                prev = _previous_states(h0, hs, mask)
        ctx.save_for_backward(acts, cs, tcs, w)
        ctx.dtypes = (h0.dtype, c0.dtype)
        ctx.mask = mask
        if prev_out is not None:
            prev_out.append(prev)
        # outputs the loss does not use get None, not materialised zeros (a classifier on h_n)
        ctx.set_materialize_grads(False)
        return hs, h_n, cs[-1].clone()

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_out: Tensor | None, g_h: Tensor | None, g_c: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        acts, cs, tcs, w = ctx.saved_tensors
        if _compiled(acts) or ctx.mask is not None:
            dz, dh, dc, sums = _compiled_backward(
                acts, cs, tcs, w, g_out, g_h, g_c, ctx.mask, _GATE_SUMS
            )
            if sums is not None:
                attach_step_sums(dz, sums)
        else:
            dz, dh, dc = _torch_backward(acts, cs, tcs, w, g_out, g_h, g_c)
        return dz, dh.to(ctx.dtypes[0]), dc.to(ctx.dtypes[1]), None, None, None, None


#: Whether the compiled backward scans (:class:`_LSTMScan`, :class:`_GRUScan`) hand the
#: engine their gate gradients' sums over the steps (:func:`attach_step_sums`); tests and
#: A/B comparisons switch it off.
_GATE_SUMS = True


def attach_step_sums(b: Tensor, sums: tuple[Tensor, Tensor]) -> None:
    """Remember ``sums`` = (``b.sum(dim=1)`` as float64 ``[B, o]``, its rows' squared norms
    ``[B]`` float64) with ``b`` ``[B, T, o]``, formed by the kernel that wrote ``b``
    (:func:`step_sums` returns them while ``b`` is unchanged): the per-example bias
    gradients of the maps fed ``b`` and their squared norms, without another pass over
    ``b``."""
    b._renyi_step_sums = (b._version, sums)  # type: ignore[attr-defined]


def step_sums(b: Tensor) -> tuple[Tensor, Tensor] | None:
    """The sums :func:`attach_step_sums` gave ``b``, or ``None``: none given, or ``b`` changed
    in place since (autograd adding another gradient into the buffer bumps its version)."""
    got = getattr(b, "_renyi_step_sums", None)
    if got is None or got[0] != b._version or b.ndim != 3:
        return None
    sums: tuple[Tensor, Tensor] = got[1]
    return sums if sums[0].shape == (b.shape[0], b.shape[2]) else None


#: Whether :class:`_LSTMScan` may run the compiled kernels of
#: :mod:`renyi.dpsgd._scan_kernels` (tests switch it off to compare with the torch loops).
_USE_KERNELS = True


def _compiled(t: Tensor) -> bool:
    """Whether the compiled LSTM kernels apply to ``t``'s data: numba installed, CPU,
    float32 or float64 (else the torch loops, any device and dtype)."""
    return (
        _USE_KERNELS
        and _scan_kernels.available()
        and t.device.type == "cpu"
        and t.dtype in (torch.float32, torch.float64)
    )


def _mask_arg(mask: Tensor | None) -> tuple[np.ndarray, bool]:
    """The kernels' ``valid`` (uint8 ``[B, T]``) and ``masked`` arguments."""
    if mask is None:
        return np.zeros((1, 1), dtype=np.uint8), False
    return np.ascontiguousarray(mask.detach().cpu().numpy().astype(np.uint8)), True


def _blas_threads(batch: int, hid: int, gates: int) -> int:
    """OpenBLAS threads for the scans' per-step products ``[B, H] x [H, G]``: torch's
    thread count from 2**23 multiply-adds a product, else one. Smaller products only lose
    by threading: on this project's 2-core machine, ``[64, 64] x [64, 256]`` took 13-21 us
    on one thread and 55 us on two, and up to 15 ms whenever the second core was busy
    (OpenBLAS's threads wait for each other by spinning)."""
    return torch.get_num_threads() if batch * hid * gates >= 1 << 23 else 1


def _own(dtype: torch.dtype, threads: int) -> bool:
    """Whether the scans' per-step products run on renyi's own float32 kernel
    (:func:`renyi.dpsgd._scan_kernels.own_products`), else BLAS (whose thread count is then
    set for the call: :func:`_blas_threads`)."""
    return _scan_kernels.own_products(np.float32 if dtype == torch.float32 else np.float64, threads)


def _np(t: Tensor) -> np.ndarray:
    return t.numpy()  # type: ignore[no-any-return]


def _compiled_forward(
    gi: Tensor, h0: Tensor, c0: Tensor, w: Tensor, b_hh: Tensor | None, mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`renyi.dpsgd._scan_kernels.lstm_forward`: outputs ``[B, T, H]``, gates
    ``[T, B, 4H]``, cell states ``[T + 1, B, H]``, their ``tanh`` ``[T, B, H]``, the
    final hidden state and the state before each step (:func:`_previous_states`, written
    by the kernel: no ``torch.cat`` afterwards); ``mask`` ``[B, T]``: the valid steps of
    packed sequences.

    Used for float32 only: in float64 the kernel's scalar C-library ``exp``/``tanh`` are
    slower than the torch loop with numpy's vectorised ``tanh`` (B = 64, T = 32, H = 64:
    6.9 ms against 2.9 ms; float32: 1.2 ms against 1.6 ms)."""
    dt = gi.dtype
    batch, steps, g4 = (int(s) for s in gi.shape)
    hid = g4 // 4

    def new(*shape: int) -> Tensor:
        return torch.empty(shape, dtype=dt)

    bias = torch.zeros(g4, dtype=dt) if b_hh is None else b_hh.detach().to(dt).contiguous()
    acts, cs, tcs, hs = (
        new(steps, batch, g4),
        new(steps + 1, batch, hid),
        new(steps, batch, hid),
        new(batch, steps, hid),
    )
    ins = (
        gi.detach().contiguous(),
        bias,
        h0.detach().to(dt).contiguous(),
        c0.detach().to(dt).contiguous(),
        w.t().contiguous(),
    )
    h, prev = new(batch, hid), new(batch, steps, hid)
    outs = (acts, cs, tcs, hs, prev, h, new(batch, g4))
    valid, masked = _mask_arg(mask)
    threads = _blas_threads(batch, hid, g4)
    own = _own(dt, threads)
    old = [] if own else _scan_kernels.blas_threads(threads)
    try:
        _scan_kernels.lstm_forward(
            *(_np(a) for a in ins), valid, masked, *(_np(a) for a in outs), own
        )
    finally:
        _scan_kernels.restore_blas_threads(old)
    return hs, acts, cs, tcs, h, prev


def _compiled_backward(
    acts: Tensor,
    cs: Tensor,
    tcs: Tensor,
    w: Tensor,
    g_out: Tensor | None,
    g_h: Tensor | None,
    g_c: Tensor | None,
    mask: Tensor | None = None,
    want_sums: bool = True,
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor] | None]:
    """:func:`renyi.dpsgd._scan_kernels.lstm_backward`: gate gradients ``[B, T, 4H]``, the
    gradients at ``h_0``, ``c_0`` and (``want_sums``, else ``None``) the gate gradients' sums
    over the steps ``[B, 4H]`` and their squared norms ``[B]``, float64 (:func:`step_sums`);
    ``mask`` as :func:`_compiled_forward`'s."""
    steps, batch, g4 = (int(s) for s in acts.shape)
    hid = g4 // 4
    dt = acts.dtype

    def state(g: Tensor | None) -> Tensor:
        if g is None:
            return torch.zeros(batch, hid, dtype=dt)
        return g.detach().to(dt).contiguous().clone()

    dh, dc = state(g_h), state(g_c)
    go = torch.zeros(1, 1, 1, dtype=dt) if g_out is None else g_out.detach().to(dt).contiguous()
    dz = torch.empty(batch, steps, g4, dtype=dt)
    rows = batch if want_sums else 1
    acc, sums = torch.empty(rows, g4, dtype=dt), torch.empty(rows, g4, dtype=torch.float64)
    sq = torch.empty(rows, dtype=torch.float64)
    scratch = torch.empty(batch, g4, dtype=dt)
    threads = _blas_threads(batch, hid, g4)
    own = _own(dt, threads)
    old = [] if own else _scan_kernels.blas_threads(threads)
    try:
        _scan_kernels.lstm_backward(
            _np(acts),
            _np(cs),
            _np(tcs),
            _np(w.contiguous()),
            _np(go),
            g_out is not None,
            *_mask_arg(mask),
            _np(dh),
            _np(dc),
            _np(dz),
            _np(scratch),
            _np(torch.empty(batch, hid, dtype=dt)),
            own,
            want_sums,
            _np(acc),
            _np(sums),
            _np(sq),
        )
    finally:
        _scan_kernels.restore_blas_threads(old)
    return dz, dh, dc, (sums, sq) if want_sums else None


def _torch_forward(
    gi: Tensor, h0: Tensor, c0: Tensor, w: Tensor, b_hh: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward as a loop of batched torch operations (one ``addmm`` and six element-wise
    operations a step, on views made once); same results as :func:`_compiled_forward`."""
    dt = gi.dtype
    wt = w.t()
    z_in = gi.detach().transpose(0, 1)  # time-major [T, B, 4H], contiguous per step
    z_in = z_in + b_hh.detach().to(dt) if b_hh is not None else z_in.contiguous()
    steps, batch, g4 = z_in.shape
    hid = g4 // 4
    acts = torch.empty(steps, batch, g4, dtype=dt, device=gi.device)
    cs = torch.empty(steps + 1, batch, hid, dtype=dt, device=gi.device)
    tcs = torch.empty(steps, batch, hid, dtype=dt, device=gi.device)
    hs = torch.empty(steps, batch, hid, dtype=dt, device=gi.device)
    cs[0] = c0.detach().to(dt)
    gates = acts.view(steps, batch, 4, hid)
    a_all, zs = acts.unbind(0), z_in.unbind(0)
    a_i, a_f, a_g, a_o = (gates[:, :, k].unbind(0) for k in range(4))
    c_all, tc_all, h_all = cs.unbind(0), tcs.unbind(0), hs.unbind(0)
    h = h0.detach().to(dt)
    for t in range(steps):
        z = torch.addmm(zs[t], h, wt)
        torch.sigmoid(z, out=a_all[t])
        _tanh_into(z[:, 2 * hid : 3 * hid], a_g[t])
        torch.mul(a_f[t], c_all[t], out=c_all[t + 1])
        c_all[t + 1].addcmul_(a_i[t], a_g[t])
        _tanh_into(c_all[t + 1], tc_all[t])
        h = torch.mul(a_o[t], tc_all[t], out=h_all[t])
    return hs.transpose(0, 1), acts, cs, tcs


def _torch_backward(
    acts: Tensor,
    cs: Tensor,
    tcs: Tensor,
    w: Tensor,
    g_out: Tensor | None,
    g_h: Tensor | None,
    g_c: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Back-propagation through time as a loop of batched torch operations; same results
    as :func:`_compiled_backward`."""
    steps, batch, g4 = acts.shape
    hid = g4 // 4
    dt = acts.dtype
    # gate-major contiguous copy: the vectorised products below then run on dense memory
    i, f, g, o = acts.view(steps, batch, 4, hid).permute(2, 0, 1, 3).contiguous()
    # local derivatives, vectorised over all steps: dz_{i,f,g} = dc * m3, dz_o = dh * m_o
    m3 = torch.empty(steps, batch, 3, hid, dtype=dt, device=acts.device)
    m_i, m_f, m_g = m3.unbind(2)
    torch.mul(g, i - i * i, out=m_i)
    torch.mul(cs[:-1], f - f * f, out=m_f)
    torch.addcmul(i, i, g * g, value=-1, out=m_g)
    m3_t = m3.unbind(0)
    m_o = (tcs * (o - o * o)).unbind(0)
    k = torch.addcmul(o, o, tcs * tcs, value=-1).unbind(0)  # dh -> dc
    f_t = f.unbind(0)
    dh = torch.zeros(batch, hid, dtype=dt, device=acts.device) if g_h is None else g_h.to(dt)
    dc = torch.zeros(batch, hid, dtype=dt, device=acts.device) if g_c is None else g_c.to(dt)
    go = None if g_out is None else g_out.to(dt).unbind(1)
    # batch-first [B, T, 4H]: what the input projection's backward and the engine read
    dz = torch.empty(batch, steps, g4, dtype=dt, device=acts.device)
    d_all = dz.unbind(1)
    d_ifg = dz[:, :, : 3 * hid].unflatten(2, (3, hid)).unbind(1)
    d_o = dz[:, :, 3 * hid :].unbind(1)
    for t in range(steps - 1, -1, -1):
        if go is not None:
            dh = dh + go[t]
        dc = torch.addcmul(dc, dh, k[t])
        torch.mul(m3_t[t], dc.unsqueeze(1), out=d_ifg[t])
        torch.mul(dh, m_o[t], out=d_o[t])
        dc = dc * f_t[t]
        dh = torch.mm(d_all[t], w)
    return dz, dh, dc


# ---------------------------------------------------------------- attention


def _as_additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf")
        )
    return mask.to(dtype)


def mha_forward(
    module: nn.MultiheadAttention,
    rec: Recorder,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``module(query, key, value, ...)`` for ``nn.MultiheadAttention`` in plain operations.

    The projections are recorded as three affine maps (rows ``0:E``, ``E:2E``, ``2E:3E`` of
    the packed ``in_proj_weight``/``in_proj_bias``, or the separate ``q/k/v_proj_weight``)
    and ``out_proj``; attention is ``softmax(q k^T / sqrt(d) + mask) v`` with dropout on the
    weights in training mode, as ``torch.nn.functional.multi_head_attention_forward``.
    """
    if module.bias_k is not None or module.bias_v is not None:
        raise UnsupportedModelError(
            "nn.MultiheadAttention(add_bias_kv=True) is not supported by DP-SGD's "
            "per-example gradients; use add_bias_kv=False"
        )
    if query.ndim != 3:
        raise UnsupportedModelError(
            f"nn.MultiheadAttention query of shape {tuple(query.shape)}: DP-SGD needs a "
            "batched (3-D) input"
        )
    if not module.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    batch, tgt, emb = query.shape
    heads, hd = module.num_heads, module.head_dim
    bias = module.in_proj_bias
    bias_name = "in_proj_bias" if bias is not None else None
    spans = [(0, emb), (emb, 2 * emb), (2 * emb, 3 * emb)]
    projected = []
    for j, (src, r) in enumerate(zip((query, key, value), spans, strict=True)):
        if module._qkv_same_embed_dim:
            w_name, w, w_rows = "in_proj_weight", _rows(module.in_proj_weight, r), r
        else:
            w_name = ("q_proj_weight", "k_proj_weight", "v_proj_weight")[j]
            w, w_rows = getattr(module, w_name), None
        assert w is not None
        projected.append(
            rec.linear(
                src, w, _rows(bias, r), (w_name, w_rows, bias_name, r if bias_name else None)
            )
        )
    q, k, v = (
        p.reshape(batch, -1, heads, hd).transpose(1, 2) for p in projected
    )  # [B, H, L|S, hd]
    src_len = k.shape[2]
    mask: Tensor | None = None
    if attn_mask is not None:
        am = _as_additive(attn_mask, q.dtype)
        if am.ndim == 2:
            am = am.reshape(1, 1, tgt, src_len)
        else:
            am = am.reshape(batch, heads, tgt, src_len)
        mask = am
    elif is_causal:
        causal = torch.ones(tgt, src_len, dtype=torch.bool, device=q.device).triu(1)
        mask = _as_additive(causal, q.dtype).reshape(1, 1, tgt, src_len)
    if key_padding_mask is not None:
        kp = _as_additive(key_padding_mask, q.dtype).reshape(batch, 1, 1, src_len)
        mask = kp if mask is None else mask + kp
    if module.add_zero_attn:
        zeros = torch.zeros(batch, heads, 1, hd, dtype=k.dtype, device=k.device)
        k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros], dim=2)
        if mask is not None:
            mask = F.pad(mask, (0, 1))
    scores = torch.matmul(q * (1.0 / math.sqrt(hd)), k.transpose(-2, -1))
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    if module.dropout > 0.0 and module.training:
        weights = F.dropout(weights, p=module.dropout, training=True)
    attended = torch.matmul(weights, v).transpose(1, 2).reshape(batch, tgt, emb)
    out = rec.linear(
        attended,
        module.out_proj.weight,
        module.out_proj.bias,
        (
            "out_proj.weight",
            None,
            "out_proj.bias" if module.out_proj.bias is not None else None,
            None,
        ),
    )
    if not module.batch_first:
        out = out.transpose(0, 1)
    if not need_weights:
        return out, None
    return out, weights.mean(dim=1) if average_attn_weights else weights


# ---------------------------------------------------------------- registry

Forward = Callable[..., Any]

#: Layer types whose forward is replaced by a decomposed one while a batch is recorded.
DECOMPOSED_LAYER_TYPES: dict[type[nn.Module], Forward] = {
    nn.RNN: rnn_forward,
    nn.GRU: rnn_forward,
    nn.LSTM: rnn_forward,
    nn.MultiheadAttention: mha_forward,
}


def supports_decomposed(module: nn.Module) -> bool:
    """Whether ``module`` is one of :data:`DECOMPOSED_LAYER_TYPES` (or a subclass that keeps
    its ``forward``)."""
    for kind in DECOMPOSED_LAYER_TYPES:
        if isinstance(module, kind):
            return type(module).forward is kind.forward
    return False
