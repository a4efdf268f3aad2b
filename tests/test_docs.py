"""The prose stays findable: README short, every relative link resolving, every command and flag in docs/cli.md."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pipeforge.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
README_WORDS = 1400  # the issue asks for about 1,200: essentials only, the rest in docs/
PAGES = sorted([README, *(ROOT / "docs").glob("*.md"), *ROOT.glob("*/README.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SHARED = "What every command shares"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


def test_readme_stays_short():
    words = len(README.read_text().split())
    assert words <= README_WORDS, f"README.md has {words} words (at most {README_WORDS}): move details to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in _relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def _sections(text: str) -> dict[str, str]:
    """docs/cli.md cut at its `## ` headings: heading -> the text below it."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _named(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def test_every_command_has_its_section_in_cli_doc():
    sections = _sections(CLI_DOC.read_text())
    commands = _subparsers()
    assert sorted(commands) == sorted(COMMANDS)
    missing = [name for name in commands if name not in sections]
    assert not missing, f"docs/cli.md has no '## NAME' section for {missing}"
    readme = README.read_text()
    assert [name for name in commands if f"`pipeforge {name}" not in readme] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_is_in_cli_doc(command):
    """Each flag of `pipeforge COMMAND --help` is named in the command's section or among the shared flags."""
    sections = _sections(CLI_DOC.read_text())
    text = sections.get(command, "") + sections[SHARED]
    flags = [flag for action in _subparsers()[command]._actions for flag in action.option_strings]
    assert flags
    missing = [flag for flag in flags if not _named(flag, text)]
    assert not missing, f"docs/cli.md, '## {command}': add a line for {missing}"


def test_the_checks_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n[gone](missing.md) [here](#title) [not](#nowhere)\n")
    assert _relative_links(page) == ["missing.md", "#title", "#nowhere"]
    assert _anchors(page) == {"title"}
    assert not _named("--solve", "`--solved`") and _named("-o", "`-o OUT`") and not _named("-o", "--output")


def _mentions(pattern: str) -> list[tuple[str, str]]:
    """(file, match) of ``pattern`` in the prose, code and scripts that name benchmarks."""
    files = [*PAGES, *ROOT.glob("pipeforge/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py"),
             *ROOT.glob("scripts/*"), *ROOT.glob("examples/*.py")]
    return [(str(f.relative_to(ROOT)), m) for f in files if f.is_file() and f != Path(__file__)
            for m in re.findall(pattern, f.read_text(errors="replace"))]


def test_named_benchmarks_exist():
    paths = [(f, m) for f, m in _mentions(r"benchmarks/[\w/]+\.\w+") if not (ROOT / m).exists()]
    modules = [(f, m) for f, m in _mentions(r"-m (benchmarks(?:\.\w+)+)")
               if not (ROOT / (m.replace(".", "/") + ".py")).exists()]
    assert not paths + modules, f"named but missing: {paths + modules}"


def test_benchmarks_leave_sys_path_alone():
    """They run as ``python -m benchmarks.KIND.NAME`` from the root: no script edits ``sys.path``."""
    edits = [str(f.relative_to(ROOT)) for f in ROOT.glob("benchmarks/**/*.py") if "sys.path" in f.read_text()]
    assert edits == []


ROOTED = re.compile(r"(?<![\w/.])((?:pipeforge|tests|scripts|examples|templates|grammar)/[\w/.-]+\.(?:py|md|j2|lark|pipe|sh))")
PACKAGE_RELATIVE = re.compile(
    r"`((?:sim|verifier|runtime|optimizer|passes|lang|interop|render|tools|models|library|commands)/[\w/]+\.py)`")


def test_named_source_files_exist():
    """A file the prose names (``pipeforge/sim/workgraph.py``, or ``sim/workgraph.py`` in README and docs/)
    is there: a module moved or renamed takes its mentions with it."""
    gone = []
    for page in PAGES:
        text = page.read_text()
        gone += [(page.name, path) for path in ROOTED.findall(text) if not (ROOT / path).exists()]
        if page.parent.name == "docs" or page == README:
            gone += [(page.name, path) for path in PACKAGE_RELATIVE.findall(text)
                     if not (ROOT / "pipeforge" / path).exists()]
    assert not gone, f"named but missing: {sorted(set(gone))}"


def test_the_file_patterns_find_what_they_should():
    assert ROOTED.findall("`pipeforge/sim/gone.py`, benchmarks/x.py") == ["pipeforge/sim/gone.py"]
    assert PACKAGE_RELATIVE.findall("`sim/gone.py` and sim/bare.py") == ["sim/gone.py"]
