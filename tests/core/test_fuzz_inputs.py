"""Bad input, fuzzed (hypothesis): flags, environment values, config files and checkpoint manifests. Every input
gets either a run (a valid value) or a clear message and a non-zero exit; never a traceback, another exception
type or a hang. Counts of the inputs tried are printed (-s) and recorded in tests/core/fuzz_counts.json when
ACC_FUZZ_RECORD is set."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "acc-hypothesis"))  # its caches stay out of the tree

from acc.assembly.settings import core_settings
from acc.cli import cli
from tests.conftest import ACC, clean_env

FUZZ = settings(max_examples=int(os.environ.get("ACC_FUZZ_EXAMPLES", "60")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TRIED: dict[str, int] = {}
SCRIPT_TEXT = "print('trained')\n"

# values: unicode text, digits of other scripts, huge and negative numbers, floats, nan/inf, empty, whitespace
NUMBERS = st.one_of(st.integers(min_value=-(10**40), max_value=10**40).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["nan", "inf", "-inf", "1e400", "0x10", "1_000", "٣", "１２", "²", "-0", "+5",
                                     " 7 ", "", " ", "true", "None", "[]", "{}"]))
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
VALUES = st.one_of(NUMBERS, TEXT)
FLAGGED = [s for s in core_settings() if s.flags and s.kind is not bool and s.name not in ("backend", "plugins")]


def _count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    print("\nfuzz inputs tried:", json.dumps(TRIED, sort_keys=True))
    if os.environ.get("ACC_FUZZ_RECORD"):
        Path(os.environ["ACC_FUZZ_RECORD"]).write_text(json.dumps(TRIED, indent=1, sort_keys=True))


def dry_run(args: list[str], env: dict | None = None, cwd: Path | None = None):
    work = Path(cwd or tempfile.mkdtemp(prefix="acc-fuzz-"))
    (work / "train.py").write_text(SCRIPT_TEXT)
    old = os.getcwd()
    os.chdir(work)
    try:
        env = {"ACC_CONFIG_HOME": str(work / "user"), **(env or {})}
        return CliRunner().invoke(cli, ["launch", "--dry-run", *args, "train.py"], env=env, prog_name="acc")
    finally:
        os.chdir(old)
        if cwd is None:
            shutil.rmtree(work, ignore_errors=True)


def assert_clear(result, *names: str) -> None:
    """A valid run (0) or a usage error (2) with a one-line `Error:` naming what was wrong; no other exception."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError("".join(traceback.format_exception(result.exception)) + result.output)
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    assert "Traceback" not in result.output
    if result.exit_code:
        assert "Error: " in result.output
        if names:
            assert any(n in result.output for n in names), (names, result.output)


def expected_valid(setting, raw) -> bool:
    try:
        value = setting.convert(raw)
    except ValueError:
        return False
    return not (isinstance(value, float) and not math.isfinite(value))


@FUZZ
@given(setting=st.sampled_from(FLAGGED), raw=VALUES)
def test_fuzzed_flags(setting, raw):
    _count("flags")
    result = dry_run(["--backend", "ddp", f"{setting.flags[0]}={raw}"])
    assert_clear(result, setting.flags[0], setting.name)
    if not expected_valid(setting, raw):
        assert result.exit_code == 2, (setting.name, raw, result.output)


@FUZZ
@given(setting=st.sampled_from([s for s in core_settings() if s.name not in ("plugins",)]), raw=VALUES)
def test_fuzzed_environment_values(setting, raw):
    _count("environment")
    result = dry_run(["--backend", "ddp"] if setting.name != "backend" else [], env={setting.env_var: raw})
    assert_clear(result, setting.env_var, setting.name)
    if setting.name != "backend" and not expected_valid(setting, raw):
        assert result.exit_code == 2, (setting.name, raw, result.output)


# TOML values of every type, keys known and unknown (unicode too), plugin tables
KEYS = st.one_of(st.sampled_from([s.name for s in core_settings()]),
                 st.text(alphabet="abcdefghijklmnopqrstuvwxyz_é字", min_size=1, max_size=12))
