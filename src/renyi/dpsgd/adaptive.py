"""Adaptive clipping for DP-SGD: the clipping norm tracks a quantile of the gradient norms.

Andrew, Thakkar, McMahan & Ramaswamy (2021), "Differentially private learning with adaptive
clipping" (NeurIPS), Algorithm 1, for DP-SGD with Poisson sampling. At every step, besides
the noisy clipped gradient sum, the optimizer releases a noisy count of the examples whose
gradient norm is at most the current clipping norm ``C``:

* each example of the batch contributes ``b_i − 1/2`` with ``b_i = 1[‖g_i‖ ≤ C]``, so one
  example moves the sum by at most ``1/2`` (add/remove neighbouring); the release is
  ``Σ (b_i − 1/2) + N(0, σ_b²)``;
* the estimate of the unclipped fraction is ``b̃ = release / (q·n) + 1/2`` (the divisor is
  the *expected* batch size, as for the gradient);
* the geometric update ``C ← C · exp(−η (b̃ − γ))``, clamped to ``[min_clipbound,
  max_clipbound]`` (post-processing of released values), drives ``C`` to the γ-quantile of
  the norms.

**Privacy.** The gradient sum (sensitivity ``C``, noise ``σ_Δ C``) and the count
(sensitivity ``1/2``, noise ``σ_b``) are one Gaussian mechanism on a vector; whitened, one
example moves it by at most ``sqrt(σ_Δ⁻² + (2σ_b)⁻²)``. Choosing

    σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)        (Andrew et al. 2021, Sec. 3.1)

makes that exactly ``1/z``: each step is the Poisson-subsampled Gaussian with noise
multiplier ``z`` (``noise_multiplier``), the event the accountant already composes. The
quantile release's cost is therefore in the accountant; the gradient just gets a little more
noise (``σ_Δ > z``). Requires ``z < 2σ_b``.

Example:
    >>> round(adaptive_noise_multiplier(1.0, unclipped_num_std=5.0), 6)
    1.005038
"""

from __future__ import annotations

import math
from typing import Any

import torch

from renyi._validation import check_positive, check_range, fail
from renyi.dpsgd.optimizer import DPOptimizer

__all__ = ["AdaptiveClipDPOptimizer", "adaptive_noise_multiplier"]


