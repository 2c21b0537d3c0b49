"""The docs site builds strictly, and the pages and README name only what exists.

MkDocs checks links between pages, anchors, the nav and the API pages' objects (``mkdocs build --strict`` with the
``validation`` settings of mkdocs.yml). What it cannot see is checked here: the repository paths the pages and the
README name, the options shown for the commands under ``scripts/`` and ``lab/``, the
``agents.``/``gagpo_gym.``/``wrappers.`` names, the code's citations of docs pages and their anchors, and the README's
result tables against their reports.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
# Top-level entries a path in the docs can start with (env ids like gagpo_gym/Maze-v0 are not paths: see is_path).
# Top-level folders and files a clean checkout has (an ignored local folder such as runs/ is not the repository's).
TOP = {
    line.split("/", 1)[0]
    for line in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
}
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
ENV_ID = re.compile(r"^gagpo_gym/[A-Z]")
OPTION = re.compile(r"^--[a-z][\w-]*")
HELP_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
DOTTED = re.compile(r"^(agents|gagpo_gym|wrappers)(\.[A-Za-z_]\w*)+$")
CITATION = re.compile(r"\bdocs/([\w/-]+\.md)(#[\w-]+)?")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def code_of(text: str) -> tuple[list[str], list[str]]:
    """The fenced blocks and the inline code spans (outside the blocks) of a Markdown text."""
    blocks = FENCE.findall(text)
    return blocks, INLINE.findall(FENCE.sub("", text))


def tokens(text: str) -> Iterator[str]:
    for token in re.split(r"[\s'\"(),;=\[\]]+", text):
        token = token.rstrip(".:")
        if token:
            yield token


def is_path(token: str) -> bool:
    head = token.split("/", 1)[0]
    return "/" in token and head in TOP and not ENV_ID.match(token) and not re.search(r"[<>{}]|\.\.\.", token)


def path_exists(token: str) -> bool:
    path = token.split("#", 1)[0]
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def named_paths(page: Path) -> Iterator[str]:
    """Repository paths in a page's code (inline and fenced), and in the README's links (a docs page's links are
    relative to the page: MkDocs checks them)."""
    text = page.read_text(encoding="utf-8")
    blocks, spans = code_of(text)
    for chunk in [*blocks, *spans]:
        yield from (t for t in tokens(chunk) if is_path(t))
    if page.name == "README.md" and page.parent == ROOT:
        yield from (target for target in LINK.findall(text) if is_path(target))


def headings(page: Path) -> set[str]:
    """The anchors of a Markdown page, as MkDocs' toc extension makes them."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors = set()
    for title in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        anchors.add(slugify(plain, "-"))
    return anchors


def test_mkdocs_strict_build(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert (site / "algorithm" / "index.html").is_file() and (site / "api" / "agent" / "index.html").is_file()


def test_named_repository_paths_exist() -> None:
    missing = [f"{rel(page)}: {path}" for page in PAGES for path in named_paths(page) if not path_exists(path)]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_readme_links_and_anchors_exist() -> None:
    """The README's links into docs/ (MkDocs does not build the README): the page and its anchor."""
    broken = []
    for target in LINK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        page = ROOT / path
        if not page.exists() or (anchor and anchor not in headings(page)):
            broken.append(target)
    assert not broken, f"README.md links to missing pages or anchors: {broken}"


def test_code_citations_of_docs_pages_exist() -> None:
    """``docs/algorithm.md#key-back-off`` in a docstring or comment names a page and a section that exist."""
    broken = []
    for folder in ("agents", "gagpo_gym", "wrappers", "scripts", "lab", "tests", "configs"):
        for source in sorted((ROOT / folder).rglob("*")):
            if source.suffix not in {".py", ".yaml", ".md"} or source == Path(__file__).resolve():
                continue
            for page, anchor in CITATION.findall(source.read_text(encoding="utf-8")):
                target = DOCS / page
                if not target.is_file() or (anchor and anchor[1:] not in headings(target)):
                    broken.append(f"{rel(source)}: docs/{page}{anchor}")
    assert not broken, "citations of missing docs pages or sections:\n" + "\n".join(broken)


def test_dotted_names_resolve() -> None:
    unresolved = []
    for page in PAGES:
        for span in code_of(page.read_text(encoding="utf-8"))[1]:
            if DOTTED.match(span) and not resolves(span):
                unresolved.append(f"{rel(page)}: {span}")
    assert not unresolved, "names in the docs that do not exist:\n" + "\n".join(unresolved)


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


# ----- command-line options -------------------------------------------------------------------------------------


class _Parsed(Exception):
    """Raised instead of parsing, once a command's main() hands its parser over."""


@cache
def script_files() -> dict[str, list[Path]]:
    files: dict[str, list[Path]] = {}
    for path in sorted([*(ROOT / "scripts").rglob("*.py"), *(ROOT / "lab").rglob("*.py")]):
        files.setdefault(path.name, []).append(path)
    return files


def command_file(token: str) -> Path | None:
    """The script a token names: a path from the root, or a name unique under scripts/ and lab/ (``eval.py``)."""
    if token.startswith(("scripts/", "lab/")) and token.endswith(".py"):
        return ROOT / token
    matches = script_files().get(token, []) if re.fullmatch(r"\w+\.py", token) else []
    return matches[0] if len(matches) == 1 else None


@cache
def accepted_options(command: str) -> frozenset[str]:
    """The option strings a command's parser accepts: its main() is run until it parses, then stopped."""
    if command.startswith("-m "):
        module = importlib.import_module(command[3:])
    else:
        path = ROOT / command
        sys.path.insert(0, str(path.parent))  # a script may import a module beside it (bench/checkouts.py)
        try:
            spec = importlib.util.spec_from_file_location(f"docs_check_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.parent))
    seen: list[argparse.ArgumentParser] = []
    parse = argparse.ArgumentParser.parse_known_args
    add_subparsers = argparse.ArgumentParser.add_subparsers
    commands: list[Any] = []  # the sub-command actions (alfworld_compare.py train ...): their parsers' options count

    def record(self: argparse.ArgumentParser, **kwargs: Any) -> Any:
        commands.append(add_subparsers(self, **kwargs))
        return commands[-1]

    def capture(self: argparse.ArgumentParser, args=None, namespace=None):
        seen.append(self)
        if self.add_help:  # the command's own parser; a pre-parser (train.py's --recipe) parses through
            raise _Parsed
        return parse(self, args, namespace)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture),
        mock.patch.object(argparse.ArgumentParser, "add_subparsers", record),
        mock.patch.object(sys, "argv", [command]),
        pytest.raises(_Parsed),
    ):
        module.main()
    # the options as each parser's own help lists them (argparse keeps its table of actions private)
    seen += [parser for action in commands for parser in action.choices.values()]
    return frozenset(option for parser in seen for option in HELP_OPTION.findall(parser.format_help()))


