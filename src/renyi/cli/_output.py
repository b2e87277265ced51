"""Shared output helpers for the command line: plain-text tables, JSON, progress bars."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.4e}"
        return f"{value:.6g}"
    return str(value)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str = "") -> str:
    """Render a readable fixed-width table (numbers right-aligned)."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return value


def print_json(obj: dict[str, Any]) -> None:
    """Print exactly one JSON object (infinities as strings, numpy values as Python ones).

    An object that reports an ``epsilon`` also gets ``implementation_slack``: the ε and δ that
    renyi's noise implementation adds (:func:`renyi.noise.accounting_slack`, already included
    in every accountant's figures)."""
    if "epsilon" in obj and "implementation_slack" not in obj:
        from renyi.noise import MAX_ACCOUNTED_VALUES, accounting_slack

        try:
            eps = float(obj["epsilon"])
        except (TypeError, ValueError):
            eps = 1.0
        e, d = accounting_slack(eps if math.isfinite(eps) and eps >= 0 else 1.0)
        obj = {
            **obj,
            "implementation_slack": {
                "epsilon": e,
                "delta": d,
                "released_values_covered": MAX_ACCOUNTED_VALUES,
            },
        }
    sys.stdout.write(json.dumps(_jsonable(obj), indent=2) + "\n")


def progress(
    iterable: Iterable[T], total: int | None = None, desc: str = "", *, enabled: bool = True
) -> Iterator[T]:
    """Wrap ``iterable`` in a progress bar on stderr (tqdm when installed, else plain)."""
    if not enabled:
        yield from iterable
        return
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the cli extra
        yield from iterable
        return
    yield from tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False)
