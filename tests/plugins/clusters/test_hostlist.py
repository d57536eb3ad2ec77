"""SLURM host lists expanded as `scontrol show hostnames` does (expected lists: scontrol 22.05.8's own output)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from acc.cluster import ClusterError
from acc_clusters import hostlist

SHAPES = {
    "node[01-03,07]": ["node01", "node02", "node03", "node07"],
    "a1,b[2-3]": ["a1", "b2", "b3"],
    "gpu-[001-010]": [f"gpu-{i:03d}" for i in range(1, 11)],
    "rack[1-2]-gpu[001-002,010]": ["rack1-gpu001", "rack1-gpu002", "rack1-gpu010", "rack2-gpu001", "rack2-gpu002",
                                   "rack2-gpu010"],
    "n[9-11]": ["n9", "n10", "n11"],
    "n[09-11]": ["n09", "n10", "n11"],
    "n[8-12]": ["n8", "n9", "n10", "n11", "n12"],
    "single": ["single"],
    "c[1,3],d[0001-0002],e7": ["c1", "c3", "d0001", "d0002", "e7"],
}


@pytest.mark.parametrize("text", SHAPES)
def test_expansion_count_and_first_host(text):
    assert hostlist.expand(text) == SHAPES[text]
    assert hostlist.count(text) == len(SHAPES[text])
    assert hostlist.first_host(text) == SHAPES[text][0]


def test_a_huge_list_is_counted_without_expanding_it():
    assert hostlist.count("node[0000001-9999999],x[1-2]") == 9999999 + 2
    assert hostlist.first_host("node[0000001-9999999]") == "node0000001"


@pytest.mark.parametrize("text,fragment", [
    ("n[1-2", "leaves a bracket open"),
    ("n1-2]", "closes a bracket it did not open"),
    ("n[2-1]", "range '2-1' runs backwards"),
    ("n[a-b]", "holds 'a-b', which is neither a number nor a range"),
    ("n[[1-2]]", "nests brackets"),
    ("a,,b", "has an empty entry"),
])
def test_malformed_lists_are_errors_naming_them(text, fragment):
    with pytest.raises(ClusterError, match="host list") as info:
        hostlist.expand(text)
    assert fragment in str(info.value) and repr(text) in str(info.value)


def test_tasks_per_node_runs():
    assert hostlist.tasks_per_node("2(x3),1") == [(2, 3), (1, 1)]
    assert hostlist.tasks_per_node("4") == [(4, 1)]
    with pytest.raises(ClusterError, match=r"'2\(3\)' is neither N nor N\(xM\)"):
        hostlist.tasks_per_node("2(3)")


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol (slurm-client) is not installed; "
                    "tests/integration/test_slurm.py installs it")
def test_the_same_as_scontrol_show_hostnames(tmp_path):
    conf = tmp_path / "slurm.conf"  # scontrol reads a config before it expands anything; no daemon is asked
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=ALL\n")
    for text, hosts in SHAPES.items():
        out = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True,
                             env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}, timeout=30)
        assert out.stdout.split() == hosts == hostlist.expand(text), (text, out.stderr)
