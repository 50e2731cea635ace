"""A rank's environment before hvd.init(), from one pure function: what the config sets, what
the launcher or user set, and hvdtrain's launch defaults, in that order of precedence."""
from __future__ import annotations

import os

import pytest

from hvdtrain.launch import rank_env
from hvdtrain.config import HorovodConfig

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

STALL = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}


TWO_RANKS = {"OMPI_COMM_WORLD_SIZE": "2"}


def test_a_rank_of_two_gets_the_stall_settings_and_the_launch_defaults():
    assert rank_env.rank_environment(HorovodConfig(), TWO_RANKS) == {
        **STALL, "OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.2"}
    assert rank_env.rank_environment(HorovodConfig(), {"HOROVOD_SIZE": "4"})[
        "HOROVOD_CYCLE_TIME"] == "0.2"


def test_a_process_alone_gets_a_long_cycle_unless_elastic():
    # No gradient is all-reduced alone: Horovod's thread should leave the core to training.
    for alone in ({}, {"OMPI_COMM_WORLD_SIZE": "1"}, {"HOROVOD_SIZE": "1"}):
        assert rank_env.rank_environment(HorovodConfig(), alone)["HOROVOD_CYCLE_TIME"] == "5"
    # Elastic training may grow: the cycle stays short.
    elastic = {"HOROVOD_SIZE": "1", "HOROVOD_ELASTIC": "1"}
    assert rank_env.rank_environment(HorovodConfig(), elastic)["HOROVOD_CYCLE_TIME"] == "0.2"
    # Yours still wins.
    assert "HOROVOD_CYCLE_TIME" not in rank_env.rank_environment(
        HorovodConfig(), {"HOROVOD_CYCLE_TIME": "1"})


def test_two_ranks_on_two_hosts_under_mpirun_all_reduce_by_recursive_doubling():
    two_hosts = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    env = rank_env.rank_environment(HorovodConfig(), two_hosts)
    assert {k: env[k] for k in rank_env.TWO_HOSTS_ALLREDUCE} == {
        "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
        "OMPI_MCA_coll_tuned_allreduce_algorithm": "3"}
    # Controls: two ranks on one host, four ranks on two hosts, and a coll_tuned setting of
    # the user's keep Open MPI's own choice.
    for other in ({**two_hosts, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, TWO_RANKS,
                  {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
                  {**two_hosts, "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}):
        env = rank_env.rank_environment(HorovodConfig(), other)
        assert not any(k.startswith("OMPI_MCA_coll_tuned_") for k in env), other


def test_the_launchers_or_users_settings_beat_the_launch_defaults():
    mine = {"OMPI_MCA_mpi_yield_when_idle": "0", "HOROVOD_CYCLE_TIME": "5"}
    env = rank_env.rank_environment(HorovodConfig(), mine)
    assert env == STALL  # nothing of theirs is overwritten: both defaults stay out
    # Control: one of the two set, the other default still comes in.
    assert rank_env.rank_environment(HorovodConfig(), {"HOROVOD_CYCLE_TIME": "5"}) == {
        **STALL, "OMPI_MCA_mpi_yield_when_idle": "1"}


def test_a_config_key_beats_the_environment():
    env = rank_env.rank_environment(HorovodConfig(cycle_time_ms=3), {"HOROVOD_CYCLE_TIME": "5"})
    assert env["HOROVOD_CYCLE_TIME"] == "3"
    # The stall settings come from run.stall_*_s always (they have defaults of their own).
    env = rank_env.rank_environment(HorovodConfig(), {"HOROVOD_STALL_CHECK_TIME_SECONDS": "9"},
                                    stall_warning_s=30, stall_abort_s=0)
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "30"
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "0"


def test_defaults_left_at_minus_one_set_no_horovod_option():
    assert rank_env.from_config(HorovodConfig(), stall_warning_s=60, stall_abort_s=600) == STALL


def test_each_option_sets_its_variable():
    env = rank_env.from_config(HorovodConfig(fusion_threshold_mb=64, cycle_time_ms=2.5,
                                             autotune=True, timeline="t.json"),
                               stall_warning_s=60, stall_abort_s=600)
    assert env == {**STALL, "HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024),
                   "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_AUTOTUNE": "1",
                   "HOROVOD_TIMELINE": os.path.abspath("t.json")}
    off = rank_env.from_config(HorovodConfig(fusion_threshold_mb=0), stall_warning_s=60,
                               stall_abort_s=600)
    assert off["HOROVOD_FUSION_THRESHOLD"] == "0"  # 0 turns fusion off, it is not "unset"


def test_values_in_force_whoever_set_them():
    assert rank_env.in_force({}) == "fusion 128 MB, cycle 1 ms, autotune off, timeline off"
    launcher_set = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "5",
                    "HOROVOD_AUTOTUNE": "1", "HOROVOD_TIMELINE": "/tmp/t.json"}
    assert rank_env.in_force(launcher_set) == ("fusion 0 MB (off), cycle 5 ms, autotune on, "
                                               "timeline /tmp/t.json")
    ours = rank_env.rank_environment(HorovodConfig(fusion_threshold_mb=32), TWO_RANKS)
    assert rank_env.in_force(ours).startswith("fusion 32 MB, cycle 0.2 ms")
