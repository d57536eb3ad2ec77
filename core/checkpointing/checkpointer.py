"""The checkpointer: `save_state`/`load_state` (exact resume), `save_model`, `save` and the save/load pre-hooks,
a component of the facade (Accelerator's methods of these names call it).

The backend writes and reads model and optimizer state through `acc_save_checkpoint` /
`acc_load_checkpoint` (a sharding backend writes shards from every process); the kernel writes the
rest: schedulers, the fp16 scaler, data-loader positions, counters, registered objects (main process)
and each process's RNG states (per process), then the manifest. See checkpoint.py for the protocol.

What it works on is declared in its constructor: the run context (settings, loop counters, process, the
communicator), the backend's hooks, the prepared-objects registry (prepared.py), how the facade unwraps a model,
where the fp16 scaler is, the project configuration and the assembled plugins (for the manifest).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from acc.assembly import manifest as run_manifest
from acc.checkpointing import files as ckpt
from acc.checkpointing import hashed_io
from acc.checkpointing.accelerate_format import is_accelerate_checkpoint, load_accelerate_checkpoint
from acc.checkpointing.files import ProjectConfiguration
from acc.errors import CheckpointError
from acc.runtime.prepared import PreparedObjects

KERNEL_STATE = "kernel_state.pt"
RNG_FILE = "rng_state_{rank}.pt"
CUSTOM_FILE = "custom_{index}.pt"


class Checkpointer:
    """Writes and restores checkpoints of the prepared objects (see the module docstring for what it uses)."""

    def __init__(self, ctx: Any, hooks: Any, prepared: PreparedObjects, *, unwrap: Callable[[Any], Any],
                 scaler: Callable[[], Any], project_configuration: ProjectConfiguration,
                 plugins: Mapping[str, tuple[str, str]], distributed_type: Callable[[], Any]):
        self.ctx = ctx
        self._hooks = hooks
        self.prepared = prepared
        self.unwrap_model = unwrap
        self._scaler = scaler
        self.project_configuration = project_configuration
        self._plugins = dict(plugins)
        self._distributed_type = distributed_type

    # the run, as the checkpointer sees it
    @property
    def settings(self) -> Any:
        return self.ctx.settings

    @property
    def num_processes(self) -> int:
        return int(self.ctx.process.num_processes)

    @property
    def process_index(self) -> int:
        return int(self.ctx.process.process_index)

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def _broadcast(self, obj: Any) -> Any:
        return obj if self.num_processes == 1 else self.ctx.communicator.broadcast_object(obj, 0)

    def _gather_objects(self, obj: Any) -> list[Any]:
        return list(self.ctx.communicator.gather_object(obj))

    # ------------------------------------------------------------------ save/load hooks
    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> Any:
        """Call `hook(models, weights, output_dir)` in `save_state` before anything is written.

        `models` are the prepared models, `weights` their state dicts; a hook that saves a model itself (e.g.
        `save_pretrained`) removes its entry from `weights`, and acc then does not write that model. `output_dir`
        is the checkpoint's directory while it is written (`.NAME.tmp-...` beside the one asked for, renamed to it
        once complete): what the hook writes there is published with the checkpoint and listed in its manifest.
        Returns a handle whose `remove()` unregisters the hook.
        """
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self.prepared.save_hooks)
        self.prepared.save_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> Any:
        """Call `hook(models, input_dir)` in `load_state` before anything is read; a hook that loads a model
        itself removes it from `models`, and acc then does not load that model."""
        from torch.utils.hooks import RemovableHandle

        handle = RemovableHandle(self.prepared.load_hooks)
        self.prepared.load_hooks[handle.id] = hook
        return handle

    def _models_to_save(self, output_dir: Path) -> list[Any]:
        """The models acc writes: all of them, minus those a save hook took over (it removed their weights)."""
        if not self.prepared.save_hooks:
            return list(self.prepared.models)
        weights = [self.get_state_dict(m, unwrap=False) for m in self.prepared.models]
        before = list(weights)
        for hook in list(self.prepared.save_hooks.values()):
            hook(self.prepared.models, weights, str(output_dir))
        kept = {id(w) for w in weights}
        return [m for m, w in zip(self.prepared.models, before) if id(w) in kept]

    def _models_to_load(self, input_dir: Path) -> list[Any]:
        """The models acc loads: all of them, minus those a load hook took over (it removed them from the list)."""
        models = list(self.prepared.models)
        for hook in list(self.prepared.load_hooks.values()):
            hook(models, str(input_dir))
        return models

    # ------------------------------------------------------------------ save_state
    def save_state(self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True,
                   **save_model_func_kwargs: Any) -> Path:
        """Write everything needed to resume into `output_dir` (or the next automatic name).

        The directory appears only once complete; a crash leaves the previous checkpoint intact.
        Call it on every process. Returns the checkpoint directory. acc always writes tensors as safetensors.
        """
        if not safe_serialization or save_model_func_kwargs:
            given = ["safe_serialization=False"] if not safe_serialization else []
            given += [f"{k}=..." for k in save_model_func_kwargs]
            warnings.warn(f"save_state({', '.join(given)}) is ignored: acc writes tensors as safetensors and other "
                          "state with torch.save, and loads nothing that could run code", stacklevel=3)
        config = self.project_configuration
        machines = self.settings.get("num_machines", 1)
        if config.save_on_each_node and machines > 1:
            raise CheckpointError(f"ProjectConfiguration(save_on_each_node=True) on a run over {machines} machines: "
                                  "acc's checkpoints are written by every process into one directory that every "
                                  "machine sees; put output_dir on a shared file system and drop save_on_each_node")
        if output_dir is None:
            if not config.automatic_checkpoint_naming:
                raise CheckpointError("save_state() needs a directory, or ProjectConfiguration("
                                      "automatic_checkpoint_naming=True, project_dir=...)")
            final = config.checkpoints_dir / f"{ckpt.AUTO_PREFIX}{config.iteration}"
        else:
            final = Path(output_dir)
        ckpt.finish_removals()  # the previous save's replaced checkpoint is deleted before this one is written
        tmp, problem = None, None
        if self.is_main_process:
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = ckpt.temporary_dir(final)
                tmp.mkdir()
            except OSError as exc:
                problem = f"save_state: cannot create a directory in {final.parent}: {exc}"
        tmp, problem = self._broadcast((str(tmp) if tmp else None, problem))
        if problem:
            raise CheckpointError(problem)
        tmp = Path(tmp)  # the directory exists for everyone (shared file system)
        # save hooks write into the directory that becomes output_dir, so their files are published with it
        models = self._models_to_save(tmp)
        from_hooks = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file()) \
            if self.is_main_process and self.prepared.save_hooks else []

        # every failure while writing is collective: all processes learn of it, nothing is published, all raise
        mine: dict[str, Any] = {}
        failure: tuple[str, str] | None = None
        error: BaseException | None = None
        current = "the backend's model and optimizer files"
        try:
            with hashed_io.recording() as record:  # files written through the SDK are hashed and fsynced as written
                written = from_hooks + list(self._hooks.acc_save_checkpoint(
                    ctx=self.ctx, directory=tmp, models=[self.unwrap_model(m) for m in models],
                    optimizers=[o.optimizer for o in self.prepared.optimizers]) or [])
                current = RNG_FILE.format(rank=self.process_index)
                ckpt.save_object(ckpt.rng_state(), tmp / current)
                written.append(current)
                if self.is_main_process:
                    current = KERNEL_STATE
                    ckpt.save_object(self._kernel_state(len(models)), tmp / KERNEL_STATE)
                    written.append(KERNEL_STATE)
                    for i, obj in enumerate(self.prepared.custom_objects):
                        current = CUSTOM_FILE.format(index=i)
                        ckpt.save_object(obj.state_dict(), tmp / current)
                        written.append(current)
            current = "the flush of the files to disk"
            # every file on disk before the directory is published: recorded ones already are (and are not read
            # again); any other is read back, hashed and fsynced here
            mine = ckpt.digest_many(tmp, written, sync=True, record=record)
        except Exception as exc:  # noqa: BLE001  (reported to every process, then raised)
            error = exc
            failure = self._write_failure(exc, final, tmp, current)
        everyone = self._gather_objects((mine, failure))
        failures = [(rank, f) for rank, (_, f) in enumerate(everyone) if f is not None]
        if not failures and self.is_main_process:
            try:
                files: dict[str, Any] = {}
                for part, _ in everyone:
                    files.update(part)
                data = {"format": ckpt.FORMAT, "files": files, "run": self._manifest(),
                        "step": self.ctx.loop.step}
                current = ckpt.MANIFEST
                run_manifest.write_json(tmp / ckpt.MANIFEST, data)
                ckpt.publish(tmp, final)
            except Exception as exc:  # noqa: BLE001
                error = exc
                failures = [(0, self._write_failure(exc, final, tmp, current))]
        if self.num_processes > 1:
            failures = self._broadcast(failures)
        if failures:
            if self.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            self._raise_write_failure(failures, error, tmp)
        if self.is_main_process and output_dir is None:
            self._prune(config)
            ckpt.remove_stale_temporaries(config.checkpoints_dir, config.iteration)
        if output_dir is None:
            config.iteration += 1
        return final

    def _write_failure(self, exc: BaseException, final: Path, tmp: Path, current: str) -> tuple[str, str]:
        """(kind, message) of a failed write: "full" with the bytes needed and free, or "error"."""
        needed, how = self._bytes_needed(final)
        if ckpt.is_disk_full(exc, final.parent, needed):
            previous = self._previous_checkpoint(final)
            return "full", ckpt.disk_full_message(final, tmp, current, needed, how, previous)
        return "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"

    def _raise_write_failure(self, failures: list, error: BaseException | None, tmp: Path) -> None:
        rank, (kind, message) = failures[0]
        mine = next((f for r, f in failures if r == self.process_index), None)
        if mine is not None and mine[0] == "full":
            raise CheckpointError(mine[1]) from None
        if mine is not None and error is not None:
            raise error
        if kind == "full":
            raise CheckpointError(f"(process {rank}) {message}") from None
        raise CheckpointError(f"save_state: process {rank} failed while writing the checkpoint ({message}); nothing "
                              f"was published and the temporary directory {tmp} was removed") from None

    def _previous_checkpoint(self, final: Path) -> Path | None:
        if final.name.startswith(ckpt.AUTO_PREFIX):
            complete = [p for _, p in ckpt.automatic_checkpoints(final.parent) if p != final]
            if complete:
                return complete[-1]
        return final if ckpt.is_complete(final) else None

    def _bytes_needed(self, final: Path) -> tuple[int, str]:
        """About how many bytes the checkpoint takes: the previous one's size, else its tensors' size."""
        previous = self._previous_checkpoint(final)
        if previous is not None:
            try:
                return ckpt.total_size(ckpt.read_manifest(previous)), f"the size of {previous.name}"
            except CheckpointError:
                pass
        total = 0
        for obj in [*(self.unwrap_model(m) for m in self.prepared.models), *(o.optimizer for o in self.prepared.optimizers)]:
            try:
                state = obj.state_dict()
            except Exception:  # noqa: BLE001  (an estimate only)
                continue
            from acc.runtime.ops import apply

            sizes: list[int] = []

            def count(t: torch.Tensor) -> torch.Tensor:
                sizes.append(t.numel() * t.element_size())
                return t

            apply(count, state)
            total += sum(sizes)
        return total, "the size of its model and optimizer tensors; more with the other files"

    def _kernel_state(self, saved_models: int) -> dict[str, Any]:
        return {
            "step": self.ctx.loop.step,
            "micro_step": self.ctx.loop.micro_step,
            "models": saved_models,
            "schedulers": [s.state_dict() for s in self.prepared.schedulers],
            "scaler": self._scaler().state_dict() if self._scaler() is not None else None,
            "dataloaders": [dl.state_dict() for dl in self.prepared.dataloaders],
        }

    def _prune(self, config: ckpt.ProjectConfiguration) -> None:
        if not config.total_limit:
            return
        complete = ckpt.automatic_checkpoints(config.checkpoints_dir)
        for _, path in complete[: max(0, len(complete) - config.total_limit)]:
            ckpt.retire(path)  # hidden first: a kill while deleting never leaves a half checkpoint in view

    def _manifest(self) -> dict[str, Any]:
        s = self.settings
        run_dir = os.environ.get(run_manifest.RUN_DIR_ENV)
        command = None
        if run_dir and (Path(run_dir) / "manifest.json").is_file():
            command = json.loads((Path(run_dir) / "manifest.json").read_text()).get("command")
        world = {"num_processes": self.num_processes, "distributed_type": self._distributed_type()}
        data = run_manifest.build(s, s.sources, self._plugins, command or sys.argv, world)
        batch = [{"per_process": dl.per_process_batch_size, "global": dl.total_batch_size} for dl in self.prepared.dataloaders]
        data["batch_sizes"] = batch
        return data

    # ------------------------------------------------------------------ load_state
    def load_state(self, input_dir: str | os.PathLike | None = None, load_kwargs: dict | None = None,
                   strict: bool = True, **load_model_func_kwargs: Any) -> Path:
        """Restore what `save_state` wrote; with no directory, the newest complete automatic checkpoint.

        Restores models, optimizers, schedulers, the fp16 scaler, each process's RNG states, the step counters
        and registered objects (what Accelerate restores). Data loaders continue where the checkpoint stopped only
        with `resume_data_position` (acc's exact resume); otherwise the script skips batches itself, as with
        Accelerate. Every file is checked against the manifest first, on every process, before anything is
        restored; nothing in a checkpoint is executed. With automatic naming, a newest checkpoint that fails the
        check is refused with a warning naming the file, and the newest one that passes is loaded (checkpoint.py's
        fallback rule); a directory given explicitly that fails is an error and nothing is loaded.
        """
        strict = bool(load_model_func_kwargs.pop("strict", strict))
        if load_kwargs or load_model_func_kwargs:
            warnings.warn(f"load_state({', '.join(list(load_kwargs or {}) + list(load_model_func_kwargs))}=...) is "
                          "ignored: acc reads tensors with safetensors onto each process's device", stacklevel=3)
        if input_dir is None:
            config = self.project_configuration
            complete = ckpt.automatic_checkpoints(config.checkpoints_dir)
            if not complete:
                raise CheckpointError(f"no complete checkpoint in {config.checkpoints_dir} to load")
            iteration, directory, manifest = self._newest_verified(complete)
            config.iteration = iteration + 1
        else:
            directory = Path(input_dir)
            if is_accelerate_checkpoint(directory):
                return self._load_accelerate_checkpoint(directory, strict)
            found, problems = self._verified_everywhere(directory)
            if problems or found is None:
                raise CheckpointError(f"load_state: refused {directory}: {(problems or ['no manifest'])[0]}; "
                                      "nothing was loaded")
            manifest = found
        self._warn_about_differences(manifest, directory)
        state = ckpt.load_object(ckpt.verify(directory, manifest, KERNEL_STATE))
        models = self._models_to_load(directory)
        saved = state.get("models", len(self.prepared.models))
        if saved != len(models):
            raise CheckpointError(f"{directory}: holds {saved} model(s), but {len(models)} are to be loaded "
                                  f"({len(self.prepared.models)} prepared, {len(self.prepared.models) - len(models)} loaded by "
                                  "load-state hooks); prepare the same models as when it was saved")
        self._hooks.acc_load_checkpoint(ctx=self.ctx, directory=directory,
                                          models=[self.unwrap_model(m) for m in models],
                                          optimizers=[o.optimizer for o in self.prepared.optimizers], manifest=manifest)
        self._restore_kernel_state(state, directory)
        for i, obj in enumerate(self.prepared.custom_objects):
            obj.load_state_dict(ckpt.load_object(ckpt.verify(directory, manifest, CUSTOM_FILE.format(index=i))))
        rng_name = RNG_FILE.format(rank=self.process_index)
        saved_world = manifest.get("run", {}).get("processes", {}).get("num_processes")
        if saved_world == self.num_processes and rng_name in manifest.get("files", {}):
            ckpt.set_rng_state(ckpt.load_object(ckpt.verify(directory, manifest, rng_name)))
        self.ctx.communicator.barrier()
        return directory

    def _load_accelerate_checkpoint(self, directory: Path, strict: bool) -> Path:
        """A directory Accelerate's save_state wrote (checkpointing/accelerate_format.py)."""
        models = self._models_to_load(directory)
        step = load_accelerate_checkpoint(
            directory, models=[self.unwrap_model(m) for m in models],
            optimizers=[o.optimizer for o in self.prepared.optimizers], schedulers=list(self.prepared.schedulers),
            custom_objects=list(self.prepared.custom_objects), scaler=self._scaler(),
            process_index=self.process_index, strict=strict, device=self.ctx.device)
        if step is not None:  # Accelerate's `accelerator.step` (the micro-step count)
            self.ctx.loop.micro_step = step
        self.ctx.communicator.barrier()
        return directory

    def _verified_everywhere(self, directory: Path) -> tuple[dict[str, Any] | None, list[str]]:
        """The manifest of `directory` with every file each process will read verified (on every process), and
        the problems found (with the process that found them; empty: loadable)."""
        manifest, problem = None, None
        try:
            manifest = ckpt.read_manifest(directory)
            mine = RNG_FILE.format(rank=self.process_index)
            names = [n for n in manifest["files"] if n == mine or not re.fullmatch(r"rng_state_\d+\.pt", n)]
            ckpt.verify_all(directory, manifest, names)
        except CheckpointError as exc:
            problem = str(exc)
        found = self._gather_objects(problem) if self.num_processes > 1 else [problem]
        problems = [p if self.num_processes == 1 else f"{p} (found by process {r})"
                    for r, p in enumerate(found) if p is not None]
        return manifest, problems

    def _newest_verified(self, complete: list[tuple[int, Path]]) -> tuple[int, Path, dict[str, Any]]:
        """The fallback rule of automatic naming: the newest checkpoint whose files all verify on every process;
        each newer one is refused with a warning naming the file and why."""
        refused: list[tuple[Path, str]] = []
        for iteration, directory in reversed(complete):
            manifest, problems = self._verified_everywhere(directory)
            if not problems and manifest is not None:
                if refused and self.is_main_process:
                    for name, problem in refused:
                        warnings.warn(f"load_state: refused {name}: {problem}; loading {directory} instead, the "
                                      "newest complete checkpoint whose files all verify", stacklevel=4)
                return iteration, directory, manifest
            refused.append((directory, problems[0]))
        listing = "; ".join(f"{d.name}: {p}" for d, p in refused)
        raise CheckpointError(f"load_state: no checkpoint in {complete[0][1].parent} verifies, nothing was loaded: "
                              f"{listing}")

    def _restore_kernel_state(self, state: dict[str, Any], directory: Path) -> None:
        if len(state["schedulers"]) != len(self.prepared.schedulers) or len(state["dataloaders"]) != len(self.prepared.dataloaders):
            raise CheckpointError(
                f"{directory}: holds {len(state['schedulers'])} scheduler(s) and {len(state['dataloaders'])} data "
                f"loader(s), but {len(self.prepared.schedulers)} and {len(self.prepared.dataloaders)} are prepared; prepare the "
                "same objects as when it was saved"
            )
        for sched, sd in zip(self.prepared.schedulers, state["schedulers"]):
            sched.load_state_dict(sd)
        if state["scaler"] is not None and self._scaler() is not None:
            self._scaler().load_state_dict(state["scaler"])
        positions = [_position(p) for p in state["dataloaders"]]
        if self.settings["resume_data_position"]:
            for dl, pos in zip(self.prepared.dataloaders, positions):
                dl.load_state_dict(pos)
        else:
            mid = [(i, p) for i, p in enumerate(positions) if p["batches"]]
            if mid and self.is_main_process:
                i, p = mid[0]
                print(f"acc: {directory} was saved after batch {p['batches']} of epoch {p['epoch']} (data loader "
                      f"#{i}); its data loaders start their epoch at batch 0 unless the script skips "
                      "(accelerator.skip_first_batches), as with Accelerate. To continue exactly where it stopped, "
                      "set resume_data_position = true (--resume-data-position, or "
                      "DataLoaderConfiguration(use_stateful_dataloader=True))", file=sys.stderr)
        self.ctx.loop.step = state["step"]
        self.ctx.loop.micro_step = state["micro_step"]

    def _warn_about_differences(self, manifest: dict[str, Any], directory: Path) -> None:
        run = manifest.get("run", {})
        saved_world = run.get("processes", {}).get("num_processes")
        saved_backend = run.get("backend")
        if saved_world is not None and saved_world != self.num_processes:
            data = ("data loaders resume at the saved epoch and batch" if self.settings["resume_data_position"]
                    else "data loaders start afresh")
            warnings.warn(f"{directory} was saved by {saved_world} process(es); this run has {self.num_processes}: "
                          f"model and optimizer state are restored, {data}, RNG states are not restored (each "
                          "process keeps its current seed)", stacklevel=4)
        if saved_backend is not None and saved_backend != self.ctx.backend:
            warnings.warn(f"{directory} was saved with backend '{saved_backend}'; this run uses '{self.ctx.backend}': "
                          "the files are read as the current backend writes them", stacklevel=4)

    # ------------------------------------------------------------------ models and objects
    def get_state_dict(self, model: Any, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict (gathered from shards where needed), complete on the main process."""
        inner = self.unwrap_model(model) if unwrap else model
        return self._hooks.acc_model_state_dict(ctx=self.ctx, model=inner)

    def save_model(self, model: Any, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB",
                   safe_serialization: bool = True) -> None:
        """Write the unwrapped model's weights as safetensors (sharded with an index file when large), or with
        `safe_serialization=False` as Accelerate's torch.save files (pytorch_model*.bin; acc loads them with
        weights_only=True)."""
        state = self.get_state_dict(model)
        if self.is_main_process:
            write_sharded(state, Path(save_directory), parse_size(max_shard_size), safe=safe_serialization)
        self.ctx.communicator.barrier()

    def save(self, obj: Any, path: str | os.PathLike) -> None:
        """torch.save on the main process only (other processes return at once)."""
        if self.is_main_process:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            ckpt.save_object(obj, Path(path))


def parse_size(size: int | str) -> int:
    """Bytes from 10GB, 500MB, 100KB or an int."""
    if isinstance(size, int):
        return size
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    text = size.strip().upper()
    for unit, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def write_sharded(state: dict[str, torch.Tensor], directory: Path, max_bytes: int, safe: bool = True) -> list[str]:
    """`model.safetensors`, or `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`; with
    `safe=False` Accelerate's torch.save names: `pytorch_model.bin`, or `pytorch_model-0000i-of-0000n.bin` +
    `pytorch_model.bin.index.json`."""
    directory.mkdir(parents=True, exist_ok=True)
    stem, suffix = ("model", ".safetensors") if safe else ("pytorch_model", ".bin")

    def write(tensors: dict[str, torch.Tensor], path: Path) -> None:
        if safe:
            ckpt.save_tensors(tensors, path)
        else:
            torch.save({k: v.detach().contiguous() for k, v in tensors.items()}, path)

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        write(shards[0], directory / f"{stem}{suffix}")
        return [f"{stem}{suffix}"]
    names, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        name = f"{stem}-{i:05d}-of-{len(shards):05d}{suffix}"
        write(shard, directory / name)
        names.append(name)
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    run_manifest.write_json(directory / f"{stem}{suffix}.index.json", {"metadata": {"total_size": total},
                                                                     "weight_map": weight_map})
    return names


def _position(saved: dict[str, Any]) -> dict[str, Any]:
    """A data loader's saved position (checkpoints of acc 0.1 called the batches "skip")."""
    position = dict(saved)
    position.setdefault("batches", position.pop("skip", 0))
    return position
