"""What ``qcli demo`` prints where stderr is not a terminal (a log file, CI): whole lines, advice it can follow."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from qcli.main import build_parser
from qcore.inference import PADDLE_LOGS_ENV

#: Runs qcli as if on an AVX2-only CPU (oneDNN's int8 kernels drift there and the predictor warns).
SCRIPT = """
import os, sys, warnings
os.environ["GLOG_minloglevel"] = "2"  # what qcli's main does before it imports Paddle, which this script does first
warnings.filterwarnings("ignore", module="paddle")
from qcore.deploy import host
host.int8_pairs_saturate = lambda *args: True
from qcli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_demo_prints_whole_lines_and_advice_it_can_follow_when_not_on_a_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != PADDLE_LOGS_ENV}  # set by an earlier in-process --verbose run
    result = subprocess.run([sys.executable, "-c", SCRIPT, "demo", "--calib-samples", "40", "--out",
                             str(tmp_path / "int8")], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "\r" not in err, err  # no progress bar redrawn in place
    progress = [line for line in err.splitlines() if line.startswith("calibrating")]
    assert progress and all(re.fullmatch(r"calibrating: 2 batches in [\d.]+ s", line) for line in progress), err
    warnings = [line for line in err.splitlines() if "VNNI" in line]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("qcli demo: warning: ") and "--backend openvino" in warnings[0], err
    assert "warnings.warn" not in err and "UserWarning" not in err, err
    assert set(err.splitlines()) == set(progress + warnings), err  # nothing else: no source lines
    assert "| int8 (kl) |" in result.stdout


def test_the_demo_has_the_backend_option_the_advice_names(capsys):
    demo = build_parser()._subparsers._group_actions[0].choices["demo"]
    demo.parse_known_args([])  # its module adds its options when the command is used
    backend = next(a for a in demo._actions if "--backend" in a.option_strings)
    assert "openvino" in backend.choices and backend.default is None
