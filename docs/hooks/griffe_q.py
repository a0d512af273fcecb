"""Griffe extensions the API reference is built with (docs only: mkdocs.yml loads them into mkdocstrings).

The packages' docstrings are written for Sphinx; mkdocstrings renders Markdown. Rather than change
the sources, the docs build adapts the docstrings in memory when griffe loads a package, in order:

* :class:`DocComments` reads Sphinx autodoc's attribute doc-comments (the ``#:`` lines right
  above an assignment) as the attribute's docstring, so documented constants (``EXIT_CODES``,
  ``PIXEL_MEAN``) appear in the reference and the roles pointing at them can link.
* :class:`LazyExports` makes the names a package exports through ``__all__`` plus a module
  ``__getattr__`` (``qembed``'s program API, imported on first use) visible to the reference:
  each becomes an alias of the one submodule member of that name, as it is at runtime.
* :class:`SphinxMarkup` turns the roles ``:func:``, ``:class:``, ``:meth:``, ``:mod:``,
  ``:data:``, ``:attr:``, ``:exc:``, ``:obj:``, ``:const:`` into cross-references. A target is
  resolved as Sphinx's Python domain does: the object itself, its class, its module, the
  enclosing packages, else the path as written (``.name`` is relative to the current package;
  imported names follow their import). It is emitted as an *optional* mkdocs-autorefs
  reference: a link when the target is rendered anywhere in the reference, plain code (and no
  warning, so ``mkdocs build --strict`` holds) when it is not. ``~`` shows the last component
  only, ``!`` suppresses the link, ``title <target>`` sets the text, as in Sphinx. The two other
  reST constructs the docstrings use are rendered too: ``text::`` before a literal block (shown
  as ``text:``) and simple tables (``==== ====`` rules), which become Markdown tables.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

from griffe import Alias, Docstring, Extension, GriffeLoader, Module, Object

DOC_COMMENT_RE = re.compile(r"^\s*#:\s?(?P<text>.*)$")
ROLE_RE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(?P<body>[^`]+)`")
EXPLICIT_TITLE_RE = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")
# "text::" or a lone "::" line, followed by a blank line (the literal block itself is indented: Markdown code).
LITERAL_MARKER_RE = re.compile(r"(?m)(?<=\S)::(?=\n[ \t]*\n)|^[ \t]*::\n(?=[ \t]*\n)")
TABLE_RULE_RE = re.compile(r"^ *=+(?: +=+)+ *$")


def _walk(obj: Object) -> Iterator[Object]:
    """``obj`` and every object defined under it (aliases, i.e. imported names, are not followed)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


# --- #: doc-comments -------------------------------------------------------------------------


def doc_comment(attribute: Object) -> str | None:
    """The text of the ``#:`` lines right above ``attribute``'s first line, or None."""
    try:
        lines = attribute.module.lines
    except Exception:  # no source (a compiled or inspected module)
        return None
    if not attribute.lineno or attribute.lineno > len(lines):
        return None
    above: list[str] = []
    index = attribute.lineno - 2
    while index >= 0 and (match := DOC_COMMENT_RE.match(lines[index])):
        above.insert(0, match["text"].rstrip())
        index -= 1
    return "\n".join(above).strip() or None


class DocComments(Extension):
    """Attributes documented with ``#:`` comments (Sphinx autodoc style) get that text as docstring."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.is_attribute and obj.docstring is None and (text := doc_comment(obj)):
                obj.docstring = Docstring(text, lineno=obj.lineno, parent=obj)


# --- lazy exports ------------------------------------------------------------------------------


class LazyExports(Extension):
    """Alias each ``__all__`` name a module serves through its ``__getattr__`` to the submodule member."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        for module in _walk(pkg):
            if not module.is_module or "__getattr__" not in module.members or not module.exports:
                continue
            for name in module.exports:
                if not isinstance(name, str) or name in module.members:
                    continue
                found = [
                    sub.members[name]
                    for sub in module.modules.values()
                    if name in sub.members and not sub.members[name].is_alias
                ]
                if len(found) == 1:
                    module.set_member(name, Alias(name, found[0], parent=module))


