"""The one loop every Python driver of kvcheck's exported vectors runs (docs/vectors.md, "A driver in Python"): read
the export's manifest, leave out the cases outside the driver's declaration by the rule `kvcheck grade` applies, run
every other case's steps on the library under test, write each case's results and, last, the results manifest with
the declaration. A driver is then only its library's calls:

    import sys, vectors_io

    class Cache:                                             # one per case, made from the case's "config"
        def __init__(self, config): ...
        def append_attend(self, seq, layer, q, k, v): ...    # -> out
        def dump(self, seq, layer): ...                      # -> (k, v), every row of (seq, layer) as stored
        def fork(self, parent, child): ...
        def release(self, seq): ...
        def live_bytes(self): ...                            # -> int

    sys.exit(vectors_io.main(Cache, "my-cache", "1.0",
                             {"capabilities": ["dtype f32", "rope neox", "gqa", "chunked"], "pipeline": "f32"}))

The calls, all with numpy arrays:

    append_attend(seq, layer, q, k, v) -> out   q [n, n_q_heads, d], k, v [n, n_kv_heads, d] float32 (read-only);
                                                out [n, n_q_heads, d], any float dtype (written as float32); n may be 0
    dump(seq, layer) -> (k, v)                  every row of (seq, layer) as stored, [rows, n_kv_heads, d], in the
                                                cache dtype: float32, float16, bf16 as uint16 bit patterns
                                                (where config["head_dim_v"] is set, v, out and V dumps have that
                                                many dims instead of d; config["windows"], ["sinks"] and
                                                ["rope_dim_begin"], ["rope_dims"] give the window of each layer, the
                                                sinks and the RoPE range: docs/windowed-caches.md)
                     -> (k, v, k_scales, v_scales)  a quantized cache (config["codes_dtype"] present): the codes (fp8
                                                as uint8 bit patterns, int8_token and q8_0 as int8) and their scales,
                                                [rows, n_kv_heads] (q8_0: [rows, n_kv_heads, d / 32]), float32, or
                                                float16 where config["scales_dtype"] is F16
    fork(parent, child), release(seq)           only cases with such a step call them
    live_bytes() -> int                         bytes of K and V held for live tokens; only MEMORY cases need it
    append_attend_batch(layer, seqs, offsets, q, k, v) -> out
                                                optional, a batched kernel (the ABI's append_attend_batch): seqs
                                                distinct, sequence seqs[j]'s tokens are rows offsets[j] ..
                                                offsets[j+1]-1 of the packed q, k, v and out. Without it a batch step
                                                runs its slices one append_attend each
    close()                                     optional: called once a case is done, to free what the library holds

What the loop does with each case:

- outside the declaration (a capability not declared, a size over a limit, a head_dim not a declared multiple, a
  property about an undeclared feature, or a q8_0 query over a head_dim that is not a multiple of 32): not run, no
  files. grade counts it apart, as outside, by the same rule;
- run: <file>.safetensors (outputs and dumps) and <file>.json (live bytes). What dump returns is copied when it
  returns, so a later write to the cache's storage cannot change an earlier dump;
- a call raised Unsupported, or the case needs a call the cache does not have, or a step this loop does not know:
  skipped, said on stderr, no files. Inside the declaration, grade makes it an ERROR ("the driver skipped it");
- any other exception (the library refused a call, or returned an array of the wrong dtype): <file>.json holds
  {"case", "error": {"step", "call", "message"}} and no safetensors is written, said on stderr; grade makes it an
  ERROR. The loop goes on with the next case.

The results manifest is removed first and written last, so results of a driver stopped midway are refused by grade
rather than graded in part.
"""

import argparse
import json
import math
import os
import sys
import traceback

import numpy as np

import safetensors_np as st

