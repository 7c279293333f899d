"""Reference pages generated from the code, so that they cannot drift from it.

Directives (used in ``docs/reference/``):

``ftnb-cli``
    Every ``ftnb`` command with its usage, description and options, from the CLI's own argparse
    parser (``ftnb.cli._build_parser``).
``ftnb-magics``
    Every notebook magic (``%ftrun``, ``%ftattach``, ...) from its option table
    (``ftnb.notebook.magic_options``; the tables are ``ftnb.run_options``', shared with the CLI).
``ftnb-env-vars``
    A table of the ``FTNB_`` environment variables: its body is one ``NAME | meaning`` line per
    variable (the meaning in the page's markup: MyST in a .md page); a variable the code reads (found by scanning ``ftnb/``) without a line here, or a
    line for a variable the code never reads, is a build warning (an error under ``-W``).
``ftnb-files``
    The experiment directory's files: its body is one ``CONSTANT | meaning`` line per name
    constant of ``ftnb.storage.file_names``, which gives the file's actual name; a constant
    without a line, or a line for no constant, is a build warning.

At start-up the API reference (``docs/reference/api.md``) is checked against ``ftnb.__all__``:
a public name missing from it, or a name there that is not public, is a build warning.
"""

from __future__ import annotations

import argparse
import ast
import re
import textwrap
from pathlib import Path
from typing import Iterable

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.util import logging

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ftnb"
logger = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"\bFTNB_[A-Z0-9_]*[A-Z0-9]\b")


# -- argparse parsers as docutils nodes -----------------------------------------------------------
def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest.upper()
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    return ", ".join(f"{flag} {metavar}" for flag in action.option_strings)


def _help(action: argparse.Action) -> str:
    text = (action.help or "").replace("%%", "%")
    if "%(default)s" in text:
        text = text.replace("%(default)s", str(action.default))
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text += f" (choices: {', '.join(str(c) for c in action.choices)})"
    return text


def _options(group: argparse._ArgumentGroup) -> Iterable[argparse.Action]:
    return [a for a in group._group_actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
            and not isinstance(a, argparse._HelpAction)]


def _parser_nodes(parser: argparse.ArgumentParser, title: str, anchor: str) -> nodes.section:
    section = nodes.section(ids=[anchor], names=[anchor])
    section += nodes.title(text=title)
    usage = parser.format_usage().strip()
    section += nodes.literal_block(usage, usage, language="text")
    if parser.description:
        description = textwrap.dedent(parser.description).strip()
        section += nodes.literal_block(description, description, language="text")
    for group in parser._action_groups:
        actions = _options(group)
        if not actions:
            continue
        section += nodes.rubric(text=group.title or "options")
        if group.description:
            section += nodes.paragraph(text=group.description)
        items = nodes.definition_list()
        for action in actions:
            item = nodes.definition_list_item()
            term = nodes.term()
            term += nodes.literal(text=_flags(action))
            item += term
            definition = nodes.definition()
            definition += nodes.paragraph(text=_help(action))
            item += definition
            items += item
        section += items
    return section


class CliDirective(Directive):
    """``ftnb-cli``: every ``ftnb`` command, from the CLI's parser."""

    def run(self) -> list:
        from ftnb.cli import _build_parser

        parser, specs = _build_parser()
        out = [_parser_nodes(parser, "ftnb", "cli-ftnb")]
        if parser.epilog:
            out[0] += nodes.literal_block(parser.epilog, parser.epilog.strip(), language="text")
        for name, (_spec, subparser) in specs.items():
            out.append(_parser_nodes(subparser, f"ftnb {name}", f"cli-ftnb-{name}"))
        return out


class MagicsDirective(Directive):
    """``ftnb-magics``: every magic, from its option table."""

    def run(self) -> list:
        from ftnb.notebook import magic_options
        from ftnb.run_options import CommandSpec

        specs = [value for value in vars(magic_options).values()
                 if isinstance(value, CommandSpec) and type(value).__name__ == "MagicSpec"]
        return [_parser_nodes(spec.parser(), f"%{spec.name}", f"magic-{spec.name}")
                for spec in specs]


