"""Importing the packages and loading models prints none of Paddle's notices about how qcore calls it: the
"No ccache found" import warning and the "old way to load" line Paddle's loader logs on every load. Only those
lines go: another message of the same logger, and Paddle's notice on a load made outside qcore, still print.
Each case runs in a fresh interpreter (the import warning prints once per process) and reads what it printed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from qcore.paddle_env import OLD_WAY_NOTICE
from qdemo import demo_model_dir

NOTICES = ("No ccache found", OLD_WAY_NOTICE)
#: The method packages this session has (qcore's own session has none): each is imported first, as a user would.
METHODS = [name for name in ("qptq", "qqat") if importlib.util.find_spec(name) is not None]


def _printed(code: str) -> str:
    """stdout and stderr of ``python -c code``, which must succeed."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_importing_and_loading_models_of_both_families_prints_no_paddle_notice():
    out = _printed(
        "".join(f"import {name}\n" for name in METHODS) +
        "from qcore.model_io import load_model\n"
        f"for d in ({str(demo_model_dir('legacy'))!r}, {str(demo_model_dir('pir'))!r}):\n"
        "    assert load_model(d).fetch_targets\n"
        "print('loaded')\n"
    )
    assert "loaded" in out and not [n for n in NOTICES if n in out], out


def test_only_that_line_is_dropped_and_only_during_qcore_loads():
    legacy = str(demo_model_dir("legacy"))
    out = _printed(
        "import logging\n"
        "import qcore\n"
        "import paddle\n"
        "from qcore.model_io import load_model\n"
        "from qcore.paddle_env import load_notice_hidden\n"
        "load_model(" + repr(legacy) + ")\n"
        "with load_notice_hidden():\n"
        "    logging.getLogger('paddle.static.io').warning('another line of the loader')\n"
        "paddle.enable_static()\n"
        "with paddle.pir_utils.OldIrGuard():\n"  # the user's own old-way call, outside qcore: Paddle's notice stays
        f"    paddle.static.load_inference_model({legacy!r}, paddle.static.Executor(), "
        "model_filename='inference.pdmodel', params_filename='inference.pdiparams')\n"
    )
    assert "another line of the loader" in out
    assert out.count(OLD_WAY_NOTICE) == 1, out  # the user's call only
    assert "No ccache found" not in out  # qcore imported before paddle
