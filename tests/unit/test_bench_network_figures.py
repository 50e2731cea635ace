"""bench network's parts that need no namespace: its figures (efficiency per round against the
same round's one-host rate, hvdtrain over Horovod per round), the tc command and bucket that
shape a link, and its options' mistakes, each stopped with one line and exit status 2 (never a
traceback), root's absence among them."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT
from hvdtrain import cli
from hvdtrain.bench import network
from hvdtrain.bench.shared import (network_figures, network_projection, network_result,
                                   network_systems)
from hvdtrain.bench.shared.plans import Plan
from hvdtrain.errors import UserError
from hvdtrain.config import HorovodConfig
from hvdtrain.launch import rank_env
from hvdtrain.testing import link_shaping

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

ROUNDS = [
    {"load_average": 1.0, "one_host": {"hvdtrain": 100.0, "horovod": 50.0},
     "links": {"0.1": {"link": {"achieved_gbit_per_s": 0.095},
                       "systems": {"hvdtrain": 40.0, "horovod": 20.0}}}},
    {"load_average": 2.0, "one_host": {"hvdtrain": 80.0, "horovod": 40.0},
     "links": {"0.1": {"link": {"achieved_gbit_per_s": 0.097},
                       "systems": {"hvdtrain": 40.0, "horovod": 25.0}}}},
]


def test_efficiency_and_the_ratio_to_horovod_are_per_round():
    result = network_figures.figures(ROUNDS, [0.1], ["hvdtrain", "horovod"])
    [link] = result["links"]
    assert link["gbit_per_s"] == 0.1
    assert link["achieved_gbit_per_s"]["median"] == pytest.approx(0.096)
    # Per round against the same round's one-host rate: 0.4 and 0.5, not 40 / 90.
    assert link["systems"]["hvdtrain"]["efficiency"]["per_round"] == [0.4, 0.5]
    assert link["systems"]["hvdtrain"]["efficiency"]["median"] == pytest.approx(0.45)
    assert link["hvdtrain_over_horovod"]["per_round"] == [2.0, 1.6]
    assert result["one_host"]["horovod"]["samples_per_sec"]["median"] == 45.0
    # Rates to three figures at least, a slow link's too.
    assert [network_figures.samples_per_sec(r) for r in (36.04, 2.314, 2.0, 0.5)] == \
        ["36.0", "2.31", "2.00", "0.500"]
    # Control: without Horovod's script there is no ratio to give.
    alone = network_figures.figures(ROUNDS, [0.1], ["hvdtrain"])
    assert alone["links"][0]["hvdtrain_over_horovod"] is None


def rounds_as(names, link_scale=1.0):
    """ROUNDS with its systems renamed by ``names`` (hvdtrain and horovod to other systems),
    their rates on the link times ``link_scale``."""
    return [{"load_average": r["load_average"],
             "one_host": {names[k]: v for k, v in r["one_host"].items()},
             "links": {"0.1": {**r["links"]["0.1"], "systems": {
                 names[k]: v * link_scale for k, v in r["links"]["0.1"]["systems"].items()}}}}
            for r in ROUNDS]


def test_fp16_is_set_against_horovods_fp16_and_its_column_shows_only_where_both_ran():
    fp16 = rounds_as({"hvdtrain": "hvdtrain-fp16", "horovod": "horovod-fp16"}, link_scale=1.5)
    names = ["hvdtrain-fp16", "horovod-fp16"]
    result = {"systems": dict.fromkeys(names, ""), **network_figures.figures(fp16, [0.1], names)}
    [link] = result["links"]
    assert link["fp16_over_horovod_fp16"]["per_round"] == [2.0, 1.6]
    assert link["hvdtrain_over_horovod"] is None   # like for like only: no float32 pair ran
    header = network_figures.table(result).splitlines()[0]
    assert "hvdtrain fp16 / Horovod fp16" in header
    # Control: with the float32 pair only, the fp16 column is not there.
    plain = {"systems": {"hvdtrain": "", "horovod": ""},
             **network_figures.figures(ROUNDS, [0.1], ["hvdtrain", "horovod"])}
    assert "fp16" not in network_figures.table(plain)
    assert "Gloo buckets" not in network_figures.table(plain)
    # Horovod's side is its own script with its own flag, and the model halves its bytes.
    theirs = network_systems.systems(2.0)["horovod-fp16"]
    assert theirs.horovod_script and theirs.script_args == ("--fp16-allreduce",)
    assert theirs.gradient_share == 0.5


def test_the_cost_model_predicts_each_step_from_the_rounds_one_host_step_and_the_link():
    table = network_systems.systems(2.0)
    chosen = [table["hvdtrain"], table["hvdtrain-gloo-overlap"]]
    rounds = rounds_as({"hvdtrain": "hvdtrain", "horovod": "hvdtrain-gloo-overlap"})
    # 1 MB of gradients at a measured 0.095 Gbit/s: the 2-rank ring moves 1 MB per rank.
    transfer = 1e6 * 8 / 0.095e9
    out = network_projection.projection(rounds[:1], 0.1, chosen, 16, 1e6)
    after = out["projection"]["hvdtrain"]
    # After backprop the transfer adds to the one-host step (32 samples at 100/s)...
    assert after["predicted_step_s"]["median"] == pytest.approx(0.32 + transfer)
    assert after["measured_step_s"]["median"] == pytest.approx(32 / 40)
    assert out["projection_error"]["median"] == pytest.approx((0.32 + transfer) / 0.8 - 1)
    # ...while overlapping backprop under Gloo hides it behind 2/3 of its 0.64 s step
    # (control: the same link, the transfer no longer added)...
    during = out["projection"]["hvdtrain-gloo-overlap"]
    assert during["predicted_step_s"]["median"] == pytest.approx(0.64)
    assert during["transfer_s"]["median"] == pytest.approx(transfer)
    # ...and under mpirun, on a rank's one core, the transfer waits for backprop: Horovod's
    # script and hvdtrain's buckets there add it, as one all-reduce after backprop does.
    for name in ("horovod", "hvdtrain-overlap", "horovod-fp16"):
        assert table[name].overlaps_backprop and not table[name].transfer_hides
        mpi = network_projection.predicted_step(table[name], 0.64, 1e6, 0.095)
        assert mpi["step_s"] == pytest.approx(0.64 + table[name].gradient_share * transfer)
    # fp16 compression sends half the bytes.
    half = network_projection.predicted_step(table["hvdtrain-fp16"], 0.32, 1e6, 0.095)
    assert half["bandwidth_s"] == pytest.approx(transfer / 2)
    # Overlap against its ideal, for every system that reduces during backprop: the Gloo
    # buckets' 1.6 s step over max(0.64 s of compute, the transfer); not for hvdtrain's one
    # all-reduce after backprop, and nothing where no such system ran (the control).
    assert set(out["overlap_over_ideal"]) == {"hvdtrain-gloo-overlap"}
    assert out["overlap_over_ideal"]["hvdtrain-gloo-overlap"]["per_round"] == pytest.approx(
        [1.6 / 0.64])
    after_only = network_projection.projection(rounds[:1], 0.1, chosen[:1], 16, 1e6)
    assert after_only["overlap_over_ideal"] is None
    # Where the probe measured both ways at once, the ring's transfer is read from that figure.
    both = [{**rounds[0], "links": {"0.1": {**rounds[0]["links"]["0.1"], "link": {
        "achieved_gbit_per_s": 0.095, "both_ways_gbit_per_s": 0.0475}}}}]
    slower = network_projection.projection(both, 0.1, chosen, 16, 1e6)["projection"]["hvdtrain"]
    assert slower["transfer_s"]["median"] == pytest.approx(2 * transfer)


def test_horovods_script_under_gloo_on_one_host_runs_each_rank_on_its_local_ranks_core():
    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    cores = sorted(os.sched_getaffinity(0))
    for local_rank in (0, 1):
        done = subprocess.run(network_systems.pinned("gloo", show), capture_output=True,
                              text=True, timeout=30,
                              env={**os.environ, "HOROVOD_LOCAL_RANK": str(local_rank)})
        assert done.stdout.strip() == f"[{cores[local_rank % len(cores)]}]", done.stderr
    # Control: mpirun --bind-to core binds the ranks itself; its command is left as it is.
    assert network_systems.pinned("mpi", show) == show


def test_the_tbf_command_and_its_bucket():
    command = link_shaping.tbf_command("ns1", "hvd0", 100)
    assert command[:5] == ["ip", "netns", "exec", "ns1", "tc"]
    assert command[command.index("rate") + 1] == "100000kbit"
    # A slow link's bucket still holds a 64 KiB segment; a fast one's, 4 ms at its rate.
    assert link_shaping.burst_bytes(100) == link_shaping.MIN_BURST_BYTES
    assert link_shaping.burst_bytes(10_000) == 5_000_000
    with pytest.raises(ValueError):
        link_shaping.tbf_command("ns1", "hvd0", 0)


def bench_network(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hvdtrain.cli", "bench", "network",
                           *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT), str(ROOT / "tests")])})


@pytest.mark.fault
@pytest.mark.parametrize("args, line", [
    (["--speeds", "0,1"], "hvdtrain: error: --speeds '0,1': expected link speeds in Gbit/s "
                          "such as 0.1,1,10"),
    (["--systems", "hvdtrain,ptp"], "hvdtrain: error: --systems 'hvdtrain,ptp': choose from "
                                    "hvdtrain, hvdtrain-overlap, hvdtrain-fp16, hvdtrain-gloo, "
                                    "hvdtrain-gloo-overlap, "
                                    "horovod, horovod-inter-op-2, horovod-hvdtrain-env, "
                                    "horovod-gloo, horovod-fp16"),
    (["--model", "vgg"], "hvdtrain: error: unknown bench network model 'vgg'; choose from "
                         "mobilenetv2, resnet50, mlp"),
    (["--systems", "horovod", "--quick"], "hvdtrain: error: no system left to run (horovod: "
     "Horovod's script trains keras.applications models at 224x224 only, not mlp at "
     "(8, 8, 1))"),
])
def test_a_mistake_in_the_options_is_one_line(args, line):
    done = bench_network("--quick", *args)
    assert (done.returncode, done.stderr.strip()) == (2, line), done.stderr


@pytest.mark.fault
def test_not_root_is_one_line(monkeypatch, capsys):
    # In this process, as uid 65534 (nobody) to the check: a real drop to nobody cannot read a
    # checkout under root's home, as a clone in /root is.
    monkeypatch.setattr(os, "geteuid", lambda: 65534)
    assert cli.run(["bench", "network", "--quick"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hvdtrain: error: bench network needs root to make network namespaces (run it with "
        "sudo)")
    # Control: as root, the check passes (whether the hosts can be made is another question).
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    try:
        network.check_machine()
    except UserError as e:
        assert "needs root" not in str(e), e


def test_gloos_buckets_are_set_against_horovods_script():
    gloo = rounds_as({"hvdtrain": "hvdtrain-gloo-overlap", "horovod": "horovod"})
    names = ["hvdtrain-gloo-overlap", "horovod"]
    result = {"systems": dict.fromkeys(names, ""), **network_figures.figures(gloo, [0.1], names)}
    [link] = result["links"]
    assert link["gloo_overlap_over_horovod"]["per_round"] == [2.0, 1.6]
    assert link["hvdtrain_over_horovod"] is None
    assert "hvdtrain Gloo buckets / Horovod" in network_figures.table(result).splitlines()[0]


def choices(rounds):
    """bench network's choices for ``rounds`` interleaved rounds of hvdtrain and Horovod."""
    return network.Choices(
        speeds=(0.1,), rounds=rounds, workload=network_systems.NETWORK_WORKLOADS["mlp"],
        systems=tuple(network_systems.chosen_systems("hvdtrain,horovod", 2.0)), skipped=(),
        plan=Plan(world_sizes=(2,), warmup_epochs=1, repeats=3, steps_per_repeat=4),
        probe_seconds=2.0, horovod=(None, sys.executable))


