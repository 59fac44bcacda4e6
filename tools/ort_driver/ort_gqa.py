#!/usr/bin/env python3
"""ONNX Runtime's CPU GroupQueryAttention (com.microsoft) run on kvcheck's exported vectors.

    build/bin/kvcheck export --caps tools/ort_driver/caps.json --out vectors
    build/venv/bin/python tools/ort_driver/ort_gqa.py --vectors vectors --results results [--mode f32-compute]
                                                      [--bug window-minus-one|window-plus-one]
    build/bin/kvcheck grade --vectors vectors --results results

The KV cache of GroupQueryAttention is the pair of tensors past_key/past_value [1, n_kv_heads, past, head_dim]
that the caller passes in and gets back, one token longer per new token, as present_key/present_value. This driver
holds them per (sequence, layer) and maps each call of a case onto one run of the operator:

    query [1, n_new, n_q_heads*head_dim], key, value [1, n_new, n_kv_heads*head_dim]
    past_key, past_value      the rows (sequence, layer) holds      -> present_key, present_value: every row after
    seqlens_k = [past + n_new - 1], total_sequence_length = past + n_new (the new tokens sit at positions past ..)
    do_rotary (config rope != none), rotary_interleaved (gptj 1, neox 0), cos_cache/sin_cache [max_tokens, d/2]
    num_heads, kv_num_heads, scale (the config's exact float32 scale)
    local_window_size = W in a layer whose config window is W > 0; not set (ORT's default -1, full causal
    attention) in a layer with window 0 and in a case without windows

local_window_size counts the query itself: ORT's CPU kernel lets the query at position i see keys
i - local_window_size + 1 .. i, local_window_size of them, which is kvcheck's window W (and Hugging Face's
sliding_window). The attribute's own description, "left_window_size for causal local attention (like Mistral)",
reads as flash attention's left window (the keys before the query, W - 1); kvcheck found by experiment that this ORT
does not mean that (docs/real-implementations.md; tools/ort_driver/probe_window.py shows it directly).
GroupQueryAttention has no attention sinks: "sinks" is not declared.
A --bug maps the window wrongly on purpose, to show that kvcheck names the window ORT then attends:
  window-minus-one   local_window_size = W - 1, the description's reading (a query sees W - 1 keys; W = 1 gives
                     local_window_size 0, with which ORT attends no key and outputs zeros)
  window-plus-one    local_window_size = W + 1 (a query sees W + 1 keys)

Modes (the cache dtype decides the rest):
  native       the model runs in the cache dtype: an f16 cache is an f16 model (q, k, v, cos/sin, past, present
               and output all f16), as a 16-bit model calls it; an f32 cache is an f32 model.
  f32-compute  the model always runs in f32, and the driver keeps the cache in the cache dtype between calls
               (present rounded to f16, widened again for the next call's past): a model computed in f32 over a
               16-bit cache. ORT then attends the call's new rows as given, before they are rounded.

Fork copies a sequence's tensors and release drops them: with GroupQueryAttention the caller owns the cache. A batch
step runs its sequences one at a time. ORT refuses head sizes that are not a multiple of 8 (16 with rotary) and has
no bf16 kernel on the CPU; caps.json declares that. docs/real-implementations.md has what was found.
"""

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python_example"))
import vectors_io  # noqa: E402  (the driver loop: manifest, declaration, steps, results files)

HERE = os.path.dirname(os.path.abspath(__file__))
# What each --bug adds to local_window_size = W.
BUGS = {"window-minus-one": -1, "window-plus-one": 1}
NP = {"f32": np.float32, "f16": np.float16}
# The rounding pipeline of each mode, found by experiment (docs/real-implementations.md); caps.json declares native's.
MODE_PIPELINES = {"native": {"q": "cache", "rope": "cache", "output": "cache"},
                  "f32-compute": {"new_rows_unrounded": True}}


def f32_from_bits(text):
    return float(np.array([int(text, 16)], dtype=np.uint32).view(np.float32)[0])


