"""Horovod's elastic Keras example through hvdtrain.horovod under horovodrun's elastic mode
(Gloo, host discovery): ``hvd.elastic.run`` syncs rank 0's state to every worker, the state's
callbacks count the epochs, and the ranks end equal. The rest of Horovod's API at 2 ranks:
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


def test_horovods_elastic_keras_example_runs_under_horovodrun_elastic(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    command = ["horovodrun", "--gloo", "-np", "2", "--min-np", "1", "--max-np", "2",
               "--host-discovery-script",
               f"{ROOT / 'run_scripts' / 'discover_hosts.sh'} {hosts}",
               "--network-interface", "lo", sys.executable, str(WORKER), str(tmp_path),
               str(EPOCHS)]
    job = run_job(command, timeout=300)
    assert_ok(job, "Horovod's elastic Keras example")
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert [int(r["epoch"]) for r in ranks] == [EPOCHS, EPOCHS]
    weights = [[r[k] for k in r.files if k != "epoch"] for r in ranks]
    assert len(weights[0]) == 4
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)   # seeded per rank: only the sync made them equal
