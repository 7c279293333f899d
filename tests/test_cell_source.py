"""What ftnb ships by value keeps its code's file names (``ftnb.objects.cell_source.dumps``), so
a traceback in the process that runs it names the file and shows the line. cloudpickle 3.1.3
writes ``<dynamic-code>`` instead; these tests run against whatever cloudpickle is installed."""

from __future__ import annotations

import linecache
import subprocess
import sys
import traceback

import cloudpickle
import pytest

from ftnb.objects.cell_source import CellSource, dumps, pickler_class

CELL = "/no/such/folder/ipykernel_1234/3046.py"  # a notebook cell's file name: in no file system
SOURCE = '''
def outer(x):
    def inner(y):
        raise ValueError(f"inner got {y}")  # the line the traceback shows
    return inner(x + 1)
'''


def _cell_function():
    namespace: dict = {"__name__": "a_cell_module_nobody_can_import"}  # so: pickled by value
    exec(compile(SOURCE, CELL, "exec"), namespace)
    return namespace["outer"]


def test_code_shipped_by_value_keeps_its_file_name_and_nested_code_too():
    loaded = cloudpickle.loads(dumps(_cell_function()))
    assert loaded.__code__.co_filename == CELL
    [inner] = [c for c in loaded.__code__.co_consts if hasattr(c, "co_filename")]
    assert inner.co_filename == CELL
    assert loaded.__code__.co_firstlineno == 2


def test_a_traceback_in_another_process_shows_the_cells_line():
    # What a trial does: unpickle the trainable (its CellSource registers the cell's lines),
    # call it, format the traceback.
    fn = _cell_function()
    payload = dumps((fn, CellSource({CELL: SOURCE.splitlines(keepends=True)})))
    script = (
        "import sys, traceback, cloudpickle\n"
        "fn, _ = cloudpickle.loads(sys.stdin.buffer.read())\n"
        "try:\n    fn(1)\n"
        "except ValueError:\n    print(traceback.format_exc())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True,
                         check=True, timeout=60).stdout.decode()
    assert f'File "{CELL}", line 4, in inner' in out, out
    assert 'raise ValueError(f"inner got {y}")  # the line the traceback shows' in out, out
    assert "inner got 2" in out


def test_a_pickler_of_ones_own_keeps_file_names_as_well():
    import io

    class Counting(pickler_class()):  # as the Ray executor's, which notes ftnb.put refs
        seen = 0

        def persistent_id(self, obj):
            Counting.seen += 1
            return None

    out = io.BytesIO()
    Counting(out).dump(_cell_function())
    assert Counting.seen > 0
    loaded = cloudpickle.loads(out.getvalue())
    assert loaded.__code__.co_filename == CELL
    linecache.cache[CELL] = (len(SOURCE), None, SOURCE.splitlines(keepends=True), CELL)
    try:
        with pytest.raises(ValueError) as raised:
            loaded(1)
        assert "# the line the traceback shows" in "".join(traceback.format_tb(raised.tb))
    finally:
        linecache.cache.pop(CELL, None)