# a config's cache dtype -> the safetensors dtype its dumps are written in (a quantized dtype's codes: fp8 in its own
# dtype, the int8 codes of int8_token and q8_0 as I8; the manifest's config also says it, as "codes_dtype")
STORED = {"f32": "F32", "f16": "F16", "bf16": "BF16", "fp8_e4m3": "F8_E4M3", "fp8_e5m2": "F8_E5M2",
          "int8_token": "I8", "q8_0": "I8"}

# The words a declaration's "capabilities" may hold (kvcheck refuses any other, exit 2): checked here before any case
# runs, since a misspelt word would leave every case needing it outside the declaration.
CAPABILITY_WORDS = ["dtype f32", "dtype f16", "dtype bf16", "dtype fp8_e4m3", "dtype fp8_e5m2", "dtype int8_token",
                    "dtype q8_0", "fp8 scale per tensor", "fp8 scale per kv head", "int8 scale in f16", "rope neox",
                    "rope gptj", "gqa", "paged", "fork", "release", "batch", "chunked", "window", "sinks",
                    "head_dim_v", "rope_range"]
# A declaration's "limits": the largest size of each (0 or null: no limit), then the head_dim multiples.
SIZE_LIMITS = ["max_layers", "max_q_heads", "max_kv_heads", "max_head_dim", "max_seqs", "max_tokens", "max_window",
               "max_sinks", "max_head_dim_v"]
LIMITS = SIZE_LIMITS + ["head_dim_multiple", "head_dim_multiple_rope"]
# The fields of a driver's declaration (a caps file's; "about" is free text).
DECLARATION_FIELDS = {"capabilities", "limits", "fixed", "pipeline", "precision", "about"}
# A declaration's "fixed": what the implementation hard-codes (every case is drawn with it), in the JSON report's words.
FIXED_SCALE = "1/sqrt(head_dim)"
# A property about a feature: without it every case of the property lies outside the declaration.
PROPERTY_FEATURE = {"GQA": "gqa", "BATCH": "batch", "FORK": "fork", "RELEASE": "release"}
PIPELINE_PRESETS = {"f32", "q-and-v-accum-in-cache-dtype"}
PIPELINE_KEYS = {"q", "rope", "scores", "probs", "accum", "output", "new_rows_unrounded", "q8_0_rounding"}


class Unsupported(Exception):
    """Raised by a cache for a call it cannot make (a step kind, a shape): the case is skipped, never passed."""


class BadInput(Exception):
    """The vectors or the driver's declaration cannot be used: nothing is run (exit 2)."""


# ---- the declaration and which cases lie outside it --------------------------------------------------------------


