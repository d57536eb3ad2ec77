"""acc.compat.migrate (the scanner, the checker, the differences table, the import rewriter) and `acc migrate`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from acc.cli import cli
from acc.compat import migrate as m
from tests.conftest import ACC, ROOT, run

# Names no version of acc will have, so "missing" stays true while others add Accelerate's real names.
SCRIPT = '''\
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed, frobnicate_gradients


def main():
    accelerator = Accelerator(gradient_accumulation_steps=2, warp_speed=9)
    set_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.teleport_gradients()
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 2)).sum())
    accelerator.wait_for_everyone(within_seconds=5)
    accelerator.save_state("out")
    print(accelerator.device, accelerator.num_processes)


if __name__ == "__main__":
    main()
'''


def names(uses):
    return {(u.line, u.kind, u.display) for u in uses}


def scan(text: str) -> m.Scan:
    return m.scan_source(textwrap.dedent(text))


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, prog_name="acc")


@pytest.fixture(scope="module")
def checker() -> m.Checker:
    return m.Checker()


# ---------------------------------------------------------------------------------------------- scanning


def test_scanner_finds_the_four_kinds_with_their_lines():
    found = names(m.scan_source(SCRIPT).uses)
    assert {
        (2, "import", "accelerate.Accelerator"),
        (3, "import", "accelerate.utils.set_seed"),
        (3, "import", "accelerate.utils.frobnicate_gradients"),
        (7, "keyword", "Accelerator(gradient_accumulation_steps=)"),
        (7, "keyword", "Accelerator(warp_speed=)"),
        (11, "attribute", "Accelerator.prepare"),
        (12, "attribute", "Accelerator.teleport_gradients"),
        (15, "method_keyword", "Accelerator.wait_for_everyone(within_seconds=)"),
        (16, "attribute", "Accelerator.save_state"),
        (17, "attribute", "Accelerator.device"),
        (17, "attribute", "Accelerator.num_processes"),
    } <= found
    assert not any("torch" in name for _, _, name in found)


def test_checker_reports_what_acc_lacks_and_nothing_it_has(checker):
    missing = names(checker.missing(m.scan_source(SCRIPT).uses))
    assert missing == {
        (3, "import", "accelerate.utils.frobnicate_gradients"),
        (7, "keyword", "Accelerator(warp_speed=)"),
        (12, "attribute", "Accelerator.teleport_gradients"),
        (15, "method_keyword", "Accelerator.wait_for_everyone(within_seconds=)"),
    }


def test_checker_looks_names_up_by_introspection(checker):
    import acc

    assert checker.present("import", "accelerate:Accelerator")
    assert checker.present("import", "accelerate.logging:get_logger")
    assert checker.present("import", "accelerate")
    assert checker.present("import", "accelerate:__version__")
    assert not checker.present("import", "accelerate.no_such_module:thing")
    assert not checker.present("import", "accelerate:no_such_name")
    # attributes set in __init__ count (hasattr on the class alone would miss them)
    assert "rng_types" not in dir(acc.Accelerator)
    assert checker.present("attribute", "Accelerator.rng_types")
    assert checker.present("attribute", "Accelerator.backward")
    assert not checker.present("attribute", "Accelerator.teleport")
    assert checker.present("keyword", "accelerate:Accelerator(mixed_precision=)")
    assert checker.present("method_keyword", "Accelerator.unwrap_model(keep_fp32_wrapper=)")
    assert checker.present("method_keyword", "Accelerator.backward(retain_graph=)")  # **kwargs accepts it
    assert not checker.present("method_keyword", "Accelerator.teleport(speed=)")
    with pytest.raises(ValueError, match="unknown kind"):
        checker.present("nonsense", "x")


def test_module_paths_map_to_acc():
    assert m.acc_module_candidates("accelerate") == ("acc",)
    assert m.acc_module_candidates("accelerate.utils.operations") == ("acc.utils.operations",)
    assert m.acc_module_candidates("accelerate.big_modeling") == ("acc.big_modeling", "acc.big_model")
    assert m.acc_module_candidates("acc.logging") == ("acc.logging",)
    assert m.acc_module_name("accelerate.big_modeling") in ("acc.big_modeling", "acc.big_model")
    assert m.acc_module_name("accelerate.no_such_module") == "acc.no_such_module"


def test_big_modeling_names_are_found_under_acc_big_model(checker):
    assert checker.present("import", "accelerate.big_modeling:init_empty_weights")
    assert checker.present("import", "accelerate.big_modeling:dispatch_model")


def test_objects_are_tracked_by_name_and_by_what_they_were_bound_from():
    uses = names(scan('''\
        import torch
        from accelerate import Accelerator, PartialState
        from accelerate.state import AcceleratorState as AS

        class Trainer:
            def __init__(self):
                self.accelerator = Accelerator()
                self.helper = Accelerator(cpu=True)

            def step(self, accel):
                self.accelerator.backward(1)
                self.helper.clip_grad_norm_(1, 2)
                accel.print("x")

        engine = Accelerator()
        engine.wait_for_everyone()
        state = PartialState()
        state.split_between_processes([1], apply_padding=True)
        print(AS().deepspeed_plugin, engine.state.fsdp_plugin, PartialState().device)
        device = torch.accelerator.current_accelerator().type
        ''').uses)
    assert {
        (11, "attribute", "Accelerator.backward"),
        (12, "attribute", "Accelerator.clip_grad_norm_"),
        (13, "attribute", "Accelerator.print"),
        (16, "attribute", "Accelerator.wait_for_everyone"),
        (18, "attribute", "PartialState.split_between_processes"),
        (18, "method_keyword", "PartialState.split_between_processes(apply_padding=)"),
        (19, "attribute", "AcceleratorState.deepspeed_plugin"),
        (19, "attribute", "Accelerator.state"),
        (19, "attribute", "AcceleratorState.fsdp_plugin"),
        (19, "attribute", "PartialState.device"),
    } <= uses
    assert not any(line == 20 for line, _, _ in uses)  # torch.accelerator is not Accelerate's


def test_a_variable_named_accelerator_bound_from_torch_is_not_an_accelerator():
    uses = scan('''\
        import torch
        accelerator = torch.accelerator.current_accelerator()
        print(accelerator.type)
        ''').uses
    assert uses == []


def test_module_objects_and_chains():
    uses = names(scan('''\
        import accelerate
        import accelerate.utils as au
        from accelerate import utils
        if accelerate.__version__ >= "0.16":
            au.set_seed(0, device_specific=True)
        accelerate.utils.send_to_device(1, "cpu")
        utils.ProjectConfiguration(total_limit=2)
        ''').uses)
    assert {
        (1, "import", "accelerate"),
        (2, "import", "accelerate.utils"),
        (3, "import", "accelerate.utils"),
        (4, "import", "accelerate.__version__"),
        (5, "import", "accelerate.utils.set_seed"),
        (5, "keyword", "accelerate.utils.set_seed(device_specific=)"),
        (6, "import", "accelerate.utils.send_to_device"),
        (7, "import", "accelerate.utils.ProjectConfiguration"),
        (7, "keyword", "accelerate.utils.ProjectConfiguration(total_limit=)"),
    } == uses  # only the longest chain of a module path: not also `accelerate.utils` on line 6


def test_training_scripts_and_test_only_imports():
    found = scan('''\
        import os
        from accelerate import Accelerator
        accelerator = Accelerator()
        if os.environ.get("TESTING_MOCKED_DATALOADERS", None) == "1":
            from accelerate.test_utils.training import mocked_dataloaders
        ''')
    assert not found.training_script
    assert [u for u in found.uses if u.test_only] == [
        m.Use(5, "import", "accelerate.test_utils.training:mocked_dataloaders", True)]
    assert ("import", "accelerate.test_utils.training:mocked_dataloaders") not in found.names()
    assert scan("accelerator.prepare_model(model)\n").training_script
    assert scan("model = accel.prepare(model)\n").training_script
    assert not scan("model = trainer.prepare(model)\n").training_script


def test_implied_names_are_not_repeated(checker):
    found = scan('''\
        from accelerate import DefinitelyNotInAcc
        accelerator.teleport(speed=3)
        DefinitelyNotInAcc.MEMBER
        DefinitelyNotInAcc(option=1)
        ''')
    primary = names(checker.missing(found.uses))
    assert primary == {(1, "import", "accelerate.DefinitelyNotInAcc"), (2, "attribute", "Accelerator.teleport")}
    assert len(checker.missing(found.uses, implied=True)) == 5


# ----------------------------------------------------------------------------------- behaviour differences


def hit_ids(text: str) -> set[tuple[int, str]]:
    return {(h.line, h.id) for h in m.differences(scan(text))}


# where "What behaves differently" lives now (the README links it); each DIFFERENCES entry's "readme" quotes it
DIFFERENCES_PAGE = ROOT / "docs" / "guides" / "migrating-from-accelerate.md"


def test_every_difference_quotes_the_docs():
    page = " ".join(DIFFERENCES_PAGE.read_text().split())
    ids = [entry["id"] for entry in m.DIFFERENCES]
    assert len(ids) == len(set(ids))
    for entry in m.DIFFERENCES:
        assert set(entry) <= {"id", "readme", "match", "requires", "unless", "message"}, entry["id"]
        assert " ".join(entry["readme"].split()) in page, (
            f"DIFFERENCES[{entry['id']!r}] quotes {entry['readme']!r}, which {DIFFERENCES_PAGE.relative_to(ROOT)} no "
            "longer says: update the entry (acc/compat/migrate.py) to what the page says now, or remove it")
        for pattern in entry["match"] + entry.get("requires", []) + entry.get("unless", []):
            assert len(pattern) == 1 and next(iter(pattern)) in m.PATTERNS, (entry["id"], pattern)


def test_a_schedule_sized_for_accelerate_is_not_a_difference_any_more():
    """acc steps prepared schedulers as Accelerate does by default: nothing to report."""
    assert hit_ids('''\
        warmup = args.lr_warmup_steps * accelerator.num_processes
        sched = get_scheduler("cosine", optimizer, num_training_steps=args.max_train_steps * accelerator.num_processes)
        model, opt, sched = accelerator.prepare(model, opt, sched)
        ''') == set()


def test_resume_skip_is_reported_only_with_exact_resume():
    loop = '''\
        from accelerate import Accelerator, DataLoaderConfiguration
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        accelerator.load_state(path)
        for step, batch in enumerate(loader):
            if args.resume_from_checkpoint and epoch == first_epoch and step < resume_step:
                continue
            if step < warmup:
                continue
        '''
    assert hit_ids(loop) == {(3, "checkpoints"), (5, "resume-skip-twice")}
    # Accelerate's own way (load_state, then skip) is what acc does by default: only the checkpoint note
    plain = loop.replace("dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)", "")
    assert hit_ids(plain) == {(3, "checkpoints")}
    assert hit_ids(loop.replace("accelerator.load_state(path)", "pass")) == set()
    assert hit_ids('''\
        from accelerate import Accelerator, DataLoaderConfiguration
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        accelerator.load_state(path)
        for step, batch in enumerate(loader):
            if resume_step is not None and step < resume_step:
                pass
        ''') == {(3, "checkpoints")}  # a skip that does nothing skips nothing


def test_other_differences():
    assert hit_ids("from accelerate import Accelerator\na = Accelerator(split_batches=True)\n") == {
        (2, "split-batches-ignored")}
    assert hit_ids("x = accelerator.reduce(t, scale=2.0)\n") == {(1, "reduce-scale")}
    assert hit_ids("from accelerate.utils import gather_object\nx = gather_object(y)\n") == {(2, "gather-object")}
    deepspeed = "from accelerate.utils import DeepSpeedPlugin\n"
    assert hit_ids(deepspeed) == {(1, "deepspeed-clipping")}
    assert hit_ids(deepspeed + "accelerator.clip_grad_norm_(p, 1.0)\n") == set()


def test_the_table_is_data():
    table = [{"id": "split", "readme": "-", "message": "honoured",
              "match": [{"keyword": {"name": "split_batches", "value": True}}]}]
    text = ("from accelerate import Accelerator\n"
            "a = Accelerator(split_batches=True)\nb = Accelerator(split_batches=False)\n")
    assert [(h.line, h.id, h.message) for h in m.differences(scan(text), table)] == [(2, "split", "honoured")]


# ------------------------------------------------------------------------------------------------ rewriting


ACCELERATE_IMPORTS = '''\
# -*- coding: utf-8 -*-
"""Docstring: from accelerate import Accelerator stays as written."""
import os, accelerate  # a comment
from accelerate import (  # the names
    Accelerator,
    DistributedType,
)
from accelerate.utils import set_seed as seed_everything
from accelerate.big_modeling import init_empty_weights
import accelerate.utils
import accelerate.logging as alog

if accelerate.__version__ > "0":
    print("from accelerate import x", accelerate.utils.set_seed)
'''


def test_rewrite_changes_only_the_import_lines_and_the_version_a_script_checks():
    new, changes, notes = m.rewrite_imports(ACCELERATE_IMPORTS)
    big = m.acc_module_name("accelerate.big_modeling")
    assert new == ACCELERATE_IMPORTS.replace(
        "import os, accelerate  #", "import os, acc as accelerate  #").replace(
        "from accelerate import (", "from acc import (").replace(
        "from accelerate.utils import set_seed", "from acc.utils import set_seed").replace(
        "from accelerate.big_modeling import", f"from {big} import").replace(
        "import accelerate.utils\n", "import acc.utils, acc as accelerate\n").replace(
        "import accelerate.logging as alog", "import acc.logging as alog").replace(
        "accelerate.__version__", "accelerate.__accelerate_version__")  # the Accelerate release acc follows
    assert [c.line for c in changes] == [3, 4, 8, 9, 10, 11, 13]
    assert changes[0].before == "import os, accelerate  # a comment"
    assert changes[0].after == "import os, acc as accelerate  # a comment"
    assert notes == []
    compile(new, "rewritten.py", "exec")
    assert m.rewrite_imports(new) == (new, [], [])  # nothing left to rewrite


def test_a_migrated_version_check_reads_the_accelerate_release_acc_follows(tmp_path):
    import acc

    text = ("import accelerate\nfrom accelerate import __version__\nfrom accelerate import __version__ as v\n"
            "print(accelerate.__version__, __version__, v)\n")
    new, _, _ = m.rewrite_imports(text)
    assert new == ("import acc as accelerate\nfrom acc import __accelerate_version__ as __version__\n"
                   "from acc import __accelerate_version__ as v\nprint(accelerate.__accelerate_version__, "
                   "__version__, v)\n")
    (tmp_path / "s.py").write_text(new)
    out = subprocess.run([sys.executable, str(tmp_path / "s.py")], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [acc.__accelerate_version__] * 3 and acc.__accelerate_version__ == "1.15.0"


def test_rewrite_of_an_unused_module_import_and_of_crlf_sources():
    new, _, _ = m.rewrite_imports("import accelerate\r\nimport accelerate.utils\r\nx = 1\r\n")
    assert new == "import acc\r\nimport acc.utils\r\nx = 1\r\n"


def test_rewrite_leaves_a_renamed_module_used_by_its_path_with_a_note():
    text = "import accelerate.big_modeling\naccelerate.big_modeling.init_empty_weights()\n"
    new, changes, notes = m.rewrite_imports(text)
    if m.acc_module_name("accelerate.big_modeling") == "acc.big_modeling":
        assert new == "import acc.big_modeling, acc as accelerate\n" + text.splitlines(True)[1]
    else:
        assert new == text and changes == [] and "left unchanged" in notes[0]


# ------------------------------------------------------------------------------------------------- the CLI


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_migrate_reports_missing_names_by_line_and_exits_1(script):
    result = invoke("migrate", str(script))
    assert result.exit_code == 1, result.output
    out = result.output
    assert f"{script}: 4 of the " in out
    rows = [line.split() for line in out.splitlines()[1:]]
    missing = {(r[0], r[2], r[3]) for r in rows if r[1] == "missing"}
    assert missing == {
        (f"{script}:3", "import", "accelerate.utils.frobnicate_gradients"),
        (f"{script}:7", "keyword", "Accelerator(warp_speed=)"),
        (f"{script}:12", "attribute", "Accelerator.teleport_gradients"),
        (f"{script}:15", "method_keyword", "Accelerator.wait_for_everyone(within_seconds=)"),
    }
    assert "Accelerator.backward" not in out and "set_seed" not in out


def test_migrate_exits_0_when_nothing_is_missing(tmp_path):
    path = tmp_path / "ok.py"
    path.write_text("from accelerate import Accelerator\naccelerator = Accelerator(cpu=True)\n"
                    "total = accelerator.reduce(loss, scale=2.0)\n")
    result = invoke("migrate", str(path))
    assert result.exit_code == 0, result.output
    assert "every Accelerate name it uses exists in acc (4 names); 1 known difference(s)" in result.output
    assert f"{path}:3" in result.output and "reduce-scale" in result.output  # differences alone do not fail


def test_migrate_json(script, tmp_path):
    other = tmp_path / "plain.py"
    other.write_text("print(1)\n")
    result = invoke("migrate", "--json", str(script), str(other))
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["missing"] == 4 and [s["path"] for s in data["scripts"]] == [str(script), str(other)]
    first = data["scripts"][0]
    assert first["training_script"] is True
    assert {(u["line"], u["name"]) for u in first["missing"]} >= {(12, "Accelerator.teleport_gradients")}
    assert data["scripts"][1]["uses"] == [] and data["scripts"][1]["missing"] == []


def test_migrate_write_rewrites_the_imports(script):
    result = invoke("migrate", "--write", str(script))
    assert result.exit_code == 1  # names are still missing: --write changes only the imports
    assert f"{script}:2  rewrote  from accelerate import Accelerator  ->  from acc import Accelerator" in result.output
    assert f"{script}:3  rewrote  from accelerate.utils import" in result.output
    text = script.read_text()
    assert text == SCRIPT.replace("from accelerate import", "from acc import").replace(
        "from accelerate.utils import", "from acc.utils import")
    compile(text, str(script), "exec")
    again = invoke("migrate", "--write", str(script))
    assert "no Accelerate import to rewrite" in again.output and script.read_text() == text


def test_migrate_write_keeps_the_encoding(tmp_path):
    path = tmp_path / "latin.py"
    source = "# -*- coding: latin-1 -*-\nfrom accelerate import Accelerator  # café\n"
    path.write_bytes(source.encode("latin-1"))
    assert invoke("migrate", "--write", str(path)).exit_code == 0
    assert path.read_bytes() == source.replace("from accelerate", "from acc").encode("latin-1")


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("dir", "is a directory"),
    (b"\x7fELF\x00\x01\x02", "not a Python source file"),
    (b"\xff\xfe\xfa bad utf-8", "not a Python source file (cannot be decoded"),
    ("def broken(:\n    pass\n", "bad.py:1: not valid Python"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, script, content, message):
    path = tmp_path / "bad.py"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    before = script.read_text()
    proc = run([ACC, "migrate", "--write", str(script), str(path)], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert script.read_text() == before  # nothing is written when any input is bad


def test_usage_errors(tmp_path):
    assert invoke("migrate").exit_code == 2
    result = invoke("migrate", "--coverage", str(tmp_path / "none.json"))
    assert result.exit_code == 2 and "none.json: no such file" in result.output
    (tmp_path / "bad.json").write_text("{")
    result = invoke("migrate", "--coverage", str(tmp_path / "bad.json"))
    assert result.exit_code == 2 and "not a usage file" in result.output
    (tmp_path / "odd.json").write_text("{}")
    result = invoke("migrate", "--coverage", str(tmp_path / "odd.json"))
    assert result.exit_code == 2 and "not a usage file" in result.output
    result = invoke("migrate", "--coverage", str(tmp_path / "odd.json"), "x.py")
    assert result.exit_code == 2 and "without SCRIPT" in result.output


def test_help_documents_the_exit_status():
    result = invoke("migrate", "--help")
    assert result.exit_code == 0
    assert "Exit status: 0 when" in result.output and "--write" in result.output and "--coverage" in result.output
    assert "migrate" in invoke("--help").output


def test_the_repository_example_needs_nothing_acc_lacks(tmp_path):
    example = ROOT / "examples" / "migrate_from_accelerate.py"
    proc = run([ACC, "migrate", str(example)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every Accelerate name it uses exists in acc" in proc.stdout and " missing " not in proc.stdout
    data = json.loads(invoke("migrate", "--json", str(example)).output)
    assert data["missing"] == 0 and data["scripts"][0]["training_script"] is True
    assert len(data["scripts"][0]["uses"]) >= 15  # it was really scanned: prepare, accumulate, backward, ...


def test_python_dash_m_checks_scripts(script, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "acc.compat.migrate", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 1 and "Accelerator.teleport_gradients" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "acc.compat.migrate", str(tmp_path / "nope.py")], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "nope.py: no such file" in proc.stderr


def test_importing_the_scanner_and_the_command_is_torch_free():
    code = ("import sys, acc.compat.migrate, acc.cli.migrate\n"
            "from acc.cli import main\n"
            "try:\n    main(['migrate', '--help'])\nexcept SystemExit:\n    pass\n"
            "s = acc.compat.migrate_scan.scan_source('from accelerate import Accelerator\\n')\n"
            "print('TORCH', 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "TORCH False" in proc.stdout, proc.stdout + proc.stderr


def test_scanning_never_runs_the_script(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "side_effect.py"
    path.write_text(f"open({str(marker)!r}, 'w').write('x')\nfrom accelerate import Accelerator\n")
    assert invoke("migrate", str(path)).exit_code == 0
    assert not marker.exists()


def test_uses_are_deduplicated_and_sorted():
    found = scan("accelerator.print(1); accelerator.print(2)\naccelerator.print(3)\n").uses
    assert [(u.line, u.name) for u in found] == [(1, "Accelerator.print"), (2, "Accelerator.print")]
    assert re.fullmatch(r"[\w.]+", found[0].display)
