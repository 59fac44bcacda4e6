#!/usr/bin/env python3
"""Hugging Face transformers' DynamicCache, served live to kvcheck over the pipe protocol.

    bash tools/setup-torch.sh        # build/venv-torch: CPU torch and transformers, pinned
    kvcheck validate --connect 'build/venv-torch/bin/python tools/python_client/examples/hf_dynamic_cache.py'

The cache under test is transformers' own `DynamicCache`, called as its attention layers call it: one per sequence
(batch 1; kvcheck's sequences have lengths of their own), `update(key_states, value_states, layer_idx)` with
[1, n_kv_heads, n_new, head_dim] tensors in the cache dtype, which returns every row of the layer for attention.
Attention is what a model with `attn_implementation="sdpa"` runs: transformers' `repeat_kv` for grouped heads, then
`torch.nn.functional.scaled_dot_product_attention` in float32 over the rows as stored, with a mask that lets row i
of a chunk see the keys up to its own position. RoPE is applied by the model before the cache in transformers, so
the cache declares no RoPE variant: kvcheck then hands it keys already rotated where a case rotates.

* fork(parent, child): a deep copy of the parent's DynamicCache (transformers shares nothing between caches).
* release(seq): the sequence's DynamicCache is dropped.
* memory(): the tensors DynamicCache holds are exactly the live rows (it concatenates on every update), so live,
  capacity and the held tensors' bytes are one number; block size 1.

Broken on purpose:
  --bug is-causal   attention with SDPA's `is_causal=True` instead of the mask. SDPA aligns that mask to the top
                    left, so a chunk appended after cached rows sees only the first keys (row i: keys 0..i) instead
                    of everything up to its own position: right for a prompt, wrong for every later chunk.
"""

import argparse
import copy
import os
import sys

import numpy as np
import torch
import transformers
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import repeat_kv

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvcheck_client as kvc  # noqa: E402  (the in-repo package, also when it is not pip-installed)

TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
STORED_AS = {torch.float32: torch.float32, torch.float16: torch.float16, torch.bfloat16: torch.int16}  # same bytes


class HfDynamicCache:
    def __init__(self, cfg: kvc.Config, bug=None):
        if cfg.dtype not in TORCH_DTYPE:
            raise NotImplementedError(f"cache dtype {cfg.dtype}")
        self.cfg, self.dtype, self.bug = cfg, TORCH_DTYPE[cfg.dtype], bug
        self.group = cfg.n_q_heads // cfg.n_kv_heads
        self.caches = {}  # seq -> DynamicCache

    def _cache(self, seq, create=False):
        if not 0 <= seq < self.cfg.max_seqs:
            raise IndexError(f"sequence {seq} outside 0..{self.cfg.max_seqs - 1}")
        if seq not in self.caches:
            if not create:
                raise ValueError(f"sequence {seq} holds no tokens")
            self.caches[seq] = DynamicCache()
        return self.caches[seq]

    def _layer(self, layer):
        if not 0 <= layer < self.cfg.n_layers:
            raise IndexError(f"layer {layer} outside 0..{self.cfg.n_layers - 1}")

    def append_attend(self, seq, layer, q, k, v):
        self._layer(layer)
        cache = self._cache(seq, create=True)
        before = cache.get_seq_length(layer)
        n = q.shape[0]
        if before + n > self.cfg.max_tokens:
            raise MemoryError(f"{before + n} tokens in a sequence of at most {self.cfg.max_tokens}")
        if n == 0:
            return np.zeros((0, self.cfg.n_q_heads, self.cfg.dv), np.float32)
        # [n, heads, d] -> [1, heads, n, d], as the attention layers hand their states to the cache
        to_states = lambda x: torch.from_numpy(np.array(x)).transpose(0, 1).unsqueeze(0)  # noqa: E731
        keys, values = cache.update(to_states(k).to(self.dtype), to_states(v).to(self.dtype), layer)
        keys = repeat_kv(keys, self.group).float()
        values = repeat_kv(values, self.group).float()
        total = before + n
        visible = torch.arange(total)[None, :] <= (before + torch.arange(n))[:, None]
        mask = dict(is_causal=True) if self.bug == "is-causal" else dict(attn_mask=visible)
        out = torch.nn.functional.scaled_dot_product_attention(to_states(q), keys, values, scale=float(self.cfg.scale),
                                                                **mask)
        return out[0].transpose(0, 1)

    def seq_length(self, seq, layer):
        self._layer(layer)
        return self._cache(seq).get_seq_length(layer) if seq in self.caches else 0

    def read_kv(self, seq, layer, pos, n):
        self._layer(layer)
        length = self.seq_length(seq, layer)
        if pos + n > length:
            raise ValueError(f"rows {pos}..{pos + n - 1} of a stream of {length}")
        cache = self._cache(seq)
        rows = lambda t: t[0, :, pos:pos + n, :].transpose(0, 1).contiguous().view(STORED_AS[self.dtype])  # noqa
        return rows(cache.key_cache[layer]), rows(cache.value_cache[layer])

    def fork(self, parent, child):
        source = self._cache(parent)
        if child in self.caches:
            raise ValueError(f"sequence {child} already holds tokens")
        self._cache(child, create=True)
        self.caches[child] = copy.deepcopy(source)

    def release(self, seq):
        self._cache(seq)
        del self.caches[seq]

    def memory(self):
        held = sum(t.numel() * t.element_size() for c in self.caches.values()
                   for t in list(c.key_cache) + list(c.value_cache) if isinstance(t, torch.Tensor))
        return kvc.Memory(block_size=1, live_bytes=held, capacity_bytes=held, pool_bytes=0)


CAPS = kvc.Caps(dtypes=["f32", "f16", "bf16"], features=["gqa", "chunked", "fork", "release"], pipeline={})


def warm_up():
    """Runs every path once before serving, so that torch's and transformers' first-call work happens before
    kvcheck's first memory reading rather than inside a case."""
    for dtype in (0, 1, 2):
        cfg = kvc.Config(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=8, cache_dtype=dtype, max_seqs=3,
                         max_tokens=40, scale=np.float32(0.35), rope=0, rope_theta=np.float32(10000.0),
                         block_size_hint=0, kv_scale_mode=0, int8_scale_dtype=0)
        c = HfDynamicCache(cfg)
        x = np.linspace(-1, 1, 20 * 4 * 8, dtype=np.float32).reshape(20, 4, 8)
        c.append_attend(0, 1, x, x[:, :2], x[:, 2:])
        c.append_attend(0, 1, x[:3], x[:3, :2], x[:3, 2:])
        c.fork(0, 1)
        c.read_kv(1, 1, 0, 23)
        c.memory()
        c.release(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bug", choices=["is-causal"], help="break the attention on purpose")
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic, and kvcheck runs cases side by side
    warm_up()
    name = "transformers-DynamicCache" + ("-" + args.bug if args.bug else "")
    return kvc.serve(lambda cfg: HfDynamicCache(cfg, args.bug), CAPS, name=name, version=transformers.__version__)


if __name__ == "__main__":
    sys.exit(main())