def checked_declaration(declaration):
    """The declaration with every field known, every capability word and limit one kvcheck reads, and a pipeline:
    raises BadInput naming the first problem, before any case runs (grade would refuse the manifest after all ran)."""
    if not isinstance(declaration, dict):
        raise BadInput("the declaration is not a JSON object")
    unknown = sorted(set(declaration) - DECLARATION_FIELDS)
    if unknown:
        raise BadInput(f'the declaration has an unknown field "{unknown[0]}" (known: '
                       f'{", ".join(sorted(DECLARATION_FIELDS))})')
    words = declaration.get("capabilities")
    if not isinstance(words, list):
        raise BadInput('the declaration has no "capabilities" list')
    for w in words:
        if w == "evict":  # kvcheck refuses it by name: a dump cannot say which rows an evicting cache dropped
            raise BadInput('"capabilities": "evict" is not supported on the vectors route (a dump cannot say which '
                           'rows the cache dropped); declare "window" and "sinks" without it, or judge an evicting '
                           'cache through `kvcheck validate --plugin` or `--connect`')
        if w not in CAPABILITY_WORDS:
            raise BadInput(f'"capabilities": unknown word {json.dumps(w)} (known: {", ".join(CAPABILITY_WORDS)})')
    limits = declaration.get("limits") or {}
    if not isinstance(limits, dict):
        raise BadInput('"limits" is not an object')
    for key, value in limits.items():
        if key not in LIMITS:
            raise BadInput(f'"limits": unknown limit "{key}" (known: {", ".join(LIMITS)})')
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise BadInput(f'"limits": "{key}" must be a non-negative integer or null, not {json.dumps(value)}')
    fixed = declaration.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise BadInput('"fixed" is not an object')
    for key, value in fixed.items():
        if key not in ("rope_theta", "softmax_scale"):
            raise BadInput(f'"fixed": unknown parameter "{key}" (known: rope_theta, softmax_scale)')
        if value is None:
            continue
        if key == "rope_theta" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                    or not 0 < value <= 3.4028234663852886e38):
            raise BadInput(f'"fixed": "rope_theta" must be a finite number > 0 or null, not {json.dumps(value)}')
        if key == "softmax_scale" and value != FIXED_SCALE:
            raise BadInput(f'"fixed": "softmax_scale" must be "{FIXED_SCALE}" or null, not {json.dumps(value)}')
    if ("pipeline" in declaration) == ("precision" in declaration):
        raise BadInput('the declaration needs a "pipeline" (or the older "precision"), once')
    if "precision" in declaration:
        if declaration["precision"] not in PIPELINE_PRESETS | {"q_and_v_accum_in_cache_dtype"}:
            raise BadInput(f'"precision" must be f32 or q-and-v-accum-in-cache-dtype, not '
                           f'{json.dumps(declaration["precision"])}')
        return declaration
    pipeline = declaration["pipeline"]
    if isinstance(pipeline, str) and pipeline not in PIPELINE_PRESETS:
        raise BadInput(f"unknown pipeline preset {json.dumps(pipeline)} (f32 or q-and-v-accum-in-cache-dtype)")
    if isinstance(pipeline, dict) and set(pipeline) - PIPELINE_KEYS:
        raise BadInput(f'the pipeline has an unknown stage "{sorted(set(pipeline) - PIPELINE_KEYS)[0]}"')
    if not isinstance(pipeline, (str, dict)):
        raise BadInput("the pipeline is neither a preset name nor an object of stages")
    return declaration


def q8_0_query(declaration):
    """Whether the declared pipeline rounds q to q8_0 blocks of 32 (then head_dim must hold whole blocks)."""
    pipeline = declaration.get("pipeline")
    return isinstance(pipeline, dict) and pipeline.get("q") == "q8_0"


def head_dim_multiple(limits, rope, q8_0=False):
    """The multiple a declaration demands of head_dim, with or without RoPE (1: any), as kvcheck computes it."""
    m = (limits.get("head_dim_multiple_rope") if rope else None) or limits.get("head_dim_multiple") or 1
    return m * 32 // math.gcd(m, 32) if q8_0 else m


def case_sizes(case):
    """The sizes a case uses, by the name of the limit that bounds each (a window, the sinks and head_dim_v only
    where the case has them, as kvcheck compares them)."""
    cfg = case["config"]
    lengths = [a["pos_end"] for s in case["steps"] for a in s.get("slices", [s]) if "pos_end" in a]
    sizes = {"max_layers": cfg["n_layers"], "max_q_heads": cfg["n_q_heads"], "max_kv_heads": cfg["n_kv_heads"],
             "max_head_dim": cfg["head_dim"], "max_seqs": cfg["max_seqs"], "max_tokens": max(lengths, default=0)}
    windows = cfg.get("windows") or []
    if any(windows):
        sizes["max_window"] = max(windows)
        if cfg.get("sinks"):
            sizes["max_sinks"] = cfg["sinks"]
    if cfg.get("head_dim_v", cfg["head_dim"]) != cfg["head_dim"]:
        sizes["max_head_dim_v"] = cfg["head_dim_v"]
    return sizes