def test_render_computes_a_saved_results_figures_again_from_its_rounds(tmp_path):
    saved = network.result_of(choices(2), {"load_average": 0.0}, ROUNDS, 1_000_000)
    stale = json.loads(json.dumps(saved))
    stale["links"][0]["hvdtrain_over_horovod"] = {"median": 9.9}   # as an older version wrote
    del stale["speeds"], stale["bucket_mb"]                         # before these keys
    (tmp_path / "old.json").write_text(json.dumps(stale))
    assert cli.run(["bench", "network", "--render", str(tmp_path / "old.json"),
                    "--out", str(tmp_path / "new")]) == 0
    rendered = json.loads((tmp_path / "new" / "network.json").read_text())
    assert rendered["links"][0]["hvdtrain_over_horovod"]["per_round"] == [2.0, 1.6]
    assert rendered["links"] == json.loads(json.dumps(saved["links"]))
    assert "| 0.1 Gbit/s |" in (tmp_path / "new" / "network.md").read_text()
    assert (tmp_path / "new" / "network.png").stat().st_size > 0
    # Control: a file that is not bench network's is one line, not a traceback.
    (tmp_path / "other.json").write_text(json.dumps({"benchmark": "tax"}))
    with pytest.raises(UserError, match="not a bench network result"):
        network_result.render(tmp_path / "other.json", tmp_path / "new", 2.0)


