#!/usr/bin/env python3
"""Converts tinygpt's Hugging Face exports with llama.cpp's own converter (`convert_hf_to_gguf.py`)
and keeps what it wrote as `crates/trainer/tests/fixtures/gguf/NAME/converter.gguf`, for the
BPE GPT-2 (`bpe`) and the Llama-shaped run (`llama`) that `scripts/gguf-llamacpp.py` checks.
CI (`tests/gguf_llamacpp.rs`) then requires that the converter wrote the very tensors of
tinygpt's own GGUF export, and that tinygpt imports the converter's file to what llama.cpp
computed.

llama.cpp's converter knows a byte-level BPE tokenizer by a hash of its ids for a test text, and
a vocabulary trained by tinygpt is in no list it has: it stops with "BPE pre-tokenizer was not
recognized". As its message asks, this script tells it the pre-tokenizer, GPT-2's (`gpt-2`),
after checking that `tokenizer.json` splits text that way (`ByteLevel` with GPT-2's regex); a
user converting such an export does the same. A char vocabulary has no byte-level merges, and
the file the converter writes from one does not load in llama.cpp ("cannot find tokenizer merges
in model file"): `tinygpt export --format gguf` writes char runs itself.

Not for CI: the converter needs PyTorch and transformers. llama-cpp-python's source archive
carries the llama.cpp tree it builds (`vendor/llama.cpp`). From the repository root:

    python -m venv .convert
    .convert/bin/pip install -r LLAMA_CPP/requirements/requirements-convert_hf_to_gguf.txt
    cargo build --release
    .convert/bin/python scripts/gguf-converter.py --tinygpt target/release/tinygpt --llama-cpp LLAMA_CPP
"""

import argparse
import json
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates/trainer/tests/fixtures/gguf"
CASES = ["bpe", "llama"]


def splits_like_gpt2(hf: Path) -> bool:
    """Whether the export's tokenizer splits text before BPE as GPT-2 does."""
    pre = json.loads((hf / "tokenizer.json").read_text(encoding="utf-8"))["pre_tokenizer"]
    return pre.get("type") == "ByteLevel" and pre.get("use_regex") is True


def convert(llama_cpp: Path, hf: Path, out: Path) -> None:
    """Runs llama.cpp's converter in this process, with GPT-2's pre-tokenizer taught."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    import conversion.base as base

    known = base.TextModel.get_vocab_base_pre

    def pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            if not splits_like_gpt2(hf):
                raise
            print(f"{hf.name}: pre-tokenizer taught to the converter: gpt-2", file=sys.stderr)
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = pre
    script = llama_cpp / "convert_hf_to_gguf.py"
    argv = sys.argv
    sys.argv = [str(script), str(hf), "--outtype", "f32", "--outfile", str(out)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
        base.TextModel.get_vocab_base_pre = known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True, help="the tinygpt binary")
    parser.add_argument("--llama-cpp", required=True, type=Path,
                        help="a llama.cpp source tree (with convert_hf_to_gguf.py)")
    args = parser.parse_args()
    for name in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            hf = Path(tmp) / f"{name}-hf"
            subprocess.run([args.tinygpt, "export", "--checkpoint", str(FIXTURES / name),
                            "--format", "hf", "--out", str(hf)], check=True,
                           stdout=subprocess.DEVNULL)
            out = FIXTURES / name / "converter.gguf"
            convert(args.llama_cpp.resolve(), hf, out)
            print(f"{name}: wrote {out.relative_to(ROOT)} ({out.stat().st_size} bytes)",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
