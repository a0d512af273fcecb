"""Benchmark-side pieces of the LLM benchmarks: where the real GGUF files are (:mod:`.models`), offline text
(:mod:`.text`), the check of the ports against ``transformers`` (``check_port.py``) and a test of that data
(``test_data.py``). The decoders themselves are :mod:`qptq.llm`. Extra requirements:
``benchmarks/requirements-llm.txt``."""
