#!/usr/bin/env python3
"""An fp8 KV cache whose codes are made by PyTorch's own float8 types, run on kvcheck's exported vectors.

    torch_fp8_driver.py [--example tools/python_example] --vectors V --results R [--no-clamp]

Each appended head row is divided by its config scale in float32 and cast with `.to(torch.float8_e4m3fn)` or
`.to(torch.float8_e5m2)`, after clamping to the format's largest finite value as serving engines do before the cast
(vLLM's scaled fp8 conversion clamps first). Attention runs in float64 over the rows dequantized from the stored
codes, as quant_driver.py's does (this class is that one with the quantizer swapped): what is checked here is
torch's conversion. --no-clamp casts without clamping. PyTorch's cast does not saturate: a value past the largest
finite one becomes NaN (E4M3FN, from 464 on) or an infinity (E5M2, from 61440 on), which the ABI forbids.
"""

import argparse
import os
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FP8_CAPABILITIES = ["dtype fp8_e4m3", "dtype fp8_e5m2", "fp8 scale per tensor", "fp8 scale per kv head",
                    "rope neox", "rope gptj", "gqa", "chunked", "fork", "release", "batch"]


def torch_quantizer(torch, quant_np, clamp):
    """quantize_row for fp8 (the signature quant_np's has) with torch's cast making the codes."""
    fp8_types = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}

    def quantize_row(x32, cfg, which, layer, head, bug=None):
        dtype = fp8_types[cfg["dtype"]]
        scale = quant_np.fp8_scale(cfg, which, layer, head)
        x = torch.from_numpy(np.ascontiguousarray(x32, np.float32)) / torch.tensor(scale, dtype=torch.float32)
        if clamp:
            largest = torch.finfo(dtype).max
            x = x.clamp(-largest, largest)
        codes = x.to(dtype).view(torch.uint8).numpy().copy()
        return codes, np.array([scale], np.float32)

    return quantize_row


def main():
    example = os.path.join(HERE, "..", "..", "tools", "python_example")
    sys.dont_write_bytecode = True
    sys.path[:0] = [HERE]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--example", default=example)
    known, _ = pre.parse_known_args()
    sys.path[:0] = [known.example]
    import torch
    import kvcache_example
    import quant_driver
    import quant_np
    import vectors_io

    ap = vectors_io.arguments(__doc__.split("\n")[0])
    ap.add_argument("--example", default=example, help="tools/python_example (vectors_io, safetensors_np, rope)")
    ap.add_argument("--no-clamp", action="store_true", help="cast without clamping first (PyTorch does not saturate)")
    args = ap.parse_args()
    quantizer = torch_quantizer(torch, quant_np, clamp=not args.no_clamp)

    # quant_np's functions, its quantizer swapped for torch's: dequantizing and the byte counts stay numpy's
    ops = types.SimpleNamespace(**{**vars(quant_np), "quantize_row": quantizer})
    name = "torch-" + torch.__version__.split("+")[0] + "-fp8" + ("-unclamped" if args.no_clamp else "")
    return vectors_io.drive(args, lambda cfg: quant_driver.QuantCache(cfg, kvcache_example, ops, None, "f32"),
                            name, torch.__version__, {"capabilities": FP8_CAPABILITIES, "pipeline": {"q": "f32"}})


if __name__ == "__main__":
    sys.exit(main())
