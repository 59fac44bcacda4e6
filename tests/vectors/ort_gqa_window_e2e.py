#!/usr/bin/env python3
"""ONNX Runtime's CPU GroupQueryAttention with local_window_size, through `kvcheck export | driver | grade` (run by
ort_gqa.sh in the venv).

    ort_gqa_window_e2e.py --kvcheck build/bin/kvcheck --work DIR

Exports windowed cases (tools/ort_driver/caps-window.json: caps.json plus "window"; per-layer windows, 0 = full
attention in that layer, no sinks) and runs the driver three ways, asserting what docs/real-implementations.md
reports:
  local_window_size = W        (the driver's mapping) CONFORMANT;
  local_window_size = W - 1    (--bug window-minus-one, the attribute description's "left window" reading)
                               NOT CONFORMANT: every case whose outputs are graded and whose window is reached fails,
                               named "inside its window of", or, where a layer has W = 1 (local_window_size 0: ORT
                               attends no key and outputs zeros), "are all zero, as if it attended no key";
  local_window_size = W + 1    (--bug window-plus-one) NOT CONFORMANT: exactly those cases fail, each named
                               "outside its window of".
The stored rows do not depend on the window: CACHE-CONTENT, APPEND-ONLY and MEMORY pass under every mapping.
The seed is fixed (--seed to change it; it is printed). Exit 0 when every expectation holds.
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ort_gqa_e2e import GRADES_OUTPUTS, expect, sh  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
DRIVER = os.path.join(ROOT, "tools", "ort_driver", "ort_gqa.py")
CAPS = os.path.join(ROOT, "tools", "ort_driver", "caps-window.json")
PROPERTIES = "EQUIV,CACHE-CONTENT,APPEND-ONLY,MEMORY,LAYERS,GQA,BATCH,FORK,RELEASE"


def windows(case):
    return case["config"].get("windows") or []


def window_reached(case):
    """Some (sequence, layer) of a windowed layer grows past its window W, so that a query there cannot see every
    earlier key: only then does the window change an output."""
    w = windows(case)
    if not any(w):
        return False
    length = collections.Counter()
    for s in case["steps"]:
        if s["op"] == "fork":
            for (seq, layer), n in list(length.items()):
                if seq == s["parent"]:
                    length[(s["child"], layer)] = n
        elif s["op"] == "release":
            for key in [key for key in length if key[0] == s["seq"]]:
                del length[key]
        elif s["op"] in ("append", "append_batch"):
            slices = s["slices"] if s["op"] == "append_batch" else [s]
            for sl in slices:
                length[(sl["seq"], s["layer"])] += sl["n_new"]
                if w[s["layer"]] and length[(sl["seq"], s["layer"])] > w[s["layer"]]:
                    return True
    return False


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
            self.cases = {c["id"]: c for c in json.load(f)["cases"]}
        windowed = [c for c in self.cases.values() if any(windows(c))]
        expect(not any(c["config"].get("sinks") for c in self.cases.values()), "a case with sinks was exported")
        # the mapping is only tested where windows are reached, and where a layer of a case is windowed and another
        # is not (one node per window: the layers must not share one)
        self.reached = {c["id"] for c in windowed if window_reached(c)}
        self.graded_reached = {i for i in self.reached if self.cases[i]["property"] in GRADES_OUTPUTS}
        mixed = [c["id"] for c in windowed if 0 in windows(c) and c["id"] in self.graded_reached]
        print(f"{len(self.cases)} cases, {len(windowed)} windowed, {len(self.reached)} reach a window "
              f"({len(self.graded_reached)} of them grade outputs), {len(mixed)} of those mix windowed and full layers")
        expect(len(self.graded_reached) >= 10, "too few cases whose outputs depend on the window")
        expect(mixed, "no case mixes a windowed layer with a full-attention one")

    def drive_and_grade(self, bug=None):
        """Runs the driver (with --bug BUG), grades; returns (grade's exit code, verdicts by id)."""
        tag = bug or "correct"
        results = os.path.join(self.work, "results-" + tag)
        cmd = [sys.executable, "-B", DRIVER, "--vectors", self.vectors, "--results", results]
        if bug:
            cmd += ["--bug", bug]
        rc, _ = sh(cmd)
        expect(rc == 0, f"the driver ({tag}) exited {rc}")
        report = os.path.join(self.work, tag + ".json")
        rc, _ = sh([self.kvcheck, "grade", "--vectors", self.vectors, "--results", results, "--report", report])
        with open(report) as f:
            impl = json.load(f)["implementations"][0]
        expect(not impl["outside_declaration"], f"{tag}: cases outside the declaration: {impl['outside_declaration']}")
        verdicts = {c["id"]: c for c in impl["cases"]}
        expect(set(verdicts) == set(self.cases), f"{tag}: graded cases differ from the exported ones")
        return rc, verdicts

    def storage_passes(self, verdicts, tag):
        for i, c in self.cases.items():
            if c["property"] in ("CACHE-CONTENT", "APPEND-ONLY", "MEMORY"):
                expect(verdicts[i]["verdict"] == "PASS", f"{tag}: {i} is {verdicts[i]['verdict']}: "
                                                         f"{verdicts[i]['reason']}")


def correct(r):
    rc, verdicts = r.drive_and_grade()
    expect(rc == 0, f"grade exited {rc}: local_window_size = W must be CONFORMANT")
    bad = [i for i in r.cases if verdicts[i]["verdict"] not in ("PASS", "QUALITY_WARNING")]
    expect(not bad, f"cases that do not pass: {[(i, verdicts[i]['reason']) for i in bad]}")


def minus_one(r):
    rc, verdicts = r.drive_and_grade("window-minus-one")
    expect(rc == 1, f"grade exited {rc}: local_window_size = W - 1 must be NOT CONFORMANT")
    r.storage_passes(verdicts, "window-minus-one")
    fails = {i for i, v in verdicts.items() if v["verdict"] == "FAIL"}
    expect(r.graded_reached <= fails, f"cases that reach their window and pass: {sorted(r.graded_reached - fails)}")
    named = 0
    for i in sorted(fails):
        expect(any(windows(r.cases[i])), f"{i} has no window and fails: {verdicts[i]['reason']}")
        if "inside its window of" in verdicts[i]["reason"]:
            expect("the outputs match a window of" in verdicts[i]["reason"], f"{i}: {verdicts[i]['reason']}")
            named += 1
        else:  # local_window_size 0: ORT attends nothing, and the outputs are zeros
            expect(1 in windows(r.cases[i]) and "as if it attended no key: its window of 1" in verdicts[i]["reason"],
                   f"{i}: the reason does not name the window: {verdicts[i]['reason']}")
    expect(named > 0, "no failure names the window")
    print(f"window-minus-one: {len(fails)} FAIL, {named} named 'inside its window of', "
          f"{len(fails) - named} in cases with a window of 1")


def plus_one(r):
    rc, verdicts = r.drive_and_grade("window-plus-one")
    expect(rc == 1, f"grade exited {rc}: local_window_size = W + 1 must be NOT CONFORMANT")
    r.storage_passes(verdicts, "window-plus-one")
    fails = {i for i, v in verdicts.items() if v["verdict"] == "FAIL"}
    expect(fails == r.graded_reached, f"failing {sorted(fails)}, expected those reaching a window "
                                      f"{sorted(r.graded_reached)}")
    for i in sorted(fails):
        reason = verdicts[i]["reason"]
        expect("the outputs match a window of" in reason and "outside its window of" in reason, f"{i}: {reason}")
    print(f"window-plus-one: {len(fails)} FAIL, each named 'outside its window of'")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvcheck", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--seed", type=int, default=20261207)
    ap.add_argument("--cases", type=int, default=8, help="cases per property")
    args = ap.parse_args()
    import onnxruntime

    print(f"seed {args.seed} (--seed {args.seed} reruns it); onnxruntime {onnxruntime.__version__}")
    try:
        r = Run(args)
        correct(r)
        minus_one(r)
        plus_one(r)
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    shutil.rmtree(args.work, ignore_errors=True)
    print(f"ok: {len(r.cases)} cases exported; local_window_size = W conforms, W - 1 and W + 1 fail naming the window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
