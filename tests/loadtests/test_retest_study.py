"""The retest study's claims, scenario by scenario (slow: each is two full diagnose runs; run them alone).

For each labelled scenario the prediction names the lever that binds, pulling it with ``--retest``
improves output throughput by at least 10%, and the predicted throughput is within 20% of the measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from studies.retest_study import SCENARIOS, StudyScenario, run_scenario

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_named_lever_pulled_gains_as_predicted(scenario: StudyScenario, tmp_path: Path) -> None:
    result = run_scenario(scenario, tmp_path)
    assert result["named"] == scenario.expected_lever, result
    pull = result["pull"]
    assert pull is not None and pull["lever"] == scenario.expected_lever
    assert pull["measured_gain"] >= 1.1, pull
    assert abs(pull["errors"]["output_throughput"]) <= 0.20, pull
