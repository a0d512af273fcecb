"""What weight-only quantization does (:class:`WeightOnlyConfig`) and the group each linear gets."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from qcore.config import validate_choice
from qcore.errors import ConfigError
from qcore.groupwise import GGUF_GROUPS, GRID_FAMILIES, K_GRIDS, check_bits, family_bits, grid_of, group_count

ALGOS = ("rtn", "gptq")
#: What a linear whose width ``group_size`` does not divide gets (NNCF's names): a one-line error, the largest
#: power-of-two group from ``group_size`` down to 32 that divides it (else int8 per channel), or float.
GROUP_FALLBACKS = ("error", "adjust", "ignore")
SMALLEST_ADJUSTED_GROUP = 32
#: llama.cpp's block type for a tensor whose rows 256 does not divide, by the K-quant's bits: ``(bits, symmetric)``
#: of a block of 32 (``Q4_K`` -> ``Q5_0``, ``Q5_K`` -> ``Q5_1``, ``Q6_K`` -> ``Q8_0``).
K_FALLBACKS = {4: (5, True), 5: (5, False), 6: (8, True)}


@dataclass(frozen=True)
class WeightOnlyConfig:
    r"""What weight-only quantization (:func:`qptq.weight_only.layer.quantize_`) does.

    ``bits`` 4 or 8; ``group_size`` input channels per step (-1: per output channel); asymmetric (zero
    points) unless ``symmetric``; ``algo`` ``"rtn"`` (round to nearest) or ``"gptq"``; ``awq``
    activation-aware scales first; ``clip_search`` each group's range by layer output error (with ``"gptq"``:
    of the grids it fixes before its updates); ``ratio`` the share of the weights (by count) at ``bits`` when
    4, the rest int8: the linears whose 4-bit output error per weight is largest (mixed precision);
    ``group_size_fallback`` what a linear whose width ``group_size`` does not divide gets
    (:data:`GROUP_FALLBACKS`); linears whose full name matches one of the ``skip`` regular expressions stay
    float. ``grid``: the grid family (:data:`qcore.groupwise.GRID_FAMILIES`): ``"int"`` for ONNX's
    ``MatMulNBits`` and OpenVINO, ``"gguf"`` for llama.cpp's block types (``bits`` 4, 5 or 8 with
    ``group_size=32``: ``Q4_0`` / ``Q5_0`` / ``Q8_0`` symmetric, ``Q4_1`` / ``Q5_1`` otherwise; ``bits`` 4, 5 or 6
    with ``group_size=256``: the K-quants ``Q4_K`` / ``Q5_K`` / ``Q6_K``, 8 bits staying ``Q8_0``, and under
    ``group_size_fallback="adjust"`` llama.cpp's type for rows 256 does not divide, :data:`K_FALLBACKS`; no AWQ,
    whose input scales a GGUF file cannot hold). ``sequential``: a decoder's layers (its longest ``LayerList``) are
    calibrated one after another, each on the outputs of the layers already quantized (GPTQ's order), instead
    of every Hessian from one float pass; mixed precision then applies within each layer. ``bits_by_name``: the
    user's own per-tensor rule, regular expression -> bits (the first whose pattern a linear's full name matches
    decides; e.g. ``{r"attn\.v_proj|mlp\.down_proj": 8}``, in the spirit of llama.cpp's ``Q4_K_M`` mix); those
    linears are outside ``ratio``'s choice.
    """

    bits: int = 4
    group_size: int = 128
    symmetric: bool = False
    algo: str = "rtn"
    awq: bool = False
    clip_search: bool = False
    ratio: float = 1.0
    group_size_fallback: str = "error"
    skip: Sequence[str] = ()
    embedding_bits: int | None = None
    grid: str = "int"
    sequential: bool = False
    bits_by_name: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_choice("grid", self.grid, GRID_FAMILIES)
        check_bits(self.bits, self.grid)
        allowed = family_bits(self.grid)
        if self.embedding_bits is not None and self.embedding_bits not in allowed:
            raise ConfigError(f"embedding_bits={self.embedding_bits!r} is not supported; use one of {allowed}, "
                              "or None to keep embedding tables float")
        if self.grid == "gguf":
            if self.group_size not in GGUF_GROUPS:
                raise ConfigError(f"GGUF blocks hold 32 input channels, or 256 for the K-quants; use group_size=32 or "
                                  f"256 (got {self.group_size})")
            if self.awq:
                raise ConfigError("awq=True divides each linear's input by scales a GGUF file cannot hold; "
                                  "use clip_search=True (and algo='gptq') for grid='gguf'")
        validate_choice("algo", self.algo, ALGOS)
        validate_choice("group_size_fallback", self.group_size_fallback, GROUP_FALLBACKS)
        if not 0.0 < self.ratio <= 1.0:
            raise ConfigError(f"ratio={self.ratio!r} is not valid; use the share of weights at {self.bits} bits, "
                              "in (0, 1]")
        for kind, pattern in [("skip", p) for p in self.skip] + [("bits_by_name", p) for p in self.bits_by_name]:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{kind} pattern {pattern!r} is not a regular expression: {exc}") from None
        for pattern, bits in self.bits_by_name.items():
            if bits not in allowed:
                raise ConfigError(f"bits_by_name[{pattern!r}]={bits!r} is not supported; use one of {allowed}")
        if self.grid == "gguf":  # each width has a block type at this group size (8 bits: Q8_0 at any)
            for bits in {self.bits, self.embedding_bits, *self.bits_by_name.values()} - {None, 8}:
                grid_of(bits, self.symmetric, self.grid, self.group_size)

    def bits_for(self, name: str) -> int | None:
        """The bits ``bits_by_name`` gives the linear ``name`` (None: no pattern matches it)."""
        return next((bits for pattern, bits in self.bits_by_name.items() if re.search(pattern, name)), None)

    @property
    def calibrated(self) -> bool:
        return self.algo == "gptq" or self.awq or self.clip_search



class LayerGroup(NamedTuple):
    """The codes a linear gets: their bits, group size and symmetry (:func:`qcore.groupwise.grid_of`'s arguments)."""

    bits: int
    group_size: int
    symmetric: bool


def layer_group(k: int, config: WeightOnlyConfig, bits: int | None = None) -> LayerGroup | None:
    """The group of a linear of ``k`` input channels (``bits``: default ``config.bits``), None to leave it float
    (fallback ``"ignore"``, or ``"adjust"`` on GGUF blocks of 32); one :class:`ConfigError` line for a group size
    that does not divide ``k`` under ``"error"``. GGUF: 8 bits is ``Q8_0`` (blocks of 32) under the K-quants' 256
    too, and ``"adjust"`` gives a K-quant's rows that 256 does not divide llama.cpp's type (:data:`K_FALLBACKS`)."""
    size = config.group_size
    bits = config.bits if bits is None else bits
    gguf = config.grid == "gguf"
    if gguf and size == 256 and bits not in K_GRIDS:
        size = 32
    if size == -1 or k % size == 0 or config.group_size_fallback == "error":
        if gguf and size == 256 and k % size:
            raise ConfigError(f"K-quant blocks of 256 do not divide the {k} input channels; use "
                              "group_size_fallback='adjust' for llama.cpp's type there (Q4_K -> Q5_0, Q5_K -> Q5_1, "
                              "Q6_K -> Q8_0) or 'ignore' to leave it float")
        group_count(k, size)
        return LayerGroup(bits, size, config.symmetric)
    if config.group_size_fallback == "ignore":
        return None
    if gguf:  # GGUF blocks are 32 wide, no smaller
        fallback = K_FALLBACKS.get(bits) if size == 256 and k % 32 == 0 else None
        return None if fallback is None else LayerGroup(fallback[0], 32, fallback[1])
    while size >= SMALLEST_ADJUSTED_GROUP:
        if k % size == 0:
            return LayerGroup(bits, size, config.symmetric)
        size //= 2
    return LayerGroup(8, -1, config.symmetric)
