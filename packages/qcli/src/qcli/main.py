"""The ``qcli`` entry point: one subcommand per installed method package.

Errors of the toolkit, missing files and unwritable outputs end the command with one line on
stderr and an exit code per kind (:data:`EXIT_CODES`); Ctrl-C ends it with one line and
:data:`INTERRUPTED`; a warning is one line too. ``--verbose`` shows the traceback (and where each
warning was raised) and Paddle's own logs and warnings instead.

A command's module (and with it Paddle) is imported only when that command is used, so
``qcli --help`` answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, TextIO

from . import __version__, commands

#: Exit status per kind of failure (argparse's usage errors exit with 2).
EXIT_CODES = {
    "ConfigError": 3,  # an option, argument or config value is invalid
    "ModelFormatError": 4,  # the input model is missing or unreadable
    "FileNotFoundError": 4,
    "DataError": 5,  # calibration / table data is unusable
    "OutputError": 6,  # the output cannot be written safely
    "PermissionError": 6,
    "QuantError": 7,  # any other error of the toolkit (e.g. a graph rewrite that cannot apply)
    "MissingPackageError": 9,  # the subcommand's package is not installed (qcli.plugins)
}
#: Exit status after Ctrl-C (what a shell reports for a process SIGINT ended), with :data:`INTERRUPTED_LINE`.
INTERRUPTED = 130
INTERRUPTED_LINE = "qcli: interrupted"


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose options its module adds when the command is used (the modules import Paddle)."""

    def __init__(self, *args: Any, module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module = module

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        if self._module is not None:
            importlib.import_module(self._module).add_arguments(self)
            self._module = None
        return super().parse_known_args(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qcli", description="Quantize Paddle 3 models (PIR and legacy).")
    parser.add_argument("--version", action="version", version=f"qcli {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log each step, show Paddle's logs and warnings, and tracebacks"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for name, text in commands.COMMANDS.items():
        sub.add_parser(name, help=text, module=f"{commands.__name__}.{name}")
    return parser


def exit_code(exc: BaseException) -> int | None:
    """The documented exit status for ``exc``, or None for an unexpected error (shown with its traceback)."""
    for kind in type(exc).__mro__:
        if kind.__name__ in EXIT_CODES:
            return EXIT_CODES[kind.__name__]
    return None


def _warning_line(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` printing one line, ``qcli COMMAND: warning: ...`` (no source file or line)."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
        print(f"qcli {command}: warning: {text}", file=file or sys.stderr)

    return show


def _exit_interrupted(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write(INTERRUPTED_LINE + "\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED)


@contextlib.contextmanager
def _interrupt_ends_at_once() -> Iterator[None]:
    """While qcli starts, Ctrl-C ends the process at once with one line: nothing is written yet, and a
    KeyboardInterrupt inside Paddle's import would come out as another error after lines Paddle prints itself.
    A SIGINT someone else handles or ignores (a background job) is left alone."""
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler and (
        threading.current_thread() is threading.main_thread()
    )
    if ours:
        signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        yield
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _configure_logging(before: Sequence[logging.Handler], verbose: bool) -> None:
    """qcli's log lines at WARNING (INFO with ``--verbose``). Importing Paddle gives the root logger a handler of
    its own and the INFO level, and Paddle's modules log through handlers of their own (e.g. "The old way to load
    inference model is deprecated" on every model load): the first is undone, the second silenced unless
    ``verbose``. ``before``: the root logger's handlers before the import."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h not in before]:
        root.removeHandler(handler)
    logging.basicConfig(format="%(levelname)s %(message)s")
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        for logger in list(logging.root.manager.loggerDict.values()):
            if isinstance(logger, logging.Logger) and logger.handlers and not logger.propagate:
                logger.setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in raw or "--verbose" in raw
    if verbose:
        os.environ["QCORE_PADDLE_LOGS"] = "1"  # qcore.inference.PADDLE_LOGS_ENV: the passes' own output
    else:
        os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ info/warning lines, read at import
    with warnings.catch_warnings():
        if not verbose:  # e.g. "No ccache found", which importing Paddle warns
            warnings.filterwarnings("ignore", module=r"paddle(\.|$)")
        handlers = list(logging.getLogger().handlers)
        with _interrupt_ends_at_once():
            args = build_parser().parse_args(raw)  # imports the command's module, and Paddle with it
        _configure_logging(handlers, args.verbose)
        if not args.verbose:  # --verbose keeps Python's form: where it was raised, and the source line
            warnings.showwarning = _warning_line(args.command)
        try:
            return int(args.run(args) or 0)
        except KeyboardInterrupt:
            if args.verbose:
                raise
            print(INTERRUPTED_LINE, file=sys.stderr)
            return INTERRUPTED
        except Exception as exc:
            code = exit_code(exc)
            if args.verbose or code is None:
                raise
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"qcli {args.command}: error: {message}", file=sys.stderr)
            return code


if __name__ == "__main__":
    sys.exit(main())
