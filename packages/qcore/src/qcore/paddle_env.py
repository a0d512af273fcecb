"""Entering Paddle's static-graph modes for one of the two IR families.

Paddle 3 has two static IRs: PIR (the default) and the legacy ProgramDesc, which is still
built and edited under ``paddle.pir_utils.OldIrGuard``. Every piece of qcore that touches a
program goes through :func:`static_mode` so the caller's global mode is restored afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
from collections.abc import Iterator
from typing import Literal

import paddle

Family = Literal["pir", "legacy"]
_LIBC = ctypes.CDLL(None)
FAMILIES: tuple[Family, ...] = ("pir", "legacy")


@contextlib.contextmanager
def static_mode(family: Family, scope: paddle.static.Scope | None = None) -> Iterator[None]:
    """Run the body in static mode of ``family`` (and inside ``scope`` when given)."""
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        with contextlib.ExitStack() as stack:
            if family == "legacy":
                stack.enter_context(paddle.pir_utils.OldIrGuard())
            else:
                stack.enter_context(paddle.pir_utils.IrGuard())
            if scope is not None:
                stack.enter_context(paddle.static.scope_guard(scope))
            yield
    finally:
        if was_dynamic:
            paddle.disable_static()


@contextlib.contextmanager
def eager_mode() -> Iterator[None]:
    """Run the body in eager (dygraph) mode whatever the caller's global mode: PaddleSlim-era scripts call
    the quantizers after ``paddle.enable_static()``, and the layer-wise methods replay layers eagerly."""
    was_static = not paddle.in_dynamic_mode()
    if was_static:
        paddle.disable_static()
    try:
        yield
    finally:
        if was_static:
            paddle.enable_static()


@contextlib.contextmanager
def cpu_threads() -> Iterator[None]:
    """Paddle's eager CPU kernels on every core this process may use for the body (Paddle's default is
    ``FLAGS_paddle_num_threads``, 1; restored after): the layer-wise methods replay convolutions eagerly."""
    paddle.base.core.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        yield
    finally:
        paddle.base.core.set_num_threads(int(paddle.get_flags(["FLAGS_paddle_num_threads"])["FLAGS_paddle_num_threads"]))


@contextlib.contextmanager
def layer_mode(layer: paddle.nn.Layer, training: bool) -> Iterator[None]:
    """``layer`` in train or eval mode for the body; every sublayer's own mode restored after."""
    modes = [(sub, sub.training) for sub in layer.sublayers(include_self=True)]
    if training:
        layer.train()
    else:
        layer.eval()
    try:
        yield
    finally:
        for sub, mode in modes:
            sub.training = mode


def cpu_executor() -> paddle.static.Executor:
    """An executor on the CPU, the place every test and benchmark here runs on."""
    return paddle.static.Executor(paddle.CPUPlace())


@contextlib.contextmanager
def onednn_kernels() -> Iterator[None]:
    """Let ``paddle.static.Executor`` run oneDNN's float kernels in the body (``FLAGS_use_mkldnn``).

    About 3x faster than Paddle's reference CPU kernels on a conv net (PP-OCRv4 rec, batch 10:
    0.31 s against 1.0 s per batch); the flag is restored afterwards. A no-op on builds without oneDNN.
    """
    if not paddle.base.core.is_compiled_with_mkldnn():
        yield
        return
    before = paddle.get_flags(["FLAGS_use_mkldnn"])["FLAGS_use_mkldnn"]
    paddle.set_flags({"FLAGS_use_mkldnn": True})
    try:
        yield
    finally:
        paddle.set_flags({"FLAGS_use_mkldnn": before})



#: What Paddle's loaders log on every load given a directory and file names, the one call that takes every file
#: layout (``__model__`` + one file per parameter, custom names); it is about that call, not the model.
OLD_WAY_NOTICE = "The old way to load inference model is deprecated"
#: The loggers ``paddle.static.load_inference_model`` logs it through (legacy and PIR).
LOAD_LOGGERS = ("paddle.static.io", "paddle.static.pir_io")


class _DropOldWayNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(OLD_WAY_NOTICE)


@contextlib.contextmanager
def load_notice_hidden() -> Iterator[None]:
    """Drop :data:`OLD_WAY_NOTICE` from Paddle's loaders for the body (qcore's own loads), and only that line:
    everything else those loggers say, and every error, still comes out; calls outside the body are untouched."""
    drop = _DropOldWayNotice()
    loggers = [logging.getLogger(name) for name in LOAD_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)


@contextlib.contextmanager
def native_output_quiet(quiet: bool = True) -> Iterator[None]:
    """Send what Paddle's C++ code prints to stdout / stderr (e.g. the oneDNN passes' ``--- fused ...``
    lines) to /dev/null for the body; ``quiet=False`` leaves the streams alone."""
    if not quiet:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        _LIBC.fflush(None)  # C/C++ buffers still holding the body's output go to /dev/null too
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
