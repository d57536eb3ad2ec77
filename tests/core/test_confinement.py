"""Loading reads only regular files inside the checkpoint it was given (acc.checkpointing.confine): load_state, the big-model
loader (load_checkpoint_and_dispatch) and acc merge-weights refuse entries with `..`, absolute paths, and symbolic
links that resolve outside, naming the entry. Whether a file outside was opened is watched with inotify (it also
sees the opens of safetensors' Rust code, which Python's audit hooks do not)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from acc import Accelerator
from acc.checkpointing.confine import problem
from acc.checkpointing.files import digest
from acc.errors import CheckpointError

IN_OPEN, IN_ACCESS, IN_ISDIR = 0x20, 0x1, 0x40000000


class OpenWatch:
    """The files opened or read in one directory (inotify), from creation to `opened()`."""

    def __init__(self, directory: Path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or self.libc.inotify_add_watch(self.fd, str(directory).encode(), IN_OPEN | IN_ACCESS) < 0:
            pytest.skip(f"inotify is not available here (errno {ctypes.get_errno()})")

    def opened(self) -> list[str]:
        names = []
        try:
            while True:
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    break
                at = 0
                while at < len(data):
                    _, mask, _, length = struct.unpack_from("iIII", data, at)
                    name = data[at + 16: at + 16 + length].rstrip(b"\0").decode()
                    if name and not mask & IN_ISDIR:
                        names.append(name)
                    at += 16 + length
        finally:
            os.close(self.fd)
        return names


def _setup(tmp_path: Path):
    acc = Accelerator()
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    return acc, model


@pytest.fixture
def saved(tmp_path):
    acc, model = _setup(tmp_path)
    directory = acc.save_state(tmp_path / "ckpt")
    outside = tmp_path / "outside"
    outside.mkdir()
    return acc, Path(directory), outside


def _link_out(directory: Path, outside: Path, name: str) -> Path:
    """Replace `name` by a symbolic link to a copy outside the checkpoint with the same bytes (its checksum
    matches: only the confinement can refuse it)."""
    copy = outside / name.replace("/", "_")
    shutil.copyfile(directory / name, copy)
    (directory / name).unlink()
    (directory / name).symlink_to(copy)
    return copy


@pytest.mark.parametrize("name", ["model_0.safetensors", "optimizer_0.pt", "kernel_state.pt"])
def test_load_state_refuses_a_listed_file_that_links_outside_and_reads_nothing_there(saved, name):
    acc, directory, outside = saved
    if name not in json.loads((directory / "manifest.json").read_text())["files"]:
        pytest.skip(f"{name} is not in this backend's checkpoint")
    _link_out(directory, outside, name)
    watch = OpenWatch(outside)
    with pytest.raises(CheckpointError, match=rf"refused to read the entry '{name}' \(listed in .*manifest.json\): "
                                              r"it is a symbolic link to .*outside.*, outside the directory"):
        acc.load_state(directory)
    assert watch.opened() == []


def test_links_inside_the_checkpoint_and_a_linked_checkpoint_directory_are_followed(saved, tmp_path):
    acc, directory, _ = saved
    (directory / "sub").mkdir()
    os.replace(directory / "optimizer_0.pt", directory / "sub" / "optimizer.bin")
    (directory / "optimizer_0.pt").symlink_to(Path("sub") / "optimizer.bin")  # stays inside
    latest = tmp_path / "latest"
    latest.symlink_to(directory)  # the directory given may itself be a link
    acc.load_state(latest)


def test_a_linked_manifest_and_a_linked_part_of_the_path_are_refused(saved, tmp_path):
    acc, directory, outside = saved
    manifest = json.loads((directory / "manifest.json").read_text())
    (outside / "m").mkdir()
    shutil.copyfile(directory / "optimizer_0.pt", outside / "m" / "optimizer_0.pt")
    (directory / "deep").symlink_to(outside / "m", target_is_directory=True)
    manifest["files"]["deep/optimizer_0.pt"] = manifest["files"]["optimizer_0.pt"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    from acc.checkpointing.files import read_manifest, verify

    with pytest.raises(CheckpointError, match=r"'deep/optimizer_0.pt'.*its part 'deep' is a symbolic link to "):
        verify(directory, read_manifest(directory), "deep/optimizer_0.pt")
    copy = outside / "manifest.json"
    os.replace(directory / "manifest.json", copy)
    (directory / "manifest.json").symlink_to(copy)
    with pytest.raises(CheckpointError, match=r"refused to read the entry 'manifest.json': it is a symbolic link"):
        acc.load_state(directory)


@pytest.mark.parametrize("entry", ["../outside/optimizer_0.pt", "/ABS/optimizer_0.pt", "a/../../optimizer_0.pt"])
def test_manifest_entries_that_climb_out_or_are_absolute_are_refused_naming_them(saved, entry):
    acc, directory, outside = saved
    shutil.copyfile(directory / "optimizer_0.pt", outside / "optimizer_0.pt")
    entry = entry.replace("/ABS", str(outside))
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][entry] = manifest["files"]["optimizer_0.pt"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    watch = OpenWatch(outside)
    with pytest.raises(CheckpointError, match=rf"file name {entry!r} is not a plain name inside the checkpoint"):
        acc.load_state(directory)
    assert watch.opened() == []
    from acc.checkpointing.files import verify

    with pytest.raises(CheckpointError, match=rf"refused to read the entry {entry!r}"):
        verify(directory, {"files": {entry: manifest["files"]["optimizer_0.pt"]}}, entry)  # the reading step too


def test_a_named_pipe_listed_in_the_manifest_is_refused_not_waited_on(saved):
    acc, directory, _ = saved
    (directory / "optimizer_0.pt").unlink()
    os.mkfifo(directory / "optimizer_0.pt")
    with pytest.raises(CheckpointError, match=r"'optimizer_0.pt'.*it is a named pipe, not a regular file"):
        acc.load_state(directory)


# ------------------------------------------------------------------ load_checkpoint_and_dispatch


@pytest.fixture
def sharded(tmp_path):
    acc = Accelerator()
    model = acc.prepare(nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)]))
    acc.save_model(model, tmp_path / "m", max_shard_size="20KB")
    outside = tmp_path / "outside"
    outside.mkdir()
    return tmp_path / "m", outside


def _fresh():
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)])


@pytest.mark.parametrize("how", ["climb", "absolute", "link"])
def test_load_checkpoint_and_dispatch_reads_only_shards_inside_the_index_directory(sharded, how):
    from acc.big_modeling import load_checkpoint_and_dispatch

    directory, outside = sharded
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    shutil.copyfile(directory / shard, outside / shard)
    if how == "link":
        (directory / shard).unlink()
        (directory / shard).symlink_to(outside / shard)
        entry = shard
    else:
        entry = f"../outside/{shard}" if how == "climb" else str(outside / shard)
        index["weight_map"] = {k: (entry if v == shard else v) for k, v in index["weight_map"].items()}
        index_path.write_text(json.dumps(index))
    load_checkpoint_and_dispatch(_fresh(), str(outside / shard))  # control: a file given directly is read
    watch = OpenWatch(outside)
    with pytest.raises(CheckpointError, match=rf"refused to read the entry {entry!r} \(listed in .*index.json\)"):
        load_checkpoint_and_dispatch(_fresh(), str(directory))
    assert watch.opened() == []


def test_a_directory_whose_only_safetensors_file_links_outside_is_refused(tmp_path):
    from safetensors.torch import save_file

    from acc.big_modeling import load_checkpoint_and_dispatch

    outside, directory = tmp_path / "outside", tmp_path / "d"
    outside.mkdir()
    directory.mkdir()
    save_file(_fresh().state_dict(), str(outside / "weights.safetensors"))
    (directory / "weights.safetensors").symlink_to(outside / "weights.safetensors")
    with pytest.raises(CheckpointError, match=r"refused to read the entry 'weights.safetensors'"):
        load_checkpoint_and_dispatch(_fresh(), str(directory))


# ------------------------------------------------------------------ acc merge-weights


def test_merge_weights_refuses_a_listed_file_that_links_outside(saved, tmp_path):
    from click.testing import CliRunner

    from acc.cli import cli

    _, directory, outside = saved
    _link_out(directory, outside, "model_0.safetensors")
    watch = OpenWatch(outside)
    result = CliRunner().invoke(cli, ["merge-weights", str(directory), str(tmp_path / "out.safetensors")])
    assert result.exit_code != 0
    assert "refused to read the entry 'model_0.safetensors'" in result.output and "symbolic link" in result.output
    assert watch.opened() == [] and not (tmp_path / "out.safetensors").exists()


# ------------------------------------------------------------------ fuzzed manifests


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    work = tmp_path_factory.mktemp("confine")
    acc, _ = _setup(work)
    return Path(acc.save_state(work / "ckpt"))


ENTRY = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=0, max_size=12),
    st.sampled_from(["../x", "../../outside/secret.pt", "/OUT/secret.pt", "a/../../x", "./optimizer_0.pt",
                     "sub//x", "\\..\\x", "link/secret.pt", "dirlink/secret.pt", "fifo", "optimizer_0.pt",
                     "model_0.safetensors", "kernel_state.pt", "x/"]))
PLANT = st.sampled_from(["none", "link-file-out", "link-dir-out", "link-inside", "fifo", "dir"])


@settings(max_examples=int(os.environ.get("ACC_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(entries=st.lists(st.tuples(ENTRY, PLANT), min_size=1, max_size=4))
def test_fuzzed_manifests_never_read_outside_the_checkpoint(pristine, entries):
    """Manifests listing arbitrary entries, some planted as links out of the checkpoint (with the outside file's
    own checksum, so only the confinement stops them), links inside, pipes and directories: loading works or
    raises a CheckpointError, and no file outside the checkpoint is ever opened."""
    work = Path(tempfile.mkdtemp(prefix="acc-confine-"))
    try:
        directory, outside = work / "ckpt", work / "outside"
        shutil.copytree(pristine, directory)
        outside.mkdir()
        secret = outside / "secret.pt"
        shutil.copyfile(directory / "optimizer_0.pt", secret)
        manifest = json.loads((directory / "manifest.json").read_text())
        for name, plant in entries:
            name = name.replace("/OUT", str(outside))
            path = directory / name
            if not name or problem(directory, name) is not None and plant == "none":
                manifest["files"][name] = digest(secret)
                continue
            try:
                if plant != "none" and not os.path.lexists(path):
                    path.parent.mkdir(parents=True, exist_ok=True)
                    if plant == "link-file-out":
                        path.symlink_to(secret)
                    elif plant == "link-dir-out":
                        path.symlink_to(outside, target_is_directory=True)
                    elif plant == "link-inside":
                        path.symlink_to(directory / "optimizer_0.pt")
                    elif plant == "fifo":
                        os.mkfifo(path)
                    else:
                        path.mkdir()
            except OSError:
                pass  # a name the file system refuses: it stays an entry only
            manifest["files"][name] = digest(secret)
        (directory / "manifest.json").write_text(json.dumps(manifest))
        acc, _ = _setup(work)
        watch = OpenWatch(outside)
        try:
            acc.load_state(directory)
        except CheckpointError as exc:
            assert str(directory) in str(exc)
        finally:
            opened = watch.opened()
        assert opened == [], f"read outside the checkpoint: {opened}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.skipif(os.sep != "/", reason="a backslash is a separator on Windows")
def test_a_link_out_whose_name_holds_a_backslash_is_refused(tmp_path):
    # found by the fuzzer: the check walked `0/0` (nothing there) while the reader opened the link named `0\0`
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "secret.pt").write_bytes(b"x")
    (tmp_path / "ckpt" / "0\\0").symlink_to(tmp_path / "secret.pt")
    why = problem(tmp_path / "ckpt", "0\\0")
    assert why is not None and "symbolic link" in why and "outside the directory" in why
