"""acc's backend conformance suite (collected by the `acc.testing` plugin when a backend is named).

It holds a backend to what it declares in `acc_capabilities`: replicas that agree at every synchronisation point,
a synchronous N-process run equal to one process with N times the batch, micro-steps that keep gradients local and
communicate nothing, checkpoints that give every rank back its own state (at several points, with Adam), the mixed
precision modes it declares, resharding if it declares it. Every failure says which rank, what value, and what
was expected. Backend settings for the runs: `--acc-flags "--localsgd-sync-every 2"` (or the `acc_flags` ini).
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from acc import HOOKSPEC_VERSION
from acc.errors import ValidationError
from acc.testing import backend_flags, clean_environment

pytestmark = pytest.mark.acc_conformance
HOOKS_CHECKED = ("acc_setup", "acc_init_module", "acc_wrap", "acc_wrap_dataloader", "acc_unwrap_model", "acc_no_sync", "acc_backward",
                 "acc_clip_grad_norm", "acc_optimizer_step", "all_gather", "gather_object", "all_reduce",
                 "broadcast", "broadcast_object", "barrier", "acc_save_checkpoint", "acc_load_checkpoint",
                 "acc_model_state_dict")
BATCH, STEPS = 4, 8
AGREE = 1e-6  # replicas "agree": every parameter within this of rank 0's (averaging makes them bitwise equal)
MATCH = 1e-5  # relative tolerance of "N processes x batch B equals 1 process x batch N*B" (float sums reorder)


def _plan(backend: str, nproc: int) -> Any:
    from acc.assembly.choose import assemble
    from acc.launcher import orchestrate

    return orchestrate.make_plan(assemble(flags={"backend": backend, "nproc": str(nproc)}))


def _refusal(backend: str, nproc: int) -> str | None:
    """Why the backend refuses `nproc` processes (None when it accepts them)."""
    try:
        _plan(backend, nproc)
    except ValidationError as exc:
        return str(exc)
    return None


def expect(condition: bool, message: str) -> None:
    """Fail with `message` (which names the rank, the value and what was expected) unless `condition`."""
    if not condition:
        pytest.fail(message, pytrace=False)


@pytest.fixture(scope="module")
def capabilities(acc_backend: str, request: pytest.FixtureRequest) -> Any:
    from acc.assembly.choose import assemble
    from acc.launcher.orchestrate import capabilities as declared

    flags = _flag_values(backend_flags(request.config), acc_backend)
    return declared(assemble(flags={"backend": acc_backend, **flags}))


def _flag_values(flags: list[str], backend: str) -> dict[str, str]:
    """`--name value` / `--name=value` pairs as setting flags for assemble() (peeked the way the CLI does); a flag
    that is no setting of `backend`'s assembly is a usage error, not silently dropped."""
    from acc.assembly.choose import assemble

    out: dict[str, str] = {}
    if not flags:
        return out
    registry = assemble(flags={"backend": backend}).registry
    by_flag = {flag: s for s in registry for flag in s.flags}
    i = 0
    while i < len(flags):
        name, _, value = flags[i].partition("=")
        negated = name.startswith("--no-") and "--" + name[5:] in by_flag
        setting = by_flag.get("--" + name[5:] if negated else name)
        if setting is None:
            raise pytest.UsageError(f"--acc-flags: {name} is not a setting of backend '{backend}' (its plugin "
                                    f"set's flags: {', '.join(sorted(by_flag))})")
        if setting.kind is bool and not value:
            value = "false" if negated else "true"
        elif not value and i + 1 < len(flags):
            value, i = flags[i + 1], i + 1
        out[setting.name] = value
        i += 1
    return out


