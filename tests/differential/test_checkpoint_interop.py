"""Accelerate's save_state read by acc's load_state: models, optimizer, scheduler, registered objects, the step
and the RNG states come back as Accelerate saved them, without running code from the checkpoint."""

from __future__ import annotations

import pickle

import pytest
import torch

from tests.differential.harness import migrated, start_acc, start_accelerate, together


@pytest.mark.parametrize("unsafe", [False, True], ids=["safetensors", "torch-bin"])
def test_a_checkpoint_accelerate_saved_loads_on_acc(unsafe, accelerate_python, migrated_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    (saved,) = together(lambda: start_accelerate(accelerate_python, "checkpoint_interop.py",
                                                 ["--save", str(ckpt)] + (["--unsafe"] if unsafe else []), 1,
                                                 tmp_path / "accelerate", tmp_path))
    names = sorted(p.name for p in ckpt.iterdir())
    assert ("pytorch_model.bin" if unsafe else "model.safetensors") in names and "random_states_0.pkl" in names
    script = migrated("checkpoint_interop.py", migrated_dir)
    (loaded,) = together(lambda: start_acc(script, ["--load", str(ckpt)], 1, tmp_path / "acc", tmp_path))
    assert saved[0]["step"] == 3 and saved[0]["counter"][0] == 3  # what is compared was trained
    assert loaded[0] == saved[0]


def test_a_file_that_would_run_code_is_refused_naming_it(accelerate_python, migrated_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    together(lambda: start_accelerate(accelerate_python, "checkpoint_interop.py", ["--save", str(ckpt)], 1,
                                      tmp_path / "accelerate", tmp_path))

    class Payload:
        def __reduce__(self):
            return (print, ("ran code from the checkpoint",))

    with open(ckpt / "custom_checkpoint_0.pkl", "wb") as f:
        pickle.dump({"seen": Payload(), "total": torch.zeros(2)}, f)
    script = migrated("checkpoint_interop.py", migrated_dir)
    run = start_acc(script, ["--load", str(ckpt)], 1, tmp_path / "acc", tmp_path)
    with pytest.raises(AssertionError) as failed:
        run.records()
    assert "custom_checkpoint_0.pkl: refused" in str(failed.value)
    assert "ran code from the checkpoint" not in str(failed.value)
    assert not (tmp_path / "acc" / "rank0.json").exists()