# -- tables checked against the code --------------------------------------------------------------
class _CheckedTable(Directive):
    """A two-column table whose first column must name exactly ``self.known()``."""

    has_content = True
    header = ("name", "meaning")

    def known(self) -> dict[str, str]:
        """Name -> what the first column shows for it."""
        raise NotImplementedError

    def run(self) -> list:
        rows = []
        for line in self.content:
            if line.strip():
                name, _, meaning = line.partition("|")
                rows.append((name.strip(), meaning.strip()))
        known = self.known()
        given = {name for name, _ in rows}
        for name in sorted(set(known) - given):
            logger.warning(f"{self.name}: {name} is in the code but not in this table",
                           location=(self.state.document.settings.env.docname, self.lineno))
        for name in sorted(given - set(known)):
            logger.warning(f"{self.name}: {name} is in this table but not in the code",
                           location=(self.state.document.settings.env.docname, self.lineno))
        return self._table(rows, known)

    def _table(self, rows: list[tuple[str, str]], known: dict[str, str]) -> list:
        table = nodes.table()
        group = nodes.tgroup(cols=2)
        table += group
        group += nodes.colspec(colwidth=30)
        group += nodes.colspec(colwidth=70)
        head = nodes.thead()
        group += head
        head += self._row([nodes.paragraph(text=h) for h in self.header])
        body = nodes.tbody()
        group += body
        rows_messages: list = []
        for name, meaning in rows:
            label = nodes.paragraph()
            label += nodes.literal(text=known.get(name, name))
            text, messages = self.state.inline_text(meaning, self.lineno)
            cell = nodes.paragraph()
            cell += text
            body += self._row([label, cell])
            rows_messages.extend(messages)  # a markup error in a meaning: shown after the table
        return [table, *rows_messages]

    @staticmethod
    def _row(cells: list) -> nodes.row:
        row = nodes.row()
        for content in cells:
            entry = nodes.entry()
            entry += content
            row += entry
        return row


def environment_variables() -> set[str]:
    """Every ``FTNB_`` variable named in ftnb's code."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        found.update(_ENV_NAME.findall(path.read_text()))
    return found


class EnvVarsDirective(_CheckedTable):
    header = ("variable", "meaning")

    def known(self) -> dict[str, str]:
        return {name: name for name in environment_variables()}


def file_name_constants() -> dict[str, str]:
    """The public string constants of ``ftnb/storage/file_names.py``: name -> value."""
    tree = ast.parse((PACKAGE / "storage" / "file_names.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper() \
                    and not target.id.startswith("_"):
                value = node.value
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    found[target.id] = value.value
                elif isinstance(value, ast.Call):  # a pattern: re.compile(r"...")
                    found[target.id] = ast.literal_eval(value.args[0])
    return found


class FilesDirective(_CheckedTable):
    header = ("file or folder", "what it holds")

    def known(self) -> dict[str, str]:
        return file_name_constants()


# -- the API reference names every public name -------------------------------------------------
def api_page_names(text: str) -> set[str]:
    """The names ``docs/reference/api.md`` lists (one per line in its autosummary blocks)."""
    return set(re.findall(r"^   ([A-Za-z_]\w*)\s*$", text, re.M))


def table_names(text: str, directive: str) -> set[str]:
    """The first column of the ``directive`` block in a page's text."""
    body = text.split("```{" + directive + "}", 1)[1].split("```", 1)[0]
    return {line.partition("|")[0].strip() for line in body.splitlines() if "|" in line}


def check_api_page(app) -> None:
    """Warn about public names the API page misses and names it lists that are not public; remove
    generated pages of names no longer public (they would be pages in no toctree)."""
    import ftnb

    page = Path(app.srcdir) / "reference" / "api.md"
    text = page.read_text()
    listed = api_page_names(text)
    public = {name for name in ftnb.__all__ if not name.startswith("__")}
    for stub in (page.parent / "api").glob("ftnb.*.rst"):
        if stub.stem.split(".", 1)[1] not in public:
            stub.unlink()
    for name in sorted(public - listed):
        logger.warning(f"reference/api.md does not list ftnb.{name} (in ftnb.__all__)",
                       location=str(page))
    for name in sorted(listed - public):
        logger.warning(f"reference/api.md lists {name}, which ftnb does not export",
                       location=str(page))


def setup(app) -> dict:
    app.add_directive("ftnb-cli", CliDirective)
    app.add_directive("ftnb-magics", MagicsDirective)
    app.add_directive("ftnb-env-vars", EnvVarsDirective)
    app.add_directive("ftnb-files", FilesDirective)
    app.connect("builder-inited", check_api_page)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