SCALARS = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True),
                    st.booleans(), TEXT, st.lists(st.integers(0, 9), max_size=3), st.lists(TEXT, max_size=3))


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value == math.inf else "-inf" if value == -math.inf
                                                else repr(value))
    if isinstance(value, (int,)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    return "[" + ", ".join(toml_value(v) for v in value) + "]"


def toml_text(top: dict, tables: dict) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines.append(f"[{json.dumps(name)}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


@FUZZ
@given(top=st.dictionaries(KEYS, SCALARS, max_size=4),
       tables=st.dictionaries(st.sampled_from(["ddp", "fsdp", "timing", "nosuch"]),
                              st.dictionaries(KEYS, SCALARS, max_size=3), max_size=2))
# found by the fuzzer: the error named the --backend flag for a plugin the file asked for, and did not say that
# num_machines came from the file
@example(top={"plugins": "0"}, tables={})
@example(top={"num_machines": 2}, tables={})
def test_fuzzed_config_files(top, tables):
    _count("config files (TOML)")
    work = Path(tempfile.mkdtemp(prefix="acc-fuzz-"))
    (work / "acc.toml").write_text(toml_text(top, tables))
    result = dry_run(["--backend", "ddp"], cwd=work)
    assert_clear(result, str(work / "acc.toml"))
    shutil.rmtree(work, ignore_errors=True)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.sampled_from([b"", b"\n", b"\xff\xfe", b"\x00" * 10,
                                                                 b"nproc = 2\x00", b"[ddp\n", b"=" * 50,
                                                                 b"a = " + b"[" * 5000])),
       suffix=st.sampled_from([".toml", ".yaml", ".yml", ""]))
def test_fuzzed_config_file_bytes(data, suffix):
    """Binary junk, empty files, NULs, deep nesting; as TOML or as an Accelerate YAML (by its name)."""
    _count("config files (bytes)")
    work = Path(tempfile.mkdtemp(prefix="acc-fuzz-"))
    path = work / f"cfg{suffix}"
    path.write_bytes(data)
    result = dry_run(["--backend", "ddp", "--config-file", str(path)], cwd=work)
    assert_clear(result, str(path))
    shutil.rmtree(work, ignore_errors=True)


NASTY = [  # through the real `acc` program: exit code, message, no traceback
    (["--nproc", "99999999999999999999999999"], {}, None, "--nproc"),
    (["--nproc", "100000"], {}, None, "nproc 100000 (from flag --nproc) is more processes than one machine runs"),
    (["--timeout", "nan"], {}, None, "--timeout"),
    (["--monitor-interval", "inf"], {}, None, "--monitor-interval"),
    (["--timeout", "1e300"], {}, None, "timeout 1e+300 (from flag --timeout) is above 10000000 s"),
    (["--nproc", "２"], {}, None, None),
    ([], {"ACC_TIMEOUT": "-1"}, None, "ACC_TIMEOUT"),
    ([], {"ACC_MIXED_PRECISION": "fp8\u202e"}, None, "ACC_MIXED_PRECISION"),
    (["--config-file", "cfg.toml"], {}, b"\xff\xfe\x00garbage", "cfg.toml"),
    (["--config-file", "cfg.toml"], {}, b"", None),
    (["--config-file", "cfg.yaml"], {}, b"\x89PNG\r\n\x1a\n", "cfg.yaml"),
    (["--config-file", "cfg.toml"], {}, "nprocs = 2\n".encode(), "nprocs"),
    (["--config-file", "cfg.toml"], {}, b"nproc = 1e999\n", "nproc"),
]


