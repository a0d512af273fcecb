"""Codes for a set of matmul weights, whatever holds them (a ``paddle.nn.Layer``, a saved program): each weight's
algorithms in NNCF's order (AWQ-style scales shared by the weights reading one input, then clip search or
GPTQ), mixed precision across them, and the report; embedding tables by round to nearest
(:func:`quantize_tables`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from qcore.distributed import all_gather, all_reduce_array, world
from qcore.groupwise import GroupCodes, join_outputs, quantize_groups

from .awq import search_scales
from .clip_search import search_clip
from .columns import COLUMN_CHUNK
from .config import WeightOnlyConfig, layer_group
from .gptq import Factor, factor_hessian, gptq
from .hessian import column_errors


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
    output errors (:meth:`column_errors`)."""

    weight: np.ndarray
    hessian: np.ndarray | None
    scales: np.ndarray | None
    alpha: float | None
    codes: GroupCodes | None = None
    effective: np.ndarray | None = None
    error: float | None = None
    relative: float | None = None

    def quantize(self, config: WeightOnlyConfig, bits: int) -> None:
        """Codes at ``bits`` in the group :func:`.config.layer_group` gives this weight, and their errors."""
        codes = self.choose(config, bits)
        self.settle(codes, *self.column_errors(codes))

    def prepared(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The weight and Hessian the codes are chosen for: the weight rows times AWQ's scales read the input divided
        by them, so its Hessian is divided by them on both sides."""
        if self.scales is None:
            return self.weight, self.hessian
        return self.weight * self.scales[:, None], self.hessian / np.outer(self.scales, self.scales)

    def factor(self) -> Factor:
        """GPTQ's factor of the prepared Hessian (what every output column's codes share)."""
        return factor_hessian(self.prepared()[1])

    def choose(self, config: WeightOnlyConfig, bits: int, columns: slice = slice(None),
               factor: Factor | None = None) -> GroupCodes:
        """The codes ``config``'s algorithms choose at ``bits`` for the output ``columns`` (the expensive step);
        ``factor``: :meth:`factor`, when already computed (GPTQ)."""
        w, h = self.prepared()
        w = w[:, columns]
        family = config.grid
        bits, size, symmetric = layer_group(w.shape[0], config, bits)
        clip = search_clip(w, h, bits, size, symmetric, family=family) if config.clip_search else 1.0
        if config.algo == "gptq":
            return gptq(w, h, bits, size, symmetric, clip=clip, family=family, factor=factor)
        return quantize_groups(w, bits, size, symmetric, clip, family=family)

    def dequantized(self, codes: GroupCodes) -> np.ndarray:
        """The float32 weight ``codes`` stand for (divided by AWQ's scales), as the layer will hold it."""
        effective = codes.dequantize()
        return effective if self.scales is None else (effective / self.scales[:, None]).astype(np.float32)

    def column_errors(self, codes: GroupCodes, columns: slice = slice(None)
                      ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per output column of ``columns`` (``codes``' own): the output error ``d^T H d`` of the weight change ``d``
        (``||d||^2`` without calibration inputs) and the output's ``w^T H w`` (None without them), from one
        product; a column's values depend on it alone (:func:`.hessian.column_errors`)."""
        weight = self.weight[:, columns]
        if self.hessian is None:
            d = self.dequantized(codes).astype(np.float64) - weight
            return np.sum(d * d, axis=0), None
        change, output = column_errors([self.dequantized(codes) - weight, weight], self.hessian)
        return change, output

    def settle(self, codes: GroupCodes, change: np.ndarray, output: np.ndarray | None) -> None:
        """Take ``codes`` (chosen here or by other ranks) and their per-column errors (:meth:`column_errors`): the
        effective weight, ``tr(D^T H D)`` and the output error relative to the output."""
        error = float(np.sum(change))
        self.adopt(codes, error, None if output is None else float(np.sqrt(error / np.sum(output))))

    def adopt(self, codes: GroupCodes, error: float, relative: float | None) -> None:
        """Take ``codes`` and their errors (:meth:`settle`'s, here or on another rank): the effective weight follows."""
        self.codes, self.effective = codes, self.dequantized(codes)
        self.error, self.relative = error, relative


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


#: Output columns of a rank's share of a weight (:func:`column_bounds`): a multiple of the chunk the math takes
#: products over, so that every column of a share comes from the same products as in the whole weight.
COLUMN_SHARE = COLUMN_CHUNK


def column_bounds(columns: int, ranks: int) -> list[int] | None:
    """Where the ranks' shares of ``columns`` output columns start and end: near-equal, cut at multiples of
    :data:`COLUMN_SHARE`; None when a share would be narrower than that."""
    cuts = [0] + [round(columns * r / ranks / COLUMN_SHARE) * COLUMN_SHARE for r in range(1, ranks)] + [columns]
    return cuts if all(b - a >= COLUMN_SHARE for a, b in zip(cuts, cuts[1:])) else None


@dataclass(frozen=True)
class JobWork:
    """A job's estimated time in one unit (about 4e-11 s on one core of an AVX-512 VM): GPTQ's factorisation of its
    Hessian, the work on its output columns (clip search, GPTQ's column loop, the output errors), and what sending
    its factor to every rank costs. Measured on Qwen2.5's shapes: an 8960-wide factor 6.9 s, the 1536 columns of
    the down projection 7.8 s, a 1536 x 8960 gate projection 3.6 s; a 4864-wide factor 1.9 s."""

    factor: float
    columns: float
    send: float

    @staticmethod
    def of(shapes: Sequence[tuple[int, int]], config: WeightOnlyConfig) -> JobWork:
        """The work of the weights of ``shapes`` (``[K, N]`` each, one input) under ``config``."""
        k = shapes[0][0]
        group = k if config.group_size == -1 else min(config.group_size, k)
        per_column = k * k + (35 * group * k if config.clip_search else 0)
        return JobWork(k**3 / 4 if config.algo == "gptq" else 0.0, sum(n for _, n in shapes) * per_column,
                       150.0 * k * k)


def _makespan(costs: Sequence[float], ranks: int) -> float:
    load = [0.0] * ranks
    for cost, rank in zip(costs, owners(costs, ranks)):
        load[rank] += cost
    return max(load, default=0.0)


def column_split(works: Sequence[JobWork], eligible: Sequence[bool], ranks: int) -> list[bool]:
    """Which jobs have their output columns shared out over the ranks: of the ``eligible`` ones, those whose work
    is more than a rank's share of all (a 1.5B model's down projection: whole, it held one rank while the others
    idled), when the estimated time of the two rounds (factors and whole jobs shared out by :func:`owners`, then
    every rank's share of the split columns, after the factors are sent) is below that of whole jobs alone."""
    whole = [w.factor + w.columns for w in works]
    split = [ok and ranks > 1 and cost > sum(whole) / ranks for ok, cost in zip(eligible, whole)]
    if not any(split):
        return split
    first = [w.factor if cut else cost for w, cost, cut in zip(works, whole, split)]
    rounds = _makespan(first, ranks) + sum(w.send + w.columns / ranks for w, cut in zip(works, split) if cut)
    return split if rounds < _makespan(whole, ranks) else [False] * len(works)


def _share(plans: Mapping[str, WeightPlan], jobs: Sequence[Sequence[str]], config: WeightOnlyConfig,
           bits_of: Callable[[str], int], search_awq: bool, progress: Callable[[str], None] | None,
           what: str) -> None:
    """Codes of every job's weights (keys of ``plans`` reading one input) at ``bits_of(key)``, AWQ's scales first
    with ``search_awq``; every rank gets every plan's codes, scales and errors, the same as one process computes.

    Under ``paddle.distributed`` each job goes to an owner rank (:func:`owners`, by :class:`JobWork`), except those
    :func:`column_split` picks for GPTQ: their owner only factors the Hessian (and searches AWQ's scales), the
    factor is sent to every rank, and each rank quantizes its share of the output columns."""
    rank, size = world()
    works = [JobWork.of([plans[k].weight.shape for k in keys], config) for keys in jobs]
    eligible = [config.algo == "gptq" and all(plans[k].hessian is not None
                                              and column_bounds(plans[k].weight.shape[1], size) for k in keys)
                for keys in jobs]
    split = column_split(works, eligible, size)
    owner = owners([w.factor if cut else w.factor + w.columns for w, cut in zip(works, split)], size)
    factors: dict[int, Factor] = {}
    done: dict[str, tuple] = {}
    for j, keys in enumerate(jobs):
        if owner[j] != rank:
            continue
        if search_awq:
            _search_awq(plans, keys, config)
        if split[j]:
            factors[j] = plans[keys[0]].factor()
        for k in keys:
            if not split[j]:
                plans[k].quantize(config, bits_of(k))
                if progress is not None:
                    progress(k)
            order, dead = (factors[j].order, factors[j].dead) if split[j] else (None, None)
            done[k] = (plans[k].codes, plans[k].scales, plans[k].alpha, plans[k].error, plans[k].relative, order, dead)
    shared = [done] if size == 1 else all_gather(done, what)
    layouts = {}
    for part in shared:
        for k, (codes, scales, alpha, error, relative, order, dead) in part.items():
            plans[k].scales, plans[k].alpha = scales, alpha
            if codes is not None:
                plans[k].adopt(codes, error, relative)
            layouts[k] = (order, dead)
    for j, keys in enumerate(jobs):
        if split[j]:
            _split_columns(plans, keys, config, bits_of, factors.get(j), layouts[keys[0]], what)
            if progress is not None and rank == 0:
                for k in keys:
                    progress(k)


def _search_awq(plans: Mapping[str, WeightPlan], keys: Sequence[str], config: WeightOnlyConfig) -> None:
    """AWQ's input scales, shared by the weights ``keys`` reading one input."""
    bits, size, symmetric = layer_group(plans[keys[0]].weight.shape[0], config)  # one input width: one group
    found = search_scales([plans[k].weight for k in keys], plans[keys[0]].hessian, bits, size, symmetric)
    for k in keys:
        plans[k].scales, plans[k].alpha = found.scales, found.alpha


def _split_columns(plans: Mapping[str, WeightPlan], keys: Sequence[str], config: WeightOnlyConfig,
                   bits_of: Callable[[str], int], factor: Factor | None,
                   layout: tuple[np.ndarray, np.ndarray], what: str) -> None:
    """GPTQ of the weights ``keys`` with their output columns shared out over the ranks: the owner's ``factor`` is
    sent to every rank (a sum with zeros elsewhere: exact), each rank quantizes its columns, and the parts are
    joined in column order (codes, and per-column errors summed in one order: what one process computes)."""
    rank, size = world()
    k0 = plans[keys[0]].weight.shape[0]
    upper = np.ascontiguousarray(factor.upper[::-1, ::-1]) if factor is not None else np.zeros((k0, k0), np.float32)
    upper = all_reduce_array(upper, "sum", f"the GPTQ factor of {keys[0]}")[::-1, ::-1]
    shared = Factor(layout[0], upper, layout[1])
    part = {}
    for k in keys:
        bounds = column_bounds(plans[k].weight.shape[1], size)
        assert bounds is not None  # column_split's condition
        columns = slice(bounds[rank], bounds[rank + 1])
        codes = plans[k].choose(config, bits_of(k), columns, shared)
        part[k] = (codes, *plans[k].column_errors(codes, columns))
    del shared, upper
    parts = all_gather(part, what)
    for k in keys:
        codes = join_outputs([p[k][0] for p in parts])
        assert codes is not None  # one grid: the same bits and group for every column
        output = None if parts[0][k][2] is None else np.concatenate([p[k][2] for p in parts])
        plans[k].settle(codes, np.concatenate([p[k][1] for p in parts]), output)


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
    keys reading one input, which share AWQ's scales. Under ``paddle.distributed`` the work is shared out
    over the ranks (:func:`_share`) and every rank gets every code: the same as one process computes."""
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
    _share(plans, jobs, config, lambda k: config.bits_for(k) or config.bits, config.awq, progress,
           "the codes of the weights")
    promote = promoted({k: p for k, p in plans.items() if config.bits_for(k) is None}, config)
    _share(plans, [[k] for k in promote], config, lambda k: 8, False, None, "the int8 codes")
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
