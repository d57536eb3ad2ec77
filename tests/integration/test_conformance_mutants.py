"""The conformance kit proves correctness: installed from outside the repo, the correct backends pass it whole
(a ddp-style reference, local SGD with its own `[localsgd] sync_every`, a version-1 backend from the old template
with deprecation warnings), and each deliberately broken copy (tests/fixtures/acc_mutants) fails it with a
message that names the rank, the value and what was expected."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.conftest import ROOT, clean_env, overlay_venv, pip_install_editable

pytestmark = pytest.mark.slow
FIXTURES = ROOT / "tests" / "fixtures"


# the kit runs this module's tests ask for, started ahead of the tests (in their order) this many at a time: one
# run keeps about one core busy (its jobs start one after another), independent runs share nothing but the venv
AHEAD = 2


@pytest.fixture(scope="module")
def kit(tmp_path_factory, request):
    """`kit(backend, *pytest_args)`: the conformance kit run on `backend` in a venv with the fixtures installed.
    The runs the collected tests of this module ask for (`_runs_of`) start ahead, AHEAD at a time, each test
    taking its own run's result; a run no test announced runs when asked for."""
    tmp = tmp_path_factory.mktemp("kit")
    python = overlay_venv(tmp)
    for name in ("acc_localsgd", "acc_mutants", "acc_legacy"):
        pip_install_editable(python, FIXTURES / name, tmp)
    work = tmp / "author"
    work.mkdir()
    (work / "conftest.py").write_text("")
    live: set[subprocess.Popen] = set()
    closing = threading.Event()

    def execute(args: tuple[str, ...]) -> subprocess.CompletedProcess:
        if closing.is_set():
            raise RuntimeError("the module's tests ended before this run started")
        backend, rest = args[0], args[1:]
        if rest[:1] == ("check",):  # `acc check` in the same venv
            cmd, timeout = [str(python), "-m", "acc", "check", "--backend", backend, *rest[1:]], 300
        else:
            cmd, timeout = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "acc.testing",
                            "--acc-backend", backend, "-rfEs", *rest], 900
        # its own process group: what is still running when the module ends early is stopped, launches included
        with subprocess.Popen(cmd, cwd=work, env=clean_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, process_group=0) as proc:
            live.add(proc)
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                raise
            finally:
                live.discard(proc)
        return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)

    module = request.module.__name__
    pool = ThreadPoolExecutor(max_workers=AHEAD)
    ahead: dict[tuple[str, ...], list[Future]] = {}
    for item in request.session.items:
        if getattr(getattr(item, "module", None), "__name__", None) == module:
            for args in _runs_of(item):
                ahead.setdefault(args, []).append(pool.submit(execute, args))

    def run(backend: str, *args: str) -> subprocess.CompletedProcess:
        started = ahead.get((backend, *args))
        return started.pop(0).result() if started else execute((backend, *args))

    yield run
    closing.set()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in list(live):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    pool.shutdown(wait=True)


def _summary(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]


CORRECT = [
    ("mut_reference", (), None),
    ("localsgd", ("--acc-flags=--localsgd-sync-every 2",), None),
    ("legacy", (), "plugin 'legacy' targets hook-spec version 1, deprecated"),
]


@pytest.mark.parametrize("backend,flags,warning", CORRECT)
def test_a_correct_backend_passes_the_whole_kit(kit, backend, flags, warning):
    proc = kit(backend, *flags)
    summary = _summary(proc)
    assert proc.returncode == 0 and "failed" not in summary and "error" not in summary, proc.stdout[-4000:]
    assert int(summary.split(" passed")[0].split()[-1]) >= 15, summary
    if warning:
        assert warning in proc.stdout, proc.stdout[-3000:]
        # the old template averaged gradients at the optimizer step: allowed in version 1, said in a warning
        assert "version 2 requires averaged gradients after a synchronising backward" in proc.stdout
    else:
        assert "DeprecationWarning" not in proc.stdout, proc.stdout[-3000:]


