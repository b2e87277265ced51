"""Entry point of the ``renyi`` console script.

Each sub-command lives in its own module of this package exposing
``register(subparsers) -> None``; the module adds its parser and sets ``func`` to a
callable taking the parsed namespace and returning an exit code. Every public module of
``renyi.cli`` (not starting with ``_``) is discovered automatically, so adding a command is
adding a file. Command modules import optional dependencies (torch, matplotlib) inside
their functions, so ``renyi --help`` works with the core install.

What every command gets from here, without code of its own:

* **One-line errors, never a traceback.** A mistake ends in ``renyi: error: ...`` on stderr
  (one JSON object ``{"error": ..., "kind": ...}`` on stderr under ``--json``). Numeric flags
  with a known meaning (``--steps``, ``--epsilon``, ``--delta``, ``--sample-rate``, ...; see
  :data:`FLAG_RANGES`) are range-checked while parsing, naming the flag and its valid range.
  Output paths (``--plot``) and input paths (``--config``, ``--data-dir``) are checked before
  any work starts, and ``--plot`` also checks that matplotlib is installed.
* **Missing extras named.** A command that needs an optional dependency says which
  ``pip install 'renyi[...]'`` provides it.
* **Warnings** print as one ``renyi: warning: ...`` line each.
* **Help for every flag** (flags a command left without help get the shared text below).
* **No network traffic**: Flower's telemetry and Ray's usage statistics are switched off
  before any command can import them.

Exit codes: 0 success; 1 a refusal or failure at run time (budget exceeded, damaged or
unwritable ledger, unexpected internal error); 2 a usage error (bad flag or value, unusable
path, missing optional dependency); 130 interrupted.
"""

from __future__ import annotations

import os

# Before any command can import flwr or ray (they read these at import time).
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import argparse
import importlib
import importlib.util
import json
import math
import pkgutil
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from renyi.errors import BudgetExceededError, RenyiError

EXIT_REFUSED = 1
EXIT_USAGE = 2

# dest -> (int or float, low, high, low_open, high_open). Checked while parsing, for every
# command that has a flag of that name (the library re-checks with its own messages).
FLAG_RANGES: dict[str, tuple[type, float, float, bool, bool]] = {
    **{
        name: (int, 1, math.inf, False, True)
        for name in (
            "steps",
            "count",
            "iterations",
            "runs",
            "repetitions",
            "canaries",
            "batch_size",
            "max_batch_size",
            "dataset_size",
            "population",
            "clients_per_round",
            "rounds",
            "parties",
            "peers",
            "steps_per_party",
            "dimension",
            "threads",
            "queries",
        )
    },
    **{name: (int, 0, math.inf, False, True) for name in ("trials", "seed")},
    **{
        name: (float, 0, math.inf, True, True)
        for name in (
            "epsilon",
            "target_epsilon",
            "claimed_epsilon",
            "pure_epsilon",
            "rho",
            "noise_multiplier",
            "sigma",
            "scale",
            "laplace_scale",
            "sensitivity",
            "lipschitz",
            "epochs",
            "lr",
            "max_grad_norm",
            "timeout",
            "count_stddev",
            "epsilons",
        )
    },
    "delta": (float, 0, 1, False, True),
    "sample_rate": (float, 0, 1, True, False),
    "honest": (float, 0, 1, True, False),
    "confidence": (float, 0, 1, True, True),
    "p": (float, 0.5, 1, False, False),
    "order": (float, 1, math.inf, True, True),
    "alpha": (float, 1, math.inf, True, True),
}

