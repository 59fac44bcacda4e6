#!/usr/bin/env python3
"""How many keys does GroupQueryAttention's local_window_size let a query see? A direct probe, beside kvcheck's
verdict (docs/real-implementations.md, "Sliding windows").

    build/venv/bin/python tools/ort_driver/probe_window.py

Every score is equal (q = 0) and the value of the key at position j is j + 1 in every dim, so a query's output is the
mean of the positions it sees plus one: a query at position i that sees keys lo .. i returns (lo + i) / 2 + 1, and
sees i - lo + 1 keys. An output of exactly 0 means it saw no key. Each local_window_size is run as one prompt, one
decode step and two chunked calls, in f32 and f16; the line gives the number of keys each query saw.
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

D = 8
CALLS = [(0, 10), (9, 1), (5, 5), (3, 4)]  # (rows already cached, new tokens)


def session(local_window_size, elem):
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    types = [elem] * 5 + [TensorProto.INT32] * 2
    inputs = [helper.make_tensor_value_info(n, t, None) for n, t in zip(names, types)]
    outputs = [helper.make_tensor_value_info(n, elem, None) for n in ["output", "present_key", "present_value"]]
    attrs = dict(num_heads=1, kv_num_heads=1, scale=1.0)
    if local_window_size is not None:
        attrs["local_window_size"] = local_window_size
    node = helper.make_node("GroupQueryAttention", names, ["output", "present_key", "present_value"],
                            domain="com.microsoft", **attrs)
    model = helper.make_model(helper.make_graph([node], "probe", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def keys_seen(sess, dt, past, n):
    total = past + n
    v = np.repeat(np.arange(1, total + 1, dtype=np.float64)[:, None], D, 1).astype(dt)
    feeds = {"query": np.zeros((1, n, D), dt), "key": np.zeros((1, n, D), dt), "value": v[past:].reshape(1, n, D),
             "past_key": np.zeros((1, 1, past, D), dt), "past_value": v[:past].reshape(1, 1, past, D),
             "seqlens_k": np.array([total - 1], np.int32), "total_sequence_length": np.array(total, np.int32)}
    out = sess.run(None, feeds)[0].reshape(n, D)[:, 0].astype(np.float64)
    # mean = (lo + i) / 2 + 1, so lo = 2 (mean - 1) - i
    return [0 if o == 0 else int(round(i - (2 * (o - 1) - i) + 1)) for i, o in zip(range(past, total), out)]


def main():
    print(f"onnxruntime {ort.__version__}, CPU")
    for dt, elem in [(np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16)]:
        for lws in [None, -1, 0, 1, 2, 3, 5]:
            sess = session(lws, elem)
            seen = "; ".join(f"past {p} + {n}: {keys_seen(sess, dt, p, n)}" for p, n in CALLS)
            print(f"{np.dtype(dt).name} local_window_size {'unset' if lws is None else lws}: keys seen {seen}")


if __name__ == "__main__":
    main()
