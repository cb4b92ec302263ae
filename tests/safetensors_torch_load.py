"""A safetensors reader for the PyTorch partner scripts (amp_parity_torch.py,
trainapi_torch.py): parses the file itself (8-byte header length, JSON header, raw
little-endian data), so torch is the only package they need."""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}


def load(path):
    """The tensors of the safetensors file at `path`, by name (metadata skipped)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[lo:hi]), dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out
