"""QAT from an inference model, distilled from the float model (issue 31 item 5: PaddleSlim 2.6's
quant_aware_with_infermodel / export_quant_infermodel)."""

from __future__ import annotations

import hashlib

import paddle
import pytest

from qcore.errors import ConfigError, DataError
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model
from qdemo import demo_model_dir, load_demo_data
from qqat import convert, export_quant_infermodel, quant_aware, quant_aware_with_infermodel

PREFIX = str(demo_model_dir("legacy") / "inference")


@pytest.fixture(autouse=True)
def _static():
    paddle.enable_static()
    yield
    paddle.disable_static()


def _digest() -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(demo_model_dir("legacy").iterdir()))).hexdigest()


def test_qat_from_the_inference_model_checkpoints_exports_and_keeps_accuracy(tmp_path):
    before = _digest()
    exe = paddle.static.Executor(paddle.CPUPlace())
    x, _ = load_demo_data("calib")
    tx, ty = load_demo_data("test")
    tx, ty = tx[:1000], ty[:1000]
    calls = []

    def reader():
        for i in range(0, 640, 32):  # 20 batches an epoch
            yield {"image": x[i : i + 32]}

    def callback(program, feeds, fetches, name):
        logits = exe.run(program, feed={feeds[0]: tx}, fetch_list=fetches)[0]
        calls.append((name, float((logits.argmax(1) == ty).mean())))

    config = {"model_path_prefix": PREFIX, "num_epoch": 2, "save_iter_step": 10, "learning_rate": 1e-5,
              "quant_model_ckpt_path": str(tmp_path / "ckpt")}
    quant_aware_with_infermodel(exe, paddle.CPUPlace(), train_reader=reader, train_config=config,
                                test_callback=callback)
    assert [name for name, _ in calls] == ["epoch_0_iter_9", "epoch_0_iter_19", "epoch_1_iter_9", "epoch_1_iter_19"]
    assert all((tmp_path / "ckpt" / f"{name}.pdparams").is_file() for name, _ in calls)
    export_quant_infermodel(exe, paddle.CPUPlace(), train_config=config,
                            checkpoint_path=tmp_path / "ckpt" / calls[-1][0],
                            export_inference_model_path_prefix=str(tmp_path / "out" / "model"))
    files = find_model_files(tmp_path / "out")
    assert files.model_file.name == "model.pdmodel" and files.params_file.name == "model.pdiparams"
    program = files.model_file.read_bytes()
    assert b"quantize_linear" in program and b"fake_quantize" not in program  # converted: PTQ's deployable form
    float_top1 = float((load_model(demo_model_dir("legacy")).run({"image": tx})[0].argmax(1) == ty).mean())
    deployed = float((predict(files, {"image": tx})[0].argmax(1) == ty).mean())  # oneDNN int8
    assert deployed >= float_top1 - 0.01, (deployed, float_top1)
    assert abs(deployed - calls[-1][1]) <= 0.01  # what the checkpoint's test program measured
    max_iter = {**config, "max_iter": 5, "save_iter_step": 2, "quant_model_ckpt_path": str(tmp_path / "ckpt5")}
    quant_aware_with_infermodel(exe, paddle.CPUPlace(), train_reader=reader, train_config=max_iter)
    assert sorted(p.name for p in (tmp_path / "ckpt5").glob("*.pdparams")) == [
        "epoch_0_iter_1.pdparams", "epoch_0_iter_3.pdparams"]  # stopped after 5 iterations
    assert _digest() == before  # the input model is never modified


@pytest.mark.parametrize(("config", "message"), [
    ({}, "train_config must be a dict with at least 'model_path_prefix'"),
    ({"model_path_prefix": PREFIX, "num_epochs": 2},
     r"unknown train_config key 'num_epochs' \(did you mean 'num_epoch'"),
    ({"model_path_prefix": PREFIX, "use_pact": True}, "use_pact.*is not supported"),
    ({"model_path_prefix": PREFIX, "save_iter_step": 0}, r"train_config\['save_iter_step'\]=0 is not valid"),
    ({"model_path_prefix": PREFIX, "learning_rate": -1}, r"learning_rate'\]=-1 is not valid"),
])
def test_bad_train_config_is_one_line(config, message):
    exe = paddle.static.Executor(paddle.CPUPlace())
    with pytest.raises(ConfigError, match=message):
        quant_aware_with_infermodel(exe, paddle.CPUPlace(), train_reader=lambda: iter([]), train_config=config)


