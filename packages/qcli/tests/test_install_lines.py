"""Every ``pip install`` line the documentation, the examples, the READMEs and the install hints give names only
distributions, directories and extras that exist in ``packages/*/pyproject.toml``, and fetches this toolkit's
distributions where they are: none is on PyPI yet, so a line naming one takes ``--find-links`` (the wheels
``python3 -m nox -s build`` writes; ``nox -s wheels`` installs them that way) or the clone's ``packages/<dir>``.
A static check: it reads the text and the pyproject files, it installs nothing."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

import qcore
from qcli import plugins

REPO = Path(__file__).resolve().parents[3]
#: pip options that take a value (the value is not a requirement)
VALUED = {"--find-links", "-f", "--index-url", "-i", "--extra-index-url", "--python", "-r", "--requirement", "-c",
          "--target", "-t", "--prefix", "--root"}


def _projects() -> dict[str, tuple[str, set[str]]]:
    """{directory under packages/: (distribution name, its extras)}."""
    found = {}
    for pyproject in sorted(REPO.glob("packages/*/pyproject.toml")):  # read as text: tomllib is Python 3.11+
        text = pyproject.read_text(encoding="utf-8")
        section = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        extras = set(re.findall(r"^([A-Za-z0-9_-]+) *=", section.group(1), re.M)) if section else set()
        found[pyproject.parent.name] = (re.search(r'^name = "(.+)"$', text, re.M).group(1), extras)
    return found


PROJECTS = _projects()
DISTRIBUTIONS = {canonicalize_name(name): extras for name, extras in PROJECTS.values()}


def _sources() -> list[Path]:
    files = [*REPO.glob("docs/**/*.md"), REPO / "README.md", *REPO.glob("packages/*/README.md"),
             *REPO.glob("examples/*.py"), *REPO.glob("packages/*/src/*/__init__.py")]
    return sorted(f for f in files if f.is_file())


def install_commands(text: str) -> list[str]:
    """The argument strings of every ``pip install`` in ``text``: to the end of the line (a trailing backslash joins
    the next one), a closing backtick, ``&&``, ``;``, ``|`` or a ``#`` comment, or, for a command quoted as a whole
    (``'pip install x'``), its closing quote; a comment's own ``pip install`` is a command too."""
    text = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for match in re.finditer(r"(['\"]?)\bpip install\b(?=([^\n`]*))", text):
        quote, rest = match.groups()
        if quote:
            rest = rest.split(quote, 1)[0]
        commands.append(re.split(r"&&|;|\||\s#|\bpip install\b", rest)[0].strip())
    return commands


def problems(command: str) -> list[str]:
    """What in one ``pip install`` argument string would not install as written."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return [f"cannot be split into arguments ({exc})"]
    found, ours, find_links, skip = [], [], False, False
    for word in words:
        if skip:
            skip = False
            continue
        if word in VALUED or word.split("=", 1)[0] in VALUED:
            find_links |= word.split("=", 1)[0] in ("--find-links", "-f")
            skip = "=" not in word
            continue
        if word.startswith("-") or "<" in word or word == "...":  # an option, a placeholder
            continue
        if "/" in word or word.startswith("."):
            match = re.fullmatch(r"packages/([a-z]+)(?:\[([a-z,]+)\])?", word)
            if match is None or match.group(1) not in PROJECTS:
                found.append(f"{word}: not a package directory (packages/<dir> with a pyproject.toml)")
            elif match.group(2) and not set(match.group(2).split(",")) <= PROJECTS[match.group(1)][1]:
                found.append(f"{word}: packages/{match.group(1)} has the extras {sorted(PROJECTS[match.group(1)][1])}")
            continue
        try:
            requirement = Requirement(word)
        except InvalidRequirement:
            found.append(f"{word}: not a requirement")
            continue
        name = canonicalize_name(requirement.name)
        if name in {canonicalize_name(d) for d in PROJECTS}:
            found.append(f"{word}: the import name; PyPI's {name} is another project (use the distribution name)")
        elif name.startswith("paddle-quant") and name not in DISTRIBUTIONS:
            found.append(f"{word}: no such distribution here; they are {sorted(DISTRIBUTIONS)}")
        elif name in DISTRIBUTIONS:
            ours.append(word)
            if not requirement.extras <= DISTRIBUTIONS[name]:
                found.append(f"{word}: {name} has the extras {sorted(DISTRIBUTIONS[name])}")
    if ours and not find_links:
        found.append(f"{' '.join(ours)}: not on PyPI yet; add --find-links dist (or give packages/<dir>)")
    return found


def _texts(path: Path) -> list[str]:
    """A markdown file's text; a Python file's strings (docstrings and messages, each literal joined)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return [text]
    return [node.value for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)]


def _lines() -> list[tuple[str, str]]:
    lines = [(str(path.relative_to(REPO)), command) for path in _sources()
             for text in _texts(path) for command in install_commands(text)]
    hints = [qcore.ONNX_INSTALL, plugins.install_hint(["qptq", "qdemo"])]
    return lines + [("install hint", command) for hint in hints for command in install_commands(hint)]


def test_the_docs_give_install_lines_and_this_check_reads_them():
    where = {path for path, _ in _lines()}
    assert {"docs/install.md", "docs/ppocr.md", "docs/cli.md", "examples/ppocr_int8.py", "README.md",
            "install hint"} <= where
    assert len(_lines()) >= 30


@pytest.mark.parametrize(("path", "command"), _lines())
def test_each_install_line_names_what_exists_and_where_it_is(path, command):
    assert problems(command) == [], f"{path}: pip install {command}"


@pytest.mark.parametrize(("command", "problem"), [
    ('"paddle-quant-ptq[onnx]"', "paddle-quant-ptq has the extras ['llm']"),  # docs/ppocr.md had it
    ("--find-links dist paddle-quant-ptq[onnx]", "has the extras"),
    ("paddle-quant-core", "not on PyPI yet"),
    ("qcore", "the import name"),
    ("--find-links dist paddle-quant-cor", "no such distribution"),
    ("'packages/qptq[onnx]'", "packages/qptq has the extras ['llm']"),
    ("packages/nope", "not a package directory"),
])
def test_the_check_fails_on_what_would_not_install(command, problem):
    assert any(problem in p for p in problems(command)), problems(command)
    assert problems("--find-links dist 'paddle-quant-core[onnx]' paddle-quant-ptq") == []
    assert problems("--no-deps rapidocr_paddle==1.4.5 'packages/qcore[onnx]' packages/qptq") == []
