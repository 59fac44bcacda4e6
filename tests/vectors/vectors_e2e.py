#!/usr/bin/env python3
"""End-to-end cases of `kvcheck export | grade`, with the numpy example (tools/python_example) as the implementation.

    vectors_e2e.py --kvcheck build/bin/kvcheck --example tools/python_example --work DIR CASE

Each case exports vectors, runs the example, optionally breaks what it wrote in one precise way, grades, and checks
the exit code and that the output names the right property, file and problem. Exit 0 when the case holds.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys


def sh(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("$ " + " ".join(cmd) + "\n" + p.stdout)
    return p.returncode, p.stdout


class Case:
    def __init__(self, args):
        self.kvcheck, self.example, self.work = args.kvcheck, args.example, args.work
        sys.dont_write_bytecode = True  # keep the source tree clean
        sys.path.insert(0, self.example)
        import safetensors_np  # the example's own reader and writer

        self.st = safetensors_np
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.vectors = os.path.join(self.work, "vectors")
        self.results = os.path.join(self.work, "results")

    def export(self, *extra):
        rc, _ = sh([self.kvcheck, "export", "--out", self.vectors, *extra])
        expect(rc == 0, f"export exited {rc}")
        with open(os.path.join(self.vectors, "manifest.json")) as f:
            self.manifest = json.load(f)

    def run_example(self, *extra, results=None):
        rc, _ = sh([sys.executable, "-B", os.path.join(self.example, "kvcache_example.py"), "--vectors", self.vectors,
                    "--results", results or self.results, *extra])
        expect(rc == 0, f"the example exited {rc}")

    def grade(self, want_rc, *extra, results=None):
        rc, out = sh([self.kvcheck, "grade", "--vectors", self.vectors, "--results", results or self.results, *extra])
        expect(rc == want_rc, f"grade exited {rc}, expected {want_rc}")
        return out

    def case(self, pred):
        """The first case of the manifest for which pred(case) holds."""
        for c in self.manifest["cases"]:
            if pred(c):
                return c
        raise AssertionError("no exported case fits this test; export more cases")

    def result_path(self, case, ext="safetensors"):
        return os.path.join(self.results, case["file"] + "." + ext)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_in(text, *parts):
    for p in parts:
        expect(p in text, f"the output does not say {p!r}")


def summary_line(out):
    return next(l for l in out.splitlines() if l.startswith("summary:"))


def verdict_line(out, case_id):
    for line in out.splitlines():
        if line.split()[:1] == [case_id]:
            return line
    raise AssertionError(f"no verdict line for {case_id}")


def rewrite_header(path, edit):
    """Rewrites a safetensors file's JSON header with edit(header) (data bytes unchanged)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob[8 + n :])


def nonempty_tensors_in_data_order(header):
    names = [k for k in header if k != "__metadata__" and header[k]["data_offsets"][1] > header[k]["data_offsets"][0]]
    return sorted(names, key=lambda k: header[k]["data_offsets"])


# ---- the cases ---------------------------------------------------------------------------------------------------


def roundtrip(t):
    t.export()
    t.run_example()
    report, junit = os.path.join(t.work, "report.json"), os.path.join(t.work, "junit.xml")
    out = t.grade(0, "--report", report, "--junit", junit)
    expect(summary_line(out).endswith("40 PASS  => every graded case passes"), "a case did not pass")
    with open(report) as f:
        r = json.load(f)
    expect(r["exit_code"] == 0, "the report's exit code")
    expect(len(r["implementations"][0]["cases"]) == len(t.manifest["cases"]) == 40, "one verdict per exported case")
    expect(all(c["verdict"] == "PASS" for c in r["implementations"][0]["cases"]), "every verdict PASS")
    import xml.etree.ElementTree as ET

    suite = ET.parse(junit).getroot()
    expect(suite.get("tests") == "40" and suite.get("failures") == "0" and suite.get("errors") == "0", "JUnit")
    expect(not [p for p in os.listdir(t.work) if p.endswith((".tmp", ".kvcheck-tmp"))], "no temporary files left")


