"""The quantized cache formats of docs/quantized.md, written again in numpy from that page alone, so that the
vectors round trip of a quantized cache is judged against an implementation that shares no code with kvcheck's
reference quantizer (reference/src/quantize.cpp).

Every function takes one head row at a time, x float32 [d], and returns codes (uint8 fp8 bit patterns or int8) and
the row's scales as read_kv_scales returns them (float32, or float16 where the format keeps f16).
"""

import numpy as np

# exponent bits, mantissa bits, bias, largest finite code
FP8 = {"fp8_e4m3": (4, 3, 7, 0x7E), "fp8_e5m2": (5, 2, 15, 0x7B)}


def fp8_values(dtype):
    """The non-negative finite values of codes 0 .. max code, increasing (float64, exact)."""
    e_bits, m_bits, bias, top = FP8[dtype]
    codes = np.arange(top + 1)
    e, m = codes >> m_bits, codes & ((1 << m_bits) - 1)
    frac = m / float(1 << m_bits)
    return np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e.astype(np.float64) - bias))


def fp8_encode(x32, dtype):
    """float32 -> fp8 codes: nearest, ties to the even code, saturating at the largest finite; -0 keeps its sign."""
    values = fp8_values(dtype)
    a = np.abs(x32.astype(np.float64))
    hi = np.clip(np.searchsorted(values, a), 0, len(values) - 1)  # first value >= a (or the largest)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - values[lo], values[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= values[-1], len(values) - 1, code)  # beyond the largest finite: saturate
    return (code | np.where(np.signbit(x32), 0x80, 0)).astype(np.uint8)


def fp8_decode(codes, dtype):
    values = fp8_values(dtype).astype(np.float32)
    mag = values[np.minimum(codes & 0x7F, len(values) - 1)]
    return np.where(codes & 0x80, -mag, mag).astype(np.float32)


def quantize_fp8(x32, scale, dtype):
    scaled = (x32.astype(np.float32) / np.float32(scale)).astype(np.float32)  # one f32 division, then one rounding
    return fp8_encode(scaled, dtype), np.array([scale], np.float32)


def dequantize_fp8(codes, scales, dtype):
    return (fp8_decode(codes, dtype) * np.float32(scales[0])).astype(np.float32)


def quantize_int8(x32, f16_scale):
    x32 = x32.astype(np.float32)
    scale = np.float32(np.max(np.abs(x32)) / np.float32(127))
    if f16_scale:
        scale = np.float32(np.float16(scale))  # the kept scale makes the codes
    if scale == 0:
        codes = np.zeros(x32.shape, np.int8)
    else:
        codes = np.clip(np.rint(x32 / scale), -127, 127).astype(np.int8)  # rint: half to even
    return codes, np.array([scale], np.float16 if f16_scale else np.float32)


def dequantize_int8(codes, scales):
    return (codes.astype(np.float32) * np.float32(scales[0])).astype(np.float32)


def quantize_q8_0_blocks(x32):
    """ggml's quantize_row_q8_0_ref on a row of whole blocks of 32: codes int8, d float16 per block."""
    blocks = x32.astype(np.float32).reshape(-1, 32)
    amax = np.max(np.abs(blocks), axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    prod = (blocks * inv[:, None]).astype(np.float32).astype(np.float64)  # the f32 product, then roundf
    codes = (np.sign(prod) * np.floor(np.abs(prod) + 0.5)).astype(np.int8)  # half away from zero
    return codes.reshape(-1), d.astype(np.float16)


def dequantize_q8_0(codes, scales):
    return (codes.reshape(-1, 32).astype(np.float32) * scales.astype(np.float32)[:, None]).reshape(-1)


def quantize_row(x32, cfg, which, layer, head, bug=None):
    """One head row of K (which "k") or V ("v") of config cfg (the manifest's) -> (codes, scales)."""
    dtype = cfg["dtype"]
    if dtype in FP8:
        return quantize_fp8(x32, fp8_scale(cfg, "k" if bug == "k-scale-for-v" else which, layer, head), dtype)
    if dtype == "int8_token":
        return quantize_int8(x32, cfg["int8_scale_dtype"] == "f16")
    return quantize_q8_0_blocks(x32)


def dequantize_row(codes, scales, cfg):
    dtype = cfg["dtype"]
    if dtype in FP8:
        return dequantize_fp8(codes, scales, dtype)
    if dtype == "int8_token":
        return dequantize_int8(codes, scales)
    return dequantize_q8_0(codes, scales)


def fp8_scale(cfg, which, layer, head):
    """The config's scale of K or V rows of (layer, KV head), from its exact bit patterns."""
    mode = cfg["kv_scale_mode"]
    if mode == "none":
        return np.float32(1)
    bits = cfg[which + "_scales_bits"]
    i = layer if mode == "tensor" else layer * cfg["n_kv_heads"] + head
    return np.array([int(bits[i], 16)], np.uint32).view(np.float32)[0]


def scale_bytes_per_head_row(cfg):
    """Bytes of one head row's scales that live_bytes counts (fp8's config scales are not)."""
    if cfg["dtype"] in FP8:
        return 0
    size = 2 if cfg["scales_dtype"] == "F16" else 4
    return cfg["scales_per_head_row"] * size
