"""Workloads of the matrix factorization mechanism: what training actually reads off the noise.

A workload is a lower-triangular ``T × T`` matrix ``A``: row ``t`` says how the gradients of
steps ``0..t`` enter the model after step ``t``. With SGD at a constant learning rate the
model is a prefix sum of gradients (``A = L``, ones on and below the diagonal); with heavy-ball
momentum β and learning rates ``η_r`` (Denisov et al. 2022, §5),

    θ_t = θ_0 − Σ_{s ≤ t} A[t, s] g_s,    A[t, s] = Σ_{r = s}^{t} η_r β^{r − s}.

With a constant learning rate ``A`` is Toeplitz, given by its first column
``a_j = Σ_{r ≤ j} β^r`` (:func:`prefix_coefs`): the fast O(T) paths of the Toeplitz
strategies use that column; learning-rate schedules need the dense matrix
(:func:`prefix_workload`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from renyi._validation import check_int, check_range, fail

__all__ = ["prefix_coefs", "prefix_workload"]

FloatArray = NDArray[np.float64]


def _momentum(momentum: float) -> float:
    return check_range("momentum", momentum, 0.0, 1.0, high_open=True)


def prefix_coefs(steps: int, momentum: float = 0.0) -> FloatArray:
    """First column of the Toeplitz prefix-sum workload with momentum β (constant rate).

    ``a_j = Σ_{r=0}^{j} β^r`` (all ones for β = 0).

    >>> prefix_coefs(4, 0.5).tolist()
    [1.0, 1.5, 1.75, 1.875]
    """
    t = check_int("steps", steps, 1)
    beta = _momentum(momentum)
    return np.cumsum(beta ** np.arange(t, dtype=np.float64))


def prefix_workload(
    steps: int, momentum: float = 0.0, learning_rates: ArrayLike | None = None
) -> FloatArray:
    """The dense workload ``A[t, s] = Σ_{r=s}^{t} η_r β^{r-s}`` (lower triangular, T × T).

    ``learning_rates`` (length T, positive; default all ones) is a learning-rate schedule.
    O(T²) time and memory.

    >>> prefix_workload(3).tolist()
    [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    t = check_int("steps", steps, 1)
    beta = _momentum(momentum)
    if learning_rates is None:
        lr = np.ones(t)
    else:
        lr = np.asarray(learning_rates, dtype=np.float64).reshape(-1)
        if lr.size != t or not np.all(np.isfinite(lr)) or np.any(lr <= 0):
            raise fail("learning_rates", learning_rates, f"{t} finite positive numbers")
    gap = np.subtract.outer(np.arange(t), np.arange(t))
    with np.errstate(under="ignore"):
        p = np.where(gap >= 0, beta ** np.maximum(gap, 0).astype(np.float64), 0.0)
    if beta == 0.0:
        p = np.eye(t)
    return np.cumsum(lr[:, None] * p, axis=0)
