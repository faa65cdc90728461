"""README.md and docs/*.md say only what exists: every relative link (file and ``#anchor``) resolves,
and every flag written next to a ``servescope <command>`` in code is one that command's parser takes.

The parser is the installed command's own (``[project.scripts]`` in pyproject.toml names its module,
which builds it with ``build_parser``), so a renamed or dropped flag fails here, not in a reader's shell.
"""

from __future__ import annotations

import argparse
import importlib
import re
import tomllib
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# docs/notes-NAME.md are helpers' scratch notes on their way into the pages, not documentation.
DOC_FILES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if not p.name.startswith("notes-"))]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# [text](target) and ![alt](target); the target stops at whitespace (a title may follow) or ')'.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# `servescope` as a word of its own (not ~/.cache/servescope, not servescope:metric), then its command.
COMMAND = re.compile(r"(?<![\w/.:$-])servescope\s+([-\w]+)")
FLAG = re.compile(r"(?<![\w-])(--[a-zA-Z][\w-]*)")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")
# Where one shell command ends and the next begins (what follows is not the servescope command's).
COMMAND_END = re.compile(r"\s(?:&&|\|\||\||;|&)\s|\s#\s|\s#$")


def split_code(text: str) -> tuple[str, list[str]]:
    """The markdown with its code blanked out, and the code: each fenced block's logical lines (backslash
    continuations joined) and each inline span. Blanking keeps links written inside code out of the check."""
    prose: list[str] = []
    code: list[str] = []
    block: list[str] | None = None
    indented = False
    for line in text.splitlines():
        if FENCE.match(line):
            if block is None:
                block = []
            else:
                code.extend(_logical_lines(block))
                block = None
            prose.append("")
            continue
        if block is not None:
            block.append(line)
            prose.append("")
            continue
        # An indented block (4 spaces after a blank line) is code too, as in the README's shell snippets.
        if line.startswith("    ") and (indented or not prose or not prose[-1].strip()) and not _in_list(prose):
            indented = True
            code.extend(_logical_lines([line]))
            prose.append("")
            continue
        indented = False
        prose.append(line)
    if block is not None:
        code.extend(_logical_lines(block))
    joined = "\n".join(prose)
    code.extend(m.group(2) for m in CODE_SPAN.finditer(joined))
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), joined), code


def _in_list(prose: list[str]) -> bool:
    """Whether the last non-blank line is a list item (its indented lines continue it, not code)."""
    for line in reversed(prose):
        if line.strip():
            return bool(re.match(r"\s*([-*+]|\d+\.)\s", line)) or line.startswith("  ")
    return False


def _logical_lines(lines: list[str]) -> list[str]:
    joined = "\n".join(lines).replace("\\\n", " ")
    return joined.splitlines()


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens, and
    -1, -2, ... on repeats."""
    prose, _ = split_code(_unblank_headings(text))
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose.splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        slug = "".join(c for c in title.lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
        slug = slug.replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _unblank_headings(text: str) -> str:
    """Headings keep their code spans' text for the anchor (GitHub drops only the backticks)."""
    return "\n".join(line.replace("`", "") if HEADING.match(line) else line for line in text.splitlines())


def broken_links(text: str, path: Path) -> list[str]:
    """Each relative link in ``text`` (a page at ``path``) whose file or heading anchor does not exist."""
    prose, _ = split_code(text)
    problems = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.name}: link to {target}: no file {dest}")
            continue
        if anchor and dest.suffix == ".md":
            page = text if dest == path else dest.read_text(encoding="utf-8")
            if anchor not in heading_anchors(page):
                problems.append(f"{path.name}: link to {target}: no heading #{anchor} in {dest.name}")
    return problems


def documented_flags(text: str) -> Iterator[tuple[str, str]]:
    """(command, flag) for every ``--flag`` after ``servescope <command>`` in the same piece of code,
    up to the end of that shell command. Quoted strings are skipped: they hold another command's flags
    (``gate --base "--model M"``). ``command`` is ``""`` for ``servescope --flag``."""
    _, code = split_code(text)
    for piece in code:
        piece = QUOTED.sub(" ", piece)
        for m in COMMAND.finditer(piece):
            rest = piece[m.start(1):]
            end = COMMAND_END.search(rest)
            rest = rest[:end.start()] if end else rest
            nxt = COMMAND.search(rest)
            rest = rest[:nxt.start()] if nxt else rest
            word = m.group(1)
            command = "" if word.startswith("--") else word
            if command:
                yield command, ""
            for flag in FLAG.findall(rest):
                yield command, flag


