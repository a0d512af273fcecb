"""Train the demo CNN on the bundled Fashion-MNIST subset and export it twice.

Exports (same weights) to ``packages/qdemo/src/qdemo/assets/``:

* ``model_pir/inference.json`` + ``inference.pdiparams``   (Paddle 3 PIR program)
* ``model_legacy/inference.pdmodel`` + ``inference.pdiparams`` (legacy ProgramDesc)

then reloads both with ``paddle.static.load_inference_model`` and ``paddle.inference``,
checks that they reproduce the dygraph logits, and writes ``model_info.json`` next to
them (float test accuracy, op lists, parameter count).

CPU only, seeded and deterministic (rerunning reproduces the committed files' weights);
about 3 minutes on one core::

    python demo/train.py                  # the bundled model: GAP head, 86.0 % test top-1
    python demo/train.py --head flatten   # alternative: flatten head, 88.7 % (not bundled)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages/qcore/src"))


# Training recipe per classifier head. 'gap' is the one the bundled model was trained with.
RECIPES = {
    "gap": {"epochs": 20, "label_smoothing": 0.05},
    "flatten": {"epochs": 15, "label_smoothing": 0.0},
}


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--head", choices=sorted(RECIPES), default="gap", help="classifier head; 'gap' rebuilds the bundled model"
    )
    ap.add_argument("--epochs", type=int, default=None, help="default: the head's recipe")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "packages/qdemo/src/qdemo/assets")
    args = ap.parse_args()
    args.label_smoothing = RECIPES[args.head]["label_smoothing"]
    if args.epochs is None:
        args.epochs = RECIPES[args.head]["epochs"]
    return args


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(ARGS.threads))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle import nn  # noqa: E402

from qdemo import INPUT_NAME, MODEL_FAMILIES, load_demo_data  # noqa: E402
from qdemo.net import DemoNet  # noqa: E402  (the architecture the bundled model has)


def augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random horizontal flip and +-2 pixel translation (zero = background padding)."""
    n = x.shape[0]
    flip = rng.random(n) < 0.5
    x = x.copy()
    x[flip] = x[flip, :, :, ::-1]
    bg = x.min()
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=bg)
    dy = rng.integers(0, 5, n)
    dx = rng.integers(0, 5, n)
    out = np.empty_like(x)
    for i in range(n):
        out[i] = padded[i, :, dy[i] : dy[i] + 28, dx[i] : dx[i] + 28]
    return out


def predict(model: nn.Layer, x: np.ndarray, bs: int = 500) -> np.ndarray:
    model.eval()
    outs = []
    with paddle.no_grad():
        for i in range(0, len(x), bs):
            outs.append(model(paddle.to_tensor(x[i : i + bs])).numpy())
    return np.concatenate(outs)


def train(args: argparse.Namespace) -> tuple[DemoNet, float]:
    paddle.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    xtr, ytr = load_demo_data("train")
    xte, yte = load_demo_data("test")
    model = DemoNet(head=args.head)
    steps_per_epoch = int(np.ceil(len(xtr) / args.batch_size))
    sched = paddle.optimizer.lr.OneCycleLR(
        max_learning_rate=args.lr, total_steps=args.epochs * steps_per_epoch, phase_pct=0.2
    )
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=1e-4)
    ls = args.label_smoothing
    loss_fn = nn.CrossEntropyLoss(label_smoothing=ls) if ls else nn.CrossEntropyLoss()
    t0 = time.time()
    for ep in range(args.epochs):
        model.train()
        order = rng.permutation(len(xtr))
        xb_all = augment(xtr[order], rng)
        yb_all = ytr[order]
        tot = 0.0
        for s in range(steps_per_epoch):
            sl = slice(s * args.batch_size, (s + 1) * args.batch_size)
            xb = paddle.to_tensor(xb_all[sl])
            yb = paddle.to_tensor(yb_all[sl])
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            opt.clear_grad()
            sched.step()
            tot += float(loss) * len(yb_all[sl])
        if ep % 5 == 4 or ep == args.epochs - 1:
            acc = float((predict(model, xte).argmax(1) == yte).mean())
            print(f"epoch {ep + 1:3d} loss {tot / len(xtr):.4f} test top1 {acc * 100:.2f}%  ({time.time() - t0:.0f}s)")
        else:
            print(f"epoch {ep + 1:3d} loss {tot / len(xtr):.4f}  ({time.time() - t0:.0f}s)")
    model.eval()
    acc = float((predict(model, xte).argmax(1) == yte).mean())
    return model, acc


def input_spec():
    return [paddle.static.InputSpec([None, 1, 28, 28], "float32", INPUT_NAME)]


def _fresh_net(state: dict, head: str) -> DemoNet:
    # A fresh Layer per export, so no program traced in one IR mode is reused in the other.
    # Paddle's global name counter is NOT reset: the trained net owns conv2d_0..4, the PIR copy
    # gets conv2d_5..9 / linear_1 and the legacy copy conv2d_10..14 / linear_2. The bundled files
    # (and docs/concepts.md) carry these names, so keep this order when regenerating.
    net = DemoNet(head=head)
    net.set_state_dict(state)
    net.eval()
    return net


