#!/usr/bin/env python3
"""llama.cpp's own quantiser on a tinygpt export, for `tests/gguf_llamacpp.rs`: the bytes that
`tinygpt export --dtype q8_0|q5_0|q4_0 [--pure]` must write.

For the fixture run `tests/fixtures/gguf/llama/` it exports the f32 GGUF file with tinygpt,
has llama.cpp quantise it (llama-cpp-python's `llama_model_quantize`, no importance matrix:
ggml's reference quantisers) to Q8_0, Q5_0 and Q4_0 as it chooses each tensor's type by
default (the head in Q6_K, or Q8_0 at this width) and, for Q5_0 and Q4_0, `pure` (every matrix
in the file type's own type), and saves each tensor's ggml type and the SHA-256 of its data in
`quantised.json` beside the run, under the arguments tinygpt's export takes for the same
file. It then exports the same run with tinygpt with those arguments and prints the tensors
whose bytes differ (none, when tinygpt writes what llama.cpp writes).

Not for CI (llama-cpp-python compiles llama.cpp). From the repository root:

    python -m venv .llama && .llama/bin/pip install llama-cpp-python numpy gguf
    cargo build --release
    .llama/bin/python scripts/gguf-quantised-fixture.py --tinygpt target/release/tinygpt
"""

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import llama_cpp

RUN = Path("crates/trainer/tests/fixtures/gguf/llama")
# tinygpt's export arguments, llama.cpp's file type (llama.h's `llama_ftype`) and `pure`.
FILES = {"q8_0": (7, False), "q5_0": (8, False), "q4_0": (2, False),
         "q5_0 --pure": (8, True), "q4_0 --pure": (2, True)}


def tensors(path):
    """Each tensor's ggml type name and the SHA-256 of its data."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: {"type": t.tensor_type.name, "sha256": hashlib.sha256(
        t.data.tobytes()).hexdigest()} for t in reader.tensors}


def export(tinygpt, args, out):
    subprocess.run([tinygpt, "export", "--checkpoint", str(RUN), "--format", "gguf", "--dtype",
                    *args.split(), "--out", str(out)], check=True, capture_output=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tinygpt", required=True)
    args = parser.parse_args()
    fixture, differ = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        export(args.tinygpt, "f32", work / "f32.gguf")
        for n, (dtype, (ftype, pure)) in enumerate(FILES.items()):
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread, params.pure = ftype, 2, pure
            code = llama_cpp.llama_model_quantize(str(work / "f32.gguf").encode(),
                                                  str(work / f"{n}.gguf").encode(), params)
            assert code == 0, f"llama_model_quantize: {code}"
            theirs = tensors(work / f"{n}.gguf")
            fixture[dtype] = theirs
            export(args.tinygpt, dtype, work / f"tinygpt-{n}.gguf")
            ours = tensors(work / f"tinygpt-{n}.gguf")
            types = sorted({t["type"] for t in theirs.values()})
            same = [n for n in theirs if ours.get(n) == theirs[n]]
            print(f"{dtype}: llama.cpp's types {types}; {len(same)} of {len(theirs)} tensors "
                  f"byte-equal in tinygpt's export")
            for name in theirs:
                if ours.get(name) != theirs[name]:
                    differ += 1
                    print(f"  {name}: llama.cpp {theirs[name]['type']}, tinygpt "
                          f"{ours.get(name, {}).get('type')}")
    (RUN / "quantised.json").write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