def skip_self(t):
    t.export("--properties", "EQUIV", "--cases", "5")
    t.run_example("--bug", "skip-self")
    report = os.path.join(t.work, "report.json")
    out = t.grade(1, "--report", report)
    expect_in(out, "FAIL", "EQUIV: ", "first mismatch: output at op")
    with open(report) as f:
        r = json.load(f)
    expect(all(c["verdict"] == "FAIL" and c["failed_property"] == "EQUIV" for c in r["implementations"][0]["cases"]), "every case FAILs")


def flip_dump_element(t, case, step, row):
    """Changes the lowest bit of one element of step<step>.v's row `row` in the case's results."""
    path = t.result_path(case)
    tensors, dtypes, meta = t.st.read(path)
    out = []
    for name, array in tensors.items():
        array = array.copy()
        if name == f"step{step}.v":
            flat = array.reshape(-1).view({2: "u2", 4: "u4"}[array.itemsize])
            flat[row * array.shape[1] * array.shape[2]] ^= 1
        out.append((name, dtypes[name], array))
    t.st.write(path, out, meta)


def content_bitflip(t):
    t.export("--properties", "CACHE-CONTENT", "--cases", "4")
    t.run_example()
    c = t.case(lambda c: any(s["op"] == "append" and s["n_new"] > 0 for s in c["steps"]))
    s = next(s for s in c["steps"] if s["op"] == "append" and s["n_new"] > 0)
    flip_dump_element(t, c, s["step"], s["pos_begin"])
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "FAIL", "CACHE-CONTENT: dumped v differs from the appended value",
              f"position {s['pos_begin']}")


def equiv_storage_named(t):
    """An EQUIV failure whose dumped rows also differ from the appended ones names the storage, not a pipeline."""
    t.export("--properties", "EQUIV", "--cases", "4", "--dtypes", "f16")
    t.run_example()
    c = t.case(lambda c: any(s["op"] == "append" and s["n_new"] > 0 for s in c["steps"]))
    s = next(s for s in c["steps"] if s["op"] == "append" and s["n_new"] > 0)
    flip_dump_element(t, c, s["step"], s["pos_begin"])
    path = t.result_path(c)
    tensors, dtypes, meta = t.st.read(path)
    out = []
    for name, array in tensors.items():
        if name == f"step{s['step']}.out":
            array = array.copy()
            array.reshape(-1)[0] += 0.25  # an output error any grader sees
        out.append((name, dtypes[name], array))
    t.st.write(path, out, meta)
    line = verdict_line(t.grade(1), c["id"])
    expect_in(line, "FAIL", "EQUIV: ", "the rows read back differ from the appended values rounded to f16",
              "a storage error, not arithmetic")
    expect("consistent with" not in line, "a narrower pipeline is named beside the storage error: " + line)


def past_rewritten(t):
    t.export("--properties", "APPEND-ONLY", "--cases", "6")
    t.run_example()
    c = t.case(lambda c: any(s["op"] == "append" and s["pos_begin"] > 0 for s in c["steps"]))
    s = next(s for s in c["steps"] if s["op"] == "append" and s["pos_begin"] > 0)
    flip_dump_element(t, c, s["step"], 0)  # row 0 was dumped by an earlier step
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "FAIL", "APPEND-ONLY: a row dumped earlier changed", "position 0")


def memory_misreport(t):
    t.export("--properties", "MEMORY", "--cases", "3")
    t.run_example()
    c = t.manifest["cases"][0]
    with open(t.result_path(c, "json")) as f:
        j = json.load(f)
    j["live_bytes"][-1] += 2
    with open(t.result_path(c, "json"), "w") as f:
        json.dump(j, f)
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "FAIL", "MEMORY: reported live bytes differ")


