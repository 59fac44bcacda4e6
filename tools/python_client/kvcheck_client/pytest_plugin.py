"""The pytest entry: a `kvcheck` fixture that runs kvcheck's properties against a cache class from a test.

    def test_my_cache(kvcheck):
        kvcheck.validate(MyCache, CAPS, cases=20)

kvcheck (the binary: --kvcheck-binary, else $KVCHECK, else `kvcheck` on PATH) starts this test's module again in a
client process (`--connect`), builds caches with the factory there, and judges them. Each test that uses the fixture
becomes one item per operation-level property (test_my_cache[EQUIV], ...; `kvcheck list` names them), each running
that property only; a property the cache does not support is skipped with kvcheck's reason. A cache that is not
conformant fails the item with kvcheck's verdict table, its counterexamples and the replay command of each.
--kvcheck-seed fixes the run seed; --kvcheck-whole runs every property in one item instead.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from .protocol import Caps

_LAUNCHER = """\
import importlib.util, sys
sys.path[:0] = {paths!r}
spec = importlib.util.spec_from_file_location("_kvcheck_subject", {file!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
factory = module
for part in {qualname!r}.split("."):
    factory = getattr(factory, part)
import kvcheck_client
from kvcheck_client import Caps
sys.exit(kvcheck_client.serve(factory, {caps!r}, name={name!r}, watch_memory={watch!r}))
"""


def pytest_addoption(parser):
    group = parser.getgroup("kvcheck")
    group.addoption("--kvcheck-seed", default=None, help="kvcheck's run seed (default: kvcheck's own)")
    group.addoption("--kvcheck-binary", default=None, help="the kvcheck binary (default: $KVCHECK, else PATH)")
    group.addoption("--kvcheck-whole", action="store_true", help="one item per test, not one per property")


def _binary(config):
    return config.getoption("--kvcheck-binary") or os.environ.get("KVCHECK") or shutil.which("kvcheck")


def _property_ids(config):
    """The operation-level properties, from `kvcheck list --json`; [] when there is no kvcheck to ask."""
    binary = _binary(config)
    if not binary:
        return []
    run = subprocess.run([binary, "list", "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        return []
    return [p["id"] for p in json.loads(run.stdout)["properties"]]


def pytest_generate_tests(metafunc):
    if "kvcheck" not in metafunc.fixturenames or metafunc.config.getoption("--kvcheck-whole"):
        return
    ids = _property_ids(metafunc.config)
    if ids:
        metafunc.parametrize("kvcheck", ids, indirect=True, ids=ids)


class KvcheckRunner:
    def __init__(self, config, tmp_path, property_id=None):
        self.seed = config.getoption("--kvcheck-seed")
        self.binary = _binary(config)
        self.tmp_path = tmp_path
        self.property = property_id

    def validate(self, factory, caps: Caps, cases: int = 100, profile: str = "full", name: str = None,
                 watch_memory: bool = True, timeout: float = 30, extra_args=()):
        """Runs kvcheck validate against caches made by factory(config) (a class or function defined at a module's
        top level): this item's property, or every property of the profile. Fails the test unless the verdict is
        CONFORMANT, skips it when the property is not supported. Returns the JSON report."""
        if not self.binary:
            pytest.skip("no kvcheck binary: pass --kvcheck-binary PATH or set KVCHECK")
        source = sys.modules[factory.__module__].__file__
        launcher = self.tmp_path / "kvcheck_client_launcher.py"
        package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        launcher.write_text(_LAUNCHER.format(paths=[package_dir, os.path.dirname(os.path.abspath(source))],
                                             file=os.path.abspath(source), qualname=factory.__qualname__, caps=caps,
                                             name=name or factory.__qualname__, watch=watch_memory))
        report = self.tmp_path / "kvcheck-report.json"
        command = [self.binary, "validate", "--connect", shlex.join([sys.executable, str(launcher)]),
                   "--profile", profile, "--cases", str(cases), "--timeout", str(timeout),
                   "--report", str(report), "--counterexamples", str(self.tmp_path / "counterexamples")]
        if self.seed is not None:
            command += ["--seed", str(self.seed)]
        if self.property:
            command += ["--filter", f"^{self.property}$"]
        command += list(extra_args)
        run = subprocess.run(command, cwd=self.tmp_path, capture_output=True, text=True)
        if run.returncode not in (0, 1) or not report.exists():
            pytest.fail(f"kvcheck could not judge {factory.__qualname__} (exit {run.returncode}):\n"
                        f"{run.stdout}\n{run.stderr}", pytrace=False)
        result = json.loads(report.read_text())
        if run.returncode != 0:
            pytest.fail(f"kvcheck: {factory.__qualname__} is not conformant\n{run.stdout}", pytrace=False)
        counts = result.get("counts", {})
        impl = result["implementations"][0]
        # cases outside the declaration carry no verdict and are listed apart from the judged ones
        outside = impl.get("outside_declaration", [])
        untested = counts.get("NOT_SUPPORTED", 0) == sum(counts.values())
        if self.property and untested and (outside or counts.get("NOT_SUPPORTED", 0)):
            reasons = {c.get("reason", "") for c in impl.get("cases", []) + outside}
            pytest.skip(f"{self.property}: not supported by {factory.__qualname__} ({'; '.join(sorted(reasons))})")
        return result


@pytest.fixture
def kvcheck(request, tmp_path):
    """Runs kvcheck's properties against a cache class: kvcheck.validate(MyCache, caps, cases=...)."""
    return KvcheckRunner(request.config, tmp_path, getattr(request, "param", None))