def test_each_round_is_written_as_it_ends_so_a_run_ended_early_keeps_its_rounds(
        tmp_path, monkeypatch):
    def one_round(i, how, cluster, work_dir):
        if i == 2:
            raise KeyboardInterrupt   # Ctrl-C in the last round
        return ROUNDS[i]
    monkeypatch.setattr(network, "one_round", one_round)
    monkeypatch.setattr(network, "two_hosts", lambda work_dir: contextlib.nullcontext())
    monkeypatch.setattr(network_systems, "gradient_bytes", lambda workload: 1_000_000)
    with pytest.raises(KeyboardInterrupt):
        network.run(tmp_path, choices(3))
    written = json.loads((tmp_path / "network.json").read_text())
    assert (written["plan"]["rounds"], written["rounds_asked"]) == (2, 3)
    assert written["links"][0]["hvdtrain_over_horovod"]["per_round"] == [2.0, 1.6]
    assert "2 of 3 interleaved round(s)" in (tmp_path / "network.md").read_text()


def test_horovods_script_with_hvdtrains_env_is_launched_as_hvdtrains_ranks(monkeypatch, tmp_path):
    envs = []

    def measure_horovod(script, ranks, plan, python, *, command, env, inter_op_threads):
        envs.append(env or {})
        return 1.0
    monkeypatch.setattr(network_systems.horovod_synthetic, "measure_horovod", measure_horovod)
    table = network_systems.systems(2.0)
    plan = Plan(world_sizes=(2,), warmup_epochs=1, repeats=3, steps_per_repeat=4)
    for name in ("horovod-hvdtrain-env", "horovod"):
        network_systems.measure(table[name], network_systems.NETWORK_WORKLOADS["mobilenetv2"],
                                plan, tmp_path, cluster=None, across={},
                                horovod=(tmp_path / "script.py", sys.executable))
    ours, plain = envs
    # On one host, what an hvdtrain rank sets there (rank_env); control: the plain script none.
    environ = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    expected = rank_env.rank_environment(HorovodConfig(), environ)
    assert ours.items() >= {k: v for k, v in expected.items()
                            if not k.startswith("HOROVOD_STALL")}.items()
    assert not {k for k in plain if k.startswith(("OMPI_MCA", "HOROVOD_"))}
    # On two hosts, one rank each: recursive doubling too, as an hvdtrain rank there sets it.
    environ["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1"
    assert network_systems.hvdtrain_launch_env(two_hosts=True).items() >= {
        k: v for k, v in rank_env.rank_environment(HorovodConfig(), environ).items()
        if not k.startswith("HOROVOD_STALL")}.items()