def not_supported(t):
    t.export("--cases", "6")
    t.run_example()
    dropped = "dtype bf16"
    for c in t.manifest["cases"]:
        if dropped in c["requires"]:
            os.remove(t.result_path(c))
            os.remove(t.result_path(c, "json"))
    path = os.path.join(t.results, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["capabilities"].remove(dropped)
    with open(path, "w") as f:
        json.dump(m, f)
    c = t.case(lambda c: dropped in c["requires"])
    n = sum(dropped in c["requires"] for c in t.manifest["cases"])
    report = os.path.join(t.work, "report.json")
    out = t.grade(0, "--report", report)
    # outside the declaration: no verdict, counted apart, and said loudly since the export did include them
    expect(not any(l.split()[:1] == [c["id"]] for l in out.splitlines()), f"{c['id']} has a verdict line")
    expect("NOT_SUPPORTED" not in out, "a case outside the declaration is counted as a verdict")
    expect_in(out, f"outside the declaration, not graded: {n} cases", f"{n} needing dtype bf16 (exported, no results)",
              f"warning: {n} exported cases have no results and lie outside the results' declaration")
    with open(report) as f:
        r = json.load(f)
    outside = r["implementations"][0]["outside_declaration"]
    expect(r["outside_declaration"] == n == len(outside), "the report counts the cases outside apart")
    expect(all(o["exported"] and o["needs"] == [dropped] for o in outside), f"{outside}")
    expect(all(c["verdict"] != "NOT_SUPPORTED" for c in r["implementations"][0]["cases"]), "a NOT_SUPPORTED verdict")
    expect(sum(p["outside_declaration"] for p in r["implementations"][0]["properties"]) == n, "per property")
    expect(any("outside the results' declaration" in w for w in r["warnings"]), "the report's warnings")


def missing_results(t):
    t.export("--cases", "2")
    t.run_example()
    c = t.manifest["cases"][0]
    os.remove(t.result_path(c))
    os.remove(t.result_path(c, "json"))
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "ERROR", "no results", "declares every capability", "the driver skipped it")
    expect_in(out, "warning: the driver wrote no results for 1 case inside its declaration")


def missing_tensor(t):
    t.export("--properties", "EQUIV", "--cases", "2")
    t.run_example()
    c = t.manifest["cases"][0]
    tensors, dtypes, meta = t.st.read(t.result_path(c))
    t.st.write(t.result_path(c), [(n, dtypes[n], a) for n, a in tensors.items() if n != "step0.out"], meta)
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "ERROR", c["file"] + '.safetensors: tensor "step0.out" is missing')


def nan_output(t):
    t.export("--properties", "EQUIV", "--cases", "3")
    t.run_example()
    c = t.case(lambda c: any(s["op"] == "append" and s["n_new"] > 0 for s in c["steps"]))
    s = next(s for s in c["steps"] if s["op"] == "append" and s["n_new"] > 0)
    tensors, dtypes, meta = t.st.read(t.result_path(c))
    out = []
    for name, array in tensors.items():
        array = array.copy()
        if name == f"step{s['step']}.out":
            array.reshape(-1)[-1] = float("nan")
        out.append((name, dtypes[name], array))
    t.st.write(t.result_path(c), out, meta)
    out = t.grade(1)
    expect_in(verdict_line(out, c["id"]), "FAIL", "EQUIV: NaN in the output")


def malformed(t, edit, *parts, inputs=False):
    t.export("--properties", "EQUIV", "--cases", "2")
    t.run_example()
    c = t.manifest["cases"][0]
    path = os.path.join(t.vectors, c["inputs"]) if inputs else t.result_path(c)
    edit(path)
    out = t.grade(2)
    expect_in(out, path + ": ", *parts)


def truncate(path, n):
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(blob[:n])


def st_truncated_header(t):
    malformed(t, lambda p: truncate(p, 5), "truncated")


def st_header_too_long(t):
    def edit(p):
        with open(p, "rb") as f:
            blob = f.read()
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob[8:])

    malformed(t, edit, "is larger than the file")


def st_offsets_out_of_range(t):
    def edit(h):
        last = nonempty_tensors_in_data_order(h)[-1]
        h[last]["data_offsets"] = [x + 4096 for x in h[last]["data_offsets"]]  # same size, past the end

    malformed(t, lambda p: rewrite_header(p, edit), "out of range")


def st_overlap(t):
    def edit(h):
        names = nonempty_tensors_in_data_order(h)
        b = h[names[1]]["data_offsets"]
        h[names[1]]["data_offsets"] = [b[0] - 4, b[1] - 4]

    malformed(t, lambda p: rewrite_header(p, edit), "overlap")


