"""Accelerate 1.15's own unit tests, run on Accelerate (the baseline) and on acc: how many of the tests that pass on
Accelerate pass on acc ("N of B"), per file. Run by scripts/accelerate-suite.sh, which builds the two venvs.

The tests come from Accelerate's source distribution (downloaded once into the cache; none of its files are in this
repository). For the acc run they are rewritten by exactly three rules and nothing else:
1. `from accelerate` / `import accelerate` at the start of a line (any indentation) become `from acc` / `import acc`;
2. a string literal starting `accelerate.` on a `patch(...)`, `patch.object(...)`, `patch.dict(...)` or
   `assertLogs(...)` line (a module path: what is patched, or the logger named after a module) becomes `acc.`;
3. the command `accelerate` as the first element of an argument list (`["accelerate", "launch", ...]`) becomes `acc`.
Both runs: pytest with pytest-timeout (a file that fails to import is reported, the others run), offline (HF_HUB_OFFLINE=1), no GPU (CUDA_VISIBLE_DEVICES=), a private
HF_HOME, from a directory holding only Accelerate's tests/.

    python scripts/accelerate_suite.py --base-python B --acc-python A [--record | --check]

--record writes bench/results/accelerate-suite.{json,md}; --check fails (exit 1) when fewer tests pass on acc than
the recorded count, naming the recorded ones that no longer pass. The baseline run's outcomes are kept in the
cache, keyed by the source distribution, the baseline venv (its path, unresolved: it holds the pins' hash) and
BASELINE_RECIPE: --check reuses them (Accelerate's own outcomes do not change while those do not); --record and
--fresh-baseline run it anew.

With --scripts-python S, Accelerate's distributed test scripts from the same source distribution (test_script,
test_sync, test_ops, external_deps/test_metrics; rules 1-3) also run on acc with `acc launch`, on one process and
on two (ddp, gloo): "M of 8" run to the end. S is a venv with acc and what test_metrics imports (datasets, evaluate).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

VERSION = "1.15.0"
ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "bench" / "results" / "accelerate-suite.json"
TABLE = ROOT / "bench" / "results" / "accelerate-suite.md"
CACHE = Path(os.environ.get("ACC_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "acc")

_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)accelerate\b", re.M)
_PATCH_LINE = re.compile(r"\bpatch(\.object|\.dict)?\(|\bassertLogs\(")
_PATCH_STRING = re.compile(r"""(["'])accelerate\.""")
_COMMAND = re.compile(r"""\[(\s*)(["'])accelerate\2(\s*[,\]])""")


def rewrite(text: str) -> str:
    """Accelerate's test source with the three rules applied (see the module docstring)."""
    text = _IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}acc", text)
    lines = []
    for line in text.split("\n"):
        if _PATCH_LINE.search(line):
            line = _PATCH_STRING.sub(lambda m: f"{m.group(1)}acc.", line)
        lines.append(_COMMAND.sub(lambda m: f"[{m.group(1)}{m.group(2)}acc{m.group(2)}{m.group(3)}", line))
    return "\n".join(lines)


def sdist(python: str) -> Path:
    """Accelerate's source distribution, downloaded once into the cache."""
    target = CACHE / f"accelerate-{VERSION}-sdist"
    archive = target / f"accelerate-{VERSION}.tar.gz"
    if not archive.exists():
        target.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([python, "-m", "pip", "download", "-q", f"accelerate=={VERSION}", "--no-binary", ":all:",
                               "--no-deps", "-d", str(target)], capture_output=True, text=True)
        if proc.returncode != 0 or not archive.exists():
            sys.exit(f"accelerate suite: could not download accelerate=={VERSION}'s source distribution "
                     f"(is the package registry reachable?):\n{proc.stdout}{proc.stderr}")
    return archive


def unpack_tests(archive: Path, into: Path, transform: bool) -> Path:
    """Accelerate's tests/ (and only that) under `into`, rewritten for acc when `transform`."""
    into.mkdir(parents=True)
    prefix = f"accelerate-{VERSION}/tests/"
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.name.startswith(prefix) or not member.isfile():
                continue
            path = into / "tests" / member.name[len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member).read()
            if transform and path.suffix == ".py":
                data = rewrite(data.decode()).encode()
            path.write_bytes(data)
    return into


