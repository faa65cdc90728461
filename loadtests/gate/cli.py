"""``servescope gate``: fail CI on a regression.

Two modes:

- checks against floors and a baseline run (``--bench``, ``--probe-bench``, ``--baseline``/``--current``),
  decided by ``reports.gate.floors``;
- ``--ab``: two builds (``--ab REF``: the git ref against this work tree) or two engine configurations of
  one build (``--ab --base FLAGS --candidate FLAGS``), run interleaved here and decided by
  ``reports.gate.verdict``.

Exit status: 0 pass, 1 regression, 2 usage (bad or missing input, a check that cannot be made).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtests.workloads.catalog import WORKLOADS
from reports.gate.stats import DEFAULT_CONFIDENCE, min_samples
from reports.gate.verdict import DEFAULT_THRESHOLD

if TYPE_CHECKING:
    from loadtests.gate.ab import ABRun, SideSpec
    from reports.gate.verdict import ABVerdict

NO_REF = ""  # ``--ab`` given without a ref: two configurations of one build
AB_NAME = "ab.json"  # in --out, beside steps_base.parquet and steps_candidate.parquet


def _usage(message: str) -> int:
    print(f"servescope gate: error: {message}", file=sys.stderr)
    return 2


def _cmd_gate(args: argparse.Namespace) -> int:
    if args.ab is None:
        if args.base is not None or args.candidate is not None or args.flags is not None:
            return _usage("--base, --candidate and --flags belong to --ab")
        return _floors_gate(args)
    if args.bench or args.probe_bench or args.baseline or args.current:
        return _usage("--ab runs its own measurement; give it no --bench, --probe-bench, --baseline or --current")
    try:
        return _ab_gate(args)
    except ValueError as exc:
        return _usage(str(exc))


def _floors_gate(args: argparse.Namespace) -> int:
    from reports.gate.floors import format_rows, run_gate

    try:
        result = run_gate(args.floors, args.bench, args.probe_bench, args.baseline, args.current)
    except (ValueError, FileNotFoundError) as exc:
        return _usage(str(exc))
    print(format_rows(result.rows))
    for line in result.not_checked:
        print(f"not checked: {line}")
    failed = [r.metric for r in result.rows if not r.passed]
    print(f"gate: {'FAIL: ' + ', '.join(failed) if failed else 'pass'}")
    return 1 if failed else 0


def _ab_sides(args: argparse.Namespace, stack: ExitStack) -> tuple[SideSpec, SideSpec]:
    from loadtests.gate.ab import SideSpec, engine_config_of, installed_tree, repo_root, tree_at_ref

    both = shlex.split(args.flags or "")
    base_flags = shlex.split(args.base) if args.base is not None else both
    candidate_flags = shlex.split(args.candidate) if args.candidate is not None else both
    if args.ab == NO_REF:
        if args.base is None and args.candidate is None and args.flags is None:
            raise ValueError("--ab without a git ref compares two configurations: give --base FLAGS and "
                             "--candidate FLAGS (--flags alone runs both sides alike, an A/A run that shows "
                             "the noise), or --ab REF to compare a git ref against this work tree")
        for flags in (base_flags, candidate_flags):
            engine_config_of(flags)  # NOTE: bad flags are a usage error before any process starts
        tree = installed_tree()
        return SideSpec("base", tree, base_flags), SideSpec("candidate", tree, candidate_flags)
    repo = repo_root(Path(args.repo))
    if not (repo / "engine" / "__init__.py").is_file():
        raise ValueError(f"{repo} holds no engine/ package: run from a servescope work tree or give --repo")
    base_tree = stack.enter_context(tree_at_ref(args.ab, repo))
    return (SideSpec("base", base_tree, base_flags, ref=args.ab),
            SideSpec("candidate", repo, candidate_flags, ref="work tree"))


def _ab_gate(args: argparse.Namespace) -> int:
    from loadtests.gate.ab import WorkerError, run_ab
    from reports.gate.verdict import decide, format_verdict

    if not 0 < args.confidence < 1:
        raise ValueError(f"--confidence must be between 0 and 1, got {args.confidence}")
    if not args.threshold > -1:
        raise ValueError(f"--threshold must be above -1 (a share: 0.05 is 5%), got {args.threshold}")
    if args.rounds < min_samples(args.confidence):
        raise ValueError(f"--rounds {args.rounds} cannot give a {args.confidence:.0%} interval; give at least "
                         f"{min_samples(args.confidence)}")
    for name, least in (("num_prompts", 1), ("concurrency", 1), ("warmup_rounds", 0)):
        if getattr(args, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}")
    with ExitStack() as stack:
        base, candidate = _ab_sides(args, stack)
        print(f"servescope gate --ab: {args.rounds} rounds in alternating order, {args.num_prompts} "
              f"{args.workload} requests per round, {args.concurrency} in flight", file=sys.stderr)
        try:
            run = run_ab(base, candidate, workload=args.workload, num_prompts=args.num_prompts,
                         concurrency=args.concurrency, max_tokens=args.max_tokens, seed=args.seed,
                         rounds=args.rounds, warmup_rounds=args.warmup_rounds)
        except WorkerError as exc:
            return _usage(str(exc))
    verdict = decide(run.base.steps(), run.base.round_s, run.candidate.steps(), run.candidate.round_s,
                     args.threshold, args.confidence, run.ratios(args.clock))
    print(f"clock: {args.clock} time per round", file=sys.stderr)
    print(format_verdict(verdict, (base.describe(), candidate.describe())))
    if args.out:
        _write_ab(Path(args.out), run, verdict, args.clock)
    return 0 if verdict.passed else 1


def _write_ab(out: Path, run: ABRun, verdict: ABVerdict, clock: str) -> None:
    """``ab.json`` (the verdict, per-round times, both configs) and each side's step table as Parquet."""
    out.mkdir(parents=True, exist_ok=True)
    record = {"verdict": verdict.to_dict(), "workload": run.workload, "clock": clock,
              "ratios": run.ratios(clock), "wall_ratios": run.ratios("wall"), "cpu_ratios": run.ratios("cpu")}
    for name, side in (("base", run.base), ("candidate", run.candidate)):
        record[name] = {"flags": side.spec.flags, "ref": side.spec.ref, "config": side.config,
                        "round_s": side.round_s, "round_cpu_s": side.round_cpu_s}
        side.steps().to_parquet(out / f"steps_{name}.parquet", index=False)
    (out / AB_NAME).write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {out / AB_NAME} and the step tables", file=sys.stderr)


