"""Accelerate's `accelerate.utils.deepspeed` names: the placeholders `DummyOptim` and `DummyScheduler` (acc's own
objects, `acc.runtime.placeholders`), `DeepSpeedSchedulerWrapper` (`acc.runtime.optim`) and `HfDeepSpeedConfig`
(`acc.compat.deepspeed_config`, what transformers' DeepSpeed integration subclasses). Torch-free."""

from acc.compat.deepspeed_config import HfDeepSpeedConfig
from acc.runtime.placeholders import DummyOptim, DummyScheduler, check_prepare


def __getattr__(name: str) -> object:
    if name == "DeepSpeedSchedulerWrapper":  # imports torch: only when asked for
        from acc.runtime.optim import DeepSpeedSchedulerWrapper

        return DeepSpeedSchedulerWrapper
    raise AttributeError(f"module 'acc.utils.deepspeed' has no attribute {name!r}")


__all__ = ["DeepSpeedSchedulerWrapper", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig",  # noqa: F822 (lazy)
           "check_prepare"]
