"""A recommender-shaped model end to end: DLRM-style tables + MLPs, quantized in one call, in paddle.inference.

The model (random weights: no trained recommender of this size ships in a wheel) has 13 dense features and 26
sparse ones. Each sparse feature has its own table (1e7 rows x 16 down to 1e4 x 128, about 1.26 GB fp32 in
all); 5 of them are multi-hot (lists of up to 8 ids padded with ``padding_idx`` 0, sum-pooled), the others
one id per sample. Tables wider than 16 are projected to 16 by a matmul; a bottom MLP (13 -> 256 -> 64 -> 16)
turns the dense features into a 27th vector, the 351 pairwise dot products of the 27 vectors and the dense
vector go to a top MLP (367 -> 512 -> 256 -> 1) and a sigmoid: a predicted CTR. Table rows have log-normal
norms; ids are Zipf(1.1) ranks spread over the rows; the last layer is scaled so the float model's CTRs spread
(logit mean -1.2, standard deviation 1.2). Saved by ``paddle.jit.save`` as PIR and as a legacy program.

Variants, each quantized by one ``qembed.quant_embedding_model`` call: float; int8 tables + int8 MLPs (the
config's ``weights`` key: every matmul weight weight-only int8); int4 tables; both also with float16 per-row scales
and offsets (``scale_dtype``, where the issue's targets are checked); ``quantize_bits="auto"``; each
also with the compiled lookup (``fused_lookup``) where it loads (the platform wheel's, or ``python -m
qembed.build_ext``'s; ``--fused``); the others pin ``fused_lookup=False`` (the op sequence).
Per variant: bytes on disk (x float), median latency at batch 1 / 64 / 512 in ``qcore.inference``'s predictor
with oneDNN and without (2 threads; every variant's runs on both interleaved), as a ratio to the fastest float
(on this model Paddle Inference runs float faster without oneDNN), the mean absolute difference of the
predicted CTR from float's, and the AUC of the float model's own top-decile labels (the float model scores 1).

    python benchmarks/embed_dlrm.py [--quick] [--repeats 200] [--fused auto|on|off] [--out FILE]

Building, each quantization and each IR's predictors run in a process of their own, so memory stays near
what one step needs (Paddle keeps what a loaded model took until its process ends). ``--quick`` divides
every table's rows by 100 and runs a few repeats: a check that it works, not a result.
Writes ``benchmarks/results/embed_dlrm.md`` (``--accuracy-only``: ``embed_dlrm_accuracy.md``) atomically
(``--quick`` writes ``--out`` only if given).
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from embed_lookup import with_fused  # the benchmarks folder, the script's own

from qcore.deploy.host import describe_cpu

RESULTS = Path(__file__).parent / "results"
# (rows, width, multi-hot) of the 26 sparse features: 1.26 GB of fp32 tables
FEATURES = (
    [(10_000_000, 16, False), (1_000_000, 16, True), (1_000_000, 16, False), (1_000_000, 16, False)]
    + [(300_000, 32, i == 0) for i in range(4)]
    + [(100_000, 64, i == 0) for i in range(6)]
    + [(30_000, 128, i == 0) for i in range(6)]
    + [(10_000, 128, i == 0) for i in range(6)]
)
DENSE, COMMON, BAG = 13, 16, 8  # dense features, interaction width, longest id list of a multi-hot feature
BATCHES = (1, 64, 512)
WEIGHTS_INT8 = {"weights": {"weight_bits": 8}}
HALF = {"scale_dtype": "float16"}  # per-row scales and offsets in 2 bytes (16-wide int8 rows: 18 bytes, not 20)
# mixed precision's budget (pooled over the tables): the 0.16x target for the model less its float MLPs (0.0013 of it)
MIXED_BUDGET = 0.158
VARIANTS: dict[str, dict[str, Any] | None] = {  # name -> quant_embedding config; None: the float model
    "float": None,
    "int8 tables + int8 MLPs": {"per_row": "auto", **WEIGHTS_INT8},
    "int8 tables (fp16 scales) + int8 MLPs": {"per_row": "auto", **HALF, **WEIGHTS_INT8},
    "int8 tables (fp16 scales)": {"per_row": "auto", **HALF},
    "int4 tables": {"quantize_bits": 4, "per_row": "auto"},
    "int4 tables (fp16 scales)": {"quantize_bits": 4, "per_row": "auto", **HALF},
    "bits='auto'": {"quantize_bits": "auto", "per_row": "auto"},
    "mixed 8/4 (fp16 scales)": {"bytes_budget": MIXED_BUDGET, "mixed_bits": (8, 4), **HALF},
    "mixed 8/2 (fp16 scales)": {"bytes_budget": MIXED_BUDGET, "mixed_bits": (8, 2), **HALF},
}
TARGETS = {  # issues 42 and 52 at batch 64: (latency x float, bytes x float, CTR MAD), None: no target
    "int8 tables (fp16 scales) + int8 MLPs": (0.8, 0.27, 1e-3),
    "int8 tables (fp16 scales)": (0.8, 0.27, 1e-3),
    "int4 tables (fp16 scales)": (None, 0.16, 3e-3),
    "mixed 8/4 (fp16 scales)": (None, 0.16, 3e-3),
    "mixed 8/2 (fp16 scales)": (None, 0.16, 3e-3),
}
CALIBRATION_SAMPLES = 1_000_000  # samples whose ids (not a model run) tell mixed tables which rows are hot
LOGIT_MEAN, LOGIT_STD = -1.2, 1.2


def features(quick: bool) -> list[tuple[int, int, bool]]:
    return [(max(rows // 100, 100) if quick else rows, width, multi) for rows, width, multi in FEATURES]


def table(rows: int, width: int, rng: np.random.Generator, chunk: int = 1 << 20) -> np.ndarray:
    """Rows of log-normal norm (a few of large norm, as trained tables have), row 0 (padding) zero; made chunk-wise."""
    out = np.empty((rows, width), np.float32)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        norms = rng.lognormal(-1.0, 0.6, (n, 1)).astype(np.float32)
        out[start : start + n] = rng.standard_normal((n, width), np.float32) * (norms / np.sqrt(width))
    out[0] = 0
    return out


def zipf_ids(rows: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Ids 1..rows-1: Zipf(1.1) ranks spread over the rows by a multiplicative hash (the hot ids are scattered)."""
    ranks = np.minimum(rng.zipf(1.1, shape) - 1, rows - 2).astype(np.int64)
    return 1 + (ranks * 2_654_435_761) % (rows - 1)


