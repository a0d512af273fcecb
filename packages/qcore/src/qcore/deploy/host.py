"""The one fact about the host CPU the CPU targets depend on: whether its int8 dot products saturate.

x86 CPUs without VNNI (AVX2 only: AMD Zen 1-3, Intel before Cascade Lake) multiply u8
activations by s8 weights with ``vpmaddubsw``, which adds each pair of products in int16: two
products of 255 x 127 overflow it and the sum saturates. Measured on an AMD EPYC with AVX2
only, Paddle 3.3.1: an int8 fc on OpenVINO came out 46 % off its simulation, a conv 7 %.
Keeping weight codes within +-64 (2 x 255 x 64 = 32640 fits in int16) removes the overflow at
the cost of one bit of weight precision, and OpenVINO then runs every op kind exactly as
simulated: both CPU targets do so on such CPUs. oneDNN's int8 kernels there stay 1-36 % off
the simulation with or without it (:data:`~qcore.deploy.onednn.NO_VNNI_PROBLEM`), so the fix
is what keeps the default (oneDNN-rules) output exact on OpenVINO. CPUs with VNNI (``avx512_vnni``,
``avx_vnni``, AMX) add in int32 and need no fix; ARM's ``sdot`` neither.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from ..errors import ConfigError

#: The largest weight code whose u8 x s8 pair sums fit in int16 (2 * 255 * 64 = 32640 <= 32767).
SATURATION_FREE_CODE = 64
#: ``/proc/cpuinfo`` flags of x86 CPUs whose int8 dot products add in int32.
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
#: Set to 1 or 0 to force the overflow fix on or off (e.g. when quantizing for other machines).
OVERFLOW_FIX_ENV = "QCORE_OVERFLOW_FIX"


@functools.cache
def int8_pairs_saturate(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when this machine is x86 without VNNI (u8 x s8 pairs add in int16); False when it has
    VNNI, is not x86, or its CPU flags cannot be read (from ``cpuinfo``)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    if not cpuinfo.is_file():
        return False
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return not VNNI_FLAGS & set(line.split(":", 1)[-1].split())
    return False


def overflow_fix_default() -> bool:
    """Whether CPU targets keep weight codes within :data:`SATURATION_FREE_CODE` when not told:
    ``$QCORE_OVERFLOW_FIX`` (1 or 0) if set, else :func:`int8_pairs_saturate` for this machine."""
    forced = os.environ.get(OVERFLOW_FIX_ENV, "").strip()
    if not forced:
        return int8_pairs_saturate()
    if forced not in ("0", "1"):
        raise ConfigError(
            f"${OVERFLOW_FIX_ENV}={forced!r}: set it to 1 (fix on), 0 (off) or leave it unset (this CPU decides)"
        )
    return forced == "1"
