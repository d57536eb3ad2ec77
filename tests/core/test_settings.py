"""Settings: conversion, precedence (flag > env > project file > user file > default) and config-file errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from acc.assembly.choose import assemble
from acc.assembly.config_files import ConfigFile, find_config_files
from acc.assembly.settings import core_settings, resolve
from acc.contract.settings import ResolvedSettings, Setting, SettingsRegistry
from acc.errors import ConfigError, PluginError


def registry() -> SettingsRegistry:
    reg = SettingsRegistry()
    for s in core_settings():
        reg.add(s)
    return reg


@pytest.mark.parametrize(
    "kind,raw,expected",
    [(int, "3", 3), (int, 3, 3), (bool, "yes", True), (bool, "0", False), (bool, True, True),
     (float, "1.5", 1.5), (list, "a, b,,c", ["a", "b", "c"]), (list, ["x"], ["x"]), (str, "s", "s")],
)
def test_convert_accepts_flag_env_and_toml_forms(kind, raw, expected):
    assert Setting("x", kind, None, "h").convert(raw) == expected


@pytest.mark.parametrize(
    "setting,raw,message",
    [
        (Setting("n", int, 1, "h", minimum=1), "two", "expected an integer >= 1, got 'two'"),
        (Setting("n", int, 1, "h", minimum=1), 0, "expected an integer >= 1, got 0"),
        (Setting("n", int, 1, "h"), True, "expected an integer, got True"),
        (Setting("b", bool, False, "h"), "maybe", "expected true or false, got 'maybe'"),
        (Setting("m", str, "no", "h", choices=("no", "fp16", "bf16")), "bf61",
         "expected one of: no, fp16, bf16, got 'bf61' (did you mean 'bf16'?)"),
        (Setting("p", int, None, "h", minimum=1, maximum=65535), "70000", "expected an integer from 1 to 65535"),
    ],
)
def test_convert_rejects_bad_values_saying_what_is_valid(setting, raw, message):
    with pytest.raises(ValueError) as info:
        setting.convert(raw)
    assert message in str(info.value)


def test_duplicate_setting_names_and_flags_name_both_owners():
    reg = registry()
    with pytest.raises(PluginError, match="declared by both 'acc' and 'ddp'"):
        reg.add(Setting("nproc", int, 1, "h"), owner="ddp")
    with pytest.raises(PluginError, match="flag --nproc is declared by both 'acc' and 'x'"):
        reg.add(Setting("other", int, 1, "h", ("--nproc",)), owner="x")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_precedence_flag_over_env_over_project_over_user_over_default(tmp_path):
    project = ConfigFile.read(write(tmp_path / "acc.toml", 'nproc = 3\nmixed_precision = "fp16"\ncpu = true\n'),
                              "project file")
    user = ConfigFile.read(write(tmp_path / "u.toml", 'nproc = 4\nmixed_precision = "bf16"\n'
                                 'gradient_accumulation_steps = 2\nmax_restarts = 5\n'), "user file")
    env = {"ACC_MIXED_PRECISION": "bf16", "ACC_MAX_RESTARTS": "1"}
    s = resolve(registry(), {"nproc": "2"}, env, [project, user])
    assert (s["nproc"], s.source("nproc")) == (2, "flag --nproc")
    assert (s["mixed_precision"], s.source("mixed_precision")) == ("bf16", "env ACC_MIXED_PRECISION")
    assert (s["max_restarts"], s.source("max_restarts")) == (1, "env ACC_MAX_RESTARTS")
    assert (s["cpu"], s.source("cpu")) == (True, f"project file {tmp_path / 'acc.toml'}")
    assert (s["gradient_accumulation_steps"], s.source("gradient_accumulation_steps")) == (
        2, f"user file {tmp_path / 'u.toml'}")
    assert (s["backend"], s.source("backend")) == ("cpu", "default")


def test_resolved_settings_round_trip_through_json():
    s = ResolvedSettings({"a": 1, "b": ["x"], "c": None}, {"a": "flag --a"})
    back = ResolvedSettings.from_json(s.to_json())
    assert back.values == s.values and back.source("a") == "flag --a" and back.source("b") == "default"


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError) as info:
        resolve(registry(), {}, {"ACC_NPROC": "lots"}, [])
    assert "env ACC_NPROC: expected an integer >= 1, got 'lots'" in str(info.value)


def test_malformed_toml_names_file_and_line(tmp_path):
    path = write(tmp_path / "acc.toml", 'backend = "ddp"\nnproc = = 2\n')
    with pytest.raises(ConfigError) as info:
        find_config_files({}, tmp_path)
    msg = str(info.value)
    assert str(path) in msg and "line 2" in msg and "not valid TOML" in msg


def test_bad_value_in_file_names_file_line_and_key(tmp_path):
    write(tmp_path / "acc.toml", '# comment\nbackend = "cpu"\nnproc = "two"\n')
    with pytest.raises(ConfigError) as info:
        assemble(environ={}, cwd=tmp_path)
    msg = str(info.value)
    assert f"project file {tmp_path / 'acc.toml'}, line 3: key 'nproc': expected an integer >= 1, got 'two'" in msg


def test_unknown_key_in_file_is_an_error_with_suggestion(tmp_path):
    write(tmp_path / "acc.toml", 'nprocs = 2\n')
    with pytest.raises(ConfigError) as info:
        assemble(environ={}, cwd=tmp_path)
    msg = str(info.value)
    assert "line 1: unknown key 'nprocs' (did you mean 'nproc'?)" in msg and "valid top-level keys" in msg


def test_tables_of_plugins_not_loaded_are_ignored(tmp_path):
    write(tmp_path / "acc.toml", 'nproc = 1\n[deepspeed]\nzero_stage = 3\n')
    assert assemble(environ={}, cwd=tmp_path).settings["nproc"] == 1


def test_user_file_is_read_from_acc_config_home(tmp_path):
    write(tmp_path / "home" / "config.toml", 'mixed_precision = "bf16"\n')
    s = assemble(environ={"ACC_CONFIG_HOME": str(tmp_path / "home")}, cwd=tmp_path).settings
    assert s["mixed_precision"] == "bf16" and s.source("mixed_precision").startswith("user file")


def test_config_file_option_replaces_project_file(tmp_path):
    write(tmp_path / "acc.toml", 'nproc = 3\n')
    other = write(tmp_path / "other.toml", 'gradient_accumulation_steps = 4\n')
    s = assemble(environ={}, cwd=tmp_path, config_file=str(other)).settings
    assert s["nproc"] == 1 and s["gradient_accumulation_steps"] == 4
    assert s.source("gradient_accumulation_steps") == f"config file {other}"
    with pytest.raises(ConfigError, match="config file .*missing.toml does not exist"):
        assemble(environ={}, cwd=tmp_path, config_file=str(tmp_path / "missing.toml"))
