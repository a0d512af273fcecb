"""Codes for a set of matmul weights, whatever holds them (a ``paddle.nn.Layer``, a saved program): each weight's
algorithms in NNCF's order (AWQ-style scales shared by the weights reading one input, then clip search or
GPTQ), mixed precision across them, and the report; embedding tables by round to nearest
(:func:`quantize_tables`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from qcore.distributed import all_gather, world
from qcore.groupwise import GroupCodes, join_outputs, quantize_groups

from .awq import search_scales
from .clip_search import search_clip
from .config import WeightOnlyConfig, layer_group
from .gptq import gptq
from .hessian import output_errors


@dataclass
class LayerReport:
    name: str
    weight: str
    shape: tuple[int, int]
    bits: int
    group_size: int
    output_error: float | None  # relative layer output error on the calibration inputs (None without them)
    awq_alpha: float | None = None
    grid: str = ""  # the codes' grid: int4 / uint4 / int8 / uint8, or a GGUF block type (Q4_0, ...)


@dataclass
class WeightOnlyResult:
    """What weight-only quantization did: codes (and AWQ input scales) by weight name, a row per linear."""

    codes: dict[str, GroupCodes] = field(default_factory=dict)
    input_scales: dict[str, np.ndarray] = field(default_factory=dict)  # weight name -> divide the input by it
    layers: list[LayerReport] = field(default_factory=list)
    seconds: float = 0.0
    calibration_seconds: float = 0.0  # running the model (or its layers) over the calibration data
    math_seconds: float = 0.0  # choosing codes (GPTQ, clip search, AWQ, rounding)

    def size_bytes(self) -> int:
        """Bytes of the codes (packed), steps (fp32, or fp16 on half grids), zero points (packed) and offsets of
        every quantized linear; on two-level grids (K-quants) a block's float16 step (and offset step) and the
        sub-block codes instead."""
        total = 0
        for q in self.codes.values():
            k, n = q.codes.shape
            if q.grid is not None and q.grid.sub is not None:
                levels = 1 + (q.offsets is not None)
                sub_bits = int(np.log2(q.grid.sub_codes[1] - q.grid.sub_codes[0] + 1))
                per_block = levels * (2 + q.grid.block // q.grid.sub * sub_bits // 8)
                total += k * n * q.bits // 8 + k // q.grid.block * n * per_block
                continue
            groups = k // q.group_size
            float_bytes = 2 if q.grid is not None and q.grid.half else 4
            zero_bytes = 0 if q.zero_points is None else -(-groups * n * q.bits // 8)
            offset_bytes = 0 if q.offsets is None else groups * n * float_bytes
            total += k * n * q.bits // 8 + groups * n * float_bytes + zero_bytes + offset_bytes
        return total


@dataclass
class WeightPlan:
    """One linear's float weight, input Hessian, AWQ scales and, once quantized, its codes, effective weight and
    output errors (:meth:`errors`)."""

    weight: np.ndarray
    hessian: np.ndarray | None
    scales: np.ndarray | None
    alpha: float | None
    codes: GroupCodes | None = None
    effective: np.ndarray | None = None
    error: float | None = None
    relative: float | None = None

    def quantize(self, config: WeightOnlyConfig, bits: int) -> None:
        """Codes at ``bits`` in the group :func:`.config.layer_group` gives this weight, and their error (on the
        rank that chose them: a ``[K, K]`` by ``[K, 2N]`` product, as much as the codes' own math for wide K)."""
        self.adopt(self.choose(config, bits))
        self.error, self.relative = self.errors()

    def adopt(self, codes: GroupCodes) -> None:
        """Take ``codes`` (chosen here or by another rank): the effective weight follows from them."""
        self.codes = codes
        effective = codes.dequantize()  # float32, as the layer will hold it
        self.effective = effective if self.scales is None else (effective / self.scales[:, None]).astype(np.float32)

    def choose(self, config: WeightOnlyConfig, bits: int) -> GroupCodes:
        """The codes ``config``'s algorithms choose at ``bits`` (the expensive step)."""
        w, h = self.weight, self.hessian
        if self.scales is not None:  # the weight rows times s read the input divided by s: its Hessian scales too
            w = w * self.scales[:, None]
            h = h / np.outer(self.scales, self.scales)
        family = config.grid
        bits, size, symmetric = layer_group(w.shape[0], config, bits)
        clip = search_clip(w, h, bits, size, symmetric, family=family) if config.clip_search else 1.0
        if config.algo == "gptq":
            return gptq(w, h, bits, size, symmetric, clip=clip, family=family)
        return quantize_groups(w, bits, size, symmetric, clip, family=family)

    def errors(self) -> tuple[float, float | None]:
        """``tr(D^T H D)`` of the weight change ``D`` (``||D||^2`` without calibration inputs), and the layer output
        error relative to its output on the calibration inputs (None without them), from one product."""
        if self.hessian is None:
            d = self.effective.astype(np.float64) - self.weight
            return float(np.sum(d * d)), None
        change, output = output_errors([self.effective - self.weight, self.weight], self.hessian)
        return change, float(np.sqrt(change / output))


def promoted(plans: Mapping[str, WeightPlan], config: WeightOnlyConfig) -> list[str]:
    """The linears kept in int8 so that at most ``config.ratio`` of the weights (by count) are ``config.bits``:
    those whose low-bit output error per weight is largest first."""
    if config.ratio >= 1.0:
        return []
    total = sum(p.weight.size for p in plans.values())
    low = total
    chosen = []
    for name in sorted(plans, key=lambda n: -plans[n].error / plans[n].weight.size):
        if low <= config.ratio * total:
            break
        chosen.append(name)
        low -= plans[name].weight.size
    return chosen



def owners(costs: Sequence[float], ranks: int) -> list[int]:
    """The rank that does each job of ``costs``: the largest first, each to the least loaded rank (ties: the
    lower rank), a function of the costs alone, so every rank computes the same assignment."""
    load = [0.0] * ranks
    owner = [0] * len(costs)
    for job in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[job] = rank
        load[rank] += costs[job]
    return owner


def _share(plans: Mapping[str, WeightPlan], jobs: Sequence[Sequence[str]], work: Callable[[list[str]], None],
           what: str) -> None:
    """Run ``work(keys)`` for each job (keys of ``plans``) on its owner rank (:func:`owners`, by the weights'
    ``K^2 N + K^3``) and give every rank the codes, scales, alpha and errors of every plan."""
    rank, size = world()
    costs = [sum(plans[k].weight.shape[0] ** 2 * (plans[k].weight.shape[1] + plans[k].weight.shape[0])
                 for k in keys) for keys in jobs]
    owner = owners(costs, size)
    mine = [keys for keys, r in zip(jobs, owner) if r == rank]
    for keys in mine:
        work(list(keys))
    if size == 1:
        return
    done = {k: (plans[k].codes, plans[k].scales, plans[k].alpha, plans[k].error, plans[k].relative)
            for keys in mine for k in keys}
    for part in all_gather(done, what):
        for k, (codes, scales, alpha, error, relative) in part.items():
            plans[k].scales, plans[k].alpha, plans[k].error, plans[k].relative = scales, alpha, error, relative
            plans[k].adopt(codes)


def quantize_weights(
    weights: Mapping[str, np.ndarray],
    names: Mapping[str, str],
    hessians: Mapping[str, np.ndarray] | None,
    shared: Sequence[Sequence[str]],
    config: WeightOnlyConfig,
    progress: Callable[[str], None] | None = None,
) -> tuple[WeightOnlyResult, dict[str, np.ndarray]]:
    """Codes of every weight (``[in, out]`` by key) whose group ``config`` allows, and the float weights
    they stand for (divided by AWQ's scales). ``names``: the weight's parameter name by key (what the ONNX
    writers look up); ``hessians``: its input Hessian by key (None: round to nearest only); ``shared``: the
    keys reading one input, which share AWQ's scales. Under ``paddle.distributed`` the weights are shared out
    over the ranks (:func:`owners`) and every rank gets every code: the same as one process computes."""
    plans: dict[str, WeightPlan] = {}
    jobs = []
    for keys in shared:
        keys = [k for k in keys if layer_group(weights[k].shape[0], config) is not None]
        if not keys:
            continue
        h = hessians[keys[0]] if hessians is not None else None
        for k in keys:
            plans[k] = WeightPlan(np.asarray(weights[k]), h, None, None)  # float32 weights stay float32
        jobs.append(keys)

    def first(keys: list[str]) -> None:
        bits, size, symmetric = layer_group(weights[keys[0]].shape[0], config)  # one input width: one group
        if config.awq:
            found = search_scales([weights[k] for k in keys], plans[keys[0]].hessian, bits, size, symmetric)
            for k in keys:
                plans[k].scales, plans[k].alpha = found.scales, found.alpha
        for k in keys:
            plans[k].quantize(config, config.bits_for(k) or config.bits)
            if progress is not None:
                progress(k)

    _share(plans, jobs, first, "the codes of the weights")
    promote = promoted({k: p for k, p in plans.items() if config.bits_for(k) is None}, config)
    _share(plans, [[k] for k in promote], lambda keys: plans[keys[0]].quantize(config, 8), "the int8 codes")
    result = WeightOnlyResult()
    effective = {}
    for k, plan in plans.items():
        effective[k] = plan.effective
        result.codes[names[k]] = plan.codes
        if plan.scales is not None:
            result.input_scales[names[k]] = plan.scales.astype(np.float32)
        result.layers.append(LayerReport(k, names[k], tuple(plan.weight.shape), plan.codes.bits,
                                         plan.codes.group_size, plan.relative, plan.alpha,
                                         plan.codes.grid.name))
    return result, effective


#: Vocabulary rows of a table coded at a time: its float64 working copies stay bounded (a 151936 x 1536 table whole
#: took three of 1.9 GB each) and the codes are the same (each row's groups are its own).
TABLE_ROWS = 16384


def quantize_tables(tables: Mapping[str, np.ndarray], names: Mapping[str, str], config: WeightOnlyConfig,
                    result: WeightOnlyResult) -> list[str]:
    """Round-to-nearest codes of each embedding table (``[vocab, hidden]`` by key) at ``config.embedding_bits``,
    in groups of hidden channels (:func:`.config.layer_group`), added to ``result`` under the table's parameter
    name as the codes of its transpose, ``[hidden, vocab]``: the weight of a tied LM head (``h @ table.T``),
    whose column ``v`` is row ``v`` of the table. Coded :data:`TABLE_ROWS` rows at a time. Returns the keys
    coded (tables the fallback leaves float are not); :func:`table_rows` gives a coded table's rows."""
    coded = []
    for k, table in tables.items():
        group = layer_group(table.shape[1], config, config.embedding_bits)
        if group is None:
            continue
        codes = join_outputs([quantize_groups(np.asarray(table[lo:lo + TABLE_ROWS], np.float64).T, *group,
                                              family=config.grid) for lo in range(0, table.shape[0], TABLE_ROWS)])
        result.codes[names[k]] = codes
        result.layers.append(LayerReport(k, names[k], codes.codes.shape, codes.bits, codes.group_size, None,
                                         grid=codes.grid.name))
        coded.append(k)
    return coded


def table_rows(codes: GroupCodes, ids: np.ndarray | None = None) -> np.ndarray:
    """The float32 rows a coded table (:func:`quantize_tables`) stands for: all, or those of ``ids``; dequantized
    :data:`TABLE_ROWS` rows at a time (the whole table at once made three float32 copies of it)."""
    ids = np.arange(codes.codes.shape[1]) if ids is None else np.asarray(ids)
    rows = np.empty((len(ids), codes.codes.shape[0]), np.float32)
    for lo in range(0, len(ids), TABLE_ROWS):
        rows[lo:lo + TABLE_ROWS] = codes.select_outputs(ids[lo:lo + TABLE_ROWS]).dequantize().T
    return rows
