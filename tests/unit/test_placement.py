"""Where a rank sits, without MPI: its thread share, its rank before hvd.init(), its GPU by local
rank, and the multi-host Gloo host-name check."""
from __future__ import annotations

import pytest

from hvdtrain.launch import placement

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks


def test_thread_counts_run_two_ops_at_once_where_buckets_overlap_backprop():
    # Two inter-op threads on one core with buckets: with one, a bucket waits for the end of
    # backprop. Control: one core without buckets keeps one.
    assert placement.thread_counts(1, overlap=True) == (1, 2)
    assert placement.thread_counts(1) == (1, 1)
    assert placement.thread_counts(8) == placement.thread_counts(8, overlap=True) == (8, 2)
    # What the user asked for stands.
    assert placement.thread_counts(1, intra_op=3, inter_op=1, overlap=True) == (3, 1)


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
    # The local rank, from each launcher's row of the table, then srun's; 0 alone.
    assert placement.launcher_local_rank({}) == 0
    assert placement.launcher_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "1",
                                          "OMPI_COMM_WORLD_RANK": "3"}) == 1
    assert placement.launcher_local_rank({"HOROVOD_LOCAL_RANK": "2", "SLURM_LOCALID": "0"}) == 2
    assert placement.launcher_local_rank({"SLURM_LOCALID": "3"}) == 3
    assert placement.launcher_size({"OMPI_COMM_WORLD_SIZE": "4"}) == 4
    assert placement.launcher_size({}) == 1


def test_gpu_choice_is_by_local_rank():
    assert placement.choose_gpu(4, local_rank=2, local_size=4, device="auto") == (2, None)
    assert placement.choose_gpu(8, local_rank=0, local_size=2, device="gpu") == (0, None)
    assert placement.choose_gpu(0, local_rank=1, local_size=2, device="auto") == (None, None)
    assert placement.choose_gpu(4, local_rank=1, local_size=2, device="cpu") == (None, None)
    index, problem = placement.choose_gpu(2, local_rank=3, local_size=4, device="auto")
    assert index is None and "4 ranks on this host" in problem and "sees 2 GPU(s)" in problem
    assert "CUDA_VISIBLE_DEVICES unset" in problem
    index, problem = placement.choose_gpu(0, local_rank=0, local_size=1, device="gpu")
    assert index is None and "sees no GPU" in problem


def test_a_gpu_the_launcher_gave_the_rank_is_the_one_it_pins():
    # Every rank sees all of the host's GPUs (given or not): its local rank's.
    assert placement.choose_gpu(4, 2, 4, "auto", given="0,1,2,3") == (2, None)
    # One GPU per task (srun --gpus-per-task=1, --gpu-bind=single:1): each rank sees its own
    # one, though the host runs 4 ranks: that one (before: refused, "only 1 GPUs visible").
    assert placement.choose_gpu(1, 3, 4, "auto", given="3") == (0, None)
    assert placement.choose_gpu(1, 3, 4, "gpu", given="GPU-5e1d") == (0, None)  # a UUID
    # k per task, fewer than the host's ranks: the first of its own.
    assert placement.choose_gpu(2, 1, 4, "auto", given="2,3") == (0, None)
    # Control: fewer than the ranks and nothing given per rank (or a list that is not what it
    # sees): refused, naming what this rank sees.
    for given in (None, "0,1,2,3"):
        index, problem = placement.choose_gpu(1, 1, 4, "auto", given=given)
        assert index is None and "local rank 1) sees 1 GPU(s)" in problem, problem
        assert "--gpus-per-task=1" in problem


def test_ranks_of_one_host_pinned_to_the_same_gpu_are_named():
    pinned = [placement.pinned_gpu(given, index) for given, index in (
        ("3", 0), ("5", 0), ("0,1", 1), (None, 1), (None, None))]
    assert pinned == ["3", "5", "1", "1", None]
    # One GPU per task, each its own; every GPU visible, by local rank; the CPU: no clash.
    assert placement.same_gpu_problem([("a", "0", "0"), ("a", "1", "1"), ("b", "0", "0")]) is None
    assert placement.same_gpu_problem([("a", None, "0"), ("a", None, "1"), ("a", None, None),
                                       ("a", None, None)]) is None
    # Control: a launcher that gave every rank of host a the same GPU.
    problem = placement.same_gpu_problem([("a", "0", "0"), ("b", "0", "0"), ("a", "0", "0")])
    assert problem.startswith("ranks 0 and 2 on host a would share GPU 0"), problem
    assert "CUDA_VISIBLE_DEVICES '0' and '0'" in problem


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