def command_lines(text: str) -> Iterator[list[str]]:
    """Each shell line of the fenced blocks and inline spans, continuation lines joined, as words."""
    blocks, spans = code_of(text)
    for chunk in [*blocks, *spans]:
        for line in chunk.replace("\\\n", " ").splitlines():
            try:
                yield shlex.split(line, comments=True)
            except ValueError:  # an unbalanced quote in prose-like code: plain words
                yield line.split()


def shown_options(text: str) -> Iterator[tuple[str, str]]:
    """(command, option) for every option written after a command under scripts/ or lab/, or ``python -m`` of a
    ``gagpo_gym.`` or ``lab.`` module."""
    for words in command_lines(text):
        command = None
        for i, word in enumerate(words):
            if word == "-m" and i + 1 < len(words) and words[i + 1].startswith(("gagpo_gym.", "lab.")):
                command = f"-m {words[i + 1]}"
            elif (path := command_file(word)) is not None:
                command = rel(path)
            elif command is not None and OPTION.match(word):
                yield command, OPTION.match(word).group(0)


def test_options_shown_for_commands_exist() -> None:
    unknown = []
    for page in PAGES:
        for command, option in shown_options(page.read_text(encoding="utf-8")):
            if not (ROOT / command).is_file() and not command.startswith("-m "):
                unknown.append(f"{rel(page)}: {command} does not exist")
            elif option not in accepted_options(command):
                unknown.append(f"{rel(page)}: {command} has no option {option}")
    assert not unknown, "options shown in the docs that the commands do not accept:\n" + "\n".join(unknown)


def test_option_check_sees_train_and_eval() -> None:
    """The check above is not vacuous: it reads the commands' real parsers and finds their options in the docs."""
    assert {"--env", "--recipe", "--num-groups", "--resume"} <= accepted_options("scripts/train.py")
    assert "--no-such-option" not in accepted_options("scripts/eval.py")
    shown = {pair for page in PAGES for pair in shown_options(page.read_text(encoding="utf-8"))}
    assert {("scripts/train.py", "--total-timesteps"), ("scripts/eval.py", "--agent")} <= shown
    assert {("-m lab.bench.learning", "--envs"), ("lab/bench/throughput.py", "--checkout")} <= shown


# ----- the README's result tables -------------------------------------------------------------------------------


def tables(text: str) -> Iterator[tuple[int, list[str], list[list[str]]]]:
    """(line number, header, rows) of every Markdown table."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| :]+\|$", lines[i + 1]):
            cells = [[c.strip() for c in row.strip("|").split("|")] for row in lines[i : i + 1]]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            yield i, cells[0], rows
            i = j
        else:
            i += 1


def test_readme_result_tables_match_their_reports() -> None:
    """Each README table that follows a link to a report under results/ is copied from it, cell for cell."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    checked = 0
    for start, header, rows in tables(text):
        report = None
        for line in reversed(lines[:start]):
            if line.startswith("#"):
                break
            if found := re.findall(r"\]\((results/[^)]+\.md)\)", line):
                report = found[-1]
                break
        if report is None:
            continue
        assert (ROOT / report).is_file(), f"README.md's table at line {start + 1} links a missing report {report}"
        theirs = list(tables((ROOT / report).read_text(encoding="utf-8")))
        for row in rows:
            ours = dict(zip(header, row))
            assert any(
                set(header) <= set(their_header)
                and any(dict(zip(their_header, their_row)).items() >= ours.items() for their_row in their_rows)
                for _, their_header, their_rows in theirs
            ), f"README.md row {row} is not in {report}"
        checked += 1
    assert checked == 3, f"expected the README's three result tables to link their reports, found {checked}"