def register_gate(subparsers: Any) -> None:
    """Add ``servescope gate``."""
    p = subparsers.add_parser(
        "gate", help="fail CI when a build or configuration regresses (floors, a baseline run, or --ab)",
        description="Exit 0 on pass, 1 on a regression, 2 on bad input or a check that cannot be made.")
    floors = p.add_argument_group("floors and baseline runs")
    floors.add_argument("--floors", default=None, help="TOML of floors and allowed regressions (default: the bundled one)")
    floors.add_argument("--bench", default=None, help="`servescope bench --json` output (ratios measured in one run)")
    floors.add_argument("--probe-bench", default=None,
                        help="pytest-benchmark JSON of tests/benchmarks/test_probe_overhead.py")
    floors.add_argument("--baseline", default=None, help="baseline run directory (serving figures)")
    floors.add_argument("--current", default=None, help="current run directory, compared with --baseline")
    ab = p.add_argument_group("A/B: two builds or two configurations, interleaved in one run")
    ab.add_argument("--ab", nargs="?", const=NO_REF, default=None, metavar="REF",
                    help="run A/B; with REF, the build at that git ref (base) against the work tree (candidate)")
    ab.add_argument("--base", default=None, metavar="FLAGS", help="engine flags of the base side, quoted")
    ab.add_argument("--candidate", default=None, metavar="FLAGS", help="engine flags of the candidate side, quoted")
    ab.add_argument("--flags", default=None, metavar="FLAGS", help="engine flags of both sides (--base/--candidate "
                                                                  "replace them for one side)")
    ab.add_argument("--repo", default=".", help="with --ab REF: the git work tree to compare (default: here)")
    ab.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                    help="fail when the interval lies above this slowdown (default %(default)s = 5%%)")
    ab.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, help="of the interval (default %(default)s)")
    ab.add_argument("--rounds", type=int, default=20, help="measured rounds, each side once per round "
                                                          "(default %(default)s)")
    ab.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first (default %(default)s)")
    ab.add_argument("--workload", default="mixed", choices=sorted(WORKLOADS))
    ab.add_argument("--num-prompts", type=int, default=16, help="requests per round (default %(default)s)")
    ab.add_argument("--concurrency", type=int, default=16, help="requests in flight (default %(default)s)")
    ab.add_argument("--max-tokens", type=int, default=32, help="cap on output tokens per request (default %(default)s)")
    ab.add_argument("--seed", type=int, default=0, help="of the first round's requests (default %(default)s)")
    ab.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="what a round's time is: wall time (default), or the side's own CPU time, which does "
                         "not count time the OS gave to other processes (a shared machine) but misses waiting")
    ab.add_argument("--out", default=None, help="write ab.json and both sides' step tables here")
    p.set_defaults(func=_cmd_gate)
