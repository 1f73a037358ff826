"""What the docs point at exists: links and heading anchors, ``dgrpo`` subcommands and flags, repository paths,
``pytest`` targets, markers and ``-k`` words, the flags given to this repository's scripts, ``DGRPO_*`` variables.

The docs are README.md, ARCHITECTURE.md and docs/*.md, read as they are. The ``dgrpo`` parser is the one the
console script builds (``[project.scripts]`` in pyproject.toml, read here), so the CLI can move without this
test changing. No stack and no model: it runs in about a second.

A path that belongs to ART's repository, not this one, is written after "ART's" (ART's `tests/support/`) and
is not looked for here.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


# --- reading markdown ---------------------------------------------------------------------------------------

FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


class Doc:
    """One markdown file, split into its code (fenced blocks, inline spans) and its prose."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path.relative_to(ROOT))
        self.text = path.read_text(encoding="utf-8")
        self.code: list[str] = []
        outside = FENCE.sub(self._block, self.text)
        self.prose = SPAN.sub(self._span, outside)

    def _block(self, m: re.Match[str]) -> str:
        self.code.append(m.group(2).replace("\\\n", " "))  # a shell line continued is one command
        return "\n" * m.group(0).count("\n")

    def _span(self, m: re.Match[str]) -> str:
        self.code.append(" ".join(m.group(2).split()))  # a span wrapped over lines reads as one line
        return " "

    def headings(self) -> set[str]:
        """GitHub's anchors for this file's headings (a repeated one gets -1, -2, ...)."""
        seen: dict[str, int] = {}
        anchors = set()
        for m in HEADING.finditer(FENCE.sub(lambda b: "\n" * b.group(0).count("\n"), self.text)):
            anchor = slug(m.group(2))
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            anchors.add(anchor if n == 0 else f"{anchor}-{n}")
        return anchors


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text, not its target
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def docs() -> tuple[Doc, ...]:
    return tuple(Doc(p) for p in doc_files())


def problems_of(check: Callable[[Doc], Iterable[str]]) -> list[str]:
    return [f"{doc.name}: {problem}" for doc in docs() for problem in check(doc)]


# --- links ----------------------------------------------------------------------------------------------------


def broken_links(doc: Doc) -> Iterator[str]:
    for m in LINK.finditer(doc.prose):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.path.parent / path_part).resolve() if path_part else doc.path
        if not path.exists():
            yield f"link {target!r}: no file {path_part!r}"
        elif anchor:
            if path.suffix != ".md":
                yield f"link {target!r}: an anchor into a file that is not markdown"
            elif anchor not in Doc(path).headings():
                yield f"link {target!r}: {path.relative_to(ROOT)} has no heading with anchor #{anchor}"


def test_every_relative_link_and_anchor_resolves():
    problems = problems_of(broken_links)
    assert not problems, "\n".join(problems)


# --- repository paths -----------------------------------------------------------------------------------------


@cache
def top_dirs() -> tuple[str, ...]:
    return tuple(
        sorted(
            p.name
            for p in ROOT.iterdir()
            if p.is_dir() and not p.name.startswith((".", "_")) and not p.name.endswith(".egg-info")
        )
    )


def path_pattern() -> re.Pattern[str]:
    tops = "|".join(map(re.escape, top_dirs()))
    return re.compile(rf"(?<![\w./<>$~-])((?:{tops})/[\w./*-]*)")


def missing_paths(doc: Doc) -> Iterator[str]:
    for m in path_pattern().finditer(doc.text):
        if re.search(r"ART's\s*`?$", doc.text[max(0, m.start() - 8) : m.start()]):
            continue
        mentioned = m.group(1).rstrip(".-")
        if "*" in mentioned:
            if not list(ROOT.glob(mentioned)):
                yield f"{mentioned!r} matches no file"
        elif not (ROOT / mentioned).exists():
            yield f"{mentioned!r} does not exist"


def test_every_repository_path_mentioned_exists():
    problems = sorted(set(problems_of(missing_paths)))
    assert not problems, "\n".join(problems)


# --- the dgrpo command ----------------------------------------------------------------------------------------


class _Built(BaseException):
    """Carries the parser out of the console script, before it parses anything."""