# Help for flags a command registered without any (shared meanings only).
DEFAULT_HELP: dict[str, str] = {
    "json": "print one JSON object on stdout (errors as one JSON object on stderr)",
    "epsilon": "target epsilon (> 0)",
    "delta": "target delta, in (0, 1)",
    "rho": "zCDP rho (> 0)",
    "steps": "number of steps (>= 1)",
    "rounds": "number of rounds (>= 1)",
    "parties": "number of parties (>= 1)",
    "label": "a label recorded with the entry",
    "seed": "seed for a reproducible (insecure) run",
    "sampling": "how batches or clients are sampled",
    "sample_rate": "Poisson sampling rate q, in (0, 1]",
    "noise_multiplier": "noise multiplier sigma / sensitivity (> 0)",
    "target_epsilon": "the epsilon to reach (> 0)",
    "epsilons": "target epsilons (each > 0)",
    "plot": "write the figure to this path (png, pdf, svg, ...)",
    "accountant": "which accountant to use",
    "orders": "Rényi orders of the accountant's grid",
    "convention": "how the privacy loss is counted",
    "name": "which one (one of the choices shown)",
    "bug": "plant this known bug, to check that the audit catches it",
    "method": "which audit method",
    "trainer": "which trainer runs the audited training",
    "steps_per_party": "steps per party (>= 1)",
    "dataset": "which dataset",
}

# top-level module -> the extra that installs it
EXTRAS: dict[str, str] = {
    "torch": "torch",
    "sklearn": "torch",
    "tqdm": "cli",
    "matplotlib": "plot",
    "flwr": "flower",
    "ray": "flower",
    "cryptography": "federated",
    "psycopg": "postgres",
}
_PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp")
_OUTPUT_DESTS = ("plot", "output", "out", "save", "checkpoint")
_INPUT_FILES = ("config",)
_INPUT_DIRS = ("data_dir",)


class UsageError(RenyiError):
    """A command-line mistake (exit code 2)."""