def st_dtype_size(t):
    def edit(h):
        h[nonempty_tensors_in_data_order(h)[0]]["dtype"] = "F16"  # the F32 bytes are twice what F16 needs

    malformed(t, lambda p: rewrite_header(p, edit), "bytes, but dtype F16")


def inputs_truncated(t):
    malformed(t, lambda p: truncate(p, 30), "is larger than the file", inputs=True)


def batch_steps(t):
    return [(c, s) for c in t.manifest["cases"] for s in c["steps"] if s["op"] == "append_batch" and
            len(s["slices"]) > 1 and all(x["n_new"] > 0 for x in s["slices"])]


def batch_step(t):
    """A batched call is one step: packed inputs, one slice per sequence with its token offsets and dump names."""
    t.export("--properties", "BATCH", "--cases", "4")
    found = batch_steps(t)
    expect(found, "no batch step with several sequences; export more cases")
    for c, s in found:
        inputs, _, _ = t.st.read(os.path.join(t.vectors, c["inputs"]))
        expect(inputs[s["inputs"]["q"]].shape[0] == s["n_new"], "the packed q holds every slice's tokens")
        begin = 0
        for x in s["slices"]:
            expect(x["token_begin"] == begin and x["token_end"] == begin + x["n_new"], "slices are packed in order")
            expect(x["pos_end"] == x["pos_begin"] + x["n_new"], "positions")
            expect(x["dump"]["k"] == f"step{s['step']}.s{x['seq']}.k", "the dump names of a slice")
            begin = x["token_end"]
        expect(begin == s["n_new"], "the slices cover the packed tensors")
    t.run_example()
    out = t.grade(0)
    expect(" FAIL" not in summary_line(out) and " ERROR" not in summary_line(out), "a case did not pass")


def batch_slice_swapped(t):
    """Outputs written at another slice's offsets (a batch regrouped wrongly) fail, naming the slice's sequence."""
    t.export("--properties", "BATCH", "--cases", "4")
    c, s = batch_steps(t)[0]
    t.run_example()
    a, b = s["slices"][0], s["slices"][1]
    tensors, dtypes, meta = t.st.read(t.result_path(c))
    out = []
    for name, array in tensors.items():
        if name == f"step{s['step']}.out":
            array = array.copy()
            n = min(a["n_new"], b["n_new"])
            first = array[a["token_begin"] : a["token_begin"] + n].copy()
            array[a["token_begin"] : a["token_begin"] + n] = array[b["token_begin"] : b["token_begin"] + n]
            array[b["token_begin"] : b["token_begin"] + n] = first
        out.append((name, dtypes[name], array))
    t.st.write(t.result_path(c), out, meta)
    line = verdict_line(t.grade(1), c["id"])
    expect_in(line, "FAIL", "BATCH: ", f"[step {s['step']}]", f"seq {a['seq']}, layer {s['layer']}")