def run(python: str, where: Path, label: str, timeout: float) -> dict[str, str]:
    """Run the tests under `where` with `python`: test id -> passed / failed / error / skipped."""
    report = where / "junit.xml"
    home = where / "hf_home"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HOME": str(home),
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ACC_LAUNCH", None)
    start = time.monotonic()
    proc = subprocess.run([python, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "--timeout", "300",
                           "--continue-on-collection-errors",  # a file that fails to import does not stop the others
                           "-o", "addopts=", f"--junitxml={report}"], cwd=where, env=env, capture_output=True,
                          text=True, timeout=timeout)
    print(f"accelerate suite: {label}: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else '?'} "
          f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    if not report.exists():
        sys.exit(f"accelerate suite: the {label} run wrote no report:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[test_id] = ("error" if "error" in kinds else "failed" if "failure" in kinds else
                             "skipped" if "skipped" in kinds else "passed")
    return outcomes


BASELINE_RECIPE = 1  # bump when the way the tests are run changes (run()'s command, its environment)


def baseline_cache(archive: Path, python: str) -> Path:
    """Where the baseline's outcomes for this source distribution and baseline venv are kept."""
    import hashlib

    source = hashlib.sha256(archive.read_bytes()).hexdigest()
    key = hashlib.sha256(f"{BASELINE_RECIPE}\n{source}\n{Path(python).absolute()}".encode()).hexdigest()[:16]
    return CACHE / f"accelerate-suite-baseline-{key}.json"


def baseline(python: str, archive: Path, work: Path, timeout: float, fresh: bool) -> dict[str, str]:
    """Accelerate's own outcomes: from the cache unless `fresh` (then measured, and kept for the next run)."""
    cached = baseline_cache(archive, python)
    if not fresh and cached.is_file():
        kept = json.loads(cached.read_text())
        print(f"accelerate suite: accelerate: {sum(o == 'passed' for o in kept['outcomes'].values())} passed, "
              f"measured {kept['date']} with this venv and source distribution (kept in {cached}; "
              "--fresh-baseline measures it again)", file=sys.stderr)
        return kept["outcomes"]
    outcomes = run(python, unpack_tests(archive, work / "accelerate", transform=False), "accelerate", timeout)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "outcomes": outcomes}))
    return outcomes


def node_id(test_id: str, where: Path) -> str:
    """pytest's node id of a junit test id ("tests.test_x.Class::name" -> "tests/test_x.py::Class::name")."""
    classname, _, name = test_id.partition("::")
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (where / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], name])
    return test_id


def rerun(python: str, where: Path, test_ids: list[str], timeout: float) -> dict[str, str]:
    """Run only `test_ids` once more (a fresh process): test id -> outcome. For tests of Accelerate's that draw
    unseeded random numbers (test_save_load_model compares two random initialisations' absolute sums with a
    1e-3 margin, which chance now and then undercuts)."""
    report = where / "junit-rerun.xml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HOME": str(where / "hf_home"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ACC_LAUNCH", None)
    subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "300", "-o", "addopts=",
                    f"--junitxml={report}", *[node_id(t, where) for t in test_ids]], cwd=where, env=env,
                   capture_output=True, text=True, timeout=timeout)
    if not report.exists():
        return {}
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = (
            "error" if "error" in kinds else "failed" if "failure" in kinds else
            "skipped" if "skipped" in kinds else "passed")
    return outcomes


SCRIPTS = ("test_script.py", "test_sync.py", "test_ops.py", "external_deps/test_metrics.py")
LAUNCHES = {1: ["--cpu"], 2: ["--backend", "ddp", "--nproc", "2"]}


