"""The ``qcli`` entry point: one subcommand per installed method package.

Errors of the toolkit, missing files and unwritable outputs end the command with one line on
stderr and an exit code per kind (:data:`EXIT_CODES`); ``--verbose`` shows the traceback and
Paddle's own logs instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

from . import __version__, commands

#: Exit status per kind of failure (argparse's usage errors exit with 2).
EXIT_CODES = {
    "ConfigError": 3,  # an option or config value is invalid
    "ModelFormatError": 4,  # the input model is missing or unreadable
    "FileNotFoundError": 4,
    "DataError": 5,  # calibration / table data is unusable
    "OutputError": 6,  # the output cannot be written safely
    "PermissionError": 6,
    "QuantError": 7,  # any other error of the toolkit (e.g. a graph rewrite that cannot apply)
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qcli", description="Quantize Paddle 3 models (PIR and legacy).")
    parser.add_argument("--version", action="version", version=f"qcli {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step, Paddle's logs and tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").add_parser(sub)
    return parser


def exit_code(exc: BaseException) -> int | None:
    """The documented exit status for ``exc``, or None for an unexpected error (shown with its traceback)."""
    for kind in type(exc).__mro__:
        if kind.__name__ in EXIT_CODES:
            return EXIT_CODES[kind.__name__]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if "-v" not in raw and "--verbose" not in raw:
        os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ info/warning lines, read at import
    else:
        os.environ["QCORE_PADDLE_LOGS"] = "1"  # qcore.inference.PADDLE_LOGS_ENV: the passes' own output
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return int(args.run(args) or 0)
    except (Exception, KeyboardInterrupt) as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else exit_code(exc)
        if args.verbose or code is None:
            raise
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"qcli {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