def make_feed(feats: list[tuple[int, int, bool]], n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` samples: dense features, one id per one-hot feature, padded id lists (some empty) per multi-hot one."""
    single = np.stack([zipf_ids(rows, (n,), rng) for rows, _, multi in feats if not multi], axis=1)
    multi = np.stack([zipf_ids(rows, (n, BAG), rng) for rows, _, m in feats if m], axis=1)
    lengths = rng.integers(0, BAG + 1, (n, multi.shape[1], 1))
    multi[np.arange(BAG) >= lengths] = 0  # padding
    return {"dense": rng.standard_normal((n, DENSE), np.float32), "single": single, "multi": multi}


def calibration_ids(feats: list[tuple[int, int, bool]], n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The ids each feature's lookup reads in ``n`` samples (padding 0 included, as a model reads it)."""
    return calibration_ids_of(feats, make_feed(feats, n, rng))


def unseen_share(feats: list[tuple[int, int, bool]], calibration: list[np.ndarray],
                 scored: dict[str, np.ndarray]) -> float:
    """Share of the scored (non-padding) lookups that read a row no calibration id read: the held-back part."""
    unseen = total = 0
    for ids, scored_ids in zip(calibration, calibration_ids_of(feats, scored)):
        seen = np.zeros(int(max(ids.max(), scored_ids.max())) + 1, bool)
        seen[ids.reshape(-1)] = True
        read = scored_ids[scored_ids != 0]
        unseen += int((~seen[read]).sum())
        total += read.size
    return unseen / total


def calibration_ids_of(feats: list[tuple[int, int, bool]], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``feed``'s ids per feature, in the features' order."""
    single, multi = iter(feed["single"].T), iter(feed["multi"].transpose(1, 0, 2))
    return [next(multi) if m else next(single) for *_, m in feats]


def build_net(feats: list[tuple[int, int, bool]], rng: np.random.Generator) -> Any:
    """The DLRM-style layer with its tables filled and its last layer scaled (see the module docstring)."""
    import paddle
    from paddle.base.layer_helper import LayerHelper

    def legacy_op(op_type: str, x: Any, **attrs: Any) -> Any:
        """Paddle 3.3.1's sum and sigmoid have no legacy-IR path: write the legacy op when saving a legacy program."""
        helper = LayerHelper(op_type)
        out = helper.create_variable_for_type_inference(x.dtype)
        helper.append_op(type=op_type, inputs={"X": x}, outputs={"Out": out}, attrs=attrs)
        return out

    def legacy() -> bool:
        return not (paddle.in_dynamic_mode() or paddle.framework.in_pir_mode())

    def reduce_sum(x: Any, axis: int) -> Any:
        return legacy_op("reduce_sum", x, dim=[axis], keep_dim=False, reduce_all=False) if legacy() else x.sum(axis)

    def mlp(sizes: list[int]) -> Any:
        layers: list[Any] = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [paddle.nn.Linear(a, b), paddle.nn.ReLU()]
        return paddle.nn.Sequential(*layers[:-1])

    n_vec = len(feats) + 1
    upper = np.triu_indices(n_vec, 1)

    class DLRM(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.tables = paddle.nn.LayerList([paddle.nn.Embedding(r, w, padding_idx=0) for r, w, _ in feats])
            self.project = paddle.nn.LayerList([paddle.nn.Linear(w, COMMON, bias_attr=False) if w != COMMON
                                                else paddle.nn.Identity() for _, w, _ in feats])
            self.bottom = mlp([DENSE, 256, 64, COMMON])
            self.top = mlp([COMMON + len(upper[0]), 512, 256, 1])
            self.register_buffer("pairs", paddle.to_tensor((upper[0] * n_vec + upper[1]).astype("int64")))
            self.multi_hot = [m for _, _, m in feats]

        def logits(self, dense: Any, single: Any, multi: Any) -> Any:
            x = paddle.nn.functional.relu(self.bottom(dense))
            vectors, s, m = [x], 0, 0
            for table, project, is_multi in zip(self.tables, self.project, self.multi_hot):
                if is_multi:
                    rows = reduce_sum(table(multi[:, m, :]), 1)
                    m += 1
                else:
                    rows = table(single[:, s])
                    s += 1
                vectors.append(project(rows))
            z = paddle.stack(vectors, axis=1)
            dots = reduce_sum(z.unsqueeze(2) * z.unsqueeze(1), -1).reshape([-1, n_vec * n_vec])
            return self.top(paddle.concat([x, paddle.gather(dots, self.pairs, axis=1)], axis=1))

        def forward(self, dense: Any, single: Any, multi: Any) -> Any:
            logits = self.logits(dense, single, multi)
            return legacy_op("sigmoid", logits) if legacy() else paddle.nn.functional.sigmoid(logits)

    paddle.seed(0)
    net = DLRM()
    for emb, (rows, width, _) in zip(net.tables, feats):
        values = table(rows, width, rng)
        emb.weight.set_value(values)
        del values
    net.eval()
    sample = make_feed(feats, 2048, rng)
    with paddle.no_grad():
        logits = net.logits(*(paddle.to_tensor(sample[k]) for k in ("dense", "single", "multi"))).numpy().ravel()
    last = net.top[-1]
    gain = LOGIT_STD / float(logits.std())
    last.weight.set_value(last.weight.numpy() * gain)
    last.bias.set_value((last.bias.numpy() - float(logits.mean())) * gain + LOGIT_MEAN)
    return net


def save_float_models(feats: list[tuple[int, int, bool]], root: Path) -> dict[str, Path]:
    """The float model saved as PIR and as legacy under ``root``; {family: directory}."""
    import paddle

    paddle.disable_static()
    net = build_net(feats, np.random.default_rng(0))
    spec = [paddle.static.InputSpec([None, DENSE], "float32", "dense"),
            paddle.static.InputSpec([None, sum(not m for *_, m in feats)], "int64", "single"),
            paddle.static.InputSpec([None, sum(m for *_, m in feats), BAG], "int64", "multi")]
    dirs = {"pir": root / "pir" / "float", "legacy": root / "legacy" / "float"}
    paddle.jit.save(net, str(dirs["pir"] / "inference"), input_spec=spec)
    with paddle.pir_utils.OldIrGuard():
        paddle.jit.save(net, str(dirs["legacy"] / "inference"), input_spec=spec)
    return dirs


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties count half)."""
    from scipy.stats import rankdata

    pos = labels.astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((rankdata(scores)[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def chosen_bits(reports: list[Any]) -> str:
    """How the tables were stored, e.g. 'int8 per-row x 20, int4 one scale x 6'."""
    counts: dict[str, int] = {}
    for r in reports:
        q = r.choice.table
        if hasattr(q, "hot_ids"):  # a mixed table (qembed.mixed)
            hot, cold = q.bits
            key = f"int{hot} hot {len(q.hot_ids) / r.shape[0]:.1%} / int{cold}" + (" + offsets" if q.cold.offsets
                                                                                     is not None else "")
            counts[key] = counts.get(key, 0) + 1
            continue
        key = f"int{q.bits} {'per-row' if r.choice.per_row else 'one scale'}"
        key += (" + offsets" if q.offsets is not None else "") + (" fp16" if q.scale_dtype == "float16" else "")
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} x {n}" for k, n in sorted(counts.items()))


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh process: Paddle keeps what a loaded model or a predictor took, so each heavy step
    (building, each quantization, one IR's predictors) gives its memory back when it ends."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def quantize(float_dir: Path, out_dir: Path, config: dict[str, Any], feats: list[tuple[int, int, bool]],
             calibration: list[np.ndarray]) -> tuple[Any, str]:
    """One ``quant_embedding_model`` call (``calibration``: each feature's calibration ids); its files and how the
    tables were stored and read."""
    from qcore.graph import open_graph
    from qcore.model_io import load_model
    from qembed import quant_embedding_model

    graph = open_graph(load_model(float_dir))
    names = [graph.weight_operand(op).name for op in graph.ops(["lookup_table"])]  # the features' order
    assert [graph.get_param(n).shape for n in names] == [(rows, width) for rows, width, _ in feats]
    del graph
    ids = dict(zip(names, calibration)) if "bytes_budget" in config else None
    files, reports = quant_embedding_model(float_dir, out_dir, config, calibration_ids=ids)
    return files, f"{chosen_bits(reports)}; {reports[0].lookup}"


BACKENDS = ("onednn", "native")  # Paddle Inference with oneDNN (qcore.inference's default) and without it


def measure(files: dict[str, Any], scored: dict[str, np.ndarray], timed: dict[int, dict[str, np.ndarray]],
            repeats: int) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Every model's predictor on each of :data:`BACKENDS` at once: CTRs on ``scored``, interleaved latency per
    batch size, relative to the fastest float predictor at that batch size; the float CTR's 5th / 50th / 95th
    percentiles."""
    from qcore.inference import create_predictor
    from qcore.scoring import interleaved_latency

    predictors = {f"{name} @ {backend}": create_predictor(f, threads=2, backend=backend)
                  for name, f in files.items() for backend in BACKENDS}
    ctr = {key: predict(p, scored) for key, p in predictors.items()}
    ms = {b: interleaved_latency(predictors, timed[b], repeats=repeats if b < 512 else max(repeats // 4, 3), warmup=3)
          for b in BATCHES}
    fastest_float = {b: min(ms[b][f"float @ {backend}"] for backend in BACKENDS) for b in BATCHES}
    rows = [{"name": name, "backend": backend, "bytes": dir_bytes(f.directory),
             "ms": {b: ms[b][f"{name} @ {backend}"] for b in BATCHES},
             "x": {b: ms[b][f"{name} @ {backend}"] / fastest_float[b] for b in BATCHES}}
            for name, f in files.items() for backend in BACKENDS]
    return scores(rows, ctr, f"float @ {BACKENDS[0]}")


def predict(predictor: Any, scored: dict[str, np.ndarray]) -> np.ndarray:
    """The predicted CTRs of ``scored``, 512 samples at a time."""
    from qcore.inference import run_predictor

    return np.concatenate([run_predictor(predictor, {k: v[i : i + 512] for k, v in scored.items()})[0]
                           for i in range(0, len(scored["dense"]), 512)]).ravel()


def score_one(files: Any, scored: dict[str, np.ndarray]) -> np.ndarray:
    """One model's CTRs on ``scored`` in Paddle Inference without oneDNN (``--accuracy-only``: nothing timed)."""
    from qcore.inference import create_predictor

    return predict(create_predictor(files, threads=2, backend="native"), scored)


def scores(rows: list[dict[str, Any]], ctr: dict[str, np.ndarray], float_key: str) -> tuple[list[dict[str, Any]],
                                                                                          np.ndarray]:
    """``rows`` with each one's CTR MAD against float and AUC of float's top-decile labels; float's CTR 5/50/95th
    percentiles."""
    reference = ctr[float_key]
    labels = reference >= np.quantile(reference, 0.9)
    for r in rows:
        got = ctr[f"{r['name']} @ {r['backend']}"]
        r.update(mad=float(np.mean(np.abs(got - reference))), auc=auc(labels, got))
    return rows, np.percentile(reference, [5, 50, 95])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tables 100x smaller, 3 repeats: a check, not a result")
    parser.add_argument("--repeats", type=int, default=200, help="interleaved rounds, b=1 and 64 (512: a quarter)")
    parser.add_argument("--samples", type=int, default=8192, help="samples scored for CTR difference and AUC")
    parser.add_argument("--fused", choices=["auto", "on", "off"], default="auto",
                        help="also each variant with the compiled lookup (auto: where it loads)")
    parser.add_argument("--accuracy-only", action="store_true",
                        help="bytes, CTR MAD and AUC only (native backend, nothing timed, no fused variants)")
    parser.add_argument("--families", nargs="+", choices=["pir", "legacy"], default=["pir", "legacy"],
                        help="program families to quantize")
    parser.add_argument("--variants", nargs="+", choices=[v for v in VARIANTS if v != "float"], default=None,
                        help="run only these variants (and float); default: all")
    parser.add_argument("--out", type=Path, default=None, help="results file (default: results/embed_dlrm.md)")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    chosen = {k: v for k, v in VARIANTS.items() if args.variants is None or v is None or k in args.variants}
    todo = chosen if args.accuracy_only else with_fused(chosen, args.fused)
    import paddle

    from qcore.model_io import find_model_files
    from qcore.outputs import write_bytes

    feats = features(args.quick)
    rng = np.random.default_rng(1)
    scored = make_feed(feats, 1024 if args.quick else args.samples, rng)
    timed = {b: make_feed(feats, b, rng) for b in BATCHES}
    n_calibration = 20_000 if args.quick else CALIBRATION_SAMPLES
    calibration = calibration_ids(feats, n_calibration, np.random.default_rng(2))  # apart from the scored samples
    unseen = unseen_share(feats, calibration, scored)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        float_dirs = in_child(save_float_models, feats, Path(tmp))
        for family in args.families:
            float_dir = float_dirs[family]
            files, forms = {"float": find_model_files(float_dir)}, {"float": "float"}
            for name, config in todo.items():
                if config is None:
                    continue
                out = Path(tmp) / family / name.replace(" ", "_").replace("/", "-")
                files[name], forms[name] = in_child(quantize, float_dir, out, config, feats, calibration)
            if args.accuracy_only:
                rows = [{"name": name, "backend": "native", "bytes": dir_bytes(f.directory)}
                        for name, f in files.items()]
                ctr = {f"{name} @ native": in_child(score_one, f, scored) for name, f in files.items()}
                family_results, ctr_spread = scores(rows, ctr, "float @ native")
            else:
                family_results, ctr_spread = in_child(measure, files, scored, timed, repeats)
            for r in family_results:
                r.update(family=family, form=forms[r["name"]])
                timing = "" if args.accuracy_only else {b: f"{r['x'][b]:.2f}x" for b in BATCHES}
                print(family, r["name"], r["backend"], f"{r['bytes'] / 2**20:.1f} MiB", timing,
                      f"MAD {r['mad']:.2e} AUC {r['auc']:.4f}", r["form"], flush=True)
            results += family_results
    float_bytes = {r["family"]: r["bytes"] for r in results if r["name"] == "float"}
    table_bytes = sum(rows * width * 4 for rows, width, _ in feats)
    timing_note = ("Accuracy only (`--accuracy-only`): nothing timed, Paddle Inference without oneDNN. "
                   if args.accuracy_only else
                   "Latency: median ms of interleaved runs in `qcore.inference.create_predictor` "
                   f"(oneDNN and native, 2 threads; {repeats} rounds at batch 1 and 64, {max(repeats // 4, 3)} at "
                   "512). "
                   "x: ms over the fastest float predictor's ms (oneDNN or native) at that batch size. ")
    lines = [
        "# A recommender-shaped model: DLRM-style tables + MLPs quantized in one call (paddle.inference)",
        "",
        ("**--quick: tables 100x smaller, 3 repeats; a check that the benchmark runs, not a result.**\n\n"
         if args.quick else "")
        + f"Model: 26 sparse features ({table_bytes / 1e9:.2f} GB of fp32 tables, {feats[0][0]:,} x {feats[0][1]} "
        f"down to {feats[-1][0]:,} x {feats[-1][1]}; 5 multi-hot: up to {BAG} ids padded with 0, sum-pooled), "
        f"{DENSE} dense features, bottom MLP {DENSE}-256-64-16, pairwise dots of 27 vectors, top MLP 367-512-256-1, "
        "sigmoid; random weights (log-normal row norms), Zipf(1.1) ids, float CTR 5/50/95th percentiles "
        f"{ctr_spread[0]:.3f} / {ctr_spread[1]:.3f} / {ctr_spread[2]:.3f}. Each variant is one "
        "`quant_embedding_model` call; mixed tables (`bytes_budget` "
        f"{MIXED_BUDGET}, pooled over the 26 tables) count rows in the ids of {n_calibration:,} calibration "
        "samples. " + timing_note
        + f"CTR MAD: mean |CTR - float CTR| over {len(scored['dense'])} held-back samples (drawn apart from the "
        f"calibration samples; {unseen:.1%} of their lookups read a row no calibration id read); AUC: of the float "
        f"model's own top-decile labels. Machine: {describe_cpu()}, Paddle {paddle.__version__}. "
        "Produced by `benchmarks/embed_dlrm.py" + (" --accuracy-only" if args.accuracy_only else "") + "`.",
        "",
        "Targets (issues 42 and 52, batch 64), on the float16-scale variants: int8 tables <= 0.8x float latency at "
        "<= 0.27x bytes and CTR MAD <= 1e-3; int4 and mixed 4/8-bit tables <= 0.16x bytes at CTR MAD <= 3e-3.",
        "",
    ]
    if args.accuracy_only:
        lines += ["| IR | variant | tables as | backend | MiB | x float | CTR MAD | AUC |",
                  "|---|---|---|---|---:|---:|---:|---:|"]
    else:
        lines += ["| IR | variant | tables as | backend | MiB | x float | b=1 ms | x | b=64 ms | x | b=512 ms | x "
                  "| CTR MAD | AUC |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        cells = "" if args.accuracy_only else " | ".join(f"{r['ms'][b]:.2f} | {r['x'][b]:.2f}" for b in BATCHES) + " |"
        lines.append(f"| {r['family']} | {r['name']} | {r['form']} | {r['backend']} | {r['bytes'] / 2**20:.1f} | "
                     f"{r['bytes'] / float_bytes[r['family']]:.3f} | {cells} {r['mad']:.2e} | {r['auc']:.4f} |"
                     .replace("|  ", "| "))
    lines += ["", "Against the targets:", ""]
    for r in results:
        target = TARGETS.get(r["name"].removesuffix(", fused"))
        if target is None:
            continue
        lat, size, mad = target
        x_bytes = r["bytes"] / float_bytes[r["family"]]
        checks = [f"bytes {x_bytes:.3f}x {'<=' if x_bytes <= size else '>'} {size}",
                  f"CTR MAD {r['mad']:.1e} {'<=' if r['mad'] <= mad else '>'} {mad:.0e}"]
        if lat is not None and not args.accuracy_only:
            checks.insert(0, f"b=64 latency {r['x'][64]:.2f}x {'<=' if r['x'][64] <= lat else '>'} {lat}")
        lines.append(f"* {r['family']}, {r['name']} on {r['backend']}: " + "; ".join(checks))
    out = args.out or (None if args.quick else RESULTS / ("embed_dlrm_accuracy.md" if args.accuracy_only
                                                          else "embed_dlrm.md"))
    text = "\n".join(lines) + "\n"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(out, text.encode())
    print(text)

if __name__ == "__main__":
    main()