def run_scripts(python: str, archive: Path, into: Path, timeout: float) -> dict[str, str]:
    """Accelerate's test scripts, rewritten, each under `acc launch` on 1 and 2 processes: "script@N" -> passed /
    failed (with the last line it printed)."""
    prefix = f"accelerate-{VERSION}/src/accelerate/test_utils/scripts/"
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        for name in SCRIPTS:
            path = into / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(rewrite(tar.extractfile(prefix + name).read().decode()))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HOME": str(into / "hf_home"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("ACC_LAUNCH", None)
    outcomes = {}
    for name in SCRIPTS:
        for n, launch in LAUNCHES.items():
            for attempt in (1, 2):  # as a test: a failure gets one more try, and passing then is listed as flaky
                start = time.monotonic()
                try:
                    proc = subprocess.run([python, "-m", "acc", "launch", *launch, name], cwd=into, env=env,
                                          capture_output=True, text=True, timeout=timeout)
                    ok, output = proc.returncode == 0, (proc.stdout + proc.stderr).strip()
                except subprocess.TimeoutExpired as exc:
                    ok, output = False, f"{_text(exc.stdout)}{_text(exc.stderr)}\ntimed out after {timeout:.0f} s"
                tail = output.splitlines()[-1:]
                print(f"accelerate suite: script {name} on {n} process(es): {'passed' if ok else 'FAILED'} "
                      f"({time.monotonic() - start:.0f} s){'' if attempt == 1 else ', second try'}", file=sys.stderr)
                if ok:
                    outcomes[f"{name}@{n}"] = "passed" if attempt == 1 else "passed on a second try"
                    break
                # the whole failure report (acc launch names the first failing rank and quotes its traceback)
                print(f"accelerate suite: what {name} on {n} process(es) printed last:\n"
                      + "\n".join("  " + line for line in _failure_lines(output)), file=sys.stderr)
                outcomes[f"{name}@{n}"] = f"failed: {tail[0] if tail else '?'}"
    return outcomes


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _failure_lines(output: str, keep: int = 60) -> list[str]:
    """The launch's failure report when it printed one (from its first line), else the output's last lines."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("acc launch: ") and "fail" in line]
    return lines[starts[0]:][:keep] if starts else lines[-keep:]


def file_of(test_id: str) -> str:
    module = test_id.split("::")[0]
    parts = module.split(".")
    while parts and not parts[-1].startswith("test_"):  # tests.test_cli.AccelerateLauncherTester -> tests.test_cli
        parts.pop()
    return "/".join(parts) + ".py" if parts else module


# why a test that passes on Accelerate fails on acc (the lane's table lists each failing test with its cause; one
# without an entry shows as "cause not named yet")
CAUSES = {
    "tests.test_accelerator.AcceleratorTester::test_can_pickle_dataloader_0":
        "acc's prepared loader (PreparedDataLoader) is not a torch DataLoader subclass, and this test asserts it is",
    "tests.test_accelerator.AcceleratorTester::test_can_pickle_dataloader_1":
        "acc's prepared loader (PreparedDataLoader) is not a torch DataLoader subclass, and this test asserts it is",
}


def summary(base: dict[str, str], acc: dict[str, str]) -> dict:
    baseline = sorted(t for t, o in base.items() if o == "passed")
    passing = sorted(t for t in baseline if acc.get(t) == "passed")
    per_file: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in baseline:
        per_file[file_of(t)][0] += 1
    for t in passing:
        per_file[file_of(t)][1] += 1
    failing = {t: CAUSES.get(t, "cause not named yet") for t in baseline if acc.get(t) != "passed"}
    return {"accelerate": VERSION, "baseline_passed": len(baseline), "acc_passed": len(passing),
            "per_file": dict(sorted(per_file.items())), "passing": passing, "failing": failing}


def table(result: dict) -> str:
    rows = [f"Accelerate {result['accelerate']}'s own tests (rewritten by the three rules of scripts/accelerate_suite.py), "
            f"run on acc: **{result['acc_passed']} of {result['baseline_passed']}** that pass on Accelerate pass on acc.",
            "", "| file | pass on Accelerate | of those, pass on acc |", "|---|---|---|"]
    rows += [f"| {name} | {b} | {p} |" for name, (b, p) in result["per_file"].items()]
    if result.get("scripts"):
        done = sum(o.startswith("passed") for o in result["scripts"].values())
        rows += ["", f"Accelerate's distributed test scripts (same source distribution, rules 1-3) under `acc launch`: "
                     f"**{done} of {len(result['scripts'])}** run to the end.", "",
                 "| script | 1 process | 2 processes (ddp, gloo) |", "|---|---|---|"]
        rows += [f"| {name} | {result['scripts'][f'{name}@1']} | {result['scripts'][f'{name}@2']} |" for name in SCRIPTS]
    if result.get("flaky"):
        rows += ["", "Failed on acc and passed on a second try (counted as passing): "
                 + ", ".join(f"`{t}`" for t in result["flaky"])]
    if result.get("failing"):
        rows += ["", "Passing on Accelerate, failing on acc, by cause:", ""]
        rows += [f"- `{test}`: {cause}" for test, cause in sorted(result["failing"].items())]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-python", required=True)
    parser.add_argument("--acc-python", required=True)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--record", action="store_true", help="write bench/results/accelerate-suite.{json,md}")
    mode.add_argument("--check", action="store_true", help="fail when fewer tests pass than recorded")
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a new one in /tmp)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds each run may take")
    parser.add_argument("--scripts-python", default=None, help="also run Accelerate's test scripts with this python")
    parser.add_argument("--fresh-baseline", action="store_true",
                        help="run the tests on Accelerate again even when its outcomes are kept (--record does)")
    args = parser.parse_args(argv)
    archive = sdist(args.base_python)
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="accelerate-suite-"))
    shutil.rmtree(work / "accelerate", ignore_errors=True)
    shutil.rmtree(work / "acc", ignore_errors=True)
    base = baseline(args.base_python, archive, work, args.timeout, fresh=args.fresh_baseline or args.record)
    acc = run(args.acc_python, unpack_tests(archive, work / "acc", transform=True), "acc", args.timeout)
    # a test that passes on Accelerate and failed on acc gets one more try: passing then, it counts, listed as flaky
    tried = sorted(t for t, o in acc.items() if o in ("failed", "error") and base.get(t) == "passed")
    again = rerun(args.acc_python, work / "acc", tried, args.timeout) if tried else {}
    flaky = [t for t in tried if again.get(t) == "passed"]
    acc.update({t: "passed" for t in flaky})
    result = summary(base, acc)
    result["flaky"] = flaky
    if args.scripts_python:
        shutil.rmtree(work / "scripts", ignore_errors=True)
        result["scripts"] = run_scripts(args.scripts_python, archive, work / "scripts", timeout=600)
    text = table(result)
    print(text)
    print(f"{result['acc_passed']} of {result['baseline_passed']}")
    if args.record:
        RECORD.write_text(json.dumps({**result, "date": time.strftime("%Y-%m-%d")}, indent=1) + "\n")
        TABLE.write_text(text)
    if args.check:
        recorded = json.loads(RECORD.read_text())
        lost = sorted(set(recorded["passing"]) - set(result["passing"]))
        if result["acc_passed"] < recorded["acc_passed"]:
            print(f"accelerate suite: FAILED: {result['acc_passed']} pass on acc, fewer than the recorded "
                  f"{recorded['acc_passed']} ({RECORD.relative_to(ROOT)}); no longer passing:\n  " + "\n  ".join(lost),
                  file=sys.stderr)
            return 1
        if lost:
            print("accelerate suite: recorded as passing, failing now (the count still holds):\n  " + "\n  ".join(lost),
                  file=sys.stderr)
        broken = sorted(k for k, o in recorded.get("scripts", {}).items()
                        if o == "passed" and not result.get("scripts", {}).get(k, "").startswith("passed"))
        if broken and args.scripts_python:
            print("accelerate suite: FAILED: Accelerate's test scripts recorded as running to the end fail now:\n  "
                  + "\n  ".join(f"{k}: {result['scripts'].get(k)}" for k in broken), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
