"""Where a rank sits, without MPI: its thread share, its rank before hvd.init(), its GPU by local
rank, and the multi-host Gloo host-name check."""
from __future__ import annotations

import pytest

from hvdtrain.launch import placement

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


def test_threads_per_rank():
    assert placement.threads_per_rank(available_cores=1, total_cores=2, local_size=2) == 1
    assert placement.threads_per_rank(available_cores=16, total_cores=16, local_size=4) == 4
    assert placement.threads_per_rank(available_cores=2, total_cores=2, local_size=4) == 1
    assert placement.threads_per_rank(available_cores=4, total_cores=16, local_size=1) == 4


def test_launcher_rank_from_environment():
    assert placement.launcher_rank({}) == 0
    assert placement.launcher_rank({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert placement.launcher_rank({"HOROVOD_RANK": "1", "PMI_RANK": "5"}) == 1
    assert placement.launcher_rank({"SLURM_PROCID": "2"}) == 2


def test_gpu_choice_is_by_local_rank():
    assert placement.choose_gpu(4, local_rank=2, local_size=4, device="auto") == (2, None)
    assert placement.choose_gpu(8, local_rank=0, local_size=2, device="gpu") == (0, None)
    assert placement.choose_gpu(0, local_rank=1, local_size=2, device="auto") == (None, None)
    assert placement.choose_gpu(4, local_rank=1, local_size=2, device="cpu") == (None, None)
    index, problem = placement.choose_gpu(2, local_rank=3, local_size=4, device="auto")
    assert index is None and "4 ranks on this host but only 2 GPUs" in problem
    index, problem = placement.choose_gpu(0, local_rank=0, local_size=1, device="gpu")
    assert index is None and "sees no GPU" in problem


def test_gloo_host_name_check():
    def resolve(table):
        def lookup(name):
            if name not in table:
                raise OSError("unknown host")
            return table[name]
        return lookup
    across = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CROSS_SIZE": "2",
              "HOROVOD_GLOO_IFACE": "eth0", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.5"}
    fine = resolve({"node1": "10.0.0.5"})
    loopback = resolve({"node1": "127.0.1.1"})
    assert placement.gloo_host_name_problem(across, "node1", fine) is None
    problem = placement.gloo_host_name_problem(across, "node1", loopback)
    assert "'node1' resolves to 127.0.1.1" in problem and "/etc/hosts" in problem
    assert "does not resolve" in placement.gloo_host_name_problem(across, "node2", fine)
    # One host, or MPI: the host name is not used, so no complaint.
    assert placement.gloo_host_name_problem({**across, "HOROVOD_CROSS_SIZE": "1"}, "node1",
                                            loopback) is None
    assert placement.gloo_host_name_problem({"HOROVOD_CROSS_SIZE": "2"}, "node1", loopback) is None
    assert placement.gloo_host_name_problem({}, "node1", loopback) is None
    # "Hosts" that are all this machine (localhost, 127.0.0.1) talk over loopback: fine.
    assert placement.gloo_host_name_problem({**across, "HOROVOD_GLOO_IFACE": "lo"}, "node1",
                                            loopback) is None