class Operator:
    """One GroupQueryAttention node in its own session, for one shape, scale, rotary variant and model dtype."""

    _sessions = {}

    @classmethod
    def get(cls, dt, hq, hkv, scale, rope, threads, local_window=-1):
        # the window is an attribute of the node: layers with different windows are different sessions
        key = (dt, hq, hkv, scale, rope, threads, local_window)
        if key not in cls._sessions:
            cls._sessions[key] = cls(dt, hq, hkv, scale, rope, threads, local_window)
        return cls._sessions[key]

    def __init__(self, dt, hq, hkv, scale, rope, threads, local_window=-1):
        T = TensorProto.FLOAT if dt == "f32" else TensorProto.FLOAT16
        names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
        types = [T] * 5 + [TensorProto.INT32] * 2
        if rope != "none":
            names += ["cos_cache", "sin_cache"]
            types += [T, T]
        inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)]
        outputs = [helper.make_tensor_value_info(n, T, None) for n in ["output", "present_key", "present_value"]]
        attrs = dict(num_heads=hq, kv_num_heads=hkv, scale=scale, do_rotary=int(rope != "none"),
                     rotary_interleaved=int(rope == "gptj"))
        if local_window >= 0:  # only where a window is asked for: a full-attention node is ORT's default node
            attrs["local_window_size"] = local_window
        node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                                domain="com.microsoft", **attrs)
        graph = helper.make_graph([node], "gqa", inputs, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3  # refusals are reported by the driver, once
        self.session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

    def run(self, feeds):
        return self.session.run(None, feeds)


def rope_tables(cfg, dt):
    """cos/sin caches [max_tokens, d/2]: angle pos * theta^(-2j/d) in float64, rounded to the model dtype, as a model
    that builds its tables in its own dtype does."""
    d, theta = cfg["head_dim"], f32_from_bits(cfg["rope_theta_bits"])
    inv = np.float64(theta) ** (-2.0 * np.arange(d // 2, dtype=np.float64) / d)
    angle = np.arange(cfg["max_tokens"], dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angle).astype(NP[dt]), np.sin(angle).astype(NP[dt])


class Cache:
    """The caller's side of GroupQueryAttention: present_key/present_value per (sequence, layer), in the cache dtype
    ([n_kv_heads, rows, head_dim], the operator's BNSH layout without the batch axis)."""

    def __init__(self, cfg, mode, threads, bug=None):
        self.cfg, self.mode = cfg, mode
        self.dtype = cfg["dtype"]
        self.model_dt = "f32" if mode == "f32-compute" else self.dtype
        self.hq, self.hkv, self.d = cfg["n_q_heads"], cfg["n_kv_heads"], cfg["head_dim"]
        op = lambda lw: Operator.get(self.model_dt, self.hq, self.hkv, f32_from_bits(cfg["scale_bits"]), cfg["rope"],
                                     threads, lw)
        windows = cfg.get("windows") or [0] * cfg["n_layers"]
        shift = BUGS[bug] if bug else 0
        self.ops = [op(w + shift if w else -1) for w in windows]
        self.tables = rope_tables(cfg, self.model_dt) if cfg["rope"] != "none" else None
        self.k, self.v = {}, {}

    def rows(self, seq, layer):
        return self.k.get((seq, layer), np.zeros((self.hkv, 0, self.d), NP[self.dtype]))

    def append_attend(self, seq, layer, q, k, v):
        """q [n, hq, d], k, v [n, hkv, d] float32 -> out [n, hq, d] float32."""
        n = q.shape[0]
        if n == 0:  # nothing to attend: the operator is not called
            return np.zeros((0, self.hq, self.d), np.float32)
        mdt = NP[self.model_dt]
        pk, pv = self.rows(seq, layer), self.v.get((seq, layer), np.zeros((self.hkv, 0, self.d), NP[self.dtype]))
        past = pk.shape[1]
        feeds = {"query": q.reshape(1, n, -1).astype(mdt), "key": k.reshape(1, n, -1).astype(mdt),
                 "value": v.reshape(1, n, -1).astype(mdt), "past_key": pk[None].astype(mdt),
                 "past_value": pv[None].astype(mdt), "seqlens_k": np.array([past + n - 1], np.int32),
                 "total_sequence_length": np.array(past + n, np.int32)}
        if self.tables is not None:
            feeds["cos_cache"], feeds["sin_cache"] = self.tables
        out, present_k, present_v = self.ops[layer].run(feeds)
        # the cache keeps what the operator returns, in the cache dtype (f32-compute: rounded here, to nearest even)
        self.k[(seq, layer)] = present_k[0].astype(NP[self.dtype])
        self.v[(seq, layer)] = present_v[0].astype(NP[self.dtype])
        return out.reshape(n, self.hq, self.d).astype(np.float32)

    def dump(self, seq, layer):
        """Every row of (seq, layer) as stored: [rows, hkv, d]."""
        key = (seq, layer)
        z = np.zeros((self.hkv, 0, self.d), NP[self.dtype])
        return (np.ascontiguousarray(self.k.get(key, z).transpose(1, 0, 2)),
                np.ascontiguousarray(self.v.get(key, z).transpose(1, 0, 2)))

    def fork(self, parent, child):
        for (s, l) in list(self.k):
            if s == parent:
                self.k[(child, l)], self.v[(child, l)] = self.k[(s, l)].copy(), self.v[(s, l)].copy()

    def release(self, seq):
        for key in [key for key in self.k if key[0] == seq]:
            del self.k[key], self.v[key]

    def live_bytes(self):
        return sum(2 * t.size * t.itemsize for t in self.k.values())


def main():
    ap = vectors_io.arguments(__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["native", "f32-compute"], default="native")
    ap.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    ap.add_argument("--bug", choices=list(BUGS), help="map a layer's window W to local_window_size W - 1 or W + 1")
    args = ap.parse_args()
    with open(os.path.join(HERE, "caps-window.json")) as f:
        caps = json.load(f)
    # caps-window.json (caps.json plus "window") holds native's pipeline; each mode declares the one measured for it
    # unless --pipeline says otherwise
    declaration = {**caps, "pipeline": MODE_PIPELINES[args.mode]}
    name = "onnxruntime-gqa-cpu-" + args.mode + ("-" + args.bug if args.bug else "")
    return vectors_io.drive(args, lambda cfg: Cache(cfg, args.mode, args.threads, args.bug), name,
                            f"onnxruntime {ort.__version__}, onnx {onnx.__version__}", declaration)


if __name__ == "__main__":
    sys.exit(main())
