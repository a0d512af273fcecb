"""``python -m qembed.build_ext [--force] [--verbose]``: build the fused lookup op for this machine."""

from __future__ import annotations

import argparse
import sys

from qcore.errors import QuantError

from . import ext


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qembed.build_ext", description=__doc__.split(": ", 1)[1])
    parser.add_argument("--force", action="store_true", help="rebuild even if this machine's build exists")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's output")
    args = parser.parse_args(argv)
    try:
        path = ext.build(force=args.force, verbose=args.verbose)
    except QuantError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    ext.load()
    print(f"built {ext.OP_TYPE}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
