"""servescope as a pytest plugin: ``llm_server``, ``llm_load``, ``llm_benchmark`` and SLO checks (see plugin.py).

What a test imports from here: :class:`LoadRun` (what ``llm_load`` returns), :func:`check_slo` and
:class:`SLOViolation`. Nothing here imports more than the standard library at load time.
"""

from loadtests.pytest_plugin.results import Distribution, Goodput, LoadRun, Verdict
from loadtests.pytest_plugin.slo import SLOViolation, check_slo

__all__ = ["Distribution", "Goodput", "LoadRun", "SLOViolation", "Verdict", "check_slo"]