def outside(case, declaration):
    """What the case needs that the declaration lacks, in words; empty when the case lies inside it. The rule is
    grade's for a case without results (docs/vectors.md), so a case left out here is one grade counts as outside,
    and a case run here is one grade grades."""
    cfg, limits = case["config"], declaration.get("limits") or {}
    words = set(declaration["capabilities"])
    needs = [w for w in case["requires"] if w not in words]
    m = head_dim_multiple(limits, cfg["rope"] != "none", q8_0_query(declaration))
    if cfg["head_dim"] % m:
        needs.append(f"head_dim {cfg['head_dim']} not a multiple of {m}")
    for name, size in case_sizes(case).items():
        limit = limits.get(name)
        if name == "max_head_dim_v" and not limit:  # none declared: max_head_dim bounds V rows too
            limit = limits.get("max_head_dim")
        if limit and size > limit:
            needs.append(f"{name[4:]} {size} > {limit}")
    feature = PROPERTY_FEATURE.get(case["property"])
    if not needs and feature and feature not in words:
        needs.append(feature)
    return needs


def narrower(exported, declaration):
    """How the driver's declaration falls short of the one the vectors were exported for (empty: it covers it).
    grade refuses such results, since cases the driver leaves out would pass for cases outside the declaration."""
    why = [f'"{w}": declared by the export, not by the driver' for w in exported.get("capabilities", [])
           if w not in declaration["capabilities"]]
    ex, mine = exported.get("limits") or {}, declaration.get("limits") or {}
    for key in SIZE_LIMITS:
        a, b = ex.get(key) or 0, mine.get(key) or 0
        if b and (not a or a > b):
            why.append(f"{key}: {a or 'none'} in the export, {b} in the driver's declaration")
    for rope, key in ((False, "head_dim_multiple"), (True, "head_dim_multiple_rope")):
        a = (ex.get("head_dim_multiple_rope") if rope else None) or ex.get("head_dim_multiple") or 0
        b = (mine.get("head_dim_multiple_rope") if rope else None) or mine.get("head_dim_multiple") or 0
        if b > 1 and (not a or a % b):
            why.append(f"{key}: {a or 'none'} in the export, {b} in the driver's declaration")
    # a value the driver hard-codes must be the one every exported case was drawn with
    ex_fixed, my_fixed = exported.get("fixed") or {}, declaration.get("fixed") or {}
    as_kept = {"rope_theta": lambda x: None if x is None else float(np.float32(x)),  # kvcheck keeps a float32
               "softmax_scale": lambda x: x}
    for key in ("rope_theta", "softmax_scale"):
        mine_value = my_fixed.get(key)
        if mine_value is not None and as_kept[key](ex_fixed.get(key)) != as_kept[key](mine_value):
            why.append(f"fixed {key}: {ex_fixed.get(key) or 'none'} in the export, {mine_value} in the driver's "
                       "declaration")
    return why


# ---- the manifest -----------------------------------------------------------------------------------------------


def read_manifest(vectors_dir):
    """The export's manifest.json, its cases checked for the fields the loop reads; raises BadInput."""
    path = os.path.join(vectors_dir, "manifest.json")
    try:
        with open(path) as f:
            manifest = json.load(f)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("cases"), list):
            raise ValueError('no "cases" list')
        for i, case in enumerate(manifest["cases"]):
            if not isinstance(case, dict) or not isinstance(case.get("requires"), list):
                raise ValueError(f'case {i} is not an object with a "requires" list')
            for field in ("id", "property", "file", "inputs", "config", "steps", "final_dumps"):
                if field not in case:
                    raise ValueError(f'case {i} has no "{field}"')
        return manifest
    except (OSError, ValueError) as e:
        raise BadInput(f"cannot use {path}: {e} (run `kvcheck export --out {vectors_dir}` first)") from e


def load_manifest(vectors_dir, prog):
    """read_manifest for a driver's main: a missing or malformed manifest ends the program with exit code 2."""
    try:
        return read_manifest(vectors_dir)
    except BadInput as e:
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(2)


# ---- one case ----------------------------------------------------------------------------------------------------


