"""The launcher table (hvdtrain/launch/launchers.py) is the one place that holds a launcher's
facts, and they hold together: its tag and traceback pattern agree, placement reads its rank and
size variables, its script is in run_scripts/ and in ``hvdtrain launch``. Each check runs on the
table and, as its control, on a copy with one row broken."""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Mapping

import pytest

from hvdtrain import cli
from hvdtrain.commands import launch
from hvdtrain.install import shipped
from hvdtrain.launch import launchers, placement
from hvdtrain.launch.launchers import Entry, Script

pytestmark = pytest.mark.one_stack   # its path is the same on both stacks

TABLE = launchers.LAUNCHERS
TRACEBACK = "Traceback (most recent call last):"


def output_problems(table: Mapping[str, Entry]) -> list[str]:
    """Where a row's tag and traceback pattern disagree: a rank's traceback line
    as the launcher forwards it (tagged, or not where it tags only when asked) must match, and
    an untagged one must not where the launcher tags every line (it is the launcher's own)."""
    problems = []
    for name, row in table.items():
        for rank, stream in [(0, "stdout"), (1, "stderr"), (12, "stderr")]:
            tag = row.rank_tag(rank, stream)
            forwarded = [tag + TRACEBACK] if row.always_tags else [tag + TRACEBACK, TRACEBACK]
            for line in forwarded:
                if not re.search(row.rank_traceback, f"before\n{line}\nafter", re.M):
                    problems.append(f"{name}: a rank's traceback {line!r} not matched")
        if row.always_tags and (not row.tag or re.search(row.rank_traceback, TRACEBACK, re.M)):
            problems.append(f"{name}: tags every line but matches an untagged traceback")
    return problems


def variable_problems(table: Mapping[str, Entry]) -> list[str]:
    """A multi-rank row without its variables, or one whose variables placement does not
    read (a rank would not know its number before hvd.init())."""
    problems = []
    for name, row in table.items():
        if row.multi_rank and not (row.rank_variable and row.size_variable
                                   and row.local_rank_variable):
            problems.append(f"{name}: starts ranks but names no rank, size or local rank "
                            f"variable")
        if row.rank_variable and placement.launcher_rank({row.rank_variable: "3"}) != 3:
            problems.append(f"{name}: placement does not read {row.rank_variable}")
        if row.size_variable and placement.launcher_size({row.size_variable: "5"}) != 5:
            problems.append(f"{name}: placement does not read {row.size_variable}")
        if (row.local_rank_variable
                and placement.launcher_local_rank({row.local_rank_variable: "2"}) != 2):
            problems.append(f"{name}: placement does not read {row.local_rank_variable}")
    return problems


def script_problems(table: Mapping[str, Entry], scripts: Mapping[str, Script]) -> list[str]:
    """A row's script that is not an executable file of run_scripts/, or that ``hvdtrain
    launch`` (``scripts``) does not offer under its name."""
    folder = shipped.folder("run_scripts")
    problems = []
    for name, row in table.items():
        if row.script is None:
            continue
        path = folder / row.script.file
        if not (path.is_file() and os.access(path, os.X_OK)):
            problems.append(f"{name}: no executable {path}")
        if scripts.get(row.script.name) != row.script:
            problems.append(f"{name}: hvdtrain launch has no {row.script.name}")
    return problems


def broken(name: str, **changes) -> dict[str, Entry]:
    """A copy of the table with row ``name`` changed."""
    return {**TABLE, name: dataclasses.replace(TABLE[name], **changes)}  # type: ignore[dict-item]


def test_every_rows_tag_and_traceback_pattern_agree():
    assert output_problems(TABLE) == []
    # Controls: horovodrun's own traceback taken for a rank's; a tag changed without its
    # traceback pattern; mpirun's untagged rank traceback missed.
    assert output_problems(broken("gloo", rank_traceback="Traceback")) == [
        "gloo: tags every line but matches an untagged traceback"]
    assert "gloo: a rank's traceback '[0]<stdout>: Traceback (most recent call last):' not " \
        "matched" in output_problems(broken("gloo", tag="[{rank}]<{stream}>: "))
    assert "mpi: a rank's traceback 'Traceback (most recent call last):' not matched" in \
        output_problems(broken("mpi", rank_traceback=r"^\[1,\d+\]<std(out|err)>:Traceback"))


def test_a_rows_tag_pattern_matches_its_tags_of_any_rank_and_stream():
    tagged = [row for row in TABLE.values() if row.tag]
    assert tagged   # the check saw some
    for row in tagged:
        for rank, stream in [(0, "stdout"), (13, "stderr")]:
            assert re.fullmatch(row.tag_pattern or "", row.rank_tag(rank, stream)), row.tag
        # Controls: another stream; the tag not at its end.
        assert not re.fullmatch(row.tag_pattern or "", row.rank_tag(0, "stdin"))
        assert not re.fullmatch(row.tag_pattern or "", row.rank_tag(0) + "x")


def test_placement_reads_every_rows_rank_size_and_local_rank_variables():
    assert variable_problems(TABLE) == []
    # Horovod's own first: horovodrun started inside an mpirun or srun task keeps its numbers.
    assert placement.launcher_rank({"HOROVOD_RANK": "1", "OMPI_COMM_WORLD_RANK": "0",
                                    "SLURM_PROCID": "0"}) == 1
    # Controls: a row whose variables placement does not know; a multi-rank row with none.
    assert variable_problems(broken("mpi", rank_variable="NEWMPI_RANK",
                                    size_variable="NEWMPI_SIZE",
                                    local_rank_variable="NEWMPI_LOCAL_RANK")) == [
        "mpi: placement does not read NEWMPI_RANK", "mpi: placement does not read NEWMPI_SIZE",
        "mpi: placement does not read NEWMPI_LOCAL_RANK"]
    assert variable_problems(broken("gloo", rank_variable=None)) == [
        "gloo: starts ranks but names no rank, size or local rank variable"]


def test_every_rows_script_exists_and_hvdtrain_launch_offers_it(capsys):
    assert script_problems(TABLE, launchers.SCRIPTS) == []
    assert [row.script for row in TABLE.values() if row.script]   # the check saw some
    for row in TABLE.values():
        if row.script:
            assert cli.run(["launch", row.script.name, "--path"]) == 0
            assert capsys.readouterr().out.strip() == str(
                shipped.folder("run_scripts") / row.script.file)
            assert f"{row.script.name} ({row.script.help})" in launch.HELP
    # Controls: a row whose script is not in run_scripts/; hvdtrain launch without a row's.
    missing = Script("nowhere", "nowhere.sh", "a script never written")
    assert script_problems(broken("gloo", script=missing), {**launchers.SCRIPTS, "nowhere": missing}
                           ) == [f"gloo: no executable {shipped.folder('run_scripts')}/nowhere.sh"]
    without = {k: v for k, v in launchers.SCRIPTS.items() if k != TABLE["mpi"].script.name}
    assert script_problems(TABLE, without) == [
        f"mpi: hvdtrain launch has no {TABLE['mpi'].script.name}"]
