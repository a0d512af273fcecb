from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qcore.inference import predict
from qcore.model_io import find_model_files, load_model
from qdemo import demo_model_dir, load_demo_data


def test_data_splits_are_real_balanced_and_normalised():
    sizes = {"train": 6000, "calib": 1000, "test": 2000}
    for split, n in sizes.items():
        x, y = load_demo_data(split)
        assert x.shape == (n, 1, 28, 28) and x.dtype == np.float32
        assert np.bincount(y, minlength=10).tolist() == [n // 10] * 10
    x, _ = load_demo_data("test")
    assert abs(float(x.mean())) < 0.1 and 0.8 < float(x.std()) < 1.2  # normalised pixels
    assert len(np.unique(x[:50].round(3))) > 100  # real images, not a constant fill


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_bundled_model_reaches_its_recorded_accuracy(family):
    info = json.loads((Path(demo_model_dir(family)).parent / "model_info.json").read_text())
    x, y = load_demo_data("test")
    model = load_model(demo_model_dir(family))
    assert model.family == family
    logits = model.run({"image": x})[0]
    top1 = float((logits.argmax(1) == y).mean() * 100)
    assert abs(top1 - info["float_test_top1"]) <= 0.5
    deployed = predict(find_model_files(demo_model_dir(family)), {"image": x[:200]}, int8=False)[0]
    np.testing.assert_allclose(deployed, logits[:200], atol=1e-3)


def test_unknown_split_is_a_clear_error():
    with pytest.raises(Exception, match="did you mean 'test'"):
        load_demo_data("tst")


# Float top-1 of the bundled model on the 2000 test images, measured by demo/train.py
# (dygraph, executor and paddle.inference agree); see demo/README.md.
MEASURED_FLOAT_TOP1 = 86.0


def test_raw_splits_are_uint8_int64_and_disjoint():
    import qdemo as demo

    with np.load(demo.demo_assets_dir() / "fashion_mnist_subset.npz") as data:
        for split, n in {"train": 6000, "calib": 1000, "test": 2000}.items():
            assert data[f"{split}_images"].shape == (n, 28, 28) and data[f"{split}_images"].dtype == np.uint8
            assert data[f"{split}_labels"].dtype == np.int64
            assert len(np.unique(data[f"{split}_source_index"])) == n
        assert not set(data["train_source_index"]) & set(data["calib_source_index"])
    images, labels = demo.load_demo_raw("calib")
    x, y = load_demo_data("calib")
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(x[:, 0], (images / 255.0 - demo.PIXEL_MEAN) / demo.PIXEL_STD, atol=1e-5)


def _static_top1(family: str) -> tuple[float, list[str]]:
    import paddle

    x, y = load_demo_data("test")
    prefix = str(demo_model_dir(family) / "inference")

    def run():
        exe = paddle.static.Executor(paddle.CPUPlace())
        prog, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
        assert list(feeds) == ["image"]
        if family == "pir":
            ops = [op.name().split(".")[-1] for op in prog.global_block().ops]
        else:
            ops = [op.type for op in prog.global_block().ops]
        (logits,) = exe.run(prog, feed={"image": x}, fetch_list=fetches)
        return float((np.asarray(logits).argmax(1) == y).mean() * 100), ops

    if family == "legacy":
        with paddle.pir_utils.OldIrGuard():
            return run()
    paddle.enable_static()
    try:
        return run()
    finally:
        paddle.disable_static()


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_bundled_model_loads_with_paddle_static_and_keeps_bn(family):
    top1, ops = _static_top1(family)
    assert abs(top1 - MEASURED_FLOAT_TOP1) <= 0.5
    bn = "batch_norm_" if family == "pir" else "batch_norm"
    assert ops.count(bn) == 5  # batch norm not folded into the convs
    assert ops.count("depthwise_conv2d") == 1 and ops.count("conv2d") == 4
    assert ops.count("matmul" if family == "pir" else "matmul_v2") == 1


def test_recorded_accuracy_matches_measured():
    info = json.loads((demo_model_dir("pir").parent / "model_info.json").read_text())
    assert info["float_test_top1"] == pytest.approx(MEASURED_FLOAT_TOP1)
    assert info["trainable_params"] + info["bn_running_stats"] == 53258


def test_unknown_model_family_is_a_clear_error():
    with pytest.raises(Exception, match="did you mean 'legacy'"):
        demo_model_dir("legasy")


def test_demo_net_holds_the_bundled_weights():
    import paddle

    from qdemo.net import DemoNet, load_demo_net

    x, y = load_demo_data("test")
    net = load_demo_net("pir")
    assert isinstance(net, DemoNet) and not net.training
    with paddle.no_grad():
        logits = net(paddle.to_tensor(x[:500])).numpy()
    reference = load_model(demo_model_dir("legacy")).run({"image": x[:500]})[0]
    np.testing.assert_allclose(logits, reference, atol=1e-4)