def caps_filter(t):
    """Capabilities declared once: only cases inside them are exported, the rest are NOT_SUPPORTED in the grade."""
    caps = os.path.join(t.work, "caps.json")
    with open(caps, "w") as f:
        json.dump({"capabilities": ["dtype f32", "dtype f16", "rope neox", "gqa", "chunked", "release", "batch"],
                   "limits": {"head_dim_multiple": 4, "head_dim_multiple_rope": 8, "max_head_dim": 64,
                              "max_layers": 3}}, f)
    t.export("--caps", caps, "--properties", "EQUIV,CACHE-CONTENT,FORK,BATCH", "--cases", "6")
    m = t.manifest
    expect(m["declared"]["limits"]["head_dim_multiple_rope"] == 8, "the manifest echoes the declaration")
    for c in m["cases"]:
        cfg = c["config"]
        expect(cfg["dtype"] in ("f32", "f16") and cfg["rope"] in ("none", "neox"), f"{c['id']}: {cfg}")
        expect(cfg["head_dim"] % (8 if cfg["rope"] != "none" else 4) == 0, f"{c['id']}: head_dim {cfg['head_dim']}")
        expect(cfg["head_dim"] <= 64 and cfg["n_layers"] <= 3, f"{c['id']}: limits")
        expect("fork" not in c["requires"] and c["property"] != "FORK", f"{c['id']} needs fork")
    for p in ("EQUIV", "CACHE-CONTENT", "BATCH"):
        expect(sum(c["property"] == p for c in m["cases"]) == 6, f"6 cases of {p} inside the declaration")
    refused = {r["id"]: r for r in m["not_supported"]}
    expect(all(refused.get(f"FORK/{i}", {}).get("needs") == ["fork"] for i in range(6)), "FORK is not supported")
    # Dtypes, RoPE variants and head_dim multiples are drawn inside the declaration, so only a property about an
    # undeclared feature (FORK here) is refused; the filter is exercised by it.
    expect(not any("not a multiple of" in " ".join(r["needs"]) or any(w.startswith(("dtype", "rope"))
                                                                        for w in r["needs"])
                   for r in refused.values()),
           "a case outside the declared dtypes, RoPE variants or head_dim multiples was drawn")
    t.run_example()
    report = os.path.join(t.work, "report.json")
    out = t.grade(0, "--report", report)
    # refused draws are no verdicts: counted apart, per property and in all
    expect("NOT_SUPPORTED" not in out, "a refused draw is counted as a verdict")
    expect_in(out, f"outside the declaration, not graded: {len(refused)} cases",
              "6 needing fork (not exported): FORK/0, FORK/1, FORK/2, FORK/3, FORK/4 and 1 more")
    fork = next(l for l in out.splitlines() if l.split()[:1] == ["FORK"])
    expect(fork.split()[1:6] == ["0", "0", "0", "0", "6"], f"FORK's row: {fork}")
    expect(summary_line(out).startswith("summary: 18 PASS"), summary_line(out))
    with open(report) as f:
        r = json.load(f)
    expect(r["outside_declaration"] == len(refused) and "NOT_SUPPORTED" not in r["summary"], f"{r['summary']}")
    expect(len(r["implementations"][0]["cases"]) == 18, "one verdict per exported case")


def driver_skipped_batch(t):
    """A driver written for vectors without append_batch steps skips the cases holding one while its manifest still
    declares "batch": each is an ERROR with a warning, never a quiet NOT_SUPPORTED."""
    caps = os.path.join(t.work, "caps.json")
    with open(caps, "w") as f:
        json.dump({"capabilities": ["dtype f32", "rope neox", "gqa", "chunked", "batch"]}, f)
    t.export("--caps", caps, "--properties", "EQUIV,BATCH", "--cases", "3")
    t.run_example()
    batched = [c for c in t.manifest["cases"] if any(s["op"] == "append_batch" for s in c["steps"])]
    expect(batched, "no case with a batch step")
    for c in batched:
        os.remove(t.result_path(c))
        os.remove(t.result_path(c, "json"))
    out = t.grade(1)
    for c in batched:
        expect_in(verdict_line(out, c["id"]), "ERROR", "the driver skipped it")
    expect_in(out, f"warning: the driver wrote no results for {len(batched)} case")
    expect("outside the declaration" not in out, "a skipped case is reported as outside the declaration")


