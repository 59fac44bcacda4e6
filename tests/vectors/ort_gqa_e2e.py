#!/usr/bin/env python3
"""ONNX Runtime's CPU GroupQueryAttention through `kvcheck export | driver | grade` (run by ort_gqa.sh in the venv).

    ort_gqa_e2e.py --kvcheck build/bin/kvcheck --work DIR

Exports a modest set of cases inside the driver's declared capabilities (tools/ort_driver/caps.json), runs the driver
in both modes and asserts the verdicts docs/real-implementations.md reports:
  native       graded for its declared pipeline (q, RoPE and output in the cache dtype): every case passes;
  f32-compute  (f32 model over an f16 cache) declared as plain f32: every f16 case that grades outputs FAILs with
               the diagnosis "new rows attended before rounding", every f32 case passes;
               declared with new_rows_unrounded: every case passes, with the note that outputs depend on chunking.
Cases outside the declaration (bf16, head_dim not a multiple of 8, or 16 with RoPE) get no verdict: they are
reported apart. f32-compute's pipeline differs from the one caps.json declares: grade must say so.
The seed is fixed (--seed to change it; it is printed). Exit 0 when every expectation holds.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DRIVER = os.path.join(ROOT, "tools", "ort_driver", "ort_gqa.py")
CAPS = os.path.join(ROOT, "tools", "ort_driver", "caps.json")
# The properties whose checks ORT's results can be graded with offline (NO-Q has no offline form).
PROPERTIES = "EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,GQA,BATCH,FORK,RELEASE"
GRADES_OUTPUTS = {"EQUIV", "LAYERS", "GQA", "BATCH", "FORK", "RELEASE"}


def sh(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("$ " + " ".join(cmd) + "\n" + p.stdout[-3000:])
    return p.returncode, p.stdout


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


class Run:
    def __init__(self, args):
        self.kvcheck, self.work = args.kvcheck, args.work
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.vectors = os.path.join(self.work, "vectors")
        rc, _ = sh([self.kvcheck, "export", "--out", self.vectors, "--caps", CAPS, "--properties", PROPERTIES,
                    "--cases", str(args.cases), "--seed", str(args.seed)])
        expect(rc == 0, f"export exited {rc}")
        with open(os.path.join(self.vectors, "manifest.json")) as f:
            self.manifest = json.load(f)
        self.cases = {c["id"]: c for c in self.manifest["cases"]}
        expect(any(c["config"]["dtype"] == "f16" for c in self.cases.values()), "no f16 case was exported")
        expect(any(c["config"]["rope"] != "none" for c in self.cases.values()), "no RoPE case was exported")

    def drive_and_grade(self, mode, pipeline=None):
        """Runs the driver, grades; returns (exit code, grade's stdout, verdicts by id)."""
        tag = mode + ("-declared" if pipeline else "")
        results = os.path.join(self.work, "results-" + tag)
        cmd = [sys.executable, "-B", DRIVER, "--vectors", self.vectors, "--results", results, "--mode", mode]
        if pipeline:
            cmd += ["--pipeline", pipeline]
        rc, _ = sh(cmd)
        expect(rc == 0, f"the driver ({tag}) exited {rc}")
        report = os.path.join(self.work, tag + ".json")
        rc, out = sh([self.kvcheck, "grade", "--vectors", self.vectors, "--results", results, "--report", report])
        with open(report) as f:
            impl = json.load(f)["implementations"][0]
        verdicts = {c["id"]: c for c in impl["cases"]}
        self.outside = impl["outside_declaration"]  # no verdict: counted apart
        return rc, out, verdicts

    def check_refused(self, verdicts):
        # Cases are drawn inside the declared dtypes and RoPE variants; what is refused is a property about an
        # undeclared feature, reported outside the declaration with no verdict.
        expect(all(i in self.cases for i in verdicts), "only exported cases get a verdict")
        for o in self.outside:
            expect(not o["exported"] and o["id"] not in self.cases, f"{o['id']} was exported but is outside")
            expect(not any(w.startswith(("dtype", "rope")) for w in o["needs"]),
                   f"{o['id']} was drawn outside the declared dtypes or RoPE variants: {o['needs']}")
        for i in self.cases:
            expect(verdicts[i]["verdict"] != "NOT_SUPPORTED", f"{i} was exported but is NOT_SUPPORTED")


def attends_f16(case):
    """An f16 case whose property grades outputs and that attends at least one token."""
    return (case["config"]["dtype"] == "f16" and case["property"] in GRADES_OUTPUTS and
            any(s.get("n_new", 0) > 0 for s in case["steps"]))


def native(r):
    rc, out, verdicts = r.drive_and_grade("native")
    expect(rc == 0, f"grade exited {rc}: ORT in its native dtype must pass its declared pipeline")
    r.check_refused(verdicts)
    bad = [i for i in r.cases if verdicts[i]["verdict"] not in ("PASS", "QUALITY_WARNING")]
    expect(not bad, f"cases that do not pass: {bad}")


def f32_compute(r):
    rc, out, verdicts = r.drive_and_grade("f32-compute", pipeline="f32")
    expect(rc == 1, f"grade exited {rc}: f32 inputs over an f16 cache declared as plain f32 must fail")
    expect("warning: the results declare the pipeline f32, the export was given" in out,
           "grade does not flag a pipeline other than the export's")
    failed = 0
    for i, c in r.cases.items():
        v = verdicts[i]
        if attends_f16(c):
            expect(v["verdict"] == "FAIL", f"{i} (f16, {c['property']}) is {v['verdict']}, expected FAIL")
            expect("new rows attended before rounding" in v["reason"], f"{i}: wrong diagnosis: {v['reason']}")
            failed += 1
        else:
            expect(v["verdict"] == "PASS", f"{i} is {v['verdict']}: {v['reason']}")
    expect(failed > 0, "no f16 case grades outputs")

    rc, out, verdicts = r.drive_and_grade("f32-compute", pipeline='{"new_rows_unrounded": true}')
    expect(rc == 0, f"grade exited {rc}: declared new_rows_unrounded, ORT must pass")
    expect("outputs depend on how a prompt is split into calls" in out, "the report does not say outputs depend on chunking")
    for i, c in r.cases.items():
        expect(verdicts[i]["verdict"] in ("PASS", "QUALITY_WARNING"), f"{i} is {verdicts[i]['verdict']}")
        if attends_f16(c):
            expect(any("split into calls" in n for n in verdicts[i]["notes"]), f"{i} lacks the chunking note")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvcheck", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--cases", type=int, default=8, help="cases per property")
    args = ap.parse_args()
    import onnxruntime

    print(f"seed {args.seed} (--seed {args.seed} reruns it); onnxruntime {onnxruntime.__version__}")
    try:
        r = Run(args)
        native(r)
        f32_compute(r)
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    shutil.rmtree(args.work, ignore_errors=True)
    print(f"ok: {len(r.cases)} cases exported, ONNX Runtime graded as docs/real-implementations.md says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
