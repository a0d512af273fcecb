"""QAT from an inference model, distilled from the float model (issue 31 item 5: PaddleSlim 2.6's
quant_aware_with_infermodel / export_quant_infermodel)."""

from __future__ import annotations

import hashlib

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, DataError
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model
from qdemo import demo_model_dir, load_demo_data
from qqat import config as qqat_config
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
    ({"model_path_prefix": PREFIX, "use_pact": 1}, r"train_config\['use_pact'\]=1 is not valid; use True or False"),
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


@pytest.mark.parametrize("onnx_format", [True, False])
def test_paddleslim26_quant_config_keys_are_accepted_with_their_meaning(tmp_path, caplog, monkeypatch, onnx_format):
    """PaddleSlim 2.6's own test_quant_aware_with_infermodel.py passes onnx_format=False: the script finishes, the
    one form written here is written, and one warning line (once per process) says why Paddle 2's is not."""
    monkeypatch.setattr(qqat_config, "_warned", set())
    exe = paddle.static.Executor(paddle.CPUPlace())
    x, _ = load_demo_data("calib")
    train = {"model_path_prefix": PREFIX, "max_iter": 2, "save_iter_step": 2,
             "quant_model_ckpt_path": str(tmp_path / "ckpt")}
    config = {**SLIM26_CONFIG, "onnx_format": onnx_format}
    with caplog.at_level("WARNING"):
        quant_aware_with_infermodel(exe, paddle.CPUPlace(), train_reader=lambda: ({"image": x[i:i + 16]}
                                                                                   for i in range(0, 64, 16)),
                                    quant_config=config, train_config=train)
        export_quant_infermodel(exe, paddle.CPUPlace(), quant_config=config, train_config=train,
                                checkpoint_path=tmp_path / "ckpt" / "epoch_0_iter_1",
                                export_inference_model_path_prefix=str(tmp_path / "out" / "model"))
    program = (tmp_path / "out" / "model.pdmodel").read_bytes()
    assert b"quantize_linear" in program and b"fake_quantize" not in program  # onnx_format=True's QDQ form
    warned = [r.getMessage() for r in caplog.records if "onnx_format" in r.getMessage()]
    assert warned == ([] if onnx_format else [qqat_config.ONNX_FORMAT_FALSE])  # four config reads, one line
    assert "OpenVINO's Paddle reader has no converter" in qqat_config.ONNX_FORMAT_FALSE
    with pytest.raises(ConfigError, match="has no PACT alpha 'image@pact0': it was trained without use_pact"):
        export_quant_infermodel(exe, paddle.CPUPlace(), quant_config=config, train_config={**train, "use_pact": True},
                                checkpoint_path=tmp_path / "ckpt" / "epoch_0_iter_1",
                                export_inference_model_path_prefix=str(tmp_path / "out2" / "model"))
    caplog.clear()
    with caplog.at_level("WARNING"):
        quant_aware(_tiny_legacy_program(), paddle.CPUPlace(), {**SLIM26_CONFIG, "scale_trainable": False},
                    for_test=True)
    assert "config['scale_trainable']=False has no effect here" in caplog.text
    for bad, message in [({"onnx_format": "no"}, "onnx_format='no' is not supported"),
                         ({"deploy_backend": "arm"}, "arm"), ({"quant_post_first": 1}, "quant_post_first")]:
        with pytest.raises(ConfigError, match=message):
            convert(_tiny_legacy_program(), paddle.CPUPlace(), {**SLIM26_CONFIG, **bad})


