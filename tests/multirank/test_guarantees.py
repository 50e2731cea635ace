"""docs/guarantees.md and docs/horovod-api.md hold on the installed stack: the Keras usage
patterns tests/guarantees_worker.py runs (its case modules), at 2 ranks through the library
path, and Horovod's API cases of tests/horovod_api_cases.py and horovod_api_calls.py (one job;
one more after a case that hangs), each give the verdict the pages' column for this stack says.
Figures are not compared, only verdicts, and a verdict carries its figures' meaning
(``identical``: 0.0 across ranks; ``= 1 rank at 2B``: within 1e-5 of the reference). The
control is in the job itself: a plain, unwrapped optimizer must end with ranks that differ."""
from __future__ import annotations

import pytest

import guarantees_table as table
import horovod_api_page

pytestmark = [pytest.mark.multirank, pytest.mark.core,
              pytest.mark.timeout(table.JOB_TIMEOUT_S + 300)]


def test_every_verdict_of_docs_guarantees_md_holds_on_this_stack(tmp_path):
    results = table.run_stack(tmp_path)
    found = table.verdicts(results)
    for row in found.values():
        print(f"{row.case:30} {row.verdict:28} {table.figure(row.across):>8} "
              f"{table.figure(row.to_2b):>8}  {row.detail}")
    print(f"{results['stack']}: {results['jobs']} job(s), {results['seconds']:.0f} s")
    expected = {**table.parse(table.DOC.read_text())[results["key"]],
                **table.parse(horovod_api_page.generated_part(
                    horovod_api_page.DOC.read_text()))[results["key"]]}
    assert table.mismatches(expected, found) == []
    # The control: without the all-reduce the ranks part ways, so "identical" is a finding.
    control = found["control_plain_optimizer"]
    assert control.verdict == table.DIFFERS and control.across > 1e-3, control
    # Horovod's callbacks bring the consistency check: a forgotten DistributedOptimizer stops.
    assert found["hvd_control_not_wrapped"].verdict == table.REFUSED
