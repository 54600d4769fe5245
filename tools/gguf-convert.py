#!/usr/bin/env python3
"""A GGUF file's weights in another format, metadata unchanged (issue 67): the default
model's F32, BF16, Q8_0, Q5_0 or Q4_0 conversion, to run suffixd and llama.cpp on the same
file.

    tools/gguf-convert.py SRC DST --to f32|bf16|q8_0|q5_0|q4_0

Every tensor is dequantized (gguf-py's reference dequantization, as llama.cpp's); with
`--to q8_0` (`q5_0`, `q4_0`) the matrices (2-D, rows a multiple of 32) are quantized again
by gguf-py (llama.cpp's reference quantization; with `--to bf16` rounded to bf16), the
embedding and head included, and vectors (norms) stay f32, as llama.cpp's quantize leaves
them. Needs the `gguf` and
`numpy` packages (pip install gguf numpy).
"""
import argparse
import sys

try:
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q
except ImportError:
    sys.exit("needs the gguf and numpy packages: pip install gguf numpy")

# llama.cpp's LLAMA_FTYPE_ALL_F32, MOSTLY_Q4_0, MOSTLY_Q5_0, MOSTLY_Q8_0, MOSTLY_BF16
FILE_TYPE = {"f32": 0, "q4_0": 2, "q5_0": 8, "q8_0": 7, "bf16": 32}
MATRIX_TYPE = {"q4_0": Q.Q4_0, "q5_0": Q.Q5_0, "q8_0": Q.Q8_0, "bf16": Q.BF16}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--to", choices=sorted(FILE_TYPE), required=True)
    a = ap.parse_args()
    reader = gguf.GGUFReader(a.src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(a.dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # The architecture and the header's own fields are the writer's.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = FILE_TYPE[a.to] if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    tensors = []
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # Numpy's order: a matrix is (rows, columns), each row one output's weights.
        if a.to in MATRIX_TYPE and values.ndim == 2 and values.shape[-1] % 32 == 0:
            kind = MATRIX_TYPE[a.to]
            data = gguf.quants.quantize(values, kind)
        else:
            data, kind = values, Q.F32
        tensors.append((t.name, data, kind))
    for name, data, kind in tensors:
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{a.dst}: {len(tensors)} tensors as {a.to}")


if __name__ == "__main__":
    main()
