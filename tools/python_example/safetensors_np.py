"""A tiny safetensors reader and writer on numpy alone (no `safetensors` package).

File layout: an 8-byte little-endian header length N, N bytes of JSON header
{name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the tensors' raw little-endian row-major bytes back to back.

numpy has no bfloat16 and no fp8: BF16 tensors are read and written as uint16 bit patterns, F8_E4M3 and F8_E5M2
tensors (a quantized cache's fp8 codes) as uint8 bit patterns. A quantized cache's int8 codes are I8.
"""

import json
import struct

import numpy as np

# safetensors dtype name -> numpy dtype of the stored elements
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # bit patterns
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "F8_E4M3": np.dtype("u1"),  # bit patterns
    "F8_E5M2": np.dtype("u1"),  # bit patterns
    "BOOL": np.dtype("?"),
}

MAX_HEADER_BYTES = 100_000_000


class FormatError(Exception):
    pass


def read(path):
    """Returns (tensors, dtypes, metadata): {name: ndarray}, {name: dtype name}, {str: str}."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{path}: truncated ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER_BYTES or n > len(blob) - 8:
        raise FormatError(f"{path}: header length {n} does not fit the file")
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n :]
    metadata = header.pop("__metadata__", {})
    tensors, dtypes, end = {}, {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, stop = info["data_offsets"]
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise FormatError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        shape = tuple(info["shape"])
        if begin != end or stop - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise FormatError(f"{path}: tensor {name}: bad data_offsets {info['data_offsets']}")
        tensors[name] = np.frombuffer(data[begin:stop], dtype=dtype).reshape(shape)
        dtypes[name] = info["dtype"]
        end = stop
    if end != len(data):
        raise FormatError(f"{path}: the tensors do not cover the data buffer")
    return tensors, dtypes, metadata


def write(path, tensors, metadata=None):
    """tensors: list of (name, dtype name, ndarray) written in that order."""
    header, chunks, at = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, dtype_name, array in tensors:
        if dtype_name not in DTYPES:
            raise FormatError(f"{path}: tensor {name}: unsupported dtype {dtype_name}")
        want = DTYPES[dtype_name]
        # bit patterns are written as they are, never converted: fp8 codes from uint8, bf16 from uint16
        if want.kind in "ui" and np.asarray(array).dtype.kind == "f":
            raise FormatError(f"{path}: tensor {name}: {dtype_name} takes integer or bit-pattern arrays, not floats")
        raw = np.ascontiguousarray(array, dtype=want).tobytes()
        header[name] = {"dtype": dtype_name, "shape": list(array.shape), "data_offsets": [at, at + len(raw)]}
        chunks.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
