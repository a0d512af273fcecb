"""PostTrainingQuantization and quant_post_static build one frozen, validated PTQConfig of groups."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest

from qcore.config import QuantConfig
from qcore.errors import ConfigError
from qptq import PostTrainingQuantization, quant_post_static
from qptq.config import CalibrationConfig, TargetConfig

# PaddleSlim's positional order, which callers rely on; q*'s additions follow.
PTQ_POSITIONAL = [
    "executor", "sample_generator", "model_dir", "model_filename", "params_filename", "batch_generator",
    "data_loader", "batch_size", "batch_nums", "scope", "algo", "hist_percent", "quantizable_op_type",
    "is_full_quantize", "weight_bits", "activation_bits", "activation_quantize_type", "weight_quantize_type",
    "optimize_model", "is_use_cache_file", "cache_dir", "skip_patterns", "bias_correction", "onednn_fallback",
    "residual_add", "progress",
]
STATIC_POSITIONAL = [
    "executor", "model_dir", "quantize_model_path", "batch_generator", "sample_generator", "model_filename",
    "params_filename", "save_model_filename", "save_params_filename", "batch_size", "batch_nums", "scope", "algo",
    "quantizable_op_type", "is_full_quantize", "weight_bits", "activation_bits", "activation_quantize_type",
    "weight_quantize_type", "optimize_model", "is_use_cache_file", "cache_dir",
]


def _positional(function):
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "self"]


def test_public_signatures_keep_their_order_and_agree():
    assert _positional(PostTrainingQuantization.__init__) == PTQ_POSITIONAL
    assert _positional(quant_post_static) == STATIC_POSITIONAL
    outputs = {"quantize_model_path", "save_model_filename", "save_params_filename"}
    assert set(inspect.signature(PostTrainingQuantization.__init__).parameters) - {"self"} == set(
        inspect.signature(quant_post_static).parameters) - outputs  # every keyword reaches the class
    defaults = inspect.signature(PostTrainingQuantization.__init__).parameters
    assert defaults["batch_size"].default == 10 and inspect.signature(quant_post_static).parameters[
        "batch_size"].default == 16  # the seeds' defaults differ; each signature keeps its own
    saves = inspect.signature(quant_post_static).parameters  # the seeds' documented names (they follow the input)
    assert (saves["save_model_filename"].default, saves["save_params_filename"].default) == ("__model__", "__params__")


def test_config_is_built_once_frozen_and_normalized(tiny_model, tiny_input):
    directory, kwargs = tiny_model
    ptq = PostTrainingQuantization(sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs,
                                   algo="direct", deploy_backend="mkldnn", is_full_quantize=True,
                                   skip_tensor_list=["x"])
    config = ptq.config
    assert isinstance(config.target, TargetConfig) and isinstance(config.calibration, CalibrationConfig)
    deployment = config.target.deployment
    assert (config.calibration.algo, deployment.name, deployment.target.name) == ("abs_max", "onednn", "onednn")
    assert config.target.op_types == QuantConfig(is_full_quantize=True).effective_op_types  # one rule for both
    assert config.target.skip_tensors == frozenset({"x"}) and config.budget is None
    assert not hasattr(ptq, "algo")  # settings are read from their group, not forwarded
    for frozen in (config, config.calibration, config.target):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.budget = None
    again = PostTrainingQuantization.from_config(config)
    assert again.config is config and again.model is not ptq.model


def test_ignored_keywords_warn_at_the_callers_line(tiny_model, tiny_input, tmp_path):
    directory, kwargs = tiny_model
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults warn about nothing
        PostTrainingQuantization(sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs)
    with pytest.warns(UserWarning, match=r"ignores scope .* and activation_quantize_type='abs_max'") as caught:
        PostTrainingQuantization(sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs,
                                 scope=object(), activation_quantize_type="abs_max")
    with pytest.warns(UserWarning, match="ignores scope") as caught_static:
        quant_post_static(None, directory, tmp_path / "int8", sample_generator=lambda: iter(tiny_input),
                          scope=object(), **kwargs)
    assert caught[0].filename == caught_static[0].filename == __file__
    with pytest.raises(ConfigError, match="activation_quantize_type='moving'"):
        PostTrainingQuantization(sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs,
                                 activation_quantize_type="moving")
