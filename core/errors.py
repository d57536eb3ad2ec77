"""Errors acc raises for bad input. Each message says what was given, what is valid, and the fix."""

from __future__ import annotations


class AccError(Exception):
    """Base class: an error whose message is written for the user, shown without a traceback by the CLI."""

    exit_code = 2


class ConfigError(AccError):
    """A setting (flag, environment variable or config file entry) has a bad name, type or value."""


class PluginError(AccError):
    """A plugin cannot be found, imported, or combined with the others."""


class PluginNotFoundError(PluginError):
    """The requested backend or plugin is not installed; `setting` names the setting that asked for it (backend or
    plugins), so the message can say where it was given."""

    def __init__(self, message: str, setting: str = "backend"):
        super().__init__(message)
        self.setting = setting


class PluginLoadError(PluginError):
    """A plugin was found but importing or registering it failed (the cause is chained)."""


class PluginConflictError(PluginError):
    """Two plugins answer the same selection hook."""


class ValidationError(AccError):
    """One or more plugins objected to the resolved settings; every problem is listed."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the launch settings have {len(self.problems)} problem(s):\n{lines}")


class LaunchError(AccError):
    """The launch cannot start (missing script, no executor for the plan's engine, ...)."""


def did_you_mean(given: str, valid: list[str] | tuple[str, ...]) -> str:
    """A ' (did you mean X?)' suffix when `given` is close to one of `valid`, else ''."""
    import difflib

    close = difflib.get_close_matches(given, list(valid), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class CheckpointError(AccError, RuntimeError):
    """A checkpoint (or a file in it) is missing, incomplete, corrupt, foreign or unsafe. A RuntimeError too, as
    torch's `load_state_dict(strict=True)` raises for a checkpoint that does not match its model."""