MUTANTS = [
    # (mutant, the kit's test that must catch it, fragments its failure message must hold); where the kit's test
    # runs on 1 and 2 processes, the process count whose failure the fragments quote: the kit runs that one only
    ("mut_local_reduce", "test_collectives_agree_with_the_reference[2]",
     ["rank 1: reduce_sum returned [2.0], expected [3.0]"]),
    ("mut_unsharded_data", "test_every_sample_is_gathered_exactly_once[2]",
     ["rank 1: gather_for_metrics over a 50-sample evaluation returned 100 samples (50 distinct), expected 0..49"]),
    ("mut_no_gradient_sync", "test_replicas_agree_at_every_synchronisation_point",
     ["rank 1: after optimizer step 1, parameter #", "where rank 0 has",
      "the backend promises replicas that agree after every step"]),
    ("mut_no_gradient_sync", "test_matches_one_process_with_n_times_the_batch",
     ["on 2 processes x batch 4 but", "on 1 process x batch 8", "are gradients averaged over the processes?"]),
    ("mut_never_average", "test_replicas_agree_at_every_synchronisation_point",
     ["rank 1: after optimizer step 2, parameter #", "agree after every 2 steps"]),
    ("mut_rank0_state", "test_checkpoints_give_every_rank_its_own_state_back",
     ["rank 1: after load_state of the checkpoint saved after step", "(they are rank 0's)",
      "every rank must get its own state back"]),
    ("mut_drops_optimizer_state", "test_checkpoints_give_every_rank_its_own_state_back",
     ["after load_state (step 3) the Adam state sums are", "optimizer state must come back exactly"]),
    ("mut_missing_collective", "test_hooks_answer_with_the_right_types[1]",
     ["answered acc_communicator with FiveCollectives, which lacks broadcast_object"]),
]


def mutant_run(mutant: str, test: str) -> tuple[str, ...]:
    """The kit run that must catch `mutant`: the kit's test `test` alone (`name[N]`: its run on N processes)."""
    flags = ("--acc-flags=--mut-never-average-sync-every 2",) if mutant == "mut_never_average" else ()
    name, _, nproc = test.partition("[")
    return (mutant, *flags, "-k", f"{name} and {nproc[:-1]}" if nproc else name)


@pytest.mark.parametrize("mutant,test,fragments", MUTANTS,
                         ids=[f"{m}-{t[5:].partition('[')[0]}" for m, t, _ in MUTANTS])
def test_each_mutant_fails_the_kit_with_a_message_naming_what_broke(kit, mutant, test, fragments):
    proc = kit(*mutant_run(mutant, test))
    summary = _summary(proc)
    assert proc.returncode == 1 and "failed" in summary, proc.stdout[-4000:]
    assert "FAILED /" in proc.stdout and f"suite.py::{test}" in proc.stdout, proc.stdout[-4000:]
    for fragment in fragments:
        assert fragment in proc.stdout, f"{fragment!r} not in:\n{proc.stdout[-4000:]}"
    assert "assert " not in proc.stdout.split("= FAILURES =")[-1], "a bare assert instead of a message"


CHECK_GOOD = ("localsgd", "check", "--nproc", "2", "--localsgd-sync-every", "2")
CHECK_BAD = ("mut_never_average", "check", "--nproc", "2")


def test_acc_check_holds_a_periodic_backend_to_its_own_promise(kit):
    """local SGD passes `acc check` (replicas agree at each synchronisation, gradients local between them); the copy
    that never averages fails exactly that check."""
    good = kit(*CHECK_GOOD)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "PASS  replicas agree at every synchronisation (every 2 steps)" in good.stdout
    assert "PASS  each process keeps its own gradients between synchronisations" in good.stdout
    assert good.stdout.count("PASS") == 8 and "FAIL" not in good.stdout
    bad = kit(*CHECK_BAD)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    failed = [line.strip() for line in bad.stdout.splitlines() if line.strip().startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL  replicas agree at every synchronisation (every 4 steps)")
    assert "step 4: max difference" in failed[0] and "(expected <= 1e-06 at steps 4)" in failed[0]


def _runs_of(item: pytest.Item) -> list[tuple[str, ...]]:
    """The kit runs a test of this module asks for, in the order it asks (the `kit` fixture starts them ahead)."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    name = getattr(item, "originalname", item.name)
    if name == test_a_correct_backend_passes_the_whole_kit.__name__:
        return [(params["backend"], *params["flags"])]
    if name == test_each_mutant_fails_the_kit_with_a_message_naming_what_broke.__name__:
        return [mutant_run(params["mutant"], params["test"])]
    if name == test_acc_check_holds_a_periodic_backend_to_its_own_promise.__name__:
        return [CHECK_GOOD, CHECK_BAD]
    return []