def _range_text(kind: type, lo: float, hi: float, lo_open: bool, hi_open: bool) -> str:
    what = "an integer" if kind is int else "a number"
    if math.isinf(hi):
        return f"{what} {'>' if lo_open else '>='} {lo:g}"
    return f"{what} in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def _checked_type(
    original: Callable[[str], Any], dest: str, spec: tuple[Any, ...]
) -> Callable[[str], Any]:
    kind, lo, hi, lo_open, hi_open = spec
    expected = _range_text(kind, lo, hi, lo_open, hi_open)

    def convert(text: str) -> Any:
        try:
            value = original(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"{dest}={text!r} is invalid: expected {expected}"
            ) from None
        x = float(value)
        ok = not math.isnan(x) and (x > lo if lo_open else x >= lo)
        ok = ok and (x < hi if hi_open else x <= hi)
        if not ok:
            raise argparse.ArgumentTypeError(f"{dest}={value!r} is invalid: expected {expected}")
        return value

    convert.__name__ = getattr(original, "__name__", "value")
    return convert


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised, so main() prints them its way)."""

    def error(self, message: str) -> NoReturn:
        where = "" if self.prog == "renyi" else f"{self.prog}: "
        raise UsageError(f"{where}{message} (see `{self.prog} --help`)")


def command_modules() -> list[str]:
    """Dotted names of the sub-command modules, sorted."""
    import renyi.cli as package

    return sorted(
        f"renyi.cli.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if not m.name.startswith("_") and m.name != "main"
    )


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out.extend(_parsers(child))
    return out


def _harden(parser: argparse.ArgumentParser) -> None:
    """Range checks and default help for every flag of every (sub)command."""
    for p in _parsers(parser):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            spec = FLAG_RANGES.get(action.dest)
            if spec is not None and action.type in (int, float) and not action.choices:
                action.type = _checked_type(action.type, action.dest, spec)
            if not action.help:
                action.help = DEFAULT_HELP.get(action.dest) or action.dest.replace("_", " ")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="renyi",
        description="Differential privacy with Rényi DP accounting.",
        epilog="Exit codes: 0 success, 1 refused or failed at run time, 2 usage error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in command_modules():
        importlib.import_module(name).register(sub)
    _harden(parser)
    return parser


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_paths(args: argparse.Namespace) -> None:
    """Refuse unusable output and input paths before any work starts."""
    for dest in _OUTPUT_DESTS:
        value = getattr(args, dest, None)
        if not isinstance(value, str):
            continue
        path = Path(value)
        if path.is_dir():
            raise UsageError(f"{_flag(dest)} {value!r} is a directory: expected a file path")
        parent = path.parent if str(path.parent) else Path(".")
        if not parent.is_dir():
            raise UsageError(f"{_flag(dest)} {value!r}: directory {str(parent)!r} does not exist")
        if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"{_flag(dest)} {value!r} is not writable")
        if dest == "plot":
            suffix = path.suffix.lower().lstrip(".")
            if suffix not in _PLOT_FORMATS:
                raise UsageError(
                    f"--plot {value!r}: unsupported figure format {path.suffix or '(none)'!r}: "
                    f"expected a file ending in one of .{', .'.join(_PLOT_FORMATS)}"
                )
            if importlib.util.find_spec("matplotlib") is None:
                raise _missing("matplotlib", args)
    for dest in _INPUT_FILES:
        value = getattr(args, dest, None)
        if isinstance(value, str) and not Path(value).is_file():
            raise UsageError(f"{_flag(dest)} {value!r}: no such file")
    for dest in _INPUT_DIRS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and not Path(value).is_dir():
            raise UsageError(f"{_flag(dest)} {value!r}: no such directory")


def _command_name(args: argparse.Namespace | None) -> str:
    parts = ["renyi"]
    for dest in ("command", "ledger_command", "audit_command", "federated_command"):
        value = getattr(args, dest, None) if args is not None else None
        if isinstance(value, str):
            parts.append(value)
    return " ".join(parts)


def _missing(module: str, args: argparse.Namespace | None) -> UsageError:
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    how = f"pip install 'renyi[{extra}]'" if extra else f"pip install {top}"
    return UsageError(f"`{_command_name(args)}` needs {top}, which is not installed: {how}")


def _report(message: str, kind: str, as_json: bool) -> None:
    if as_json:
        sys.stderr.write(json.dumps({"error": message, "kind": kind}) + "\n")
    else:
        sys.stderr.write(f"renyi: error: {message}\n")


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    sys.stderr.write(f"renyi: warning: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    args: argparse.Namespace | None = None
    debug = os.environ.get("RENYI_DEBUG", "") not in ("", "0")
    previous = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        args = build_parser().parse_args(argv)
        as_json = bool(getattr(args, "json", as_json))
        check_paths(args)
        code: int = args.func(args)
        return code
    except BudgetExceededError as exc:
        _report(str(exc), "refused", as_json)
        return EXIT_REFUSED
    except UsageError as exc:
        _report(str(exc), "usage", as_json)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if debug:
            raise
        if not name or name.split(".")[0] == "renyi":  # a broken install, not a missing extra
            _report(f"renyi is not installed correctly: {exc}", "internal", as_json)
            return EXIT_REFUSED
        _report(str(_missing(name, args)), "missing-dependency", as_json)
        return EXIT_USAGE
    except ImportError as exc:  # a module's own "needs X: pip install ..." message
        if debug or "pip install" not in str(exc):
            raise
        _report(f"`{_command_name(args)}`: {exc}", "missing-dependency", as_json)
        return EXIT_USAGE
    except RenyiError as exc:
        from renyi.ledger import LedgerError, LedgerNotFoundError

        if isinstance(exc, LedgerError) and not isinstance(exc, LedgerNotFoundError):
            _report(str(exc), "ledger", as_json)
            return EXIT_REFUSED
        _report(str(exc), "usage", as_json)
        return EXIT_USAGE
    except OSError as exc:
        where = f" {str(exc.filename)!r}" if exc.filename else ""
        _report(f"{exc.strerror or exc}{':' if where else ''}{where}", "os", as_json)
        return EXIT_USAGE
    except SystemExit as exc:  # a command's own `raise SystemExit("renyi: error: ...")`
        if not isinstance(exc.code, str):
            raise  # --help, or an explicit exit status
        message = exc.code.removeprefix("renyi: error: ")
        _report(message, "usage", as_json)
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("renyi: interrupted\n")
        return 130
    except Exception as exc:
        if debug:
            raise
        _report(
            f"internal error in `{_command_name(args)}`: {type(exc).__name__}: {exc} "
            "(please report it; RENYI_DEBUG=1 shows the traceback)",
            "internal",
            as_json,
        )
        return EXIT_REFUSED
    finally:
        warnings.showwarning = previous


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
