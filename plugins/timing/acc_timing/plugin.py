"""Times every backward and optimizer step of whichever backend runs, and prints a summary at the end.

A cross-cutting plugin: its hooks are wrappers (`wrapper=True`), so they never count as an answer to a
selection hook and compose with any backend. Its state lives on the run context, not in module globals.
"""

from __future__ import annotations

import time
from typing import Any, Generator

from acc import backend as sdk

ACC_HOOKSPEC_VERSION = 2
NAME = "timing"


def _timings(ctx: sdk.RunContext) -> dict[str, list[float]]:
    return ctx.plugin_state.setdefault(NAME, {"backward": [], "optimizer step": []})


@sdk.hookimpl(wrapper=True)
def acc_backward(ctx: sdk.RunContext, loss: Any, kwargs: dict) -> Generator[None, Any, Any]:
    start = time.perf_counter()
    result = yield
    _timings(ctx)["backward"].append(time.perf_counter() - start)
    return result


@sdk.hookimpl(wrapper=True)
def acc_optimizer_step(ctx: sdk.RunContext, optimizer: Any) -> Generator[None, Any, Any]:
    start = time.perf_counter()
    result = yield
    _timings(ctx)["optimizer step"].append(time.perf_counter() - start)
    return result


def summary(timings: dict[str, list[float]]) -> str:
    lines = ["timing (this process):"]
    for name, values in timings.items():
        if values:
            ordered = sorted(values)
            lines.append(f"  {name:15} {len(values):6d} calls, mean {1e3 * sum(values) / len(values):8.3f} ms, "
                         f"median {1e3 * ordered[len(ordered) // 2]:8.3f} ms, total {sum(values):7.3f} s")
    return "\n".join(lines)


@sdk.hookimpl
def acc_teardown(ctx: sdk.RunContext) -> None:
    if ctx.process_index == 0 and NAME in ctx.plugin_state:
        print(summary(ctx.plugin_state[NAME]), flush=True)
