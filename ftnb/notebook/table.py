"""The experiment widget's trial table: an anywidget (``static/table.js``) that is sent only the
rows that changed.

A row is keyed by its trial id (its first cell). The whole table (``rows``: the order of the
trials shown and each one's cells) is in the state a front end gets when the widget opens or a
reloaded page asks for it; from then on each update is one message (``{"type": "rows", "set":
{trial_id: cells}, "cells": {trial_id: [[index, value]]}, "drop": [trial_id], "order": [trial_id]
| None}``: :func:`rows_diff`) with new rows whole, the changed cells of the others, the trials no
longer shown, and the order only when it changed. A change of columns (a
metric chosen, a hyperparameter column) sends the table whole (``{"type": "table"}``). So a
sweep whose 8 running trials report twice a second sends those 8 rows, not the 60-row table.

DOM hooks for browser tests: ``ftnb-table`` (the table), each body row's ``data-trial-id``,
``ftnb-table-more`` (the note on trials left out).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Optional

import anywidget
import traitlets

__all__ = ["TrialTable", "compact", "rows_diff", "table_markup"]

_STATIC = Path(__file__).parent / "static"


def compact(source: str) -> str:
    """An ES module or style sheet without its comments and indentation (sent with every
    display): lines starting ``//`` and ``/* ... */`` blocks that start a line go."""
    out, in_comment = [], False
    for line in (line.strip() for line in source.splitlines()):
        if in_comment or line.startswith("/*"):
            in_comment = "*/" not in line
            continue
        if line and not line.startswith("//"):
            out.append(line)
    return "\n".join(out)


def rows_diff(before: dict[str, list], order_before: list[str],
              rows: list[list[str]]) -> Optional[dict]:
    """What changed from the rows ``before`` (trial id: cells, shown in ``order_before``) to
    ``rows`` (each one's first cell its trial id): ``{"set": {id: cells}, "cells": {id: [[index,
    value], ...]}, "drop": [ids], "order": [ids]}``: new rows whole, a changed row's changed
    cells only, ``order`` only when it changed, each part only when not empty; None when
    nothing changed."""
    order = [cells[0] for cells in rows]
    whole: dict[str, list] = {}
    cells_changed: dict[str, list] = {}
    for cells in rows:
        had = before.get(cells[0])
        if had is None or len(had) != len(cells):
            whole[cells[0]] = list(cells)
        elif had != list(cells):
            cells_changed[cells[0]] = [[i, v] for i, (old, v) in enumerate(zip(had, cells))
                                       if old != v]
    shown = set(order)
    dropped = [trial_id for trial_id in order_before if trial_id not in shown]
    moved = order != order_before
    if not whole and not cells_changed and not dropped and not moved:
        return None
    parts = {"set": whole, "cells": cells_changed, "drop": dropped,
             "order": order if moved else None}
    return {k: v for k, v in parts.items() if v}  # the empty parts left out: fewer bytes


def table_markup(header: list[str], rows: list[list[str]], more: str = "") -> str:
    """The table as HTML (what :attr:`TrialTable.value` reads; a status cell's class is
    ``s-STATUS``)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for cells in rows:
        tds = [f"<td>{html.escape(cell)}</td>" for cell in cells]
        if len(cells) > 1:
            tds[1] = f"<td class='s-{html.escape(cells[1])}'>{html.escape(cells[1])}</td>"
        body.append("<tr>" + "".join(tds) + "</tr>")
    note = f"<div class='ftnb-table-more'>{html.escape(more)}</div>" if more else ""
    return (f"<div class='ftnb-w'><table class='ftnb-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>{note}")


class TrialTable(anywidget.AnyWidget):
    """The trial table; :meth:`show` sends what changed since the last call."""

    _esm = compact((_STATIC / "table.js").read_text(encoding="utf-8"))
    #: The widget's status colours (the chart's legend, this table, the header) and the rule
    #: that hides :class:`~ftnb.notebook.chart.StaleHint` while a live view is on the page.
    _css = compact((_STATIC / "status.css").read_text(encoding="utf-8"))

    #: The header's cells.
    columns = traitlets.List().tag(sync=True)
    #: The note on trials left out ("10 more trials (errored and running first)") or "".
    more = traitlets.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        self._rows: dict[str, list[str]] = {}
        self._order: list[str] = []
        #: Messages sent, by kind, and rows they carried (tests, the benchmark).
        self.stats = {"full": 0, "updates": 0, "rows_sent": 0}
        super().__init__(**kwargs)

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict:
        """The synced traits, and (the whole state) ``rows``: every shown row in order."""
        state = super().get_state(key, drop_defaults)
        if key is None:
            state["rows"] = self._whole()
        return state

    def _whole(self) -> dict:
        rows = getattr(self, "_rows", {})
        order = getattr(self, "_order", [])
        return {"order": list(order), "cells": [rows[t] for t in order]}

    @property
    def rows(self) -> list[list[str]]:
        """The rows shown, in order."""
        return [self._rows[t] for t in self._order]

    @property
    def value(self) -> str:
        """The table as HTML (what the view shows; never sent as such)."""
        return table_markup(self.columns, self.rows, self.more)

    def show(self, header: list[str], rows: list[list[str]], more: str = "") -> bool:
        """Show ``rows`` (each one's first cell its trial id) under ``header``, sending only
        what changed, in one message; True if anything changed."""
        with self.hold_sync():
            changed = False
            if more != self.more:
                self.more = more
                changed = True
            if list(header) != list(self.columns):
                self._rows = {cells[0]: list(cells) for cells in rows}
                self._order = [cells[0] for cells in rows]
                self.columns = list(header)
                self.send({"type": "table", **self._whole()})
                self.stats["full"] += 1
                return True
            diff = rows_diff(self._rows, self._order, rows)
            if diff is None:
                return changed
            for trial_id in diff.get("drop", ()):
                self._rows.pop(trial_id, None)
            self._rows.update(diff.get("set", {}))
            for trial_id, changes in diff.get("cells", {}).items():
                for index, value in changes:
                    self._rows[trial_id][index] = value
            self._order = [cells[0] for cells in rows]
            self.send({"type": "rows", **diff})
            self.stats["updates"] += 1
            self.stats["rows_sent"] += len(diff.get("set", ())) + len(diff.get("cells", ()))
            return True
