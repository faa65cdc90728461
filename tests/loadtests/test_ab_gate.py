"""`servescope gate --ab`: usage errors exit 2 before any engine starts; one short real A/B run on dummy:tiny."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from loadtests.cli import main
from loadtests.gate.ab import repo_root, tree_at_ref

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "message"), [
    (["--ab"], "give --base FLAGS and --candidate FLAGS"),
    (["--base", "--model dummy:tiny"], "--base, --candidate and --flags belong to --ab"),
    (["--ab", "--flags", "--model dummy:tiny", "--bench", "b.json"], "--ab runs its own measurement"),
    (["--ab", "--flags", "--model dummy:tiny", "--rounds", "5"], "--rounds 5 cannot give a 95% interval"),
    (["--ab", "--base", "--model dummy:tiny", "--candidate", "--model dummy:smollm2-shape"],
     "both sides must serve the same model"),
    (["--ab", "--base", "--model dummy:tiny", "--candidate", "--model dummy:tiny --max-num-seqs 0"],
     "bad engine flags '--model dummy:tiny --max-num-seqs 0': max_num_seqs must be"),
    (["--ab", "--base", "--model dummy:tiny", "--candidate", "--model dummy:tiny --no-such-flag 3"],
     "unrecognized arguments: --no-such-flag 3"),
    (["--ab", "--flags", "--model dummy:tiny", "--num-prompts", "0"], "--num-prompts must be >= 1"),
    (["--ab", "--flags", "--model dummy:tiny", "--confidence", "95"], "--confidence must be between 0 and 1"),
    (["--ab", "no-such-ref-anywhere", "--repo", str(ROOT)], "cannot read 'no-such-ref-anywhere'"),
])
def test_usage_errors_exit_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    if "--repo" in argv and shutil.which("git") is None:
        pytest.skip("git is not installed")
    assert main(["gate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("error:") == 1


def test_a_ref_is_read_into_its_own_tree() -> None:
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                                     capture_output=True).returncode:
        pytest.skip("not a git checkout")
    assert repo_root(ROOT / "engine") == ROOT
    with tree_at_ref("HEAD", ROOT) as tree:
        assert (tree / "engine" / "__init__.py").is_file()
        assert tree != ROOT
    assert not tree.exists()


def test_a_short_real_ab_run_names_the_batching_bottleneck(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Four sequences a step against one: every request's tokens take their own steps, so the steps per
    round (a count, not a time) grow about fourfold and the breakdown names batching, however noisy the
    machine; the verdict and its exit status must agree with the interval it prints."""
    out = tmp_path / "ab"
    flags = "--model dummy:tiny --num-threads 1 --max-model-len 256"
    code = main(["gate", "--ab", "--base", f"{flags} --max-num-seqs 4", "--candidate", f"{flags} --max-num-seqs 1",
                 "--rounds", "6", "--warmup-rounds", "1", "--workload", "fixed", "--num-prompts", "4",
                 "--concurrency", "4", "--max-tokens", "4", "--out", str(out)])
    printed = capsys.readouterr().out
    record = json.loads((out / "ab.json").read_text())
    verdict = record["verdict"]
    assert code == (0 if verdict["passed"] else 1)
    assert verdict["passed"] == (verdict["slowdown"]["low"] <= 0.05)
    assert len(record["ratios"]) == 6 == len(record["base"]["round_s"]) == len(record["candidate"]["round_s"])
    assert record["candidate"]["config"]["max_num_seqs"] == 1
    assert verdict["breakdown"]["bottleneck"] == "batching"
    assert verdict["candidate"]["peak_seqs"] == 1 and verdict["base"]["peak_seqs"] == 4
    assert verdict["candidate"]["steps_per_round"] > 2.5 * verdict["base"]["steps_per_round"]
    steps = pd.read_parquet(out / "steps_candidate.parquet")
    assert sorted(steps["round"].unique()) == list(range(6))
    assert (steps["num_seqs"] == 1).all()
    assert "slowdown: " in printed and "interval" in printed
    assert printed.splitlines()[-1].startswith("gate: FAIL" if code else "gate: pass")
