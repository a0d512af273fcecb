"""Real decoder LLMs for the weight-only benchmarks: GGUF weights (:mod:`.gguf_weights`), the Llama port in
``paddle.nn`` with a KV cache and PIR export (:mod:`.llama`), offline text (:mod:`.text`). Benchmark-side
only: no package under ``packages/`` imports it. Extra requirements: ``benchmarks/requirements-llm.txt``."""