def test_use_pact_learns_a_clip_bound_per_activation_and_exports_without_idle_clips(tmp_path):
    """train_config['use_pact']: each quantized activation is clipped to [-alpha, alpha] before its quantizer,
    alpha starts at the float tensor's abs max on the first batch, trains, is checkpointed, and the export keeps
    a clip only where it changes an output."""
    exe = paddle.static.Executor(paddle.CPUPlace())
    x, _ = load_demo_data("calib")
    tx, ty = load_demo_data("test")
    tx, ty = tx[:1000], ty[:1000]
    lr = 1e-3
    scope = paddle.static.Scope()
    alphas: list[dict[str, float]] = []
    tests = []

    def record(program, feeds, fetches, name):
        names = sorted(v.name for v in program.list_vars() if v.persistable and "@pact" in v.name)
        alphas.append({n: float(np.array(scope.find_var(n).get_tensor())[0]) for n in names})
        tests.append((program, feeds, fetches))

    config = {"model_path_prefix": PREFIX, "use_pact": True, "save_iter_step": 1, "learning_rate": lr,
              "quant_model_ckpt_path": str(tmp_path / "ckpt")}
    quant_aware_with_infermodel(exe, paddle.CPUPlace(), scope=scope, train_config=config, test_callback=record,
                                train_reader=lambda: ({"image": x[i:i + 32]} for i in range(0, 640, 32)))
    test, feeds, fetches = tests[-1]
    types = [op.type for op in test.global_block().ops]
    quantizers = [op for op in test.global_block().ops if op.type == "fake_quantize_dequantize_moving_average_abs_max"]
    assert len(alphas) == 20 and len(alphas[0]) == len(quantizers) == types.count("elementwise_min") == 6
    assert sorted(op.input("X")[0] for op in quantizers) == sorted(f"{n}.out" for n in alphas[0])  # clip, quantize
    # alpha starts at the float model's abs max of its tensor on the first batch: one Adam step (<= lr) away
    float_scope = paddle.static.Scope()
    with paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(float_scope):
        program, _, _ = paddle.static.load_inference_model(PREFIX, exe)
        sources = sorted({n.rsplit("@pact", 1)[0] for n in alphas[0]})
        first = dict(zip(sources, exe.run(program, feed={"image": x[:32]}, fetch_list=sources)))
    for name, value in alphas[0].items():
        assert abs(value - np.abs(first[name.rsplit("@pact", 1)[0]]).max()) <= 1.01 * lr, name
    moved = {n: abs(alphas[-1][n] - alphas[0][n]) for n in alphas[0]}
    assert sum(m > 2 * lr for m in moved.values()) >= 4, moved  # trained: Adam moves each by <= lr a step
    assert len({tuple(a.values()) for a in alphas}) > 10  # and keep moving
    saved = paddle.static.load_program_state(str(tmp_path / "ckpt" / "epoch_0_iter_19"))
    assert {n: float(saved[n][0]) for n in alphas[-1]} == pytest.approx(alphas[-1])
    # the test program clips at the learned bounds, and on unseen data the clip changes something
    with paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(scope):
        outs = exe.run(test, feed={feeds[0]: tx}, fetch_list=[*(f"{n}.out" for n in alphas[-1]), *sources,
                                                              *fetches])
    clipped = dict(zip(alphas[-1], outs))
    source_values = dict(zip(sources, outs[len(clipped):]))
    changed = 0
    for name, out in clipped.items():
        source = source_values[name.rsplit("@pact", 1)[0]]
        bound = alphas[-1][name]
        np.testing.assert_allclose(out, np.clip(source, -bound, bound), rtol=1e-6, atol=1e-6)
        changed += bool((np.abs(source) > bound).any())
    assert changed >= 1
    qat_top1 = float((outs[-1].argmax(1) == ty).mean())
    export_quant_infermodel(exe, paddle.CPUPlace(), train_config=config, checkpoint_path=tmp_path / "ckpt" /
                            "epoch_0_iter_19", export_inference_model_path_prefix=str(tmp_path / "out" / "model"))
    files = find_model_files(tmp_path / "out")
    exported = load_model(files)
    ops = exported.program.global_block().ops
    kept = [op for op in ops if op.type == "clip"]
    assert "elementwise_min" not in [op.type for op in ops] and len(kept) < len(quantizers)  # idle clips dropped
    for op in kept:  # each kept clip is read in float (an op the target keeps float) or with a larger threshold
        readers = [r for r in ops if op.output("Out")[0] in r.input_arg_names]
        assert any(r.type != "quantize_linear" or np.array(exported.scope.find_var(r.input("Scale")[0])
                                                             .get_tensor()).max() > op.attr("max") for r in readers)
    float_top1 = float((load_model(demo_model_dir("legacy")).run({"image": tx})[0].argmax(1) == ty).mean())
    deployed = float((predict(files, {"image": tx})[0].argmax(1) == ty).mean())  # oneDNN int8
    assert abs(deployed - qat_top1) <= 0.01 and deployed >= float_top1 - 0.015, (deployed, qat_top1, float_top1)
    with pytest.raises(ConfigError, match=r"was trained with train_config\['use_pact'\]=True"):
        export_quant_infermodel(exe, paddle.CPUPlace(), train_config={**config, "use_pact": False},
                                checkpoint_path=tmp_path / "ckpt" / "epoch_0_iter_19",
                                export_inference_model_path_prefix=str(tmp_path / "out2" / "model"))


def _tiny_legacy_program():
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            paddle.static.nn.conv2d(paddle.static.data(name="image", shape=[None, 1, 8, 8], dtype="float32"), 4, 3)
    return main
