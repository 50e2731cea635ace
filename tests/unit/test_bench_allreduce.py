"""bench allreduce's arithmetic: nccl-tests' bandwidths, the calls per timed batch, the targets."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from hvdtrain.bench import allreduce
from hvdtrain.bench.shared import collectives, targets

def test_bus_bandwidth_follows_nccl_tests():
    algbw, busbw = collectives.bandwidths(nbytes=1 << 20, seconds=1e-3, ranks=4)
    assert algbw == pytest.approx((1 << 20) / 1e-3)
    assert busbw == pytest.approx(algbw * 2 * 3 / 4)
    assert collectives.bandwidths(1000, 1.0, 1)[1] == 0.0   # one rank moves nothing


def test_a_slow_allreduce_is_timed_over_fewer_calls():
    # Control: a fast all-reduce keeps the size's cap (200 calls of 4 KiB, 3 of 64 MiB).
    assert collectives.batch_ops(6e-6, collectives.ops_per_batch(4 * targets.KIB)) == 200
    assert collectives.batch_ops(0.05, collectives.ops_per_batch(64 * targets.MIB)) == 3
    # Gloo with fusion off, 30 ms a call: half a second's worth, not 200 calls (6 s).
    assert collectives.batch_ops(0.03, 200) == 17
    assert collectives.batch_ops(2.0, 200) == 3


def _row(nbytes: int, seconds: float, ratio: float | None = None) -> dict:
    return {"bytes": nbytes, "seconds": {"median": seconds},
            **({} if ratio is None else {"of_raw_mpi": ratio})}


def test_the_allreduce_targets_count_1_to_16_mib_and_the_4_kib_floor():
    mib, kib = targets.MIB, targets.KIB
    raw = {"label": collectives.RAW_MPI.label, "kind": "mpi4py",
           "rows": [_row(4 * kib, 3e-6), _row(mib, 1e-3), _row(16 * mib, 1e-2),
                    _row(64 * mib, 5e-2)]}
    hvd = {"label": collectives.HOROVOD_MPI.label, "kind": "horovod",
           "rows": [_row(4 * kib, 9e-6, 0.3), _row(mib, 1e-3, 0.95), _row(16 * mib, 1e-2, 0.91),
                    _row(64 * mib, 9e-2, 0.5)]}
    t = allreduce._target([raw, hvd])["paths"][0]
    # 64 MiB is outside the window: its 0.5 does not count; the 4 KiB floor is 3x exactly.
    assert t["of_raw_mpi_min_in_window"] == pytest.approx(0.91)
    assert t["bandwidth_met"] and t["floor_met"]
    assert t["floor_time_over_raw_mpi"] == pytest.approx(3.0)
    # Control: a slower floor and a 16 MiB dip miss both.
    hvd["rows"][0]["seconds"]["median"] = 1e-5
    hvd["rows"][2]["of_raw_mpi"] = 0.89
    target = allreduce._target([raw, hvd])
    t = target["paths"][0]
    assert not t["bandwidth_met"] and not t["floor_met"] and t["worst_bytes"] == 16 * mib
    assert "misses >= 0.9" in allreduce.target_lines(target)[0]
    assert "misses <= 3" in allreduce.target_lines(target)[1]


def test_the_chained_path_is_held_against_raw_mpi_in_place():
    mib = targets.MIB
    paths = [{**asdict(path), "rows": [_row(mib, 1e-3, None)]}
             for path in (collectives.RAW_MPI, collectives.RAW_MPI_IN_PLACE,
                          collectives.HOROVOD_MPI, collectives.HOROVOD_MPI_CHAINED)]
    for path, busbw in zip(paths, (5.0, 8.0, 2.0, 4.0)):
        path["rows"][0]["busbw_GBps"] = busbw
    allreduce.add_ratios(paths)
    ratio = {p["label"]: p["rows"][0]["of_raw_mpi"] for p in paths}
    assert ratio[collectives.HOROVOD_MPI_CHAINED.label] == pytest.approx(4.0 / 8.0)
    # Control: the one call per all-reduce, into a new buffer, against separate buffers.
    assert ratio[collectives.HOROVOD_MPI.label] == pytest.approx(2.0 / 5.0)
    target = allreduce._target(paths)
    assert [(t["label"], t["raw"]) for t in target["paths"]] == [
        (collectives.HOROVOD_MPI.label, collectives.RAW_MPI.label),
        (collectives.HOROVOD_MPI_CHAINED.label, collectives.RAW_MPI_IN_PLACE.label)]
