"""Check a Paddle decoder port (``--model smollm2``: Llama, ``gemma3``: Gemma 3) against Hugging Face
``transformers``' GGUF loader on the same file.

Runs in the Paddle environment; the reference side runs in a separate torch environment (torch and Paddle are
kept apart), started as a subprocess of this script:

    python -m venv /work/venv-llm-ref
    /work/venv-llm-ref/bin/pip install torch==2.13.0 transformers accelerate gguf==0.19.0
    python benchmarks/decoders/check_port.py --reference-python /work/venv-llm-ref/bin/python
    python benchmarks/decoders/check_port.py --model gemma3

Prints, per prompt, the max relative error of the logits (``max |paddle - hf| / max |hf|``) and whether every
position's argmax agrees, whether both tokenizers give the same ids, and both greedy continuations of the first
prompt. The prompts are short ones plus the start of the evaluation text (:mod:`decoders.text`): 1,500
characters for SmolLM2, 3,000 (over 512 tokens: beyond Gemma's sliding window) for Gemma 3.
Exits 1 when an error exceeds ``--tolerance`` (1e-3).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "In 2024, 12345 people paid $3.50 each.",
]
NEW_TOKENS = 24
LONG_CHARS = {"smollm2": 1500, "gemma3": 3000}  # of the evaluation text (decoders.text), the last prompt


def hf_reference(gguf: Path, prompts: list[str], ids: list[list[int]], out: Path) -> None:
    """Reference side (torch environment): logits of ``ids``, HF's token ids of ``prompts``, greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    arrays = {}
    with torch.no_grad():
        for i, seq in enumerate(ids):
            arrays[f"logits_{i}"] = model(torch.tensor([seq])).logits[0].numpy()
            arrays[f"hf_ids_{i}"] = np.array(tok(prompts[i])["input_ids"])  # with BOS when the file asks
        gen = model.generate(torch.tensor([ids[0]]), max_new_tokens=NEW_TOKENS, do_sample=False)
    arrays["greedy"] = gen[0, len(ids[0]):].numpy()
    np.savez(out, **arrays)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    ap.add_argument("--gguf", type=Path, help="GGUF file (default: the --model's from its package)")
    ap.add_argument("--reference-python", default="/work/venv-llm-ref/bin/python",
                    help="python of the environment that has torch and transformers")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--hf-dump", type=Path, help=argparse.SUPPRESS)  # internal: run the reference side
    ap.add_argument("--inputs", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from decoders.models import gemma3_gguf, smollm2_gguf

    gguf = args.gguf or {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}[args.model]()
    if args.hf_dump:
        inputs = json.loads(args.inputs.read_text())
        hf_reference(gguf, inputs["prompts"], inputs["ids"], args.hf_dump)
        return 0

    import paddle

    from decoders.text import evaluation_text
    from qptq.llm import gemma3, llama
    from qptq.llm.common import generate

    paddle.set_device("cpu")
    model, tok = {"smollm2": llama.load_gguf, "gemma3": gemma3.load_gguf}[args.model](gguf)
    prompts = PROMPTS + [evaluation_text()[:LONG_CHARS[args.model]]]  # hundreds of tokens: rotary angles far from 0
    ids = [tok.encode(p).ids for p in prompts]
    with tempfile.TemporaryDirectory() as tmp:
        dump, inputs = Path(tmp) / "hf.npz", Path(tmp) / "inputs.json"
        inputs.write_text(json.dumps({"prompts": prompts, "ids": ids}))
        subprocess.run([args.reference_python, __file__, "--gguf", str(gguf), "--hf-dump", str(dump),
                        "--inputs", str(inputs)], check=True)
        ref = dict(np.load(dump))
    worst = 0.0
    with paddle.no_grad():
        for i, seq in enumerate(ids):
            ours = model(paddle.to_tensor([seq], dtype="int64"))[0][0].numpy()
            theirs = ref[f"logits_{i}"]
            rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
            worst = max(worst, rel)
            same_ids = ref[f"hf_ids_{i}"].tolist() == seq
            agree = bool((ours.argmax(-1) == theirs.argmax(-1)).all())
            print(f"prompt {i} ({len(seq)} tokens): max rel error {rel:.2e}, argmax agrees {agree}, "
                  f"tokenizer ids equal to HF's {same_ids}")
    ours_gen = generate(model, ids[0], NEW_TOKENS)
    print(f"max relative error over {len(ids)} prompts: {worst:.2e} (tolerance {args.tolerance:g})")
    print(f"paddle greedy: {PROMPTS[0]!r} -> {tok.decode(ours_gen)!r}")
    print(f"hf greedy:     {PROMPTS[0]!r} -> {tok.decode(ref['greedy'].tolist())!r}")
    print(f"greedy tokens equal: {ours_gen == ref['greedy'].tolist()}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
