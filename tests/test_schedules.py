"""Learning-rate scaling and warmup, and per-rank thread placement: pure functions."""
from __future__ import annotations

import math

import pytest

from hvdtrain import placement, schedules


@pytest.mark.parametrize("size", [1, 2, 3, 8, 64])
def test_scaling_rules(size):
    assert schedules.scaled_lr(0.1, size, "linear") == pytest.approx(0.1 * size)
    assert schedules.scaled_lr(0.1, size, "sqrt") == pytest.approx(0.1 * math.sqrt(size))
    assert schedules.scaled_lr(0.1, size, "none") == 0.1


def test_unknown_rule_and_bad_size():
    with pytest.raises(ValueError):
        schedules.scaled_lr(0.1, 2, "cubic")
    with pytest.raises(ValueError):
        schedules.scaled_lr(0.1, 0, "linear")


def test_warmup_ramps_linearly_from_base_to_peak():
    lr = [schedules.lr_at_step(s, base_lr=0.1, peak_lr=0.4, warmup_steps=10, total_steps=100)
          for s in range(15)]
    assert lr[0] == pytest.approx(0.1)
    assert lr[5] == pytest.approx(0.25)
    assert all(b > a for a, b in zip(lr[:10], lr[1:11]))
    assert lr[10:] == [pytest.approx(0.4)] * 5


def test_no_warmup_starts_at_peak():
    assert schedules.lr_at_step(0, base_lr=0.1, peak_lr=0.4, warmup_steps=0,
                                total_steps=10) == 0.4


def test_cosine_decays_to_zero_after_warmup():
    kw = dict(base_lr=0.1, peak_lr=0.4, warmup_steps=10, total_steps=110, decay="cosine")
    assert schedules.lr_at_step(10, **kw) == pytest.approx(0.4)
    assert schedules.lr_at_step(60, **kw) == pytest.approx(0.2)
    assert schedules.lr_at_step(110, **kw) == pytest.approx(0.0, abs=1e-12)


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


def test_rank_env_defaults_fill_only_what_is_unset():
    assert placement.rank_env_defaults({}) == placement.RANK_ENV_DEFAULTS
    assert placement.RANK_ENV_DEFAULTS["OMPI_MCA_mpi_yield_when_idle"] == "1"
    mine = {"OMPI_MCA_mpi_yield_when_idle": "0", "HOROVOD_CYCLE_TIME": "5"}
    assert placement.rank_env_defaults(mine) == {}   # the user's (or config's) settings win
