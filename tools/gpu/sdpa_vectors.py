#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on a CUDA GPU, over a KV cache kept in torch tensors, run on kvcheck's
exported vectors (docs/vectors.md) so that `kvcheck grade` judges it: a real GPU implementation through the vectors
route (issue 10, item 3), the GPU counterpart of tools/ort_driver/.

    kvcheck export --caps tools/gpu/sdpa_caps.json --dtypes f16,bf16 --out vectors
    python3 tools/gpu/sdpa_vectors.py --vectors vectors --results results
    kvcheck grade --vectors vectors --results results

The cache: per (sequence, layer), K and V tensors [n_kv_heads, rows, head_dim] in the cache dtype (f16 or bf16) on
the GPU, grown by torch.cat; fork clones a sequence's tensors, release drops them. A call:

    q, k (float32, as given) rotated by their positions in float64 when the case has RoPE (angle pos * theta^(-2j/d);
    NeoX pairs (j, j + d/2), GPT-J pairs (2j, 2j + 1)), then rounded to the cache dtype; v rounded to it. SDPA
    takes q in the cache dtype, so q is rounded even without RoPE: the declaration says q "cache"
    k, v appended to the cache; SDPA(q [1, Hq, n, d], K, V [1, Hkv, rows, d], scale, enable_gqa) with
      n == 1: no mask (the new token sees every row); nothing cached before: is_causal; else the bottom-right
      causal mask (query i sees rows 0 .. past + i) as a boolean attn_mask (SDPA's is_causal is top-left aligned).
      GQA through enable_gqa, except with a mask: then K and V are repeated per query head (repeat_interleave),
      so that the fused kernel that takes a mask serves the call rather than the unfused math path
    the output (cache dtype) widened to float32

The declared pipeline is in sdpa_caps.json (`--pipeline` declares another, to see what kvcheck says then). Exit: 0
results written; 2 bad arguments or unreadable vectors; 77 torch (or numpy) is not importable or sees no GPU
(nothing run).
"""

import json
import os
import sys

SKIP = 77
try:
    import numpy as np
except ImportError as e:
    print(f"sdpa_vectors.py: skipped: numpy is not importable here ({e})")
    sys.exit(SKIP)

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python_example"))
import vectors_io  # noqa: E402  (the example's case replay: manifest, steps, results files; numpy only)


def load_torch():
    """torch and the GPU's name, or exit 77 saying why not."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install's OSError
        print(f"sdpa_vectors.py: skipped: torch is not importable here ({type(e).__name__}: {e})")
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print(f"sdpa_vectors.py: skipped: torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)")
        sys.exit(SKIP)
    return torch


def f32_from_bits(text):
    return float(np.array([int(text, 16)], dtype=np.uint32).view(np.float32)[0])


class Cache:
    """K/V per (sequence, layer) as torch tensors on the GPU, [n_kv_heads, rows, head_dim] in the cache dtype."""

    def __init__(self, torch, cfg, backend):
        self.t, self.cfg = torch, cfg
        self.dt = {"f16": torch.float16, "bf16": torch.bfloat16}[cfg["dtype"]]
        self.hq, self.hkv, self.d = cfg["n_q_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        self.scale = f32_from_bits(cfg["scale_bits"])
        self.rope = cfg["rope"]
        self.theta = f32_from_bits(cfg["rope_theta_bits"])
        self.backend = backend
        self.k, self.v = {}, {}

    def rotate(self, x, pos0):
        """x [n, heads, d] float64 on the GPU, rotated by positions pos0 .. pos0+n-1."""
        t, d = self.t, self.d
        half = d // 2
        inv = self.theta ** (-2.0 * t.arange(half, dtype=t.float64, device=x.device) / d)
        angle = t.arange(pos0, pos0 + x.shape[0], dtype=t.float64, device=x.device)[:, None] * inv[None, :]
        c, s = t.cos(angle)[:, None, :], t.sin(angle)[:, None, :]
        out = x.clone()
        if self.rope == "neox":
            a, b = x[..., :half], x[..., half:]
            out[..., :half], out[..., half:] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out

    def empty(self):
        return self.t.zeros((self.hkv, 0, self.d), dtype=self.dt, device="cuda")

    def append_attend(self, seq, layer, q, k, v):
        """q [n, hq, d], k, v [n, hkv, d] float32 numpy -> out [n, hq, d] float32 numpy."""
        t = self.t
        n = q.shape[0]
        if n == 0:
            return np.zeros((0, self.hq, self.d), np.float32)
        key = (seq, layer)
        past_k, past_v = self.k.get(key, self.empty()), self.v.get(key, self.empty())
        past = past_k.shape[1]
        qt = t.from_numpy(np.ascontiguousarray(q)).cuda().double()
        kt = t.from_numpy(np.ascontiguousarray(k)).cuda().double()
        if self.rope != "none":
            qt, kt = self.rotate(qt, past), self.rotate(kt, past)
        qc = qt.float().to(self.dt)
        kc = kt.float().to(self.dt)
        vc = t.from_numpy(np.ascontiguousarray(v)).cuda().to(self.dt)
        K = t.cat([past_k, kc.transpose(0, 1)], dim=1)
        V = t.cat([past_v, vc.transpose(0, 1)], dim=1)
        self.k[key], self.v[key] = K, V
        rows = past + n
        mask, causal = None, False
        if n > 1 and past == 0:
            causal = True
        elif n > 1:
            mask = t.ones((n, rows), dtype=t.bool, device="cuda").tril(diagonal=past)
        out = self.sdpa(qc.transpose(0, 1)[None], K[None], V[None], mask, causal)
        return out[0].transpose(0, 1).float().cpu().numpy()

    def sdpa(self, q, K, V, mask, causal):
        F = self.t.nn.functional
        kwargs = dict(attn_mask=mask, is_causal=causal, scale=self.scale)
        if self.hq != self.hkv and mask is None:
            kwargs["enable_gqa"] = True
        elif self.hq != self.hkv:  # the fused kernel that takes a mask wants as many KV heads as query heads
            K = K.repeat_interleave(self.hq // self.hkv, dim=1)
            V = V.repeat_interleave(self.hq // self.hkv, dim=1)
        if self.backend == "auto":
            return F.scaled_dot_product_attention(q, K, V, **kwargs)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, self.backend.upper())):
            return F.scaled_dot_product_attention(q, K, V, **kwargs)

    def dump(self, seq, layer):
        """Every row of (seq, layer) as stored, [rows, hkv, d], as numpy (bf16 as uint16 bit patterns)."""
        key = (seq, layer)
        out = []
        for store in (self.k, self.v):
            x = store.get(key, self.empty()).transpose(0, 1).contiguous()
            if self.dt == self.t.bfloat16:
                out.append(x.view(self.t.int16).cpu().numpy().view(np.uint16))
            else:
                out.append(x.cpu().numpy())
        return out

    def fork(self, parent, child):
        for (s, layer) in list(self.k):
            if s == parent:
                self.k[(child, layer)] = self.k[(s, layer)].clone()
                self.v[(child, layer)] = self.v[(s, layer)].clone()

    def release(self, seq):
        for key in [key for key in self.k if key[0] == seq]:
            del self.k[key], self.v[key]

    def live_bytes(self):
        return sum(2 * x.numel() * x.element_size() for x in self.k.values())


def main():
    ap = vectors_io.arguments(__doc__.split("\n")[0])
    ap.add_argument("--backend", default="auto", choices=["auto", "flash_attention", "efficient_attention", "math",
                                                          "cudnn_attention"],
                    help="force one SDPA backend (torch.nn.attention.sdpa_kernel); auto lets PyTorch choose")
    args = ap.parse_args()
    vectors_io.load_manifest(args.vectors, "sdpa_vectors.py")  # before torch: a bad path fails fast
    torch = load_torch()
    with open(os.path.join(HERE, "sdpa_caps.json")) as f:
        caps = json.load(f)
    name = "pytorch-sdpa-cuda" + ("" if args.backend == "auto" else "-" + args.backend)
    version = f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"
    return vectors_io.drive(args, lambda cfg: Cache(torch, cfg, args.backend), name, version, caps)


if __name__ == "__main__":
    sys.exit(main())