def checked_array(a, dtype_name, what):
    """A copy of what the cache returned, refused (TypeError) unless its numpy dtype holds dtype_name's elements as
    they are: the writer would otherwise convert it, and an f16 cache that dumps float32 rows would pass for one
    that stores them in f16."""
    a = np.array(a)  # a copy: the cache may write to the storage behind a view later
    want = st.DTYPES[dtype_name]
    if a.dtype.itemsize != want.itemsize or (a.dtype.kind == "f") != (want.kind == "f"):
        raise TypeError(f"{what} is {a.dtype}; the {dtype_name} tensor takes {want.name}")
    return a


class Replay:
    """One case's steps on one cache: the tensors and live bytes to write, and where the case is (for an error)."""

    def __init__(self, case, inputs, cache):
        self.case, self.inputs, self.cache = case, inputs, cache
        cfg = case["config"]
        self.shape_q = (cfg["n_q_heads"], cfg.get("head_dim_v", cfg["head_dim"]))  # an output row has V's dims
        self.stored, self.scales = STORED[cfg["dtype"]], cfg.get("scales_dtype")
        self.tensors, self.live = [], []
        self.step, self.call = None, "the cache's constructor"

    def method(self, name):
        """The cache's method `name`; a case that needs one the cache lacks is unsupported, not failed."""
        fn = getattr(self.cache, name, None)
        if fn is None:
            raise Unsupported(f"the cache has no {name}()")
        return fn

    def dumped(self, names, seq, layer):
        self.call = f"dump(seq {seq}, layer {layer})"
        rows = self.method("dump")(seq, layer)
        parts = [("k", self.stored), ("v", self.stored)]
        if self.scales is not None:  # a quantized cache: every dump has its scales beside it
            parts += [("k_scales", self.scales), ("v_scales", self.scales)]
        if len(rows) != len(parts):
            raise ValueError(f"{self.call} returned {len(rows)} arrays, not {len(parts)} "
                             f"({', '.join(p for p, _ in parts)})")
        for (part, dtype_name), a in zip(parts, rows):
            self.tensors.append((names[part], dtype_name, checked_array(a, dtype_name, part)))

    def output(self, out, n):
        """The call's out as float32 [n, n_q_heads, dv]; another shape or a non-float array is the cache's error."""
        if n == 0 and (out is None or np.size(out) == 0):  # an empty append returns nothing to grade
            return np.zeros((0, *self.shape_q), np.float32)
        out = np.asarray(out)
        if out.dtype.kind != "f" or out.shape != (n, *self.shape_q):
            raise ValueError(f"{self.call} returned {out.dtype} {list(out.shape)}, expected float "
                             f"{[n, *self.shape_q]}")
        return out.astype(np.float32)

    def append(self, step):
        """An append or append_batch step: one call per slice, or one batched call when the cache has one."""
        q, k, v = (self.inputs[step["inputs"][x]] for x in "qkv")
        layer = step["layer"]
        slices = step["slices"] if step["op"] == "append_batch" else [
            dict(seq=step["seq"], token_begin=0, token_end=step["n_new"], dump=step["dump"])]
        batched = getattr(self.cache, "append_attend_batch", None)
        if step["op"] == "append_batch" and batched is not None:
            seqs = [sl["seq"] for sl in slices]
            offsets = [sl["token_begin"] for sl in slices] + [step["n_new"]]
            self.call = f"append_attend_batch(layer {layer}, seqs {seqs})"
            out = self.output(batched(layer, seqs, offsets, q, k, v), q.shape[0])
        else:
            out = np.zeros((q.shape[0], *self.shape_q), np.float32)
            for sl in slices:
                b, e = sl["token_begin"], sl["token_end"]
                self.call = f"append_attend(seq {sl['seq']}, layer {layer}, {e - b} tokens)"
                out[b:e] = self.output(self.method("append_attend")(sl["seq"], layer, q[b:e], k[b:e], v[b:e]), e - b)
        for sl in slices:
            self.dumped(sl["dump"], sl["seq"], layer)
        self.tensors.append((f"step{step['step']}.out", "F32", out))

    def run(self):
        """Every step, then the final dumps. Raises Unsupported, or whatever the cache raised."""
        if self.case["property"] == "MEMORY":  # the one property that grades live bytes
            self.method("live_bytes")
        for step in self.case["steps"]:
            self.step, op = step["step"], step["op"]
            if op in ("append", "append_batch"):
                self.append(step)
            elif op == "fork":
                self.call = f"fork({step['parent']}, {step['child']})"
                self.method("fork")(step["parent"], step["child"])
            elif op == "release":
                self.call = f"release({step['seq']})"
                self.method("release")(step["seq"])
            else:
                raise Unsupported(f"step {self.step}: op {json.dumps(op)} is not one this loop knows")
            if hasattr(self.cache, "live_bytes"):
                self.call = "live_bytes()"
                self.live.append(int(self.cache.live_bytes()))
        self.step = None
        for d in self.case["final_dumps"]:
            self.dumped(d, d["seq"], d["layer"])


