"""What a process may ask about its place in the run, and the helpers built on it: the same for an `Accelerator`
and for Accelerate's `PartialState` (one definition, two faces).

A class using `ProcessViews` provides `num_processes`, `process_index`, `local_process_index` and
`wait_for_everyone()`; it gets the `is_*_process` questions, `main_process_first`, the `on_*_process` decorators and
`print` on the local main process.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator


def only_on(function: Callable | None, here: Callable[[], bool]) -> Callable:
    """`function` wrapped to run only where `here()` holds (None elsewhere); without it, the decorator."""
    if function is None:
        return lambda f: only_on(f, here)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if here() else None

    return wrapper


class ProcessViews:
    """The process's place in the run, read from `num_processes`, `process_index` and `local_process_index`."""

    num_processes: int
    process_index: int
    local_process_index: int

    def wait_for_everyone(self) -> None:  # pragma: no cover - every user of the mixin defines it
        raise NotImplementedError

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        return self.num_processes > 1

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (e.g. to download or preprocess), then the others."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Each machine's local main process runs the block first, then that machine's other processes."""
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    def on_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run `function` on the main process only (returns None elsewhere)."""
        return only_on(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable | None = None) -> Callable:
        """Decorator: run `function` on each machine's local main process only."""
        return only_on(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable) -> Callable:
        """Decorator: run `function` on the last process only."""
        return only_on(function, lambda: self.is_last_process)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        """Decorator: run `function` on the process with global index `process_index` only."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return only_on(function, lambda: self.process_index == process_index)

    def on_local_process(self, function: Callable | None = None, local_process_index: int | None = None) -> Callable:
        """Decorator: run `function` on the process with local index `local_process_index` only."""
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return only_on(function, lambda: self.local_process_index == local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)