# --- reST markup -------------------------------------------------------------------------------


def _canonical(loader: GriffeLoader, path: str) -> str:
    """The canonical path of ``path`` when griffe can follow it (imports resolved), else ``path``."""
    try:
        return loader.modules_collection[path].canonical_path
    except Exception:  # another package not loaded yet, or an unresolvable alias: keep the path
        return path


def _member(scope: Object, name: str) -> Object | Alias | None:
    """Member ``name`` of ``scope`` (inherited ones too, for a class), or None."""
    try:
        return (scope.all_members if scope.is_class else scope.members).get(name)
    except Exception:  # a base class griffe cannot resolve
        return scope.members.get(name)


def resolve(obj: Object, target: str, loader: GriffeLoader) -> str:
    """The dotted path a role's ``target`` names, seen from the docstring of ``obj``."""
    if target.startswith("."):
        name = target.lstrip(".")
        package = obj.module if obj.module.is_init_module else obj.module.parent
        for _ in range(len(target) - len(name) - 1):  # each dot after the first: one package up
            if package.parent is not None:
                package = package.parent
        return _canonical(loader, f"{package.path}.{name}")

    first, _, rest = target.partition(".")
    scope: Object | None = obj if (obj.is_class or obj.is_module) else obj.parent
    while scope is not None:
        if (member := _member(scope, first)) is not None:
            path = member.target_path if member.is_alias else member.path
            return _canonical(loader, f"{path}.{rest}" if rest else path)
        scope = scope.parent
    return _canonical(loader, target)


def roles_to_autorefs(text: str, obj: Object, loader: GriffeLoader) -> str:
    """``text`` with every Sphinx role replaced by an optional mkdocs-autorefs cross-reference."""

    def replace(match: re.Match[str]) -> str:
        body, title = match["body"].strip(), None
        if explicit := EXPLICIT_TITLE_RE.match(body):
            title, body = explicit["title"], explicit["target"].strip()
        if body.startswith("!"):
            return f"`{title or body[1:]}`"
        target = body.lstrip("~").removesuffix("()")
        if title is None:
            title = target.rsplit(".", 1)[-1] if body.startswith("~") else target.lstrip(".")
        identifier = html.escape(resolve(obj, target, loader))
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(title)}</code></autoref>'

    return ROLE_RE.sub(replace, text)


def _cells(line: str, starts: list[int]) -> list[str]:
    """A simple-table row cut at the columns' starts (the last column runs to the end of the line)."""
    bounds = [*starts, max(len(line), starts[-1]) + 1]
    return [line[bounds[i] : bounds[i + 1]].strip().replace("|", "\\|") for i in range(len(starts))]


def simple_tables(text: str) -> str:
    """reST simple tables (rule, header, rule, rows, rule: one header row) as Markdown pipe tables."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if TABLE_RULE_RE.match(lines[i]) and i + 2 < len(lines) and TABLE_RULE_RE.match(lines[i + 2]):
            end = next((j for j in range(i + 3, len(lines)) if TABLE_RULE_RE.match(lines[j])), None)
            if end is not None:
                starts = [match.start() for match in re.finditer(r"=+", lines[i])]
                out.append("| " + " | ".join(_cells(lines[i + 1], starts)) + " |")
                out.append("|" + "---|" * len(starts))
                out += ["| " + " | ".join(_cells(row, starts)) + " |" for row in lines[i + 3 : end] if row.strip()]
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


class SphinxMarkup(Extension):
    """Rewrite the reST in every docstring of a loaded package: roles, ``::`` markers, simple tables."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is None:
                continue
            text = simple_tables(obj.docstring.value)
            text = LITERAL_MARKER_RE.sub(lambda match: ":" if match[0] == "::" else "", text)
            obj.docstring.value = roles_to_autorefs(text, obj, loader)
