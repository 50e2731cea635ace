"""bench cluster's arithmetic (pure): the rates and the efficiency against the ranks alone, the
link fitted to the all-reduce's phases and the projection from it, the tables; and its refusal
to run outside a launched job."""
from __future__ import annotations

import subprocess

import pytest

from helpers import hvdtrain, launcher_env
from hvdtrain.errors import UserError
from hvdtrain.launch import launchers, placement
from hvdtrain.bench.shared import cluster_figures, cost_model
from hvdtrain.bench.shared.cost_model import Link


def figures(rank: int, job: tuple[list[int], list[float]], alone: tuple[list[int], list[float]]
            ) -> dict:
    """One rank's figures as bench cluster's rank gathers them: (samples, seconds) per repeat."""
    return {"rank": rank, "host": f"host{rank + 1}", "gradient_bytes": 4000,
            "job": {"samples": job[0], "seconds": job[1]},
            "alone": {"samples": alone[0], "seconds": alone[1]}}


def test_the_total_counts_every_rank_over_the_slowest_and_the_efficiency_the_ranks_alone():
    # Alone, rank 0 did 100 samples/s and rank 1 (a slower host) 50. In the job each trained
    # 90 samples a repeat, rank 1 in 1.2 s: the total is 180 / 1.2 = 150 samples/s.
    everyone = [figures(0, ([90, 90], [1.0, 1.0]), ([100, 100], [1.0, 1.0])),
                figures(1, ([90, 90], [1.2, 1.2]), ([100, 100], [2.0, 2.0]))]
    rates = cluster_figures.throughput(everyone)
    assert rates["total_samples_per_sec"] == pytest.approx(150.0)
    assert rates["efficiency"] == pytest.approx(150 / (100 + 50))
    # Control: rank 0's rate times N (180) or rank 0 alone times N (200) give other figures.
    assert rates["efficiency"] != pytest.approx(180 / 150) != pytest.approx(150 / 200)
    assert [r["alone_samples_per_sec"] for r in rates["ranks"]] == [100.0, 50.0]
    assert rates["efficiency_flag"] is None
    # A job faster than its ranks alone is flagged, not reported as a gain; 1.05 is not.
    faster = [figures(0, ([110], [1.0]), ([100], [1.0]))]
    assert "noise" in cluster_figures.throughput(faster)["efficiency_flag"]
    exact = [figures(0, ([105], [1.0]), ([100], [1.0]))]
    assert cluster_figures.throughput(exact)["efficiency_flag"] is None


def test_the_fitted_link_reproduces_the_measured_allreduce_and_projects_past_it():
    # A 4-rank all-reduce of 40 MB on a known link, as the timeline would show its phases.
    link, ranks, nbytes = Link(hop_s=1e-5, seconds_per_byte=1e-9, fixed_s=3e-4), 4, 4e7
    ring = cost_model.ring_allreduce_seconds(ranks, nbytes, link.hop_s, link.seconds_per_byte)
    total = cost_model.allreduce_parts(ranks, nbytes, link)["total_s"]
    phases = {"MPI_ALLREDUCE": ring * 1e3, "ALLREDUCE": total * 1e3}
    fitted = cluster_figures.fitted_link(phases, ranks, nbytes, hop_s=1e-5)
    assert fitted.seconds_per_byte == pytest.approx(1e-9)
    assert fitted.fixed_s == pytest.approx(3e-4)
    rows = cluster_figures.projection(0.1, nbytes, fitted, [ranks, 512])
    assert rows[0]["efficiency"] == pytest.approx(0.1 / (0.1 + total))
    assert rows[1]["efficiency"] < rows[0]["efficiency"]
    # Control: Gloo's collective fits alike; a wrong hop latency moves the fit.
    gloo = {"GLOO_ALLREDUCE": ring * 1e3, "ALLREDUCE": total * 1e3}
    assert cluster_figures.fitted_link(gloo, ranks, nbytes, 1e-5) == fitted
    assert cluster_figures.fitted_link(phases, ranks, nbytes, 0.0).fixed_s != fitted.fixed_s
    with pytest.raises(ValueError):
        cluster_figures.fitted_link(phases, 1, nbytes, 1e-5)   # one rank reduces nothing
    with pytest.raises(ValueError):
        cluster_figures.fitted_link({"ALLREDUCE": 1.0}, ranks, nbytes, 1e-5)


def result(efficiency_flagged: bool, phases: bool) -> dict:
    alone = ([100], [1.0])
    everyone = [figures(0, ([120 if efficiency_flagged else 90], [1.0]), alone),
                figures(1, ([90], [1.0]), alone)]
    out = {"model": "mypkg.models:build", "world_size": 2, "controller": "mpi", "stack": "s",
           "input_shape": [8, 8, 1], "batch_size_per_rank": 32, "gradient_bytes": 4000,
           "plan": {"repeats": 1, "steps_per_repeat": 5}, "compute_s": 0.01,
           "throughput": cluster_figures.throughput(everyone), "phases": None,
           "projection_missing": "the timeline holds no all-reduce"}
    if phases:
        link = Link(hop_s=1e-5, seconds_per_byte=1e-9)
        out.update(phases={"steps": 4, "step_ms": 12.0,
                           "phases_ms": {"MPI_ALLREDUCE": 1.0, "ALLREDUCE": 2.0}},
                   link=link.as_dict(),
                   projection=cluster_figures.projection(0.01, 4000, link, [2, 8]))
    return out


def test_the_report_has_a_row_per_rank_the_phases_and_the_projection():
    text = cluster_figures.markdown(result(efficiency_flagged=False, phases=True))
    assert "| 0 | host1 | 90.0 | 100.0 |" in text and "| 1 | host2 | 90.0 | 100.0 |" in text
    assert "efficiency 0.900 against" in text and "flagged" not in text
    assert "| MPI_Allreduce | 1.000 |" in text and "| 8 |" in text
    # Control: without phases there is no projection, and it says why; a flag shows.
    bare = cluster_figures.markdown(result(efficiency_flagged=True, phases=False))
    assert "No projection: the timeline holds no all-reduce." in bare
    assert "MPI_Allreduce" not in bare and "efficiency 1.050 (flagged" not in bare
    assert "efficiency 1.050" in bare
    flagged = cluster_figures.markdown(result(efficiency_flagged=True, phases=False) | {
        "throughput": cluster_figures.throughput([figures(0, ([120], [1.0]), ([100], [1.0]))])})
    assert "efficiency 1.200 (flagged: above 1.05" in flagged


def test_inputs_and_the_launched_job_are_checked():
    assert cluster_figures.input_shape("64,64,3") == (64, 64, 3)
    for bad in ("64,x", "", "0,4"):
        with pytest.raises(UserError):
            cluster_figures.input_shape(bad)
    # Every launcher of the table, and srun, which is none of its rows.
    for row in launchers.LAUNCHERS.values():
        assert not row.rank_variable or cluster_figures.inside_a_job({row.rank_variable: "3"})
    assert cluster_figures.inside_a_job({"SLURM_PROCID": "0"})
    assert not cluster_figures.inside_a_job({"HOME": "/root"})   # control: a plain shell


def test_bench_cluster_outside_a_launched_job_says_how_to_run_it():
    env = {k: v for k, v in launcher_env().items() if k not in placement.LAUNCHER_RANK_VARS}
    done = subprocess.run(hvdtrain("bench", "cluster", "--model", "mlp"), env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "hvdtrain: error: bench cluster runs inside the ranks your launcher starts, e.g. "
        "mpirun -np 4 -H a:2,b:2 hvdtrain bench cluster --model ...; no launcher's rank "
        "variable is set here"]