def test_bad_paths_and_nodes_are_one_line(tmp_path):
    exe = paddle.static.Executor(paddle.CPUPlace())
    pir = str(demo_model_dir("pir") / "inference")
    with pytest.raises(DataError, match="a PIR model: QAT from an inference model needs a legacy .pdmodel"):
        quant_aware_with_infermodel(exe, None, train_reader=lambda: iter([]), train_config={"model_path_prefix": pir})
    with pytest.raises(ConfigError, match="'nope', which is not a tensor of the model"):
        quant_aware_with_infermodel(exe, None, train_reader=lambda: iter([]),
                                    train_config={"model_path_prefix": PREFIX, "node": "nope"})
    with pytest.raises(DataError, match="checkpoint .*missing.pdparams does not exist"):
        export_quant_infermodel(exe, None, train_config={"model_path_prefix": PREFIX},
                                checkpoint_path=tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []  # nothing written


#: PaddleSlim 2.6's quant_aware config as its scripts pass it whole (quanter._quant_config_default's keys)
SLIM26_CONFIG = {
    "weight_quantize_type": "channel_wise_abs_max", "activation_quantize_type": "moving_average_abs_max",
    "weight_bits": 8, "activation_bits": 8, "not_quant_pattern": ["skip_quant"],
    "quantize_op_types": ["conv2d", "depthwise_conv2d", "mul"], "dtype": "int8", "window_size": 10000,
    "moving_rate": 0.9, "for_tensorrt": False, "is_full_quantize": False, "onnx_format": True,
    "quant_post_first": False, "scale_trainable": True, "deploy_backend": "mkldnn",
}


def test_paddleslim26_quant_config_keys_are_accepted_with_their_meaning(tmp_path, caplog):
    exe = paddle.static.Executor(paddle.CPUPlace())
    x, _ = load_demo_data("calib")
    train = {"model_path_prefix": PREFIX, "max_iter": 2, "save_iter_step": 2,
             "quant_model_ckpt_path": str(tmp_path / "ckpt")}
    quant_aware_with_infermodel(exe, paddle.CPUPlace(), train_reader=lambda: ({"image": x[i:i + 16]}
                                                                               for i in range(0, 64, 16)),
                                quant_config=SLIM26_CONFIG, train_config=train)
    export_quant_infermodel(exe, paddle.CPUPlace(), quant_config=SLIM26_CONFIG, train_config=train,
                            checkpoint_path=tmp_path / "ckpt" / "epoch_0_iter_1",
                            export_inference_model_path_prefix=str(tmp_path / "out" / "model"))
    program = (tmp_path / "out" / "model.pdmodel").read_bytes()
    assert b"quantize_linear" in program and b"fake_quantize" not in program  # onnx_format=True's QDQ form
    with caplog.at_level("WARNING"):
        quant_aware(_tiny_legacy_program(), paddle.CPUPlace(), {**SLIM26_CONFIG, "scale_trainable": False},
                    for_test=True)
    assert "config['scale_trainable']=False has no effect here" in caplog.text
    for bad, message in [({"onnx_format": False}, "onnx_format=False is not supported"),
                         ({"deploy_backend": "arm"}, "arm"), ({"quant_post_first": 1}, "quant_post_first")]:
        with pytest.raises(ConfigError, match=message):
            convert(_tiny_legacy_program(), paddle.CPUPlace(), {**SLIM26_CONFIG, **bad})


def _tiny_legacy_program():
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            paddle.static.nn.conv2d(paddle.static.data(name="image", shape=[None, 1, 8, 8], dtype="float32"), 4, 3)
    return main