@cache
def dgrpo_parser() -> argparse.ArgumentParser:
    """The parser of the ``dgrpo`` console script, found through pyproject.toml's ``[project.scripts]``."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return parser_of(scripts["dgrpo"])


def parser_of(script: str) -> argparse.ArgumentParser:
    """The parser a console script (``module:function``) builds: its module's ``build_parser()``, or else the
    parser its function builds, caught as it starts parsing (nothing runs, nothing exits)."""
    module_name, _, function = script.partition(":")
    module = importlib.import_module(module_name)
    build = getattr(module, "build_parser", None)
    if callable(build):
        parser = build()
        assert isinstance(parser, argparse.ArgumentParser)
        return parser

    def built(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Built(self)

    def exited(code: object = None) -> None:
        raise AssertionError(f"{script} exited ({code}) before parsing its arguments")

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", built),
        mock.patch.object(argparse.ArgumentParser, "parse_known_args", built),
        mock.patch.object(sys, "argv", ["dgrpo", "--help"]),
        mock.patch.object(os, "_exit", exited),
    ):
        try:
            getattr(module, function)()
        except _Built as got:
            return got.args[0]
    raise AssertionError(f"{script} returned without building a parser")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


DGRPO_CALL = re.compile(r"(?:^|(?<=[\s/(;&|\"'$]))dgrpo[ \t]+([^\n;&)#\"`]*)", re.M)
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|<.*>|\.\.\.|\[.*\])$")
WORDS = re.compile(r"^[a-z][a-z0-9_-]*(?:\|[a-z][a-z0-9_-]*)*$")


def commands(code: str, pattern: re.Pattern[str]) -> Iterator[list[str]]:
    """The words after each command ``pattern`` finds in ``code``, up to a shell pipe."""
    for m in pattern.finditer(code):
        if re.search(r"(?:\b(?:import|from)|(?:^|\s)-[-\w]+)\s+$", code[: m.start()]):
            continue  # `import dgrpo as art`, `kubectl -n dgrpo ...`: a name, not the command
        args = re.split(r"\s\|\|?\s", m.group(1))[0]
        try:
            yield shlex.split(args)
        except ValueError:
            yield args.split()


def bad_dgrpo_commands(doc: Doc) -> Iterator[str]:
    top = dgrpo_parser()
    subs = subcommands(top)
    for code in doc.code:
        for words in commands(code, DGRPO_CALL):
            shown = "dgrpo " + " ".join(words)
            while words and words[0].startswith("-"):
                if words[0].split("=")[0] not in options(top):
                    yield f"`{shown}`: dgrpo has no option {words[0]}"
                words = words[1:]
            if not words or PLACEHOLDER.match(words[0]):
                continue
            if not WORDS.match(words[0]):
                yield f"`{shown}`: {words[0]!r} is not a dgrpo subcommand ({', '.join(subs)})"
                continue
            for name in words[0].split("|"):
                if name not in subs:
                    yield f"`{shown}`: {name!r} is not a dgrpo subcommand ({', '.join(subs)})"
                    continue
                sub = subs[name]
                choices = [a.choices for a in sub._actions if not a.option_strings and a.choices]
                rest = words[1:]
                if choices and rest and WORDS.match(rest[0]):
                    for value in rest[0].split("|"):
                        if value not in choices[0]:
                            yield f"`{shown}`: dgrpo {name} takes {', '.join(choices[0])}, not {value!r}"
                for word in rest:
                    flag = word.split("=")[0]
                    if flag.startswith("--") and flag not in options(sub) | options(top):
                        yield f"`{shown}`: dgrpo {name} has no option {flag}"


def test_every_dgrpo_command_shown_is_real():
    problems = problems_of(bad_dgrpo_commands)
    assert not problems, "\n".join(problems)


# --- pytest commands ------------------------------------------------------------------------------------------

PYTEST_CALL = re.compile(r"(?:^|(?<=[\s/]))pytest[ \t]+([^\n;&)#`]*)", re.M)
PYTEST_VALUE_OPTIONS = set("-k -m -o -p -n -c --timeout --durations --maxfail --rootdir".split())
"""pytest options that take a value (the value is not a path)."""


@cache
def markers() -> set[str]:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {m.split(":")[0].strip() for m in ini.get("markers", [])}


def bad_pytest_commands(doc: Doc) -> Iterator[str]:
    for code in doc.code:
        for words in commands(code, PYTEST_CALL):
            shown = "pytest " + " ".join(words)
            targets: list[Path] = []
            selections: dict[str, str] = {}
            i = 0
            while i < len(words):
                word = words[i]
                if word in PYTEST_VALUE_OPTIONS and i + 1 < len(words):
                    selections[word] = words[i + 1]
                    i += 2
                    continue
                i += 1
                if word.startswith("-") or "<" in word or word == "..." or "=" in word:
                    continue
                file, _, node = word.partition("::")
                path = ROOT / file
                if not path.exists():
                    yield f"`{shown}`: no file {file!r}"
                    continue
                targets.append(path)
                for name in filter(None, node.split("::")):
                    name = name.split("[")[0]
                    if not re.search(
                        rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", path.read_text(), re.M
                    ):
                        yield f"`{shown}`: {file} defines no {name!r}"
            for marker in re.findall(r"\w+", selections.get("-m", "")):
                if marker not in {"and", "or", "not"} and marker not in markers():
                    yield f"`{shown}`: no marker {marker!r} in pyproject.toml"
            if "-k" in selections:
                files = [f for t in targets for f in ([t] if t.is_file() else t.rglob("*.py"))]
                if not targets:
                    files = list((ROOT / "tests").rglob("*.py"))
                haystack = "\n".join(str(f.relative_to(ROOT)) + "\n" + f.read_text() for f in files).lower()
                for word in re.findall(r"\w+", selections["-k"]):
                    if word not in {"and", "or", "not"} and word.lower() not in haystack:
                        yield f"`{shown}`: -k {word!r} names no test there"


def test_every_pytest_command_shown_selects_real_tests():
    problems = problems_of(bad_pytest_commands)
    assert not problems, "\n".join(problems)


# --- this repository's scripts and their flags ----------------------------------------------------------------


def script_pattern() -> re.Pattern[str]:
    tops = "|".join(map(re.escape, top_dirs()))
    return re.compile(rf"(?<![\w./<>$~-])((?:{tops})/[\w./-]+\.py)[ \t]+([^\n;&)#`|]*)")


def bad_script_flags(doc: Doc) -> Iterator[str]:
    """A flag given to one of this repository's argparse scripts is one it defines (``--no-x`` for ``--x``)."""
    for code in doc.code:
        for m in script_pattern().finditer(code):
            script = ROOT / m.group(1)
            if not script.is_file():
                continue  # reported as a missing path
            source = script.read_text()
            if "add_argument" not in source:
                continue
            for word in m.group(2).split():
                flag = word.split("=")[0]
                if not flag.startswith("--"):
                    continue
                defined = {flag} | ({"--" + flag[len("--no-") :]} if flag.startswith("--no-") else set())
                if not any(f'"{f}"' in source or f"'{f}'" in source for f in defined):
                    yield f"`{m.group(1)} {m.group(2).strip()}`: {m.group(1)} defines no {flag}"


