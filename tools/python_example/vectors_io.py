"""The driver's side of kvcheck's exported vectors, shared by the Python drivers here (this example, ONNX Runtime's,
PyTorch SDPA's): read the vectors' manifest, run the cases the implementation supports, write the results' manifest
(docs/vectors.md describes both).

A case the implementation does not support gets no result files: `kvcheck grade` calls it NOT_SUPPORTED, because
the results' manifest does not declare what it requires.
"""

import json
import os
import sys


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


def run_cases(manifest, results_dir, supported, run_case):
    """run_case(case) for every case that supported(case) accepts, in the manifest's order; returns (ran, skipped)."""
    os.makedirs(results_dir, exist_ok=True)
    ran = skipped = 0
    for case in manifest["cases"]:
        if not supported(case):
            skipped += 1  # no results: graded NOT_SUPPORTED
            continue
        run_case(case)
        ran += 1
    return ran, skipped


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
