"""Reads GGUF files that `tinygpt export --format gguf` wrote with llama.cpp's own Python
reader (`gguf`, from llama.cpp's gguf-py) and prints what it read as JSON, one object per file:
metadata (scalars as values, arrays as their length and first/last items) and tensors (name,
type, shape as gguf-py gives it, sha256 of the bytes).

With --requantize F32_FILE Q_FILE..., also checks each quantized tensor of the Q files against
gguf-py's own quantizer run on the F32 file's values (`gguf.quants.quantize`, bit-exact with
ggml's reference C quantizer): prints the names that differ (none, for a correct writer).

With --dequantize FILE, prints each tensor of FILE as gguf-py dequantizes it (its numpy
port of ggml's `dequantize_row_*`), as f32 values: {name: [values]}.

Usage: gguf_check.py FILE... | gguf_check.py --requantize F32_FILE Q_FILE...
       | gguf_check.py --dequantize FILE
"""

import hashlib
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize, quantize


def value(field):
    kinds = field.types
    if kinds[0] == GGUFValueType.ARRAY:
        items = field.contents()
        return {"len": len(items), "first": items[:2], "last": items[-1:]}
    return field.contents()


def describe(path):
    reader = GGUFReader(path)
    metadata = {
        name: value(field)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "ne": [int(d) for d in t.shape],
            "sha256": hashlib.sha256(t.data.tobytes()).hexdigest(),
        }
        for t in reader.tensors
    ]
    return {"path": path, "metadata": metadata, "tensors": tensors}


def requantize(f32_path, paths):
    reference = {t.name: np.array(t.data) for t in GGUFReader(f32_path).tensors}
    differ = []
    checked = 0
    for path in paths:
        for t in GGUFReader(path).tensors:
            kind = t.tensor_type
            if kind == GGMLQuantizationType.F32:
                continue
            values = reference[t.name].astype(np.float32)
            mine = np.array(t.data).tobytes()
            theirs = quantize(values, kind).tobytes()
            checked += 1
            if mine != theirs:
                differ.append(f"{path}:{t.name}:{kind.name}")
    print(json.dumps({"checked": checked, "differ": differ}))


def dequantized(path):
    out = {}
    for t in GGUFReader(path).tensors:
        values = dequantize(np.array(t.data), t.tensor_type).astype(np.float32)
        out[t.name] = [float(v) for v in values.reshape(-1)]
    print(json.dumps(out))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--dequantize":
        dequantized(args[1])
        return
    if args and args[0] == "--requantize":
        requantize(args[1], args[2:])
        return
    for path in args:
        print(json.dumps(describe(path), default=str))


if __name__ == "__main__":
    main()
