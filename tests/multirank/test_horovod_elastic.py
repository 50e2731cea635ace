"""Horovod's elastic Keras example through hvdtrain.horovod under horovodrun's elastic mode
(Gloo, host discovery): a worker lost inside a step, ``hvd.elastic.run`` restarts the others
from the last commit with rank 0's state synced, the state's callbacks count the epochs, and
the ranks end equal. The rest of Horovod's API at 2 ranks:
tests/horovod_api_cases.py and horovod_api_calls.py, in test_guarantees' job."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers import ROOT, assert_ok
from hvdtrain.testing.jobs import run_job

# In the lane beside the main one: horovodrun's elastic driver mostly waits (marker "beside").
pytestmark = [pytest.mark.multirank, pytest.mark.beside, pytest.mark.timeout(400)]

WORKER = ROOT / "tests" / "horovod_elastic_worker.py"
EPOCHS = 3


def test_horovods_elastic_keras_example_goes_on_without_a_worker_lost_inside_a_step(tmp_path):
    # Two hosts to Horovod: the worker lost is the one alone on its host (blacklisted).
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n127.0.0.1:1\n")
    command = ["horovodrun", "--gloo", "-np", "3", "--min-np", "2", "--max-np", "3",
               "--host-discovery-script",
               f"{ROOT / 'run_scripts' / 'discover_hosts.sh'} {hosts}",
               "--network-interface", "lo", sys.executable, str(WORKER), str(tmp_path),
               str(EPOCHS), "LOSE"]
    job = run_job(command, timeout=300, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"})
    assert_ok(job, "Horovod's elastic Keras example, a worker lost")
    # The survivors restarted from the last commit and trained every epoch: Horovod's own
    # hvd.elastic.run returns None on a lost worker's error from inside a tf.function (it
    # names the node, not the op), and they would have saved at epoch 0.
    assert sorted(p.name for p in tmp_path.glob("rank*.npz")) == ["rank0.npz", "rank1.npz"]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert [(int(r["epoch"]), int(r["size"])) for r in ranks] == [(EPOCHS, 2), (EPOCHS, 2)]
    weights = [[r[k] for k in r.files if k not in ("epoch", "size")] for r in ranks]
    assert len(weights[0]) == 4
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)   # seeded per rank: only the sync made them equal