def adaptive_noise_multiplier(noise_multiplier: float, unclipped_num_std: float) -> float:
    """σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the gradient's multiplier when the count gets σ_b.

    Raises:
        PrivacyParameterError: ``z ≥ 2σ_b`` (the count alone would cost the whole budget).
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    sb = check_positive("unclipped_num_std", unclipped_num_std)
    rest = z**-2 - (2.0 * sb) ** -2
    if not rest > 0.0:
        raise fail(
            "unclipped_num_std",
            unclipped_num_std,
            f"> noise_multiplier / 2 = {z / 2:g} (the count's noise must leave budget for the "
            "gradient)",
        )
    return 1.0 / math.sqrt(rest)


def _set_clip(target: Any, value: float) -> None:
    """Set the clipping norm of an engine or capture (public setter when it has one)."""
    inner = getattr(target, "engine", target)
    prop = getattr(type(inner), "max_grad_norm", None)
    if isinstance(prop, property) and prop.fset is not None:
        inner.max_grad_norm = value
    elif hasattr(inner, "_max_norm") and isinstance(inner._max_norm, float):
        inner._max_norm = value
    else:
        raise fail("engine", type(inner).__name__, "an engine whose clipping norm can be set")
    if not math.isclose(float(inner.sensitivity), value, rel_tol=1e-12):
        raise fail("engine sensitivity", inner.sensitivity, f"{value} after setting it")


class AdaptiveClipDPOptimizer(DPOptimizer):
    """:class:`~renyi.dpsgd.optimizer.DPOptimizer` with quantile-tracking clipping.

    Takes the arguments of ``DPOptimizer`` (``max_grad_norm`` is the initial ``C``; flat
    clipping only) plus Opacus's AdaClip arguments:

    Args:
        target_unclipped_quantile: γ in (0, 1), the fraction of examples to leave unclipped.
        clipbound_learning_rate: η > 0 of the geometric update.
        max_clipbound, min_clipbound: bounds on ``C`` (0 < min ≤ max).
        unclipped_num_std: σ_b, the noise std of the count; must exceed ``noise_multiplier/2``.

    ``noise_multiplier`` (z) stays the multiplier of the accounted event;
    :attr:`gradient_noise_multiplier` (σ_Δ) is the one applied to the gradient.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        target_unclipped_quantile: float,
        clipbound_learning_rate: float,
        max_clipbound: float,
        min_clipbound: float,
        unclipped_num_std: float,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("clipping", "flat") != "flat":
            raise fail("clipping", kwargs["clipping"], "'flat' with adaptive clipping")
        super().__init__(optimizer, **kwargs)
        self.target_unclipped_quantile = check_range(
            "target_unclipped_quantile",
            target_unclipped_quantile,
            0.0,
            1.0,
            low_open=True,
            high_open=True,
        )
        self.clipbound_learning_rate = check_positive(
            "clipbound_learning_rate", clipbound_learning_rate
        )
        self.min_clipbound = check_positive("min_clipbound", min_clipbound)
        self.max_clipbound = check_positive("max_clipbound", max_clipbound)
        if self.min_clipbound > self.max_clipbound:
            raise fail("min_clipbound", min_clipbound, f"<= max_clipbound={max_clipbound}")
        self.unclipped_num_std = check_positive("unclipped_num_std", unclipped_num_std)
        self.gradient_noise_multiplier = adaptive_noise_multiplier(
            self.noise_multiplier, self.unclipped_num_std
        )
        self.initial_max_grad_norm = self.max_grad_norm
        self._unclipped = 0
        self._counted = 0
        self.unclipped_fraction_history: list[float] = []

    # -- counting (with the same norms the clipping used) ---------------------------------
    def accumulate(self, inputs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
        losses, norms = super().accumulate(inputs, targets)
        self._count(norms)
        return losses, norms

    def _add_captured(self, sums: dict[str, torch.Tensor], n: int, norms: torch.Tensor) -> None:
        super()._add_captured(sums, n, norms)
        self._count(norms)

    def _count(self, norms: torch.Tensor) -> None:
        self._unclipped += int((norms.detach().double() <= self.max_grad_norm).sum())
        self._counted += int(norms.numel())

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if not self._mid_batch:
            self._unclipped = 0
            self._counted = 0

    # -- noise and the clip-bound update ---------------------------------------------------
    def noise_std(self) -> float:
        """σ_Δ·C on the gradient sum (the count takes the rest of the budget)."""
        return self.gradient_noise_multiplier * self.max_grad_norm

    def pre_step(self) -> None:
        super().pre_step()  # noise the gradient with σ_Δ C, scale, account the z-event
        centred = self._unclipped - 0.5 * self._counted  # Σ (b_i − 1/2): sensitivity 1/2
        from renyi import noise

        z = self.random_source.normal((1,), torch.float64).numpy()
        noisy = float(noise.snap(float(centred), z, self.unclipped_num_std))  # on the lattice
        fraction = noisy / self.expected_batch_size + 0.5
        self.unclipped_fraction_history.append(fraction)
        updated = self.max_grad_norm * math.exp(
            -self.clipbound_learning_rate * (fraction - self.target_unclipped_quantile)
        )
        self._set_max_grad_norm(min(self.max_clipbound, max(self.min_clipbound, updated)))
        self._unclipped = 0
        self._counted = 0

    def _set_max_grad_norm(self, value: float) -> None:
        _set_clip(self.engine, value)
        if self.capture is not None:
            _set_clip(self.capture, value)
        self.max_grad_norm = value

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        current = self.max_grad_norm
        self.max_grad_norm = self.initial_max_grad_norm  # the mechanism's fixed parameters
        try:
            state = super().state_dict()
        finally:
            self.max_grad_norm = current
        state["clipbound"] = current
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        current = self.max_grad_norm
        self.max_grad_norm = self.initial_max_grad_norm
        try:
            super().load_state_dict(state)
        except BaseException:
            self.max_grad_norm = current
            raise
        self._set_max_grad_norm(check_positive("clipbound", state["clipbound"]))
