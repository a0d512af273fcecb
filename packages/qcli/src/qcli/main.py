"""The ``qcli`` entry point: one subcommand per installed method package."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from . import __version__, commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qcli", description="Quantize Paddle 3 models (PIR and legacy).")
    parser.add_argument("--version", action="version", version=f"qcli {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what each step does")
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
