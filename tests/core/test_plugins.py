"""The plugin manager: registration checks, selection rules, blocking, discovery; a fresh manager per test."""

from __future__ import annotations

import subprocess
import sys

import pytest

import acc
from acc.assembly.choose import assemble
from acc.assembly.plugins import (
    build_plugin_manager,
    check_selection,
    collect_settings,
    installed_backends,
    new_plugin_manager,
    register,
)
from acc.contract import hookspecs
from acc.contract.settings import Setting
from acc.errors import ConfigError, PluginConflictError, PluginLoadError, PluginNotFoundError


class Backend:
    """A minimal third-party backend answering one selection hook and declaring a setting."""

    ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

    @acc.hookimpl
    def acc_add_settings(self, registry):
        registry.add(Setting("widgets", int, 2, "widgets per process", ("--widgets",), minimum=1))

    @acc.hookimpl
    def acc_launch_plan(self, settings):
        return acc.LaunchPlan(engine="process", device="widget")


class OtherBackend:
    ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

    @acc.hookimpl
    def acc_launch_plan(self, settings):
        return acc.LaunchPlan(engine="process", device="other")


class Wrapper:
    ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

    def __init__(self):
        self.seen = []

    @acc.hookimpl(wrapper=True)
    def acc_launch_plan(self, settings):
        plan = yield
        self.seen.append(plan.device)
        plan.notes.append("wrapped")
        return plan


def settings():
    return assemble(environ={}).settings


def test_cpu_answers_selection_hooks_as_the_trylast_default(fresh_pm):
    plan = fresh_pm.hook.acc_launch_plan(settings=settings())
    assert plan.engine == "process" and plan.device == "cpu"


def test_a_backend_answer_wins_over_the_default_regardless_of_order():
    pm = new_plugin_manager()
    import acc.builtin.cpu

    register(pm, Backend(), "widget")  # registered before cpu: still wins, cpu is trylast
    register(pm, acc.builtin.cpu, "cpu")
    assert pm.hook.acc_launch_plan(settings=settings()).device == "widget"


def test_two_backends_answering_one_selection_hook_is_refused_naming_both(fresh_pm):
    register(fresh_pm, Backend(), "widget")
    register(fresh_pm, OtherBackend(), "other")
    with pytest.raises(PluginConflictError) as info:
        check_selection(fresh_pm)
    msg = str(info.value)
    assert "acc_launch_plan" in msg and "'widget'" in msg and "'other'" in msg


def test_a_wrapper_is_not_an_answer_and_sees_the_result(fresh_pm):
    wrapper = Wrapper()
    register(fresh_pm, Backend(), "widget")
    register(fresh_pm, wrapper, "timing")
    check_selection(fresh_pm)
    plan = fresh_pm.hook.acc_launch_plan(settings=settings())
    assert wrapper.seen == ["widget"] and plan.notes == ["wrapped"]


def test_missing_hookspec_version_is_refused(fresh_pm):
    class NoVersion:
        @acc.hookimpl
        def acc_launch_plan(self, settings):
            return None

    with pytest.raises(PluginLoadError, match="plugin 'nover' does not declare the hook-spec version"):
        register(fresh_pm, NoVersion(), "nover")


def test_wrong_hookspec_version_names_both_versions(fresh_pm):
    class Future(Backend):
        ACC_HOOKSPEC_VERSION = 99

    with pytest.raises(PluginLoadError) as info:
        register(fresh_pm, Future(), "future")
    msg = str(info.value)
    assert "plugin 'future' targets hook-spec version 99" in msg and "provides versions 1, 2" in msg


def test_misspelled_hook_is_refused_with_suggestion(fresh_pm):
    class Typo:
        ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

        @acc.hookimpl
        def acc_lauch_plan(self, settings):
            return None

    with pytest.raises(PluginLoadError) as info:
        register(fresh_pm, Typo(), "typo")
    msg = str(info.value)
    assert "plugin 'typo' defines acc_lauch_plan()" in msg and "did you mean 'acc_launch_plan'" in msg


def test_unmarked_hook_and_old_style_wrappers_are_refused(fresh_pm):
    class Unmarked:
        ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

        def acc_launch_plan(self, settings):
            return None

    class OldWrapper:
        ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

        @acc.hookimpl(hookwrapper=True)
        def acc_launch_plan(self, settings):
            yield

    with pytest.raises(PluginLoadError, match="without the @acc.hookimpl marker"):
        register(fresh_pm, Unmarked(), "unmarked")
    with pytest.raises(PluginLoadError, match="hookwrapper=True"):
        register(fresh_pm, OldWrapper(), "old")


def test_hook_with_an_unknown_argument_is_refused(fresh_pm):
    class BadArgs:
        ACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION

        @acc.hookimpl
        def acc_launch_plan(self, settings, colour):
            return None

    with pytest.raises(PluginLoadError, match="plugin 'badargs' has an invalid hook"):
        register(fresh_pm, BadArgs(), "badargs")