def export(state: dict, out: Path, head: str) -> None:
    """Save the weights as a PIR and as a legacy ProgramDesc inference model."""
    # PIR (the default in Paddle 3): writes <prefix>.json + <prefix>.pdiparams
    net = _fresh_net(state, head)
    paddle.jit.save(net, str(out / "model_pir" / "inference"), input_spec=input_spec())
    # Legacy ProgramDesc: the same call with FLAGS_enable_pir_api switched off while staying in
    # dygraph (paddle.pir_utils.DygraphOldIrGuard) writes <prefix>.pdmodel + <prefix>.pdiparams
    net = _fresh_net(state, head)
    with paddle.pir_utils.DygraphOldIrGuard():
        paddle.jit.save(net, str(out / "model_legacy" / "inference"), input_spec=input_spec())
    for fam, files in MODEL_FAMILIES.items():
        d = out / f"model_{fam}"
        for extra in sorted(d.iterdir()):
            if extra.name not in files:  # e.g. *.pdiparams.info written by jit.save
                extra.unlink()


def run_executor(model_dir: Path, family: str, x: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Run the saved model with paddle.static.load_inference_model; return logits and op types."""
    prefix = str(model_dir / "inference")

    def _run():
        exe = paddle.static.Executor(paddle.CPUPlace())
        prog, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
        if family == "pir":  # parameters appear as builtin.parameter ops; leave them out
            ops = [op.name() for op in prog.global_block().ops if op.name() != "builtin.parameter"]
        else:
            ops = [op.type for op in prog.global_block().ops]
        (y,) = exe.run(prog, feed={feeds[0]: x}, fetch_list=fetches)
        return np.asarray(y), ops, feeds

    if family == "pir":
        paddle.enable_static()
        try:
            y, ops, feeds = _run()
        finally:
            paddle.disable_static()
    else:
        with paddle.pir_utils.OldIrGuard():
            y, ops, feeds = _run()
    assert list(feeds) == [INPUT_NAME], feeds
    return y, ops


def run_predictor(model_dir: Path, family: str, x: np.ndarray) -> np.ndarray:
    from paddle import inference

    model_file, params_file = MODEL_FAMILIES[family]
    cfg = inference.Config(str(model_dir / model_file), str(model_dir / params_file))
    cfg.disable_gpu()
    cfg.disable_glog_info()
    cfg.set_cpu_math_library_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    pred = inference.create_predictor(cfg)
    h = pred.get_input_handle(pred.get_input_names()[0])
    h.reshape(list(x.shape))
    h.copy_from_cpu(x)
    pred.run()
    return pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()


def main(args: argparse.Namespace) -> None:
    paddle.set_device("cpu")
    model, acc = train(args)
    # BN running mean/variance are non-trainable parameters in Paddle
    n_train = int(sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient))
    n_stats = int(sum(int(np.prod(p.shape)) for p in model.parameters() if p.stop_gradient))
    print(f"float test top1 {acc * 100:.2f}%  trainable params {n_train}  bn running stats {n_stats}")
    export(model.state_dict(), args.out, args.head)

    xte, yte = load_demo_data("test")
    ref = predict(model, xte)
    info: dict = {
        "dataset": "fashion_mnist_subset.npz (test split, 2000 images)",
        "head": args.head,
        "recipe": {
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "max_lr": args.lr,
            "label_smoothing": args.label_smoothing,
            "seed": args.seed,
        },
        "input": {"name": INPUT_NAME, "shape": [-1, 1, 28, 28], "dtype": "float32"},
        "float_test_top1": round(acc * 100, 2),
        "trainable_params": n_train,
        "bn_running_stats": n_stats,
        "families": {},
    }
    for fam in MODEL_FAMILIES:
        d = args.out / f"model_{fam}"
        y_exe, ops = run_executor(d, fam, xte)
        y_pred = run_predictor(d, fam, xte)
        d_exe = float(np.abs(y_exe - ref).max())
        d_pred = float(np.abs(y_pred - ref).max())
        acc_exe = float((y_exe.argmax(1) == yte).mean()) * 100
        acc_pred = float((y_pred.argmax(1) == yte).mean()) * 100
        sizes = {p.name: p.stat().st_size for p in sorted(d.iterdir())}
        print(
            f"[{fam}] executor max|diff| {d_exe:.2e} top1 {acc_exe:.2f}%; "
            f"predictor max|diff| {d_pred:.2e} top1 {acc_pred:.2f}%; files {sizes}"
        )
        print(f"[{fam}] ops: {ops}")
        assert d_exe < 1e-4 and d_pred < 1e-4, (fam, d_exe, d_pred)
        info["families"][fam] = {
            "files": sizes,
            "ops": ops,
            "op_counts": dict(Counter(ops)),
            "executor_top1": round(acc_exe, 2),
            "predictor_top1": round(acc_pred, 2),
        }
    (args.out / "model_info.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"wrote {args.out / 'model_info.json'}")


if __name__ == "__main__":
    main(ARGS)
