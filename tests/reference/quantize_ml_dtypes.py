"""Cross-check of the reference fp8 codes (reference/src/quantize.cpp) with ml_dtypes, an independent implementation
of float8_e4m3fn and float8_e5m2. Reads the table that quantize_table prints on stdin.

Expected agreement (quantize.hpp): every decode; every encode of a value that rounds into the finite range; NaN
inputs give a NaN with the same sign (ml_dtypes writes the same codes: 0x7f/0xff, 0x7e/0xfe). Where ml_dtypes'
non-saturating cast gives NaN (E4M3FN) or infinity (E5M2) for a non-NaN input, the reference must give +-max
finite (saturation, as CUDA's __NV_SATFINITE), and that case is counted separately.
"""
import sys

import ml_dtypes
import numpy as np

FORMATS = {"e4m3fn": (ml_dtypes.float8_e4m3fn, 0x7E), "e5m2": (ml_dtypes.float8_e5m2, 0x7B)}


def main():
    decodes, encodes = [], []
    for line in sys.stdin:
        f = line.split()
        if f[0] == "decode":
            decodes.append((f[1], int(f[2], 16), int(f[3], 16)))
        elif f[0] == "encode":
            encodes.append((int(f[1], 16), int(f[2], 16), int(f[3], 16)))
    bad = []
    for fmt, code, ours_bits in decodes:
        dtype = FORMATS[fmt][0]
        theirs = np.array([code], dtype=np.uint8).view(dtype).astype(np.float32)[0]
        ours = np.array([ours_bits], dtype=np.uint32).view(np.float32)[0]
        same = (np.isnan(theirs) and np.isnan(ours) and np.signbit(theirs) == np.signbit(ours)) or (
            theirs.view(np.uint32) == ours.view(np.uint32))
        if not same:
            bad.append(f"decode {fmt} 0x{code:02x}: ours {ours!r}, ml_dtypes {theirs!r}")
    xs = np.array([e[0] for e in encodes], dtype=np.uint32).view(np.float32)
    saturated = 0
    for col, fmt in ((1, "e4m3fn"), (2, "e5m2")):
        dtype, max_code = FORMATS[fmt]
        theirs = xs.astype(dtype)
        theirs_codes = theirs.view(np.uint8)
        for x, t, tc, e in zip(xs, theirs, theirs_codes, encodes):
            ours = e[col]
            if not np.isnan(x) and not np.isfinite(t.astype(np.float32)):
                want = (0x80 if np.signbit(x) else 0) | max_code  # ml_dtypes overflows; the reference saturates
                saturated += 1
            else:
                want = int(tc)
            if ours != want:
                bad.append(f"encode {fmt} {x!r} (0x{e[0]:08x}): ours 0x{ours:02x}, expected 0x{want:02x} "
                           f"(ml_dtypes 0x{int(tc):02x})")
    print(f"ml_dtypes {ml_dtypes.__version__}: {len(decodes)} decodes, {2 * len(encodes)} encodes compared "
          f"({saturated} out of range, judged as saturation); {len(bad)} mismatches")
    for b in bad[:20]:
        print("MISMATCH", b)
    if len(decodes) != 512 or len(encodes) < 4000:
        print("FAILED: the table is incomplete")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
