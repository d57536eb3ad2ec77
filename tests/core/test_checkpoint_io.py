"""Checkpoint bytes in one pass (core/checkpointing/hashed_io.py): hashed while written, one fsync per file and one for the
directory, files written at the same time, the safetensors writer, old (sha256) checkpoints, forked writers."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import blake3
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from acc import Accelerator
from acc.checkpointing import files as ckpt
from acc.checkpointing import hashed_io
from acc.checkpointing.files import digest
from acc.errors import CheckpointError
from tests.waiting import wait_for_exit


def _prepared(fresh_pm, width: int = 64):
    torch.manual_seed(0)
    acc = Accelerator(plugin_manager=fresh_pm)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.randn(4, width)).sum())
    opt.step()
    return acc, model, opt


def _blake3(path: Path) -> str:
    return blake3.blake3(path.read_bytes()).hexdigest()


def test_save_state_records_checksums_while_writing_and_reads_nothing_back(fresh_pm, tmp_path, monkeypatch):
    """Every file of a cpu-backend checkpoint is hashed as it is written: save_state never hashes a file again,
    and what it recorded is the BLAKE3 of the bytes on disk."""
    acc, *_ = _prepared(fresh_pm, width=600)  # a model file with blocks large enough for the helper thread
    rehashed = []
    real = hashed_io.hash_file
    monkeypatch.setattr(hashed_io, "hash_file", lambda path, *a, **k: rehashed.append(Path(path).name) or real(path, *a, **k))
    directory = acc.save_state(tmp_path / "c")
    assert rehashed == []
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "acc-checkpoint/2"
    for name, entry in manifest["files"].items():
        assert entry == {"size": (directory / name).stat().st_size, "blake3": _blake3(directory / name)}, name


def test_a_file_written_another_way_or_changed_after_writing_is_hashed_from_disk(fresh_pm, tmp_path):
    """A backend that writes a file itself (no record) and one that rewrites a recorded file: both are read back,
    so the manifest matches the disk."""
    acc, model, _ = _prepared(fresh_pm)

    class OwnWriter:
        @staticmethod
        def acc_save_checkpoint(ctx, directory, models, optimizers):
            ckpt.save_tensors(models[0].state_dict(), directory / "model_0.safetensors")
            os.utime(directory / "model_0.safetensors", ns=(1, 1))  # changed after it was recorded
            (directory / "extra.bin").write_bytes(b"written without the SDK" * 1000)
            torch.save(optimizers[0].state_dict(), directory / "optimizer_0.pt")
            return ["model_0.safetensors", "extra.bin", "optimizer_0.pt"]

    from acc import hookimpl

    OwnWriter.acc_save_checkpoint = hookimpl(tryfirst=True)(OwnWriter.acc_save_checkpoint)
    fresh_pm.register(OwnWriter, name="own-writer")
    directory = acc.save_state(tmp_path / "c")
    manifest = json.loads((directory / "manifest.json").read_text())
    for name in ("model_0.safetensors", "extra.bin", "optimizer_0.pt"):
        assert manifest["files"][name]["blake3"] == _blake3(directory / name), name
    acc.load_state(directory)


def test_one_fsync_per_file_and_one_per_directory(fresh_pm, tmp_path, monkeypatch):
    acc, *_ = _prepared(fresh_pm)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    directory = acc.save_state(tmp_path / "c")
    files = sorted(json.loads((directory / "manifest.json").read_text())["files"])
    names = [Path(p).name for p in synced]
    tmp_name = next(n for n in names if n.startswith(".c.tmp-"))
    # each checkpoint file once, the manifest once (written as manifest.json.part, then renamed), the temporary
    # directory once (its entries), the parent once (the rename)
    assert sorted(names) == sorted([*files, "manifest.json.part", tmp_name, tmp_path.name]), names


def test_files_are_written_at_the_same_time(fresh_pm, tmp_path, monkeypatch):
    """The cpu backend hands its model and optimizer files to run_concurrently: on 2+ CPUs they are written by
    different threads, and a failing write still fails the save (collectively, nothing published)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the files are written in turn")
    acc, *_ = _prepared(fresh_pm)
    threads: dict[str, str] = {}
    # both writes wait here for each other: written in turn, the first would wait alone and the save fail
    meet = threading.Barrier(2, timeout=30)

    def arrive(path) -> None:
        if os.environ.get("FAIL_OPTIMIZER"):
            return
        threads.setdefault(Path(path).name, threading.current_thread().name)
        if Path(path).name in ("model_0.safetensors", "optimizer_0.pt"):
            meet.wait()

    real = ckpt.save_tensors
    monkeypatch.setattr(ckpt, "save_tensors", lambda t, p, *a, **k: (arrive(p), real(t, p, *a, **k))[1])
    real_object = ckpt.save_object

    def save_object(obj, path):
        arrive(path)
        if Path(path).name == "optimizer_0.pt" and os.environ.get("FAIL_OPTIMIZER"):
            raise OSError("injected failure")
        real_object(obj, path)

    monkeypatch.setattr(ckpt, "save_object", save_object)
    acc.save_state(tmp_path / "c")
    assert threads["model_0.safetensors"] != threads["optimizer_0.pt"]
    assert threads["model_0.safetensors"].startswith("acc-write")
    monkeypatch.setenv("FAIL_OPTIMIZER", "1")
    with pytest.raises(OSError, match="injected failure"):
        acc.save_state(tmp_path / "d")
    assert not (tmp_path / "d").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".d.")]


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def test_the_safetensors_writer_matches_the_safetensors_package(tmp_path):
    """Every dtype, 0-d and empty tensors, odd sizes, metadata: what acc writes loads with safetensors to the same
    tensors as the package's own file, every tensor aligned to its element size."""
    torch.manual_seed(0)
    tensors = {f"t{i}": torch.randn(3, 5 + i).to(dtype) for i, dtype in enumerate(DTYPES)}
    tensors.update({"scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "odd": torch.ones(7, dtype=torch.bool),
                    "big": torch.randn(1 << 19)})  # 2 MB: written in a block hashed on the helper thread
    with hashed_io.recording():
        entry = hashed_io.write_safetensors(tensors, tmp_path / "acc.safetensors", {"k": "v"})
    save_file(tensors, str(tmp_path / "ref.safetensors"), metadata={"k": "v"})
    ours, ref = load_file(str(tmp_path / "acc.safetensors")), load_file(str(tmp_path / "ref.safetensors"))
    assert ours.keys() == ref.keys() == tensors.keys()
    for name in tensors:
        assert ours[name].dtype == tensors[name].dtype and ours[name].shape == tensors[name].shape
        assert torch.equal(ours[name].reshape(-1).view(torch.uint8), tensors[name].reshape(-1).view(torch.uint8)), name
    assert entry == {"size": (tmp_path / "acc.safetensors").stat().st_size,
                     "blake3": _blake3(tmp_path / "acc.safetensors")}
    raw = (tmp_path / "acc.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"k": "v"} and (8 + n) % 8 == 0
    for name, info in header.items():
        if name != "__metadata__":
            assert info["data_offsets"][0] % tensors[name].element_size() == 0, name


def test_save_tensors_keeps_its_rules_for_shared_and_strided_tensors(tmp_path):
    base = torch.arange(12.0)
    tensors = {"a": base, "b": base, "t": base.view(3, 4).t()}  # shared storage, and a transposed view
    ckpt.save_tensors(tensors, tmp_path / "x.safetensors")
    loaded = load_file(str(tmp_path / "x.safetensors"))
    assert torch.equal(loaded["a"], base) and torch.equal(loaded["b"], base)
    assert torch.equal(loaded["t"], base.view(3, 4).t())


def test_optimizer_files_load_with_plain_torch_load(fresh_pm, tmp_path):
    """The kernel writes .pt files through its hashing writer (and without zip CRC32s, which its checksum
    replaces): plain torch.load(weights_only=True) still reads them."""
    acc, _, opt = _prepared(fresh_pm)
    directory = acc.save_state(tmp_path / "c")
    state = torch.load(directory / "optimizer_0.pt", weights_only=True)
    for index, entries in opt.state_dict()["state"].items():
        assert torch.equal(state["state"][index]["exp_avg"], entries["exp_avg"])


def test_torch_save_without_crc_uses_torchs_writer_here(tmp_path):
    """On the torch this suite runs, the CRC-free writer is the one used (an upgrade that changes torch's
    internals makes it fall back to torch.save: this test says so)."""
    calls = []
    real = torch._C.PyTorchFileWriter

    class Spy:
        def __init__(self, *args):
            calls.append(args[1:])
            self._w = real(*args)

        def __getattr__(self, name):
            return getattr(self._w, name)

    torch._C.PyTorchFileWriter, saved = Spy, torch._C.PyTorchFileWriter
    try:
        with hashed_io.recording(), hashed_io.HashedFile(tmp_path / "o.pt") as out:
            hashed_io.torch_save({"x": torch.arange(5)}, out)
            out.close()
    finally:
        torch._C.PyTorchFileWriter = saved
    assert calls and calls[0][0] is False
    assert torch.equal(torch.load(tmp_path / "o.pt", weights_only=True)["x"], torch.arange(5))


def test_checkpoints_of_acc_0_1_with_sha256_still_verify(fresh_pm, tmp_path):
    """A manifest of format /1 lists sha256: such a checkpoint loads, and a flipped byte in it is refused."""
    import hashlib

    acc, model, opt = _prepared(fresh_pm)
    directory = acc.save_state(tmp_path / "c")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["format"] = "acc-checkpoint/1"
    manifest["files"] = {n: {"size": e["size"], "sha256": hashlib.sha256((directory / n).read_bytes()).hexdigest()}
                         for n, e in manifest["files"].items()}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    acc.load_state(directory)
    data = bytearray((directory / "optimizer_0.pt").read_bytes())
    data[-20] ^= 0xFF
    (directory / "optimizer_0.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="optimizer_0.pt: corrupt: its sha256 checksum differs"):
        acc.load_state(directory)


def test_a_format_2_manifest_with_sha256_entries_is_refused(fresh_pm, tmp_path):
    acc, *_ = _prepared(fresh_pm)
    directory = acc.save_state(tmp_path / "c")
    manifest = json.loads((directory / "manifest.json").read_text())
    name = next(iter(manifest["files"]))
    manifest["files"][name] = {"size": manifest["files"][name]["size"], "sha256": "0" * 64}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"the blake3 of '{name}' must be 64 hex digits, got None"):
        acc.load_state(directory)


def test_digest_of_large_files_matches_a_plain_hash(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(20 << 20))  # above the size verified with BLAKE3's own threads
    assert digest(path) == {"size": 20 << 20, "blake3": _blake3(path)}
    (tmp_path / "empty").write_bytes(b"")
    assert digest(tmp_path / "empty") == {"size": 0, "blake3": blake3.blake3(b"").hexdigest()}


def test_replacing_a_checkpoint_leaves_nothing_hidden_once_finished(fresh_pm, tmp_path):
    """The replaced checkpoint is deleted in the background; finish_removals (next save, end_training) waits."""
    acc, *_ = _prepared(fresh_pm)
    for _ in range(3):
        acc.save_state(tmp_path / "c")
    ckpt.finish_removals()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    acc.load_state(tmp_path / "c")


def test_a_forked_child_hashes_with_its_own_helper_threads(tmp_path):
    """The helper pool of a parent that wrote a file is not inherited by a forked child (fork copies no threads):
    the child makes its own, so its writes do not hang (acc's workers are forked by default)."""
    data = os.urandom(4 << 20)
    with hashed_io.HashedFile(tmp_path / "parent") as out:  # starts the parent's helper threads
        out.write(data)
        out.close()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            with hashed_io.HashedFile(tmp_path / "child") as out:
                out.write(data)
                entry = out.close()
            os._exit(0 if entry["blake3"] == blake3.blake3(data).hexdigest() else 3)
        except BaseException:  # noqa: BLE001
            os._exit(4)
    if wait_for_exit([pid], timeout=60):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's write hung (it waited on the parent's helper threads)")
    _, status = os.waitpid(pid, 0)  # it has ended: at once
    assert os.waitstatus_to_exitcode(status) == 0
