"""The pieces of a plain Locust run that need no Locust process: run directories, options, the config."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from loadtests.run.plain_run import fresh_run_dir, normalize_web_ui_options, plain_config


def options(**overrides: object) -> Namespace:
    """The --ss-* options (and Locust's own that a plain run reads) at their defaults, as Locust parses them."""
    base = {"ss_rate": 0.0, "ss_duration": None, "ss_warmup": 0.0, "ss_workload": "sharegpt-synth", "ss_seed": 0,
            "ss_max_tokens": None, "ss_burstiness": 1.0, "ss_burst_size": None, "ss_api": "completions",
            "ss_ignore_eos": 1, "ss_tokenizer": None, "ss_plan": None, "run_time": None, "stop_timeout": 0}
    return Namespace(**{**base, **overrides})


def test_each_test_gets_a_fresh_run_directory(tmp_path: Path) -> None:
    base = tmp_path / "run"
    assert fresh_run_dir(base) == base  # new
    base.mkdir()
    assert fresh_run_dir(base) == base  # empty
    (base / "load.json").write_text("{}")
    assert fresh_run_dir(base) == tmp_path / "run-2"
    (tmp_path / "run-2").mkdir()
    (tmp_path / "run-2" / "load.json").write_text("{}")
    assert fresh_run_dir(base) == tmp_path / "run-3"


def test_options_a_swarm_request_sent_as_text_get_their_types_back() -> None:
    opts = options(ss_duration="12.5", ss_max_tokens="", ss_burst_size="4", ss_tokenizer=" ")
    normalize_web_ui_options(opts)
    assert (opts.ss_duration, opts.ss_max_tokens, opts.ss_burst_size, opts.ss_tokenizer) == (12.5, None, 4, None)
    with pytest.raises(ValueError, match="--ss-max-tokens must be a whole number"):
        normalize_web_ui_options(options(ss_max_tokens="many"))


def test_the_plain_config_follows_locusts_users_or_the_rate() -> None:
    closed = plain_config(options(run_time=30), num_users=5, num_workers=2)
    assert (closed.users, closed.rate, closed.duration_s, closed.processes) == (5, None, 30.0, 2)
    assert plain_config(options(), num_users=1, num_workers=3).users == 3  # never fewer users than workers
    opened = plain_config(options(ss_rate=2.5, ss_workload="burst"), num_users=1, num_workers=1)
    assert (opened.users, opened.rate, opened.burst_size) == (None, 2.5, 8)  # the burst workload's default size
