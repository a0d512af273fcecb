"""Real decoder LLMs for the weight-only benchmarks: GGUF weights and tokenizers (:mod:`.gguf_weights`), the
Llama (SmolLM2) and Gemma 3 ports in ``paddle.nn`` (:mod:`.llama`, :mod:`.gemma3`; shared layers, KV cache and PIR
export in :mod:`.common`), offline text (:mod:`.text`), the check against ``transformers`` (``check_port.py``).
Benchmark-side only: no package under ``packages/`` imports it. Extra requirements:
``benchmarks/requirements-llm.txt``."""