def declaration_narrower(t):
    """Results that declare less than the export was given are refused (exit 2), naming what differs: the cases the
    driver left out would otherwise pass for cases outside the declaration. More is accepted."""
    caps = os.path.join(t.work, "caps.json")
    with open(caps, "w") as f:
        json.dump({"capabilities": ["dtype f32", "rope neox", "gqa", "chunked", "batch"],
                   "limits": {"max_head_dim": 64}}, f)
    t.export("--caps", caps, "--properties", "EQUIV,BATCH", "--cases", "2")
    t.run_example()  # declares every capability, no limit: more than the export, graded
    t.grade(0)
    path = os.path.join(t.results, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["capabilities"].remove("batch")
    m["limits"] = {"max_head_dim": 32}
    with open(path, "w") as f:
        json.dump(m, f)
    out = t.grade(2)
    expect_in(out, "declares less than the vectors were exported for",
              '"batch": declared by the export, not by the results', "max_head_dim: 64 in the export, 32 in the results")


def pipeline_differs(t):
    """A pipeline in the results other than the one given to export is graded, with a warning in the output and the
    report."""
    caps = os.path.join(t.work, "caps.json")
    with open(caps, "w") as f:
        json.dump({"capabilities": ["dtype f32", "dtype f16", "rope neox", "gqa", "chunked"],
                   "pipeline": "q-and-v-accum-in-cache-dtype"}, f)
    t.export("--caps", caps, "--properties", "EQUIV", "--cases", "2")
    t.run_example()  # declares f32
    report = os.path.join(t.work, "report.json")
    out = t.grade(0, "--report", report)
    expect_in(out, "warning: the results declare the pipeline f32, the export was given q-and-v-accum-in-cache-dtype")
    with open(report) as f:
        expect(any("the export was given" in w for w in json.load(f)["warnings"]), "the report's warnings")
    t.run_example("--pipeline", "q-and-v-accum-in-cache-dtype", results=os.path.join(t.work, "same"))
    expect("warning" not in t.grade(0, results=os.path.join(t.work, "same")), "a warning for the same pipeline")


def project_caps_files(t):
    """The drivers' own caps files are read whole: every field known (an unknown one is refused), the pipeline
    recorded in the manifest's declaration."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for rel in ("tools/ort_driver/caps.json", "tools/gpu/sdpa_caps.json"):
        t.export("--caps", os.path.join(root, rel), "--properties", "EQUIV", "--cases", "1")
        expect("pipeline" in t.manifest["declared"], f"{rel}: the export did not read its pipeline")


def new_rows_unrounded(t):
    """A 16-bit cache that attends its new rows before rounding them: FAIL with that diagnosis when it declares a
    plain pipeline; PASS with the note that outputs depend on chunking when it declares new_rows_unrounded."""
    t.export("--properties", "EQUIV", "--dtypes", "f16", "--cases", "4")
    t.run_example("--bug", "unrounded-new-rows")
    out = t.grade(1)
    for c in t.manifest["cases"]:
        if any(s.get("n_new", 0) > 0 for s in c["steps"]):
            expect_in(verdict_line(out, c["id"]), "FAIL", "EQUIV: ", "new rows attended before rounding")
    declared = os.path.join(t.work, "declared")
    t.run_example("--bug", "unrounded-new-rows", "--pipeline", '{"new_rows_unrounded": true}', results=declared)
    out = t.grade(0, results=declared)
    expect_in(out, "pipeline f32 new-rows-unrounded", "outputs depend on how a prompt is split into calls")


def verdict_table(t):
    """Verdict and count columns are fixed width, wide enough for QUALITY_WARNING (15 characters)."""
    t.export("--properties", "EQUIV", "--dtypes", "f32", "--cases", "3")
    t.run_example()
    c = t.case(lambda c: any(s.get("n_new", 0) > 0 for s in c["steps"]))
    s = next(s for s in c["steps"] if s.get("n_new", 0) > 0)
    expected, _, _ = t.st.read(os.path.join(t.vectors, c["expected"]))
    i = s["step"]
    # push row (token 0, head 0) to 3/4 of its bound: a pass with a QUALITY_WARNING
    delta = 0.75 * expected[f"step{i}.allowed_f32"][0, 0] * expected[f"step{i}.v_scale"][0, 0]
    tensors, dtypes, meta = t.st.read(t.result_path(c))
    out = []
    for name, array in tensors.items():
        if name == f"step{i}.out":
            array = array.copy()
            array[0, 0, :] = (expected[f"step{i}.out"][0, 0, :] + delta).astype(array.dtype)
        out.append((name, dtypes[name], array))
    t.st.write(t.result_path(c), out, meta)
    report = os.path.join(t.work, "grade.json")
    text = t.grade(0, "--report", report)
    lines = [l for l in text.splitlines() if l.split()[:1] and l.split()[0].startswith("EQUIV/")]
    expect(any("QUALITY_WARNING" in l for l in lines) and any(" PASS " in l for l in lines), "a warning and a pass")
    at = {l.index(" " + l.split()[1] + " ") + 1 for l in lines}  # where the verdict starts
    expect(len(at) == 1, f"verdicts start in different columns: {sorted(at)}")
    col = at.pop() + 15 + 2  # the verdict column is 15 wide, then two spaces
    for l in lines:
        expect(l[col - 2 : col] == "  " and l[col] != " ", f"the text after the verdict is not at column {col}: {l}")
    header = next(l for l in text.splitlines() if l.split()[:1] == ["property"])
    row = next(l for l in text.splitlines() if l.split()[:1] == ["EQUIV"])
    counts_end = header.index("  worst headroom")
    expect(row[counts_end : counts_end + 2] == "  " and row[counts_end - 1] != " ",
           f"count columns are as wide as their headers:\n{header}\n{row}")
    expect(header.split() == ["property", "PASS", "QUALITY_WARNING", "FAIL", "ERROR", "outside", "worst",
                              "headroom"], header)
    expect(row.split()[2] == "1", f"one QUALITY_WARNING counted: {row}")
    # the worst headroom of the property is the warned case's (3/4 of its bound), in the table and the report
    expect(row.split()[-1] == f"({c['id']})" and abs(float(row.split()[-2]) - 0.75) < 0.01,
           f"the worst headroom is {c['id']}'s: {row}")
    with open(report) as f:
        props = json.load(f)["implementations"][0]["properties"]
    equiv = next(p for p in props if p["id"] == "EQUIV")
    expect(equiv["worst_headroom"]["case"] == c["id"] and abs(equiv["worst_headroom"]["value"] - 0.75) < 0.01,
           f"the report's worst headroom: {equiv}")
    expect(equiv["counts"]["QUALITY_WARNING"] == 1, f"the report's counts: {equiv}")


def scale_theta(t):
    """The manifest carries each case's softmax scale and RoPE θ (values and bit patterns) and the example uses them:
    with a scale other than 1/sqrt(head_dim) and θ = 500000 it passes, while results computed with the defaults
    (an implementation that hard-codes them) fail."""
    t.export("--properties", "EQUIV", "--dtypes", "f32", "--cases", "6")
    c = t.case(lambda c: c["config"]["rope"] != "none" and any(s.get("n_new", 0) > 0 for s in c["steps"]))
    hard_coded = os.path.join(t.work, "hard-coded")
    t.run_example(results=hard_coded)  # computed with the exported 1/sqrt(d) and 10000
    c["case"]["config"].update(scale=0.375, rope_theta=500000.0)  # both exact in float32
    c["config"].update(scale=0.375, scale_bits="0x3ec00000", rope_theta=500000.0, rope_theta_bits="0x48f42400")
    with open(os.path.join(t.vectors, "manifest.json"), "w") as f:
        json.dump(t.manifest, f)
    t.run_example()
    out = t.grade(0)
    expect_in(verdict_line(out, c["id"]), "PASS")
    out = t.grade(1, results=hard_coded)
    expect_in(verdict_line(out, c["id"]), "FAIL", "EQUIV: ")


CASES = {f.__name__: f for f in [roundtrip, skip_self, content_bitflip, equiv_storage_named, past_rewritten,
                                 memory_misreport,
                                 nan_output, not_supported, missing_results, missing_tensor, st_truncated_header,
                                 st_header_too_long, st_offsets_out_of_range, st_overlap, st_dtype_size,
                                 inputs_truncated, batch_step, batch_slice_swapped, caps_filter, driver_skipped_batch,
                                 declaration_narrower, pipeline_differs, project_caps_files, new_rows_unrounded,
                                 verdict_table, scale_theta]}


def run_named_case(cases, make_case):
    """The main of every end-to-end script here: --kvcheck, --example, --work and the name of one of `cases` (a
    function of the case object make_case builds from the arguments). Exit 0 passed (the work directory removed),
    1 an expectation failed (the directory kept, to look at)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvcheck", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=sorted(cases))
    args = ap.parse_args()
    t = make_case(args)
    try:
        cases[args.case](t)
    except AssertionError as e:
        print(f"FAILED {args.case}: {e}")
        return 1
    shutil.rmtree(args.work, ignore_errors=True)
    print(f"ok {args.case}")
    return 0


def main():
    return run_named_case(CASES, Case)


if __name__ == "__main__":
    sys.exit(main())
