"""Zero-concentrated DP accounting (Bun & Steinke 2016): ρ's add under composition.

zCDP captures the Gaussian mechanism exactly and pure DP via ρ = ε²/2 (Prop. 3.3), but not
amplification by subsampling: a Poisson-subsampled mechanism is charged the ρ of the
mechanism itself (valid by quasi-convexity of Rényi divergence, never tighter). Use the
RDP or PLD accountant for DP-SGD; this one shows what ignoring amplification costs.
"""

from __future__ import annotations

from renyi.accountants.base import Accountant, DeltaResult, EpsilonResult
from renyi.analysis.curves import Zcdp
from renyi.analysis.events import Event

__all__ = ["ZcdpAccountant", "event_rho"]


def event_rho(event: Event) -> float:
    """ρ such that one run of ``event`` is ρ-zCDP (an upper bound): the event's own
    :meth:`~renyi.analysis.events.Event.zcdp_rho`."""
    return event.zcdp_rho()


class ZcdpAccountant(Accountant):
    """ρ-zCDP accountant; ε at δ by the optimal RDP conversion of the zCDP curve."""

    name = "zcdp"

    def __init__(self) -> None:
        super().__init__()
        self._rho = 0.0

    @property
    def rho(self) -> float:
        return self._rho

    def _analyse(self, event: Event) -> float:
        return event_rho(event)

    def _add(self, cost: float, count: int) -> None:
        if count:
            self._rho = self._rho + count * cost

    def _epsilon(self, delta: float) -> EpsilonResult:
        conv = Zcdp(self._rho).to_dp(delta)
        return EpsilonResult(
            conv.epsilon, delta, self.name, order=conv.order, details={"rho": self._rho}
        )

    def _delta(self, epsilon: float) -> DeltaResult:
        conv = Zcdp(self._rho).to_delta(epsilon)
        return DeltaResult(
            conv.delta, epsilon, self.name, order=conv.order, details={"rho": self._rho}
        )
