"""``--trainer.num_nodes=auto`` (``lit/elastic.py``): the nodes of this torchrun start, which an elastic launch
(``NNODES=1:2 launch/torchrun_fit.sh``) passes since the number is known only once the nodes have met. The run on
two hosts, one of them lost, is ``tests/test_elastic_hosts.py``."""
from __future__ import annotations

import pytest

from helpers import ROOT, run_cli
from scalevec_lit.errors import UsageError
from scalevec_lit.lit.elastic import nodes_of_this_start, resolve_auto_nodes


@pytest.mark.parametrize("env, nodes", [
    ({"GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 2),
    ({"GROUP_WORLD_SIZE": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, 1),  # a host lost: the start after it
    ({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2"}, 3),  # without GROUP_WORLD_SIZE: world / local world
    ({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, None),
    ({}, None),
])
def test_the_nodes_of_a_start_come_from_torchruns_environment(env, nodes):
    assert nodes_of_this_start(env) == nodes


def test_auto_is_replaced_and_nothing_else_changes():
    env = {"GROUP_WORLD_SIZE": "1", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    assert resolve_auto_nodes(["fit", "--trainer.num_nodes=auto", "--trainer.devices=1"], env) == [
        "fit", "--trainer.num_nodes=1", "--trainer.devices=1"]
    assert resolve_auto_nodes(["fit", "--trainer.num_nodes", "auto", "--x=auto"], env) == [
        "fit", "--trainer.num_nodes=1", "--x=auto"]
    assert resolve_auto_nodes(["fit", "--trainer.num_nodes=2"], {}) == ["fit", "--trainer.num_nodes=2"]
    assert env["NNODES"] == "1"  # for litdata, which reads it


def test_auto_outside_torchrun_is_refused_with_the_fix(tmp_path):
    with pytest.raises(UsageError, match=r"^--trainer.num_nodes: auto: .*not started by torchrun; give a number"):
        resolve_auto_nodes(["fit", "--trainer.num_nodes=auto"], {})
    res = run_cli(["fit", "--config", str(ROOT / "recipes" / "smoke.yaml"), "--trainer.num_nodes=auto"], cwd=tmp_path,
                  env={"GROUP_WORLD_SIZE": "", "WORLD_SIZE": "", "LOCAL_WORLD_SIZE": ""})
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1].startswith("error: --trainer.num_nodes: auto: is the number of nodes of "
                                                          "a torchrun start"), res.stderr[-3000:]


def test_the_ranks_of_one_torchrun_start_share_its_launch_id_whatever_their_agents_restart_counts(monkeypatch):
    """A host that joins an elastic job later has an agent whose restart count starts at 0 while the first host's
    is 1: the launch id of a start must not depend on it, or the joining rank refuses rank 0's lock of the very same
    start ("checkpoint folder ...: in use: run.lock says a run on host A ..."; ``runlock.check_folder_free``)."""
    from scalevec_lit.runlock import launch_id

    start = {"TORCHELASTIC_RUN_ID": "job", "MASTER_ADDR": "node-a", "MASTER_PORT": "36877"}
    ids = []
    for restarts in ("1", "0"):  # host A's agent after a lost host; host B's agent, started again
        for key, value in {**start, "TORCHELASTIC_RESTART_COUNT": restarts}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        ids.append(launch_id())
    assert ids[0] == ids[1]
    monkeypatch.setenv("MASTER_PORT", "43327")  # the next start: a store of its own
    assert launch_id() != ids[0]
