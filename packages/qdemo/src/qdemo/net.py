"""The demo CNN as a dygraph ``paddle.nn.Layer``, with the bundled trained weights.

Quantization-aware training needs the network as layers, not as an inference program.
:func:`load_demo_net` rebuilds the architecture ``demo/train.py`` trains (head ``'gap'``)
and loads the weights of the bundled inference model into it, so training can start from
the 86.0 % float model.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
import paddle
from paddle import nn

from qcore.errors import ModelFormatError
from qcore.graph import open_graph
from qcore.model_io import load_model

from . import demo_model_dir


class ConvBNReLU(nn.Layer):
    """conv (no bias) -> batch_norm -> optional relu."""

    def __init__(self, cin: int, cout: int, k: int = 3, groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2D(cin, cout, k, padding=k // 2, groups=groups, bias_attr=False)
        self.bn = nn.BatchNorm2D(cout)
        self.act = nn.ReLU() if act else None

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = self.bn(self.conv(x))
        return self.act(x) if self.act is not None else x


class DemoNet(nn.Layer):
    """conv-bn-relu -> pool -> conv-bn-relu -> [depthwise-bn-relu -> pointwise-bn] + skip -> relu
    -> pool -> conv-bn-relu -> head -> fc.

    head 'gap' (bundled): conv3 48->96, global average pool, fc 96->10.
    head 'flatten': conv3 48->32, flatten 32x7x7, fc 1568->10.
    """

    def __init__(self, num_classes: int = 10, head: str = "gap") -> None:
        super().__init__()
        self.head = head
        self.stem = ConvBNReLU(1, 16)
        self.pool1 = nn.MaxPool2D(2, 2)
        self.conv2 = ConvBNReLU(16, 48)
        self.dw = ConvBNReLU(48, 48, groups=48)
        self.pw = ConvBNReLU(48, 48, k=1, act=False)
        self.relu = nn.ReLU()
        self.pool2 = nn.MaxPool2D(2, 2)
        if head == "gap":
            self.conv3 = ConvBNReLU(48, 96)
            self.gap = nn.AdaptiveAvgPool2D(1)
            self.fc = nn.Linear(96, num_classes)
        else:
            self.conv3 = ConvBNReLU(48, 32)
            self.fc = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        x = self.conv2(self.pool1(self.stem(x)))
        x = self.relu(x + self.pw(self.dw(x)))
        x = self.conv3(self.pool2(x))
        if self.head == "gap":
            x = self.gap(x)
        return self.fc(paddle.flatten(x, 1))


_NAME = re.compile(r"^(?P<kind>.+)_(?P<index>\d+)\.(?P<suffix>[wb]_\d+)$")


def _slots(names: list[str]) -> dict[tuple[str, int, str], str]:
    """Key each parameter name by (layer kind, rank of its index within the kind, suffix).

    Paddle numbers parameters with a global counter per kind (``conv2d_5.w_0``), so two
    copies of one network differ only by an offset per kind; ranks line them up.
    """
    parsed = defaultdict(list)
    for name in names:
        m = _NAME.match(name)
        if m is None:
            raise ModelFormatError(f"unexpected parameter name {name!r} in the demo model")
        parsed[m["kind"]].append((int(m["index"]), m["suffix"], name))
    slots = {}
    for kind, entries in parsed.items():
        ranks = {index: r for r, index in enumerate(sorted({i for i, _, _ in entries}))}
        for index, suffix, name in entries:
            slots[(kind, ranks[index], suffix)] = name
    return slots


def load_demo_net(family: str = "pir") -> DemoNet:
    """A :class:`DemoNet` (head 'gap') holding the bundled model's trained weights, in eval mode."""
    model = load_model(demo_model_dir(family))
    net = DemoNet()
    ours = _slots([p.name for p in net.parameters()])
    theirs = _slots([n for n in open_graph(model).param_names() if n not in ("feed", "fetch")])
    if set(ours) != set(theirs):
        raise ModelFormatError("the bundled demo model does not match DemoNet; regenerate it with demo/train.py")
    by_name = {p.name: p for p in net.parameters()}
    for slot, name in ours.items():
        value = np.array(model.scope.find_var(theirs[slot]).get_tensor())
        by_name[name].set_value(value)
    net.eval()
    return net