@pytest.fixture(scope="module")
def job(acc_backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    """`job(nproc, phase, *args)`: the per-rank results of acc.testing.job on `nproc` real processes (run once)."""
    cache: dict[tuple, dict[int, dict]] = {}
    flags = backend_flags(request.config)

    def results(nproc: int, phase: str = "contract", *args: str, launch: tuple[str, ...] = ()) -> dict[int, dict]:
        key = (nproc, phase, args, launch)
        if key not in cache:
            refusal = _refusal(acc_backend, nproc)
            if refusal:
                pytest.skip(f"backend '{acc_backend}' refuses {nproc} processes here: {refusal}")
            out = tmp_path_factory.mktemp(f"job{nproc}-{phase}")
            cmd = [sys.executable, "-m", "acc", "launch", "--backend", acc_backend, "--nproc", str(nproc),
                   "--output-dir", "", *flags, *launch, "-m", "acc.testing.job", "--out", str(out), "--phase", phase,
                   *args]
            proc = subprocess.run(cmd, cwd=out, env=clean_environment(), capture_output=True, text=True, timeout=900)
            found = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
            expect(proc.returncode == 0 and len(found) == nproc,
                   f"the conformance job ({phase}) failed on {nproc} process(es) (exit {proc.returncode}): "
                   f"{shlex.join(cmd)}\n{proc.stderr[-4000:]}")
            cache[key] = found
        return cache[key]

    return results


def _worst(a: list[float], b: list[float]) -> tuple[float, int]:
    """The largest absolute difference between two equally long vectors, and where it is."""
    if len(a) != len(b):
        return math.inf, -1
    diffs = [abs(x - y) for x, y in zip(a, b)]
    worst = max(diffs, default=0.0)
    return worst, diffs.index(worst) if diffs else -1


# ------------------------------------------------------------------------------------------ the contract


def test_loads_through_its_entry_point(acc_backend: str) -> None:
    from acc.assembly.plugins import build_plugin_manager, installed_backends

    expect(acc_backend in installed_backends(), f"no entry point '{acc_backend}' in the group acc.backends")
    pm, _ = build_plugin_manager(acc_backend)
    version = getattr(pm.get_plugin(acc_backend), "ACC_HOOKSPEC_VERSION", None)
    expect(version in (1, HOOKSPEC_VERSION), f"ACC_HOOKSPEC_VERSION is {version!r}; this acc provides "
                                             f"{HOOKSPEC_VERSION} (and still loads 1)")


def test_declares_its_capabilities(capabilities: Any) -> None:
    from acc.contract.capabilities import Capabilities

    expect(isinstance(capabilities, Capabilities), f"acc_capabilities answered {capabilities!r}, not a Capabilities")
    expect("no" in capabilities.mixed_precision, f"mixed_precision {capabilities.mixed_precision} lacks 'no'")


@pytest.mark.parametrize("nproc", [1, 2])
def test_launch_plan_is_well_formed(acc_backend: str, nproc: int) -> None:
    refusal = _refusal(acc_backend, nproc)
    if refusal and nproc > 1:
        pytest.skip(f"single-process backend: {refusal}")
    plan = _plan(acc_backend, nproc)
    expect(plan.problems() == [] and plan.world_size == nproc and bool(plan.device),
           f"the launch plan for {nproc} process(es) is {plan!r} (problems: {plan.problems()})")


def test_dry_run_does_not_import_torch(acc_backend: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    code = ("import sys\nfrom acc.cli import main\n"
            f"try:\n    main(['launch', '--backend', {acc_backend!r}, '--dry-run', {str(script)!r}])\n"
            "except SystemExit as exc:\n    print('EXIT', exc.code)\nprint('TORCH', 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_environment(),
                          cwd=tmp_path, timeout=120)
    expect("EXIT 0" in proc.stdout, f"acc launch --dry-run failed: {proc.stdout}{proc.stderr}")
    expect("TORCH False" in proc.stdout, "the launcher-side hooks import torch (keep it inside worker hooks)")


def test_validate_rejects_a_bad_combination(acc_backend: str, acc_invalid_flags: dict) -> None:
    from acc.assembly.choose import assemble
    from acc.launcher import orchestrate

    with pytest.raises(ValidationError):
        orchestrate.make_plan(assemble(flags={"backend": acc_backend, **{k: str(v) for k, v in acc_invalid_flags.items()}}))


@pytest.mark.parametrize("nproc", [1, 2])
def test_hooks_answer_with_the_right_types(job: Any, nproc: int) -> None:
    for rank, result in job(nproc).items():
        bad = {name: result["types"].get(name, {"ok": False, "error": "not reached"}) for name in HOOKS_CHECKED
               if not result["types"].get(name, {}).get("ok")}
        expect(not bad, f"rank {rank}: " + "; ".join(f"{k}: {v.get('error', 'wrong type')}" for k, v in bad.items()))


def test_drives_the_mesh_dims_it_declares(job: Any, capabilities: Any) -> None:
    dims = [d for d in capabilities.mesh_dims if d in ("dp_replicate", "dp_shard")]
    if not dims:
        pytest.skip("the backend declares no data-parallel mesh dimension (Capabilities.mesh_dims)")
    for rank, r in job(2).items():
        for dim in dims:
            got = r.get("mesh", {}).get(dim, {"error": "not reached"})
            expect(got == {"names": [dim], "dp_sum": 3.0},
                   f"rank {rank}: ParallelismConfig({dim}_size=2) on 2 processes gave {got} (expected a mesh with "
                   f"the one dim {dim!r} whose dp group all-reduces 1 + 2 = 3)")


@pytest.mark.parametrize("nproc", [1, 2])
def test_collectives_agree_with_the_reference(job: Any, nproc: int) -> None:
    want = {"gather": [float(i) for i in range(nproc) for _ in range(2)],
            "gather_object": [{"rank": i} for i in range(nproc)],
            "reduce_sum": [float(sum(range(1, nproc + 1)))], "reduce_mean": [(nproc + 1) / 2],
            "reduce_max": [float(nproc)], "reduce_min": [1.0], "broadcast": [float(nproc - 1)],
            "broadcast_object": "from 0", "broadcast_none": None}
    for rank, r in job(nproc).items():
        for name, expected in want.items():
            got = r["collectives"].get(name)
            expect(got == expected, f"rank {rank}: {name} returned {got!r}, expected {expected!r} (the reference "
                                    f"semantics over {nproc} process(es), rank r contributing r or r + 1)")


@pytest.mark.parametrize("nproc", [1, 2])
def test_every_sample_is_gathered_exactly_once(job: Any, nproc: int) -> None:
    for rank, r in job(nproc).items():
        seen = r["seen"]
        expect(seen == list(range(50)), f"rank {rank}: gather_for_metrics over a 50-sample evaluation returned "
                                        f"{len(seen)} samples ({len(set(seen))} distinct), expected 0..49 once each: "
                                        "is every process's share of the data its own?")
        expect(r["round_trip"]["before"] == r["round_trip"]["after"],
               f"rank {rank}: the model's outputs after save_state/load_state differ from before")


# ------------------------------------------------------------------------------------------ training


def test_replicas_agree_at_every_synchronisation_point(job: Any, capabilities: Any) -> None:
    if capabilities.sync == "none":
        pytest.skip("a one-process backend has no replicas")
    results = job(2, "train", "--batch", str(BATCH), "--steps", str(STEPS))
    rows = {rank: r["after_step"] for rank, r in results.items()}
    for step in range(1, STEPS + 1):
        if not capabilities.synchronises_at(step):
            continue
        for rank in rows:
            worst, where = _worst(rows[rank][step - 1], rows[0][step - 1])
            expect(worst <= AGREE, f"rank {rank}: after optimizer step {step}, parameter #{where} is "
                                   f"{rows[rank][step - 1][where]!r} where rank 0 has {rows[0][step - 1][where]!r} "
                                   f"(difference {worst:.3g}); the backend promises replicas that agree after "
                                   f"{'every step' if capabilities.sync == 'every_step' else f'every {capabilities.sync_period} steps'}")


def test_matches_one_process_with_n_times_the_batch(job: Any, capabilities: Any) -> None:
    if capabilities.sync != "every_step":
        pytest.skip(f"sync {capabilities.sync}: only a backend that averages every step equals one process")
    two = job(2, "train", "--batch", str(BATCH), "--steps", str(STEPS))
    one = job(1, "train", "--batch", str(2 * BATCH), "--steps", str(STEPS))
    ids_two = [a + b for a, b in zip(two[0]["ids"], two[1]["ids"])]
    expect([sorted(x) for x in ids_two] == [sorted(x) for x in one[0]["ids"]],
           f"the 2 processes' batches of step 1 are {ids_two[0]}, one process with batch {2 * BATCH} saw "
           f"{one[0]['ids'][0]}: each step's global batch must be the same samples")
    for step in range(STEPS):
        mine, ref = two[0]["after_step"][step], one[0]["after_step"][step]
        worst, where = _worst(mine, ref)
        scale = max(1.0, abs(ref[where])) if where >= 0 else 1.0
        expect(worst <= MATCH * scale, f"after optimizer step {step + 1}, parameter #{where} is {mine[where]!r} on 2 "
                                       f"processes x batch {BATCH} but {ref[where]!r} on 1 process x batch "
                                       f"{2 * BATCH} (difference {worst:.3g}, tolerance {MATCH} relative): are "
                                       "gradients averaged over the processes?")


def test_micro_steps_keep_gradients_local_and_communicate_nothing(job: Any, capabilities: Any, acc_backend: str) -> None:
    if capabilities.sync == "none":
        pytest.skip("a one-process backend has nothing to keep local")
    results = job(2, "accumulate", "--batch", str(BATCH))
    for i, (a, b) in enumerate(zip(results[0]["micro"], results[1]["micro"])):
        for rank, m in ((0, a), (1, b)):
            if not m["sync"] and capabilities.local_micro_steps:
                expect(m["gradient_collectives"] == 0,
                       f"rank {rank}: micro-step {i + 1} (no sync) ran {m['gradient_collectives']} gradient "
                       "collective(s) (all-reduce / reduce-scatter); expected none: acc_no_sync must keep the "
                       "gradients local")
        if not a["sync"] and all(g is not None for g in a["grads"] + b["grads"]):
            expect(a["grads"] != b["grads"], f"micro-step {i + 1} (no sync): ranks 0 and 1 hold the same gradients "
                                             f"{a['grads']}; each should hold its own batch's")
        if a["sync"] and capabilities.sync == "every_step" and capabilities.state == "replicated" \
                and a["grads"] != b["grads"]:
            message = (f"micro-step {i + 1} (sync): rank 1's gradients {b['grads']} differ from rank 0's "
                       f"{a['grads']} after the synchronising backward")
            if _contract_version(acc_backend) >= 2:
                expect(False, message + ": version 2 requires them averaged by then (scripts read p.grad after "
                                        "backward: gradient-norm logging, torch.nn.utils.clip_grad_norm_)")
            warnings.warn(f"{message}. Version 1 allowed averaging later (the replicas agree after the step, tested "
                          "above); version 2 requires averaged gradients after a synchronising backward",
                          DeprecationWarning, stacklevel=1)
            break


def _contract_version(backend: str) -> int:
    from acc.assembly.plugins import build_plugin_manager, plugin_version

    return plugin_version(build_plugin_manager(backend)[0], backend)


def test_checkpoints_give_every_rank_its_own_state_back(job: Any, capabilities: Any) -> None:
    results = job(2 if capabilities.sync != "none" else 1, "train", "--batch", str(BATCH), "--steps", str(STEPS))
    points = results[0]["points"]
    expect(len(points) > 0, "the train phase saved no checkpoint")
    for point in map(str, points):  # mid-epoch, and right before and after a sync (job.save_points)
        for rank, r in results.items():
            saved, loaded = r["saved"][point], r["loaded"][point]
            worst, where = _worst(loaded["params"], saved["params"])
            hint = ""
            for other, o in results.items():
                if other != rank and _worst(loaded["params"], o["saved"][point]["params"])[0] == 0.0 and worst > 0:
                    hint = f" (they are rank {other}'s)"
            expect(worst == 0.0, f"rank {rank}: after load_state of the checkpoint saved after step {point}, "
                                 f"parameter #{where} is {loaded['params'][where]!r}, but this rank saved "
                                 f"{saved['params'][where]!r}{hint}: every rank must get its own state back")
            expect(loaded["adam"] == saved["adam"], f"rank {rank}: after load_state (step {point}) the Adam state "
                                                    f"sums are {loaded['adam'][:4]}..., but this rank saved "
                                                    f"{saved['adam'][:4]}...: optimizer state must come back exactly")


def test_training_continues_exactly_after_load_state(job: Any, capabilities: Any) -> None:
    results = job(2 if capabilities.sync != "none" else 1, "train", "--batch", str(BATCH), "--steps", str(STEPS))
    for rank, r in results.items():
        point = r["resumed"]["point"]
        expected = r["losses"][point:point + 2]
        expect(r["resumed"]["losses"] == expected,
               f"rank {rank}: the 2 steps after loading the checkpoint saved after step {point} had losses "
               f"{r['resumed']['losses']}, the uninterrupted run {expected}: the state of every process (model, "
               "optimizer, scheduler, RNG, data position) must come back exactly")


def test_mixed_precision_modes_it_declares(job: Any, capabilities: Any) -> None:
    modes = [m for m in capabilities.mixed_precision if m != "no"]
    if not modes:
        pytest.skip("declares no mixed precision mode")
    nproc = 2 if capabilities.sync != "none" else 1
    for mode in modes:
        results = job(nproc, "train", "--batch", str(BATCH), "--steps", "4", launch=("--mixed-precision", mode))
        for rank, r in results.items():
            expect(all(math.isfinite(x) for x in r["losses"]), f"rank {rank}: with mixed_precision {mode} the "
                                                               f"losses were {r['losses']}")
        if capabilities.sync == "every_step":
            worst, where = _worst(results[0]["final"], results[nproc - 1]["final"])
            expect(worst <= AGREE, f"mixed_precision {mode}: rank {nproc - 1}'s final parameter #{where} differs "
                                   f"from rank 0's by {worst:.3g}")


def test_checkpoints_reshard_when_declared(job: Any, capabilities: Any) -> None:
    if not capabilities.reshard or capabilities.sync == "none":
        pytest.skip("does not declare resharding" if not capabilities.reshard else "one process only")
    two = job(2, "train", "--batch", str(BATCH), "--steps", str(STEPS))
    one = job(1, "train", "--batch", str(BATCH), "--load-final", two[0]["final_dir"])
    worst, where = _worst(one[0]["loaded_final"], two[0]["final"])
    expect(worst == 0.0, f"a checkpoint saved by 2 processes, loaded on 1: parameter #{where} is "
                         f"{one[0]['loaded_final'][where]!r}, saved {two[0]['final'][where]!r}; the backend declares "
                         "reshard=True")