def write_whole(path, write):
    """write(tmp) then a rename: a results file is there whole or not at all."""
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def write_json(path, value):
    """value as one JSON document at path, written whole."""

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(value, f)
            f.write("\n")

    write_whole(path, write)


def close(cache):
    """The cache's close(), when it has one."""
    fn = getattr(cache, "close", None)
    if fn is not None:
        fn()


def error_text(e):
    """An exception as its type and message, the form a record and a log line give it in."""
    return "".join(traceback.format_exception_only(type(e), e)).strip()


def run_case(vectors_dir, results_dir, case, make_cache):
    """Runs one case inside the declaration and writes what it gave. Returns ("ran", None), ("skipped", reason) or
    ("error", message). Results an earlier run left for the case are removed first: they are never graded as this
    run's."""
    base = os.path.join(results_dir, case["file"])
    remove_results(base)
    try:
        inputs, _, _ = st.read(os.path.join(vectors_dir, case["inputs"]))
    except (OSError, ValueError, st.FormatError) as e:
        raise BadInput(f"{case['id']}: cannot read {case['inputs']}: {e}") from e
    cache = replay = None
    try:
        cache = make_cache(case["config"])
        replay = Replay(case, inputs, cache)
        replay.run()
        replay.call = "close()"
        close(cache)
    except Exception as e:  # the library's error is the case's, not the loop's
        if cache is not None and (replay is None or replay.call != "close()"):
            try:
                close(cache)
            except Exception:
                pass  # the first error is the one recorded
        if isinstance(e, Unsupported):
            return ("skipped", str(e))
        step, call = (replay.step, replay.call) if replay else (None, "the cache's constructor")
        write_json(base + ".json", {"case": case["id"], "error": {"step": step, "call": call,
                                                                  "message": error_text(e)}})
        return ("error", ("" if step is None else f"step {step}, ") + f"{call}: {error_text(e)}")
    write_whole(base + ".safetensors", lambda tmp: st.write(tmp, replay.tensors, {"case": case["id"]}))
    record = {"case": case["id"]}
    if hasattr(cache, "live_bytes"):
        record["live_bytes"] = replay.live
    write_json(base + ".json", record)
    return ("ran", None)


def remove_results(base):
    """Removes the results files at base (.safetensors, .json), when there are any."""
    for ext in (".safetensors", ".json"):
        if os.path.lexists(base + ext):
            os.remove(base + ext)


# ---- every case --------------------------------------------------------------------------------------------------


class Summary:
    """What the loop did with each case, by id: run, skipped by the driver (with why), failed with an error (with
    the message), outside the declaration (with what it needs)."""

    def __init__(self):
        self.ran, self.skipped, self.errors, self.outside = [], {}, {}, {}

    def line(self, name, results_dir):
        return (f"{name}: {len(self.ran)} cases run, {len(self.errors)} with an error, {len(self.skipped)} skipped, "
                f"{len(self.outside)} outside the declaration; results in {results_dir}")


