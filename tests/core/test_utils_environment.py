"""acc.utils.environment's helpers under Accelerate's names: environment files and ACCELERATE_* clean-up."""

from __future__ import annotations

import logging
import os

from acc.utils.environment import convert_dict_to_env_variables, purge_accelerate_environment


def test_only_safe_entries_become_env_file_lines_and_the_others_are_named(caplog):
    env = {"ACCELERATE_DEBUG_MODE": "1", "BAD_ENV_NAME": "<mything", "OTHER_ENV": "2", "EMPTY": ""}
    with caplog.at_level(logging.WARNING, logger="acc.utils.environment"):
        assert convert_dict_to_env_variables(env) == ["ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n"]
    assert [r.name for r in caplog.records] == ["acc.utils.environment"] * 2
    assert "BAD_ENV_NAME=<mything" in caplog.records[0].getMessage()


def test_purge_removes_what_the_function_set_and_restores_what_it_changed(monkeypatch):
    monkeypatch.setenv("ACCELERATE_KEPT", "before")
    monkeypatch.delenv("ACCELERATE_NEW", raising=False)

    @purge_accelerate_environment
    def sets() -> str:
        os.environ["ACCELERATE_NEW"] = "x"
        os.environ["ACCELERATE_KEPT"] = "changed"
        return "done"

    assert sets() == "done"
    assert "ACCELERATE_NEW" not in os.environ and os.environ["ACCELERATE_KEPT"] == "before"
