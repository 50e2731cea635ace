"""The fixtures the cluster test files share: ``cluster``, three namespaced hosts of the kind the
file's ``CLUSTER`` names, and ``one_host``, the summary of the file's ``ONE_HOST`` job run on
this machine, which its cluster jobs must equal. Each is made once per file (module scope: the
clusters share names and a subnet, so only one is up at a time) by the first test that asks.
"""
from __future__ import annotations

import pytest

from hvdtrain.testing import netns_cluster
import slurm_cluster
from helpers import one_host_summary, skip_unless_optional
from hvdtrain.testing.netns_cluster import NetnsCluster
from slurm_cluster import SlurmCluster

# Each kind of cluster: why this machine cannot make it, and what a skip calls it.
KINDS = {NetnsCluster: (netns_cluster.unavailable_reason, "multi-host cluster"),
         SlurmCluster: (slurm_cluster.unavailable_reason, "SLURM cluster")}


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    kind = request.module.CLUSTER
    unavailable_reason, what = KINDS[kind]
    reason = unavailable_reason()
    if reason:
        skip_unless_optional(f"no {what} on this machine: {reason}")
    netns_cluster.remove_stale()
    with kind(hosts=3, workdir=tmp_path_factory.mktemp("cluster")) as made:
        yield made


@pytest.fixture(scope="module")
def one_host(request, tmp_path_factory) -> dict:
    """The file's ONE_HOST job, (launcher, ranks, train arguments), on this machine (run once)."""
    launcher, ranks, train_args = request.module.ONE_HOST
    return one_host_summary(launcher, ranks, tmp_path_factory.mktemp("one-host"), train_args)
