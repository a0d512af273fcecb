"""``qcli ptq dynamic MODEL.gguf OUT.gguf``: an LLM checkpoint to a GGUF file for llama.cpp in one command, the
report naming the file, its size against float and each tensor's block type; the GenAI folders from a GGUF or a
PaddleNLP checkpoint directory; bad input is one line before any work and leaves nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gguf")

from qcli.main import main  # noqa: E402
from qdemo.testing import save_tiny_llama_gguf  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llm")
    source = save_tiny_llama_gguf(folder / "tiny.gguf")
    ids = np.random.default_rng(0).integers(3, 320, 2048)
    np.save(folder / "ids.npy", ids)
    return source, folder / "ids.npy"


def test_one_command_writes_a_q4_0_gguf_and_reports_it(checkpoint, tmp_path, capsys):
    source, ids = checkpoint
    out = tmp_path / "tiny-q4_0.gguf"
    code = main(["ptq", "dynamic", str(source), str(out), "--bits", "4", "--symmetric", "--algo", "gptq",
                 "--clip-search", "--embedding-bits", "8", "--data", str(ids)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((tmp_path / "tiny-q4_0.gguf.report.json").read_text())
    assert report["format"] == "gguf" and report["output"] == str(out) and out.is_file()
    assert report["sizes"]["file_bytes"] == out.stat().st_size
    # 4.5 bits a weight for the linears, 8.5 for the table, float32 norms: well under a fifth of float32
    assert 0.1 < report["sizes"]["ratio"] < 0.2
    # per layer: q and o 64x64, k and v 64x32 (2 KV heads of 16), gate, up and down 64x128
    assert report["weights_per_type"] == {"Q4_0": 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128), "Q8_0": 320 * 64}
    assert {layer["grid"] for layer in report["layers"] if layer["name"] != "embed_tokens"} == {"Q4_0"}
    assert report["verified"]["gguf_reader"] == "every tensor equals the simulation"
    if isinstance(report["verified"]["llama.cpp"], dict):  # llama-cpp-python installed: it ran the file
        assert report["verified"]["llama.cpp"]["top1_agreement"] >= 0.9
    assert f"quantized model: {out}" in printed and "14 tensors Q4_0; embed_tokens Q8_0" in printed


@pytest.mark.parametrize(("extra", "message"), [
    (["--bits", "4", "--group-size", "128"], "GGUF blocks hold 32 input channels, or 256 for the K-quants"),
    (["--bits", "4", "--group-size", "256"], "K-quant blocks of 256 do not divide the 64 input channels; use "
                                             "group_size_fallback='adjust'"),
    (["--bits", "6"], "weight_bits=6 is the K-quant Q6_K only; use group_size=256"),
    (["--format", "onnxruntime-genai", "--bits", "4", "--bits-for", "q4_k_m"], "--bits-for q4_k_m mixes GGUF block "
                                                                               "types; use it with --format gguf"),
    (["--bits", "4", "--backend", "onnxruntime"], "--format gguf names the LLM runtime: drop --backend"),
    (["--bits", "4", "--awq"], "awq=True divides each linear's input by scales a GGUF file cannot hold"),
    (["--bits", "4", "--algo", "gptq"], "algo='gptq' needs calibration data"),
    (["--bits", "4", "--algo", "gptq", "--data", "missing.txt"], "calibration data missing.txt: no such file"),
])
def test_bad_llm_options_are_one_line_before_any_work(checkpoint, tmp_path, capsys, extra, message):
    source, _ = checkpoint
    code = main(["ptq", "dynamic", str(source), str(tmp_path / "o.gguf"), *extra])
    assert code != 0 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_output_without_the_gguf_suffix_and_a_non_gguf_model_are_refused(checkpoint, tmp_path, capsys):
    source, _ = checkpoint
    assert main(["ptq", "dynamic", str(source), str(tmp_path / "out"), "--bits", "4"]) != 0
    assert "must end with .gguf" in capsys.readouterr().err
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    assert main(["ptq", "dynamic", str(not_gguf), str(tmp_path / "o.gguf"), "--bits", "4"]) != 0
    assert "is not a readable GGUF file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]


def test_one_command_writes_an_onnxruntime_genai_folder(checkpoint, tmp_path, capsys):
    source, ids = checkpoint
    out = tmp_path / "genai"
    code = main(["ptq", "dynamic", str(source), str(out), "--format", "onnxruntime-genai", "--bits", "4",
                 "--group-size", "32", "--algo", "gptq", "--embedding-bits", "8", "--data", str(ids)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert sorted(p.name for p in out.iterdir()) == ["genai_config.json", "model.onnx", "model.onnx.data",
                                                     "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert config["decoder"]["num_hidden_layers"] == 2 and config["decoder"]["num_key_value_heads"] == 2
    assert config["eos_token_id"] == 2 and config["bos_token_id"] == 1
    report = json.loads((tmp_path / "genai.report.json").read_text())
    assert report["weights_per_type"] == {"uint4": 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128), "uint8": 320 * 64}
    (runtime, check), = report["verified"].items()
    assert runtime in ("onnxruntime-genai", "onnxruntime (session)")
    # int8 activations per block (MatMulNBits accuracy level 4) against the float simulation: close, same tokens
    assert check["top1_agreement"] >= 0.9 and check["max_abs_diff_over_std"] < 0.5
    assert "an ONNX Runtime GenAI folder" in printed


def test_one_command_writes_an_openvino_genai_folder_the_pipeline_runs(checkpoint, tmp_path, capsys):
    pytest.importorskip("openvino_tokenizers")
    ovg = pytest.importorskip("openvino_genai")
    source, ids = checkpoint
    out = tmp_path / "ov"
    code = main(["ptq", "dynamic", str(source), str(out), "--format", "openvino-genai", "--bits", "4",
                 "--group-size", "32", "--algo", "gptq", "--embedding-bits", "8", "--data", str(ids)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml",
            "generation_config.json"} <= {p.name for p in out.iterdir()}
    report = json.loads((tmp_path / "ov.report.json").read_text())
    check = report["verified"]["openvino (stateful IR)"]
    assert check["top1_agreement"] >= 0.9 and check["max_abs_diff_over_std"] < 0.5
    # the pipeline runs it with no code of ours: the cache is state, the tokenizer is the folder's
    config = ovg.GenerationConfig()
    config.max_new_tokens, config.ignore_eos = 8, True
    result = ovg.LLMPipeline(str(out), "CPU").generate(["w1 w2 w3"], config)
    assert len(result.texts) == 1 and result.texts[0]
    assert "an OpenVINO GenAI folder" in printed


def test_a_per_tensor_rule_of_the_users_sets_the_block_types(checkpoint, tmp_path, capsys):
    source, _ = checkpoint
    out = tmp_path / "mix.gguf"
    code = main(["ptq", "dynamic", str(source), str(out), "--bits", "4", "--symmetric",
                 "--bits-for", r"attn\.v_proj|mlp\.down_proj=8"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "mix.gguf.report.json").read_text())
    grids = {layer["name"]: layer["grid"] for layer in report["layers"]}
    assert {n for n, g in grids.items() if g == "Q8_0"} == {f"layers.{i}.{p}" for i in range(2)
                                                             for p in ("attn.v_proj", "mlp.down_proj")}
    # v 64x32 and down 128x64 per layer in Q8_0, the other linears Q4_0
    assert report["weights_per_type"] == {"Q8_0": 2 * (64 * 32 + 128 * 64),
                                          "Q4_0": 2 * (2 * 64 * 64 + 64 * 32 + 2 * 64 * 128)}


def test_the_q4_k_m_mix_falls_back_as_llama_cpp_does_where_256_does_not_divide(checkpoint, tmp_path, capsys):
    source, _ = checkpoint  # every width 64 or 128: no K-quant fits, as on SmolLM2's 576-wide rows
    out = tmp_path / "mix.gguf"
    code = main(["ptq", "dynamic", str(source), str(out), "--bits-for", "q4_k_m"])  # --bits 4 by default
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "mix.gguf.report.json").read_text())
    chosen = report["weight_only"]
    assert (chosen["bits"], chosen["group_size"], chosen["embedding_bits"]) == (4, 256, 6)
    grids = {layer["name"]: layer["grid"] for layer in report["layers"]}
    # Q4_K -> Q5_0; Q6_K (layer 1's v and down of 2 layers, and the table) -> Q8_0
    assert {n for n, g in grids.items() if g == "Q8_0"} == {"layers.1.attn.v_proj", "layers.1.mlp.down_proj",
                                                             "embed_tokens"}
    assert set(grids.values()) == {"Q5_0", "Q8_0"}


@pytest.mark.parametrize(("rule", "message"), [
    ("v_proj=3", "bits_by_name['v_proj']=3 is not supported"),
    ("v_proj(=8", "bits_by_name pattern 'v_proj(' is not a regular expression"),
    ("v_proj", "--bits-for 'v_proj' is not PATTERN=BITS"),
])
def test_a_bad_per_tensor_rule_is_one_line(checkpoint, tmp_path, capsys, rule, message):
    source, _ = checkpoint
    assert main(["ptq", "dynamic", str(source), str(tmp_path / "o.gguf"), "--bits", "4", "--bits-for", rule]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists()


@pytest.fixture(scope="module")
def paddlenlp_checkpoint(tmp_path_factory):
    pytest.importorskip("safetensors")
    from qdemo.testing import save_tiny_paddlenlp_checkpoint

    folder = tmp_path_factory.mktemp("paddlenlp")
    directory = save_tiny_paddlenlp_checkpoint(folder / "qwen2", "qwen2", "bfloat16", "safetensors", shards=2)
    (folder / "calib.txt").write_text("the cat sat on the mat and the dog ran to the tree " * 200)
    return directory, folder / "calib.txt"


@pytest.mark.parametrize("fmt", ["onnxruntime-genai", "openvino-genai"])
def test_one_command_quantizes_a_paddlenlp_checkpoint_directory(paddlenlp_checkpoint, tmp_path, capsys, fmt):
    if fmt == "openvino-genai":
        pytest.importorskip("openvino_tokenizers")
    directory, text = paddlenlp_checkpoint
    out = tmp_path / "out"
    code = main(["ptq", "dynamic", str(directory), str(out), "--format", fmt, "--bits", "4", "--group-size", "32",
                 "--algo", "gptq", "--data", str(text)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert report["architecture"] == "qwen2" and report["model"] == str(directory)
    # per layer: q and o 64x64, k and v 64x32, gate, up and down 64x128; the tied table stays float
    assert report["weights_per_type"] == {"uint4": 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)}
    (check,) = report["verified"].values()
    assert check["top1_agreement"] >= 0.9 and check["max_abs_diff_over_std"] < 0.5
    assert f"quantized model: {out}" in printed and "qwen2" in printed


@pytest.mark.parametrize(("extra", "message"), [
    ([], "is a checkpoint directory: say what to write with --format onnxruntime-genai or --format openvino-genai"),
    (["--format", "gguf"], "format='gguf' copies its metadata and tokenizer from a GGUF source"),
])
def test_a_checkpoint_directory_without_a_folder_format_is_one_line(paddlenlp_checkpoint, tmp_path, capsys, extra,
                                                                     message):
    directory, _ = paddlenlp_checkpoint
    assert main(["ptq", "dynamic", str(directory), str(tmp_path / "o.gguf"), "--bits", "4", *extra]) != 0
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