def replay_cases(vectors_dir, manifest, results_dir, make_cache, declaration, log=None, name="driver"):
    """Every case of the manifest, in its order, each on a cache of its own; a case outside the declaration is not
    run. Says each skip and error on log (stderr by default). Returns a Summary."""
    log = log or sys.stderr
    os.makedirs(results_dir, exist_ok=True)
    summary = Summary()
    for case in manifest["cases"]:
        needs = outside(case, declaration)
        if needs:
            summary.outside[case["id"]] = needs
            remove_results(os.path.join(results_dir, case["file"]))  # an earlier run's would be graded
            continue
        what, detail = run_case(vectors_dir, results_dir, case, make_cache)
        if what == "ran":
            summary.ran.append(case["id"])
        elif what == "skipped":
            summary.skipped[case["id"]] = detail
            print(f"{name}: {case['id']}: SKIPPED by the driver (grade: ERROR): {detail}", file=log)
        else:
            summary.errors[case["id"]] = detail
            print(f"{name}: {case['id']}: ERROR: {detail}", file=log)
    return summary


def write_results_manifest(results_dir, fields):
    """results/manifest.json: the format's version, then fields (implementation, version, capabilities, ...)."""
    write_json(os.path.join(results_dir, "manifest.json"), {"kvcheck_results": 1, **fields})


def run(vectors_dir, results_dir, make_cache, implementation, version, declaration, log=None):
    """The loop: the manifest read, the declaration checked (and against the one the vectors were exported for),
    every case replayed, the results manifest written last. Returns a Summary; raises BadInput before running
    anything when the vectors or the declaration cannot be used."""
    manifest = read_manifest(vectors_dir)
    declaration = checked_declaration(declaration)
    short = narrower(manifest["declared"], declaration) if "declared" in manifest else []  # exported with --caps
    if short:
        raise BadInput("the driver declares less than the vectors were exported for (their manifest's "
                       f"\"declared\"): {'; '.join(short)}. kvcheck grade would refuse these results")
    os.makedirs(results_dir, exist_ok=True)
    manifest_path = os.path.join(results_dir, "manifest.json")
    if os.path.lexists(manifest_path):
        os.remove(manifest_path)
    summary = replay_cases(vectors_dir, manifest, results_dir, make_cache, declaration, log, implementation)
    fields = {"implementation": implementation, "version": version, "capabilities": declaration["capabilities"]}
    for key in ("limits", "fixed"):
        if declaration.get(key):
            fields[key] = declaration[key]
    fields.update({k: declaration[k] for k in ("pipeline", "precision") if k in declaration})
    write_results_manifest(results_dir, fields)
    return summary


# ---- a driver's command line -------------------------------------------------------------------------------------


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


def arguments(description=None):
    """The options every driver takes (--vectors, --results, --pipeline); a driver adds its own before parsing."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--vectors", required=True, help="directory written by `kvcheck export`")
    ap.add_argument("--results", required=True, help="directory to write the results to")
    ap.add_argument("--pipeline", help="declare this rounding pipeline instead of the driver's own: a preset name or "
                                       "a JSON object of stages (docs/vectors.md)")
    return ap


def drive(args, make_cache, implementation, version, declaration):
    """run() for parsed arguments(): --pipeline, when given, replaces the declared pipeline. Prints the summary and
    returns the exit code: 0 the results are written (grade judges them, errors and skips included), 2 the vectors,
    the declaration or --pipeline cannot be used (nothing run)."""
    prog = os.path.basename(sys.argv[0]) or implementation
    declaration = dict(declaration)
    if args.pipeline is not None:
        declaration.pop("precision", None)
        declaration["pipeline"] = pipeline_arg(args.pipeline, prog)
    try:
        summary = run(args.vectors, args.results, make_cache, implementation, version, declaration)
    except BadInput as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(summary.line(implementation, args.results))
    return 0


def main(make_cache, implementation, version, declaration, description=None):
    """A whole driver's main: arguments() parsed, then drive()."""
    return drive(arguments(description).parse_args(), make_cache, implementation, version, declaration)
