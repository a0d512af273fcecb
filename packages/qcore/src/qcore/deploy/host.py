"""What the host CPU can do, as the CPU targets and the reports need it: its class and its int8 / bf16 facts.

Machines here and users' servers are of two x86 classes that quantized models behave differently on
(``docs/cpu-classes.md``):

* **AVX-512 VNNI (+ BF16)**, e.g. AMD EPYC Zen 4: u8 x s8 dot products add in int32; OpenVINO's CPU
  plugin runs bf16 by default (``avx512_bf16`` / AMX) and quantizes the float inputs of compressed-weight
  matmuls to int8 at run time (it needs ``avx2_vnni`` or ``avx512_core_vnni`` for that).
* **AVX2 only**, e.g. AMD EPYC Zen 1-3, Intel before Cascade Lake: u8 x s8 products are added in pairs
  in int16 (``vpmaddubsw``), and two products of 255 x 127 overflow it, so the sum saturates. Measured on
  an AMD EPYC with AVX2 only, Paddle 3.3.1: an int8 fc on OpenVINO came out 46 % off its simulation, a
  conv 7 %. Keeping weight codes within +-64 (2 x 255 x 64 = 32640 fits in int16) removes the overflow
  at the cost of one bit of weight precision, and OpenVINO then runs every op kind exactly as simulated:
  both CPU targets do so on such CPUs. oneDNN's int8 kernels there stay 1-36 % off the simulation with or
  without it (:data:`~qcore.deploy.onednn.NO_VNNI_PROBLEM`). OpenVINO's default float is f32 there and it
  does not quantize inputs at run time.

ARM's ``sdot`` adds in int32 as well. Every answer comes from one reading of ``/proc/cpuinfo``
(:func:`cpu_flags`); tests replace that reading to take the other class's decisions.
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
#: ``/proc/cpuinfo`` flags of x86 CPUs with bf16 arithmetic (OpenVINO's default float precision there).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
#: The flags a benchmark table names, in this order, where the CPU has them.
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
                  "amx_bf16")
#: Set to 1 or 0 to force the overflow fix on or off (e.g. when quantizing for other machines).
OVERFLOW_FIX_ENV = "QCORE_OVERFLOW_FIX"
CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str] | None:
    """The x86 flags of this machine's CPU (from ``cpuinfo``), None when it is not x86 or they cannot be read."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686") or not cpuinfo.is_file():
        return None
    for line in cpuinfo.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[-1].split())
    return None


def int8_pairs_saturate(cpuinfo: Path = CPUINFO) -> bool:
    """True when this machine is x86 without VNNI (u8 x s8 pairs add in int16); False when it has
    VNNI, is not x86, or its CPU flags cannot be read (from ``cpuinfo``)."""
    flags = cpu_flags(cpuinfo)
    return flags is not None and not VNNI_FLAGS & flags


def has_vnni(cpuinfo: Path = CPUINFO) -> bool:
    """True on an x86 CPU whose int8 dot products add in int32 (what OpenVINO's run-time int8 inputs need)."""
    return bool(VNNI_FLAGS & (cpu_flags(cpuinfo) or frozenset()))


def has_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """True on an x86 CPU with bf16 arithmetic: OpenVINO's CPU plugin then runs float models in bf16."""
    return bool(BF16_FLAGS & (cpu_flags(cpuinfo) or frozenset()))


def cpu_class(cpuinfo: Path = CPUINFO) -> str:
    """The class a claim holds on: ``"AVX-512 VNNI/BF16"``, ``"AVX-512 VNNI"``, ``"AVX2 VNNI"``,
    ``"AVX-512 (no VNNI)"``, ``"AVX2 only"``, ``"x86 without AVX2"``, or the machine's architecture."""
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return platform.machine() or "unknown"
    if "avx512f" in flags:
        if "avx512_vnni" not in flags:
            return "AVX-512 (no VNNI)"
        return "AVX-512 VNNI/BF16" if BF16_FLAGS & flags else "AVX-512 VNNI"
    if "avx2" in flags:
        return "AVX2 VNNI" if "avx_vnni" in flags else "AVX2 only"
    return "x86 without AVX2"


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name from ``cpuinfo`` (``platform.processor()`` where there is none)."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe_cpu(cpuinfo: Path = CPUINFO) -> str:
    """One line for a benchmark table or a report: model, class, core count and the int8 / bf16 flags it has,
    e.g. ``AMD EPYC, AVX-512 VNNI/BF16, 2 cores (avx2 fma avx512f avx512bw avx512_vnni avx512_bf16)``."""
    flags = cpu_flags(cpuinfo) or frozenset()
    shown = " ".join(f for f in REPORTED_FLAGS if f in flags) or "no x86 flags read"
    return f"{cpu_model(cpuinfo)}, {cpu_class(cpuinfo)}, {os.cpu_count()} cores ({shown})"


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
