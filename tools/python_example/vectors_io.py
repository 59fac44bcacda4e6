"""The driver's side of kvcheck's exported vectors, shared by the Python drivers here (this example, ONNX Runtime's,
PyTorch SDPA's): read the vectors' manifest, replay the cases the implementation supports, write their results and
the results' manifest (docs/vectors.md describes the files).

A driver brings only its cache. run_cases makes one per case with make_cache(config) and calls nothing but:

    append_attend(seq, layer, q, k, v) -> out   q [n, n_q_heads, d], k, v [n, n_kv_heads, d] float32 numpy arrays;
                                                out [n, n_q_heads, d] float32 (n may be 0)
    dump(seq, layer) -> (k, v)                  every row of (seq, layer) as stored, [rows, n_kv_heads, d], numpy
                                                arrays of the cache dtype (bf16 as uint16 bit patterns)
                     -> (k, v, k_scales, v_scales)  for a quantized cache (config["codes_dtype"] present): the codes
                                                (fp8 as uint8 bit patterns, int8_token and q8_0 as int8) and their
                                                scales, [rows, n_kv_heads] (q8_0: [rows, n_kv_heads, d / 32]),
                                                float32, or float16 where config["scales_dtype"] is F16
    fork(parent, child), release(seq)
    live_bytes() -> int                         bytes of K and V held for live tokens

A batch step runs its slices one call at a time, which is what a batch means to a cache without a batched kernel.

A case the implementation does not support gets no result files: `kvcheck grade` counts it outside the declaration
(no verdict), because the results' manifest does not declare what it requires. A case it declares but skips is an
ERROR: declare only what the driver runs, and refuse a step it does not know (run_case raises on an unknown op).
"""

import json
import os
import sys

import numpy as np

import safetensors_np as st

# a config's cache dtype -> the safetensors dtype its dumps are written in (a quantized dtype's codes: fp8 in its own
# dtype, the int8 codes of int8_token and q8_0 as I8; the manifest's config also says it, as "codes_dtype")
STORED = {"f32": "F32", "f16": "F16", "bf16": "BF16", "fp8_e4m3": "F8_E4M3", "fp8_e5m2": "F8_E5M2",
          "int8_token": "I8", "q8_0": "I8"}


def load_manifest(vectors_dir, prog):
    """The vectors' manifest.json. A missing or malformed one ends the program with a message and exit code 2."""
    path = os.path.join(vectors_dir, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("cases"), list):
            raise ValueError('no "cases" list')
        for i, case in enumerate(manifest["cases"]):
            if not isinstance(case, dict) or not isinstance(case.get("requires"), list):
                raise ValueError(f'case {i} is not an object with a "requires" list')
        return manifest
    except (OSError, ValueError) as e:
        print(f"{prog}: cannot use {path}: {e} (run `kvcheck export --out {vectors_dir}` first)", file=sys.stderr)
        sys.exit(2)


def supported(case, caps):
    """Whether the case lies inside caps, a caps file's declaration (docs/vectors.md): every word of its "requires"
    in caps["capabilities"], its sizes inside caps["limits"] (absent, 0 or null: no limit) and its head_dim a multiple
    of head_dim_multiple (head_dim_multiple_rope with RoPE, when given)."""
    if not set(case["requires"]) <= set(caps["capabilities"]):
        return False
    lim, cfg = caps.get("limits") or {}, case["config"]
    mult = (lim.get("head_dim_multiple_rope") if cfg["rope"] != "none" else None) or lim.get("head_dim_multiple")
    if mult and cfg["head_dim"] % mult != 0:
        return False
    lengths = [a["pos_end"] for s in case["steps"] for a in s.get("slices", [s]) if "pos_end" in a]
    sizes = {"max_layers": cfg["n_layers"], "max_q_heads": cfg["n_q_heads"], "max_kv_heads": cfg["n_kv_heads"],
             "max_head_dim": cfg["head_dim"], "max_seqs": cfg["max_seqs"], "max_tokens": max(lengths, default=0)}
    return all(not lim.get(name) or size <= lim[name] for name, size in sizes.items())


def run_cases(vectors_dir, manifest, results_dir, make_cache, caps):
    """Replays every case of the manifest that supported(case, caps) accepts, in the manifest's order, each on a cache
    of its own; returns (ran, skipped)."""
    os.makedirs(results_dir, exist_ok=True)
    ran = skipped = 0
    for case in manifest["cases"]:
        if not supported(case, caps):
            skipped += 1  # no results: outside the declaration, not graded
            continue
        run_case(vectors_dir, results_dir, case, make_cache(case["config"]))
        ran += 1
    return ran, skipped


def run_case(vectors_dir, results_dir, case, cache):
    """The case's steps on cache; writes <file>.safetensors (outputs and dumps) and <file>.json (live bytes)."""
    inputs, _, _ = st.read(os.path.join(vectors_dir, case["inputs"]))
    stored = STORED[case["config"]["dtype"]]
    scales = case["config"].get("scales_dtype")  # a quantized cache: every dump has its scales beside it
    out, live = [], []

    def dumped(names, rows):
        if scales is None:
            return [(names["k"], stored, rows[0]), (names["v"], stored, rows[1])]
        k, v, ks, vs = rows
        return [(names["k"], stored, k), (names["v"], stored, v), (names["k_scales"], scales, ks),
                (names["v_scales"], scales, vs)]

    for step in case["steps"]:
        if step["op"] in ("append", "append_batch"):
            names = step["inputs"]
            q, k, v = inputs[names["q"]], inputs[names["k"]], inputs[names["v"]]
            # a batch packs its sequences' tokens one after another; each slice says where its tokens are
            slices = step["slices"] if step["op"] == "append_batch" else [
                dict(seq=step["seq"], token_begin=0, token_end=step["n_new"], dump=step["dump"])]
            o = np.zeros(q.shape, np.float32)
            for sl in slices:
                b, e = sl["token_begin"], sl["token_end"]
                o[b:e] = cache.append_attend(sl["seq"], step["layer"], q[b:e], k[b:e], v[b:e])
                out += dumped(sl["dump"], cache.dump(sl["seq"], step["layer"]))
            out.append((f"step{step['step']}.out", "F32", o))
        elif step["op"] == "fork":
            cache.fork(step["parent"], step["child"])
        elif step["op"] == "release":
            cache.release(step["seq"])
        else:
            raise ValueError(f"{case['id']}: unknown op {step['op']}")
        live.append(int(cache.live_bytes()))
    for d in case["final_dumps"]:
        out += dumped(d, cache.dump(d["seq"], d["layer"]))
    st.write(os.path.join(results_dir, case["file"] + ".safetensors"), out, {"case": case["id"]})
    with open(os.path.join(results_dir, case["file"] + ".json"), "w") as f:
        json.dump({"case": case["id"], "live_bytes": live}, f)
        f.write("\n")


def pipeline_arg(text, prog):
    """A --pipeline value: a JSON object of stages, or a preset name, quoted or not. Text that starts like an object
    but is not one ends the program with a message and exit code 2 (it would otherwise pass for a preset name)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        if text.lstrip().startswith("{"):
            print(f"{prog}: --pipeline is not a JSON object: {e}", file=sys.stderr)
            sys.exit(2)
        return text
    return value if isinstance(value, (dict, str)) else text


def write_results_manifest(results_dir, fields):
    """results/manifest.json: the format's version, then fields (implementation, version, capabilities, ...)."""
    with open(os.path.join(results_dir, "manifest.json"), "w") as f:
        json.dump({"kvcheck_results": 1, **fields}, f, indent=1)
        f.write("\n")