def test_plugin_settings_are_owned_and_read_from_its_table(fresh_pm, tmp_path):
    register(fresh_pm, Backend(), "widget")
    reg = collect_settings(fresh_pm)
    assert reg["widgets"].owner == "widget" and reg["nproc"].owner == "acc"
    (tmp_path / "acc.toml").write_text("[widget]\nwidgets = 5\n")
    s = assemble(environ={}, cwd=tmp_path, pm=fresh_pm).settings
    assert s["widgets"] == 5 and s.source("widgets") == f"project file {tmp_path / 'acc.toml'}"
    assert assemble(environ={"ACC_WIDGETS": "7"}, cwd=tmp_path, pm=fresh_pm).settings["widgets"] == 7


def test_config_errors_for_plugin_keys(fresh_pm, tmp_path):
    register(fresh_pm, Backend(), "widget")
    (tmp_path / "acc.toml").write_text("widgets = 5\n")
    with pytest.raises(ConfigError, match="key 'widgets' belongs to plugin 'widget'; put it in a \\[widget\\] table"):
        assemble(environ={}, cwd=tmp_path, pm=fresh_pm)
    (tmp_path / "acc.toml").write_text("[widget]\nwidget = 5\n")
    with pytest.raises(ConfigError) as info:
        assemble(environ={}, cwd=tmp_path, pm=fresh_pm)
    assert "line 2: unknown key '[widget] widget' (did you mean 'widgets'?)" in str(info.value)


def test_unknown_backend_lists_installed_and_says_how_to_install():
    with pytest.raises(PluginNotFoundError) as info:
        build_plugin_manager("fsdpp")
    msg = str(info.value)
    assert "backend 'fsdpp' is not installed" in msg and "installed: cpu" in msg
    with pytest.raises(PluginNotFoundError, match="install with: pip install acc-xla"):
        build_plugin_manager("xla") if "xla" not in installed_backends() else pytest.skip("acc-xla is installed")


def test_plugin_that_fails_to_import_reports_its_import_error(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin.py").write_text("import not_a_real_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginLoadError) as info:
        build_plugin_manager("cpu", ["broken_plugin"])
    msg = str(info.value)
    assert "plugin 'broken_plugin'" in msg and "ModuleNotFoundError: No module named 'not_a_real_module_xyz'" in msg
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_extra_plugin_by_module_and_blocking_it(tmp_path, monkeypatch):
    (tmp_path / "note_plugin.py").write_text(
        "import acc\nACC_HOOKSPEC_VERSION = acc.HOOKSPEC_VERSION\n"
        "@acc.hookimpl(wrapper=True)\ndef acc_launch_plan(settings):\n"
        "    plan = yield\n    plan.notes.append('noted')\n    return plan\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    pm, infos = build_plugin_manager("cpu", ["note_plugin"])
    assert "note_plugin" in infos and pm.hook.acc_launch_plan(settings=settings()).notes == ["noted"]
    pm, infos = build_plugin_manager("cpu", ["note_plugin", "no:note_plugin"])
    assert "note_plugin" not in infos and pm.hook.acc_launch_plan(settings=settings()).notes == []


def test_cpu_cannot_be_blocked_and_the_chosen_backend_cannot_be_blocked():
    with pytest.raises(acc.PluginError, match="cannot be blocked"):
        build_plugin_manager("cpu", ["no:cpu"])
    with pytest.raises(acc.PluginError, match="chosen with --backend but blocked"):
        build_plugin_manager("ddp", ["no:ddp"])


def test_selection_hooks_are_exactly_the_firstresult_specs():
    pm = new_plugin_manager()
    firstresult = {name for name in dir(hookspecs) if name.startswith("acc_")
                   and getattr(pm.hook, name).spec.opts.get("firstresult")}
    assert firstresult == set(hookspecs.SELECTION_HOOKS) | set(hookspecs.V1_COLLECTIVE_HOOKS)


@pytest.mark.parametrize("name", [n for n in dir(hookspecs) if n.startswith("acc_")])
def test_every_hookspec_is_documented_with_the_template(name):
    doc = getattr(hookspecs, name).__doc__ or ""
    for part in ("**Kind**", "**Called by**", "**Default**"):
        assert part in doc, f"{name} lacks {part}"


def test_discovery_does_not_import_plugin_modules():
    code = (
        "import sys; from acc.assembly.plugins import installed_backends, installed_plugins; "
        "b = installed_backends(); installed_plugins(); "
        "print(sorted(b)); print([m for m in ('acc_ddp.plugin', 'acc.builtin.cpu', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert "cpu" in out[0] and out[1] == "[]"
