"""tests/guarantees_table.py without a launcher: the verdict on a case from the ranks' records
(each verdict, and the edges of "identical" and "= 1 rank at 2B"), the page rendered and read
back, and the comparison test_guarantees.py makes: a row changed in a copy of the page fails
it (the control). The committed docs/guarantees.md has every case, for both stacks."""
from __future__ import annotations

import pytest

import guarantees_table as table
import horovod_api_page
from guarantees_registry import EXACT, NONE
from guarantees_worker import CASES   # every case module imported: all the cases, in order

pytestmark = pytest.mark.one_stack   # pure: the same on both stacks


def done(across=0.0, to_2b=None, scale=1.0, **checks):
    record = {"status": "done", "message": "", "across": across,
              "checks": {k: list(v) for k, v in checks.items()}}
    if to_2b is not None:
        record.update(to_2b=to_2b, reference_scale=scale)
    return record


def ended(status, message):
    return {"status": status, "message": message}


@pytest.mark.parametrize("contract, ranks, expected", [
    (EXACT, [done(0.0, 3e-8), done(0.0, 3e-8)], table.SAME_AS_2B),
    (EXACT, [done(0.0, 9e-6), done(0.0, 9e-6)], table.SAME_AS_2B),
    (EXACT, [done(0.0, 2e-5), done(0.0, 2e-5)], table.NOT_2B),
    (EXACT, [done(0.0, 2e-5, scale=4.0), done(0.0, 2e-5, scale=4.0)], table.SAME_AS_2B),
    (NONE, [done(0.0, 1e-3), done(0.0, 1e-3)], table.IDENTICAL),
    (EXACT, [done(1e-9, 3e-8), done(1e-9, 3e-8)], table.DIFFERS),   # bitwise, not close
    (NONE, [done(0.0), done(None)], table.DIFFERS),                  # shapes apart
    (NONE, [done(0.0, masks=(False, "0%")), done(0.0, masks=(False, "0%"))], table.WRONG),
    (NONE, [done(0.0, masks=(True, "50%")), done(0.0, masks=(True, "50%"))], table.IDENTICAL),
    (EXACT, [ended("refused", "no XLA"), ended("refused", "no XLA")], table.REFUSED),
    (EXACT, [ended("refused", "no XLA"), done()], table.ERROR),           # one rank only
    (EXACT, [ended("refused", "a"), ended("refused", "b")], table.ERROR),  # not alike
    (EXACT, [ended("error", "TypeError: x"), ended("error", "TypeError: x")], table.ERROR),
    (EXACT, [ended("refused", "no"), None], table.HANG),                   # a rank never ended
    (EXACT, [ended("hang", "Horovod shut down"), done()], table.HANG),
    (EXACT, [ended("not offered", "no such"), ended("not offered", "no such")],
     table.NOT_OFFERED),
])
def test_the_verdict_on_a_case_from_every_ranks_record(contract, ranks, expected):
    assert table.verdict("case", contract, ranks).verdict == expected


def fake_run(key: str, verdict_of: dict[str, str]) -> dict:
    """run_stack's results for a stack whose every case ends with the verdict asked."""
    records = {table.SAME_AS_2B: done(0.0, 1e-8), table.NOT_2B: done(0.0, 1.0),
               table.IDENTICAL: done(0.0), table.DIFFERS: done(0.5),
               table.REFUSED: ended("refused", "use | a pipe")}
    cases = {}
    for case in CASES:
        wanted = verdict_of.get(case.name, table.IDENTICAL if case.contract == NONE
                                else table.SAME_AS_2B)
        cases[case.name] = {"ranks": [records[wanted]] * 2}
    stack = f"tensorflow 2.x, keras {key[-1]}.0.0, horovod 0.28.1"
    return {"stack": stack, "key": key, "jobs": 1, "seconds": 60.0, "cases": cases}


def test_the_page_reads_back_as_rendered_and_a_changed_row_fails_the_comparison():
    first = CASES[1].name
    runs = [fake_run("keras2", {first: table.NOT_2B}),
            fake_run("keras3", {"control_plain_optimizer": table.DIFFERS,
                                first: table.REFUSED})]
    page = table.render(runs, command="make guarantees", date="today",
                        code="hvdtrain at abc1234")
    read = table.parse(page)
    assert set(read) == {"keras3", "keras2"}
    for run in runs:
        found = library(table.verdicts(run))
        assert table.mismatches(read[run["key"]], found) == []
    assert read["keras3"][first] == table.REFUSED and read["keras2"][first] == table.NOT_2B
    # The control: one verdict changed in a copy of the page fails the comparison, naming it.
    row = next(line for line in page.splitlines() if line.startswith(f"| `{first}`"))
    changed = page.replace(row, row.replace(table.REFUSED, table.SAME_AS_2B, 1))
    assert changed != page
    found = library(table.verdicts(runs[1]))
    problems = table.mismatches(table.parse(changed)["keras3"], found)
    assert len(problems) == 1 and problems[0].startswith(f"{first}: the page says"), problems
    # A case the page lacks, or one the run lacks, fails it too.
    missing = {k: v for k, v in read["keras3"].items() if k != first}
    assert table.mismatches(missing, found) == [
        f"{first}: the page says '(not on the page)', the run 'refused' (use | a pipe)"]


def library(rows: dict) -> dict:
    """The rows of guarantees.md's cases (Horovod's API has its page: horovod-api.md)."""
    return {name: row for name, row in rows.items()
            if next(c for c in CASES if c.name == name).family == "library"}


def test_the_committed_pages_have_a_known_verdict_for_every_case_on_both_stacks():
    read = table.parse(table.DOC.read_text())
    horovod = table.parse(horovod_api_page.generated_part(horovod_api_page.DOC.read_text()))
    assert set(read) == set(horovod) == set(table.STACKS)
    for key, verdicts in read.items():
        verdicts = {**verdicts, **horovod[key]}
        assert set(verdicts) == {case.name for case in CASES}, key
        assert set(verdicts.values()) <= set(table.VERDICTS), key
