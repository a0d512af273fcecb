"""Decoder LLMs in plain ``paddle.nn`` for weight-only quantization and export: the Llama (:mod:`.llama`) and
Gemma 3 (:mod:`.gemma3`) architectures with a KV cache and PIR export (shared layers in :mod:`.common`,
hyper-parameters in :mod:`.config`), read from GGUF files with their tokenizers (:mod:`.gguf_weights`; the
``[llm]`` extra: ``gguf``, ``tokenizers``)."""