@pytest.mark.parametrize("args,env,config,named", NASTY)
def test_nasty_inputs_through_the_real_program(tmp_path, args, env, config, named):
    (tmp_path / "train.py").write_text(SCRIPT_TEXT)
    if config is not None:
        (tmp_path / args[1]).write_bytes(config)
    proc = subprocess.run([ACC, "launch", "--dry-run", "--backend", "ddp", *args, "train.py"], cwd=tmp_path,
                          env=clean_env(tmp_path, **env), capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr + proc.stdout
    if named is None:
        assert proc.returncode in (0, 2), proc.stderr
    else:
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith("Error: ") and named in proc.stderr and proc.stderr.count("\n") <= 3, proc.stderr


# ------------------------------------------------------------------ checkpoint manifests


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    """A real single-process checkpoint (cpu backend) to corrupt."""
    import torch

    from acc import Accelerator

    work = tmp_path_factory.mktemp("manifest")
    acc = Accelerator()
    model, opt = acc.prepare(torch.nn.Linear(3, 2), torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1))
    acc.save_state(work / "ckpt")
    return work / "ckpt"


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False),
                              TEXT), lambda children: st.one_of(st.lists(children, max_size=4),
                                                                 st.dictionaries(TEXT, children, max_size=4)),
                    max_leaves=12)
FIELDS = st.sampled_from(["format", "files", "run", "step", "files.*", "files.*.size", "files.*.blake3",
                          "run.processes", "run.processes.num_processes", "run.backend", "files.+"])
NAMES = st.one_of(TEXT, st.sampled_from(["../../etc/passwd", "/etc/passwd", "a/../../x", "", ".", "sub/ok.pt",
                                         "kernel_state.pt/", "\\..\\x", "model_0.safetensors\x00"]))


def _mutate(manifest: dict, field: str, value, name: str) -> dict:
    m = json.loads(json.dumps(manifest))
    if field == "files.+":
        m["files"][name] = value if isinstance(value, dict) else {"size": 1, "blake3": "0" * 64}
        return m
    parts = field.split(".")
    target = m
    for part in parts[:-1]:
        if part == "*":
            target = target[next(iter(target))]
        else:
            target = target.setdefault(part, {}) if isinstance(target, dict) else target
    last = parts[-1]
    if last == "*":
        target[next(iter(target))] = value
    elif isinstance(target, dict):
        target[last] = value
    return m


def _load(directory: Path, pm=None):
    import torch

    from acc import Accelerator

    acc = Accelerator()
    acc.prepare(torch.nn.Linear(3, 2), torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1))
    return acc.load_state(directory)


@FUZZ
@given(field=FIELDS, value=JSON, name=NAMES)
def test_fuzzed_checkpoint_manifests(saved_checkpoint, field, value, name):
    """A manifest with one field replaced by arbitrary JSON: loading either works (a harmless change) or raises a
    CheckpointError that names the checkpoint; never another exception, never a file outside it read."""
    from acc.errors import CheckpointError

    _count("manifests (fields)")
    work = Path(tempfile.mkdtemp(prefix="acc-fuzz-"))
    target = work / "ckpt"
    shutil.copytree(saved_checkpoint, target)
    manifest = json.loads((saved_checkpoint / "manifest.json").read_text())
    (target / "manifest.json").write_text(json.dumps(_mutate(manifest, field, value, name)))
    try:
        _load(target)
    except CheckpointError as exc:
        assert str(target) in str(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), JSON.map(lambda v: json.dumps(v).encode()),
                      st.sampled_from([b"", b"[" * 100000, b'{"format": "acc-checkpoint/1"}', b"\xef\xbb\xbf{}",
                                       b'{"format": "acc-checkpoint/1", "files": {"x": {"size": 1e309}}}'])))
def test_fuzzed_manifest_bytes(saved_checkpoint, data):
    from acc.errors import CheckpointError

    _count("manifests (bytes)")
    work = Path(tempfile.mkdtemp(prefix="acc-fuzz-"))
    target = work / "ckpt"
    shutil.copytree(saved_checkpoint, target)
    (target / "manifest.json").write_bytes(data)
    try:
        with pytest.raises(CheckpointError, match=str(target).replace("/", ".")):
            _load(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