# A repository path in code: under one of these top-level folders, with an optional ::test node id.
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:engine|probes|loadtests|reports|tests|studies|docs|\.ci|\.github)/[\w./*-]*[\w*]/?)"
                       r"(?:::(\w+))?")
# `python -m pkg.module`; a placeholder (`studies.NAME`) is not a module name and is not matched.
MODULE = re.compile(r"python3?\s+-m\s+((?:engine|probes|loadtests|reports|tests|studies)(?:\.[a-z_]\w*)+)\b(?!\.)")


def missing_paths(text: str, root: Path) -> list[str]:
    """Repository paths (``engine/scheduler.py``, ``tests/x.py::test_y``) and ``python -m`` modules named in
    code that do not exist under ``root``."""
    _, code = split_code(text)
    problems = []
    for piece in code:
        for path, test in REPO_PATH.findall(piece):
            dest = root / path
            if "*" in path:
                if not any(root.glob(path)):
                    problems.append(f"nothing matches {path}")
            elif not dest.exists():
                problems.append(f"no {path}")
            elif test and f"def {test}(" not in dest.read_text(encoding="utf-8"):
                problems.append(f"no test {test} in {path}")
        for module in MODULE.findall(piece):
            base = root / module.replace(".", "/")
            if not (base.with_suffix(".py").exists() or (base / "__init__.py").exists()):
                problems.append(f"no module {module}")
    return sorted(set(problems))


@cache
def servescope_parser() -> argparse.ArgumentParser:
    """The parser of the installed ``servescope`` command, from the module pyproject.toml names."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module = importlib.import_module(scripts["servescope"].split(":")[0])
    return module.build_parser()


def command_options(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """Each subcommand's option strings, and the top level's under ``""``."""
    options = {"": set(parser._option_string_actions)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options[name] = set(sub._option_string_actions)
    return options


def unknown_flags(text: str, options: dict[str, set[str]], page: str) -> list[str]:
    problems = []
    for command, flag in documented_flags(text):
        if command not in options:
            problems.append(f"{page}: `servescope {command}` is not a command")
        elif flag and flag not in options[command]:
            problems.append(f"{page}: `servescope {command}` has no flag {flag}")
    return sorted(set(problems))


def test_the_docs_pages_exist() -> None:
    names = {p.name for p in DOC_FILES}
    for page in ("README.md", "getting-started.md", "servers.md", "load.md", "gating.md", "concepts.md",
                 "engine.md", "results.md"):
        assert page in names


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path.read_text(encoding="utf-8"), path) == []


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_every_documented_flag_exists(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert unknown_flags(text, command_options(servescope_parser()), path.name) == []


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_every_repository_path_exists(path: Path) -> None:
    assert missing_paths(path.read_text(encoding="utf-8"), ROOT) == []


def test_readme_keeps_the_two_set_up_commands() -> None:
    """.ci/run installs and tests exactly as README's second command says; the first is the main job."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && servescope diagnose --out runs/first"
            in readme)
    assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest" in readme


def test_a_page_documents_some_flags() -> None:
    """The flag check sees the README's commands (so an empty extraction cannot pass it)."""
    flags = set(documented_flags((ROOT / "README.md").read_text(encoding="utf-8")))
    assert ("diagnose", "--out") in flags
    assert ("load", "--target") in flags


# A row of concepts.md's rules table: | `name` | bottleneck | >= 0.3 | figure |
RULE_ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| (>=|<=) ([\d.]+) \|", re.MULTILINE)


def listed_rules() -> dict[str, tuple[str, str, float]]:
    """Every rule the verdict evaluates: name -> (bottleneck, comparison, threshold)."""
    importlib.import_module("reports.verdict.diagnosis")  # imports every rule module
    try:
        rules = list(importlib.import_module("reports.verdict.rules").RULES)
    except ModuleNotFoundError:  # NOTE: before the rules were listed in one tuple, a registry dict held them
        rules = list(importlib.import_module("reports.verdict.evidence").RULES.values())
    return {r.name: (r.bottleneck, r.comparison, float(r.threshold)) for r in rules}


def test_the_rules_table_lists_every_rule_with_its_threshold() -> None:
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    documented = {name: (bottleneck, comparison, float(threshold))
                  for name, bottleneck, comparison, threshold in RULE_ROW.findall(text)}
    assert documented == listed_rules()


SYNTHETIC = """# A page

## Worked `servescope diagnose` example

See [the example](#worked-servescope-diagnose-example), [nothing](#no-such-heading),
[a page](no-such-page.md) and [the readme](README.md#servescope).

```bash
servescope diagnose --users 8 \\
    --made-up-flag 3 --out runs/x     # --also-made-up is a comment
servescope gate --ab --base "--model dummy:tiny" && ls --color
```

Inline: `servescope load --target URL --not-a-load-flag`, `servescope frobnicate`.

Paths: `tests/test_docs.py::test_the_checks_fail_on_a_made_up_flag_and_a_broken_link`, `reports/nowhere.py`,
`tests/test_docs.py::test_nothing_of_the_kind`, `python -m tests.no_such_study DIR`.
"""


def test_the_checks_fail_on_a_made_up_flag_and_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# servescope\n")
    page = tmp_path / "page.md"
    page.write_text(SYNTHETIC)
    options = {"": {"--help"}, "diagnose": {"--users", "--out"}, "gate": {"--ab", "--base"},
               "load": {"--target"}}
    assert unknown_flags(SYNTHETIC, options, "page.md") == [
        "page.md: `servescope diagnose` has no flag --made-up-flag",
        "page.md: `servescope frobnicate` is not a command",
        "page.md: `servescope load` has no flag --not-a-load-flag",
    ]
    assert missing_paths(SYNTHETIC, ROOT) == [
        "no module tests.no_such_study", "no reports/nowhere.py",
        "no test test_nothing_of_the_kind in tests/test_docs.py",
    ]
    real = command_options(servescope_parser())
    assert unknown_flags("`servescope diagnose --made-up-flag`", real, "x") == [
        "x: `servescope diagnose` has no flag --made-up-flag"]
    problems = broken_links(SYNTHETIC, page)
    assert [p.split(":")[1].strip() for p in problems] == ["link to #no-such-heading", "link to no-such-page.md"]
