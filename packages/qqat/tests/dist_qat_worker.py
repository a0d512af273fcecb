"""One rank of the data-parallel QAT tests (test_distributed_qqat.py); also runs alone as the reference.

``python dist_qat_worker.py OUT``: under ``paddle.distributed.launch`` each rank trains a
``paddle.DataParallel`` QAT model on its half of every global batch; run directly (one process)
it trains the same model on the whole global batches. It writes every case's state dict
(``<case>_rank<r>.npz``), rank 0's shared export (``<case>/``), each rank's own export
(``<case>_own<r>/``) and the errors of the bad-input cases (``errors_rank<r>.json``).
Not collected by pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import nn

from qcore.errors import QuantError
from qdemo import load_demo_data
from qqat import QAT

GLOBAL_BATCH, STEPS = 16, 4
SPEC = [paddle.static.InputSpec([None, 1, 28, 28], "float32", "image")]
# case -> (config, learning rate, export?); lr 0 trains only the quantizers' state
CASES = {
    "moving": ({"activation_quantize_type": "moving_average_abs_max"}, 0.05, True),
    "moving_frozen": ({"activation_quantize_type": "moving_average_abs_max"}, 0.0, True),
    "range_frozen": ({"activation_quantize_type": "range_abs_max", "window_size": 3}, 0.0, False),
    "abs_max_frozen": ({"activation_quantize_type": "abs_max", "weight_quantize_type": "abs_max"}, 0.0, False),
    "pact": ({"activation_preprocess_type": "PACT"}, 0.05, False),
    "pact_frozen": ({"activation_preprocess_type": "PACT"}, 0.0, True),
}


class Net(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2D(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2D(4, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = nn.functional.relu(self.conv2(nn.functional.relu(self.conv1(x))))
        return self.fc(paddle.flatten(y, 1))


class BNNet(Net):
    """Net with a batch norm after conv1: its running statistics stay per rank under DataParallel."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2D(4)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = nn.functional.relu(self.conv2(nn.functional.relu(self.bn(self.conv1(x)))))
        return self.fc(paddle.flatten(y, 1))


def build(cls: type[Net] = Net) -> Net:
    paddle.seed(0)
    return cls()


def train(model: Net, net: nn.Layer, lr: float, images, labels, rank: int, share: int) -> None:
    opt = paddle.optimizer.SGD(learning_rate=lr, parameters=model.parameters())
    model.train()
    for step in range(STEPS):
        lo = step * GLOBAL_BATCH + rank * share
        x, y = paddle.to_tensor(images[lo:lo + share]), paddle.to_tensor(labels[lo:lo + share])
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels = load_demo_data("train")
    share = GLOBAL_BATCH // world
    for case, (config, lr, export) in CASES.items():
        qat = QAT(config)
        model = qat.quantize(build())
        net = paddle.DataParallel(model) if world > 1 else model
        train(model, net, lr, images, labels, rank, share)
        np.savez(out / f"{case}_rank{rank}.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
        if export:
            qat.save_quantized_model(net, out / case / "model", SPEC)  # rank 0 writes, the others wait
            # what this rank would have written (each process's second export: the same names on every rank)
            QAT(config, distributed=False).save_quantized_model(net, out / f"{case}_own{rank}" / "model", SPEC)
    errors = {}
    if world > 1:  # batch-norm statistics differ per rank: the export comparison warns, rank 0's is saved
        qat = QAT()
        model = qat.quantize(build(BNNet))
        train(model, paddle.DataParallel(model), 0.0, images, labels, rank, share)
        qat.save_quantized_model(model, out / "bn" / "model", SPEC)
        try:
            QAT().quantize(paddle.DataParallel(build()))
        except QuantError as exc:
            errors["reverse_order"] = str(exc)
        try:
            QAT({"activation_bits": 8 if rank == 0 else 7}).quantize(build())
        except QuantError as exc:
            errors["mismatch"] = f"{type(exc).__name__}: {exc}"
        other = build()
        if rank == 1:
            other.extra = nn.Linear(2, 2)  # a layer rank 0 does not have
        try:
            QAT().quantize(other)
        except QuantError as exc:
            errors["other_model"] = f"{type(exc).__name__}: {exc}"
    (out / f"errors_rank{rank}.json").write_text(json.dumps(errors))


if __name__ == "__main__":
    main()