def test_every_flag_given_to_a_script_is_defined():
    problems = problems_of(bad_script_flags)
    assert not problems, "\n".join(problems)


# --- DGRPO_* variables ----------------------------------------------------------------------------------------


SOURCE_SUFFIXES = {".py", ".sh", ".toml", ".yaml", ".yml", ".example", ".Dockerfile"}


@cache
def source_text() -> str:
    """The repository's code, scripts, configs and manifests (not its docs, not a wheelhouse)."""
    paths = [ROOT / "pyproject.toml"]
    for top in top_dirs():
        paths += [p for p in (ROOT / top).rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()]
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in paths)


def unknown_variables(doc: Doc) -> Iterator[str]:
    for name in sorted(set(re.findall(r"\bDGRPO_[A-Z0-9_]*[A-Z0-9]\b", doc.text))):
        if not re.search(rf"\b{name}\b", source_text()):
            yield f"{name} is read nowhere in the code"


def test_every_dgrpo_variable_named_is_read_somewhere():
    problems = problems_of(unknown_variables)
    assert not problems, "\n".join(problems)


def test_the_docs_index_lists_every_page():
    index = next(doc for doc in docs() if doc.name == "docs/index.md")
    listed = {
        (index.path.parent / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(index.prose)
    }
    unlisted = [
        doc.name for doc in docs() if doc.name.startswith("docs/") and doc.path not in listed | {index.path}
    ]
    assert not unlisted, f"docs/index.md does not link {', '.join(unlisted)}"
