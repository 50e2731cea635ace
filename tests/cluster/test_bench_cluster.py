"""``hvdtrain bench cluster`` inside a 2-host job that the user's launcher started (mpirun with a
hostfile through run_scripts/mpirun_hostfile.sh), on a user's model module written here: the
result's fields and their sense, and (the control) the same launch with a model path that does
not import stops every rank with one line and exit status 2.

Skipped, with the reason, where namespaces cannot be made (see test_multihost.py).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from helpers import ROOT, error_lines, importable_from, launcher_env
from hvdtrain.testing.netns_cluster import NetnsCluster

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

CLUSTER = NetnsCluster   # conftest's `cluster`: 3 namespaced hosts

# A user's model: 8*8*1 -> 16 -> 10, (64 + 1) * 16 + (16 + 1) * 10 = 1,210 float32 parameters.
MODEL = textwrap.dedent("""\
    import tensorflow as tf


    def build(input_shape, num_classes):
        inputs = tf.keras.Input(input_shape)
        x = tf.keras.layers.Dense(16, activation="relu")(tf.keras.layers.Flatten()(inputs))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))
    """)
GRADIENT_BYTES = 4 * 1210


def test_bench_cluster_across_two_hosts_on_a_user_model(cluster, tmp_path):
    (tmp_path / "user_models").mkdir()
    (tmp_path / "user_models" / "benchmodel.py").write_text(MODEL)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("host1 slots=1\nhost2 slots=1\n")
    env = cluster.env(launcher_env(importable_from(tmp_path / "user_models")))

    def bench(model: str, out: str):
        return cluster.run([
            str(ROOT / "run_scripts" / "mpirun_hostfile.sh"), "-f", str(hostfile),
            "-i", cluster.interface, "-p", "hvdtrain bench cluster", "--",
            "--model", model, "--input-shape", "8,8,1", "--batch-size", "32", "--steps", "5",
            "--repeats", "2", "--out", str(tmp_path / out)],
            env=env, check=False, cwd=tmp_path, timeout=300)

    done = bench("benchmodel:build", "results")
    assert done.returncode == 0, done.stdout[-4000:]
    result = json.loads((tmp_path / "results" / "cluster.json").read_text())
    assert (tmp_path / "results" / "cluster.md").read_text().startswith("bench cluster: ")
    # Rank 0 alone printed the report; the job ran on both hosts, one rank each.
    assert done.stdout.count("bench cluster: benchmodel:build on 2 ranks") == 1, done.stdout
    assert result["world_size"] == 2 and result["controller"] == "mpi"
    rates = result["throughput"]
    assert [(r["rank"], r["host"]) for r in rates["ranks"]] == [(0, "host1"), (1, "host2")]
    assert result["gradient_bytes"] == GRADIENT_BYTES   # the user's model, not a bundled one
    assert rates["total_samples_per_sec"] > 0 and rates["per_rank_samples_per_sec"] > 0
    assert all(r["alone_samples_per_sec"] > 0 for r in rates["ranks"])
    assert 0 < rates["efficiency"] <= 1.05 or rates["efficiency_flag"]
    assert rates["efficiency"] == pytest.approx(
        rates["total_samples_per_sec"] / sum(r["alone_samples_per_sec"]
                                             for r in rates["ranks"]))
    # The gradients' all-reduce, phase by phase, from rank 0's timeline: a part of the step.
    phases = result["phases"]["phases_ms"]
    assert 0 < phases["MPI_ALLREDUCE"] <= phases["ALLREDUCE"] < result["phases"]["step_ms"]
    assert result["phases"]["steps"] == 2 * 6   # the timed epochs' steps, the warmup left out
    projected = {r["ranks"]: r["efficiency"] for r in result["projection"]}
    assert list(projected) == [2, 8, 64, 512]
    assert all(0 < e <= 1 for e in projected.values())
    assert list(projected.values()) == sorted(projected.values(), reverse=True)

    # Control: a model path that does not import on any host stops every rank before Horovod
    # starts, rank 0 saying so in one line, the job's status 2, nothing written.
    wrong = bench("benchmodel:no_such_builder", "wrong")
    assert wrong.returncode == 2, wrong.stdout[-4000:]
    assert error_lines(wrong.stdout) == [
        "hvdtrain: error: benchmodel has no function 'no_such_builder' for model "
        "'benchmodel:no_such_builder'"], wrong.stdout[-4000:]
    assert "Traceback" not in wrong.stdout and not (tmp_path / "wrong").exists()
