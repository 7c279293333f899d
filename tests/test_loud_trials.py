"""A trial's output is streamed, never buffered: the driver stays small whatever a trial prints,
and the stdout/stderr files keep their first and last lines within $FTNB_OUTPUT_MAX_BYTES."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ftnb.execution.output_pump import (
    OUTPUT_MAX_BYTES,
    OUTPUT_MAX_BYTES_ENV,
    CappedFile,
    FileTail,
    PumpedOutput,
    output_max_bytes,
)
from procs import REPO, STARTED, TESTS, wait_for


# -- the capped file and the pump, without trials --------------------------------------------------
def _lines(first: int, count: int, width: int = 40) -> bytes:
    return b"".join(f"line {i:06d} ".encode().ljust(width - 1, b"x") + b"\n"
                    for i in range(first, first + count))


def test_capped_file_keeps_the_first_and_the_last_lines(tmp_path):
    path = str(tmp_path / "stdout")
    cap = 4096
    written = b""
    f = CappedFile(path, cap)
    for start in range(0, 1000, 7):  # many small writes, each appended
        chunk = _lines(start, 7)
        written += chunk
        f.write(chunk)
        assert os.path.getsize(path) <= cap
    f.close()
    data = open(path, "rb").read()
    head, note, tail = data.partition(b"[ftnb: ")
    assert written.startswith(head) and head.endswith(b"\n")
    assert len(head) > cap // 2 - 40  # the first half, to a line's end
    note_line, _, tail = tail.partition(b"\n")
    assert written.endswith(tail) and tail.startswith(b"line ")  # whole lines, to the last
    assert len(tail) >= cap // 4 - 40
    left_out = int(note_line.split()[0])
    assert left_out == len(written) - len(head) - len(tail)
    assert OUTPUT_MAX_BYTES_ENV.encode() in note_line


def test_capped_file_goes_on_across_attempts(tmp_path):
    path = str(tmp_path / "stdout")
    written = _lines(0, 300)
    f = CappedFile(path, 4096)
    f.write(written)
    f.close()
    more = _lines(300, 300)
    written += more
    f = CappedFile(path, 4096)  # the next attempt appends to the same file
    f.write(more)
    f.close()
    data = open(path, "rb").read()
    assert data.count(b"[ftnb: ") == 1  # one note, counting both attempts' cuts
    head, _, rest = data.partition(b"[ftnb: ")
    note_line, _, tail = rest.partition(b"\n")
    assert written.startswith(head) and written.endswith(tail)
    assert int(note_line.split()[0]) == len(written) - len(head) - len(tail)


def test_capped_file_cuts_a_line_longer_than_half_the_cap(tmp_path):
    path = str(tmp_path / "stdout")
    f = CappedFile(path, 4096)
    f.write(b"y" * 10000 + b"\nend\n")
    f.close()
    data = open(path, "rb").read()
    assert len(data) <= 4096 and data.startswith(b"y" * 2048) and data.endswith(b"\nend\n")


def test_pump_drops_what_the_listener_does_not_take(tmp_path):
    read_fd, write_fd = os.pipe()
    pump = PumpedOutput(read_fd, str(tmp_path / "out"), max_bytes=1 << 20, shown_bytes=1000)
    with os.fdopen(write_fd, "wb") as w:
        w.write(_lines(0, 200))  # 8000 bytes, nobody takes any
    wait_for(lambda: pump.ended, timeout=10, what="the pump to see the pipe close")
    text = ""
    while (part := pump.take_text(300)) is not None:
        text += part
    pump.close()
    assert text.startswith("line 000000 ")
    assert "bytes of output not shown here" in text
    assert len(text) < 1200
    assert open(tmp_path / "out", "rb").read() == _lines(0, 200)  # the file has it all


def test_a_full_disk_loses_output_not_the_trial(tmp_path, capfd):
    """The pipe is still drained (the trial is never blocked, nor failed, by its output)."""
    read_fd, write_fd = os.pipe()
    pump = PumpedOutput(read_fd, "/dev/full", max_bytes=1 << 20, shown_bytes=1 << 16)
    with os.fdopen(write_fd, "wb") as w:
        w.write(_lines(0, 100))
    wait_for(lambda: pump.ended, timeout=10, what="the pump to see the pipe close")
    assert pump.take_text() == _lines(0, 100).decode()
    pump.close()
    assert pump.error is not None and pump.error.errno == 28  # ENOSPC
    assert "could not write a trial's output to /dev/full" in capfd.readouterr().err


def test_file_tail_reads_bounded_pieces_and_skips_a_backlog(tmp_path):
    """How a Ray actor's output reaches the driver: never more than ``limit`` a read."""
    path = tmp_path / "stdout"
    path.write_bytes(b"before this attempt\n")
    tail = FileTail("stdout", str(path), backlog=4000)
    with open(path, "ab") as f:
        f.write(_lines(0, 50))  # 2000 bytes: within the backlog
    first = tail.read(limit=1000)
    assert first == _lines(0, 25).decode()  # whole lines only, at most the limit
    assert tail.read(limit=1000) == _lines(25, 25).decode()
    assert tail.read() is None
    with open(path, "ab") as f:
        f.write(_lines(50, 1000))  # 40000 bytes: more than the backlog
    text = tail.read(limit=100000)
    assert text.startswith("[ftnb: ") and "bytes of output not shown here" in text
    skipped = int(text.split()[1])
    assert text.endswith(_lines(1049, 1).decode()) and len(text) < 4200
    assert skipped == 40000 - len(text.split("\n", 1)[1])


@pytest.mark.parametrize("value, ok", [("", OUTPUT_MAX_BYTES), ("8192", 8192), ("100", None),
                                       ("lots", None)])
def test_output_max_bytes_setting(monkeypatch, value, ok):
    monkeypatch.setenv(OUTPUT_MAX_BYTES_ENV, value)
    if ok is not None:
        assert output_max_bytes() == ok
        return
    with pytest.raises(ValueError, match=OUTPUT_MAX_BYTES_ENV):
        output_max_bytes()


# -- a trial that prints 1 GiB, under a real driver process ----------------------------------------
_DRIVER = r'''
import json, os, sys
import ftnb

MIB = 1 << 20
ROWS = 8


def loud(config):
    line = b"%09d " + b"z" * 1013 + b"\n"  # 1 KiB lines
    block = b"".join(line % i for i in range(1024))  # 1 MiB
    out = sys.stdout.buffer
    out.write(b"FIRST LINE OF A LOUD TRIAL\n")
    sys.stderr.write("stderr: first\n")
    for row in range(ROWS):
        for _ in range(config["mib"] // ROWS):
            out.write(block)
        out.flush()
        ftnb.report({"row": row})
    out.write(b"LAST LINE OF A LOUD TRIAL\n")
    out.flush()
    sys.stderr.write("stderr: last\n")


if __name__ == "__main__":
    results = ftnb.Tuner(
        loud, param_space={"mib": int(sys.argv[2])},
        run_config=ftnb.RunConfig(storage_path=sys.argv[1], name="loud", verbose=1),
    ).fit()
    with open("/proc/self/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
    print("DRIVER_PEAK", json.dumps({"vmhwm_kb": hwm, "path": results[0].path,
                                     "errors": results.num_errors}), flush=True)
'''


def test_a_trial_printing_1_gib(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    log = tmp_path / "driver.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS]), PYTHONUNBUFFERED="1")
    env.pop(OUTPUT_MAX_BYTES_ENV, None)
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "runs"), "1024"],
                                cwd=str(tmp_path), env=env, stdout=out, stderr=subprocess.STDOUT)
        STARTED.append(proc)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the driver did not end in 300 s: " + log.read_text()[-2000:])
    took = time.monotonic() - started
    text = log.read_bytes().decode("utf-8", "replace")
    assert proc.returncode == 0, text[-3000:]
    report = json.loads(text.rsplit("DRIVER_PEAK ", 1)[1].splitlines()[0])
    print(f"driver peak RSS {report['vmhwm_kb'] / 1024:.0f} MiB, {took:.1f} s")
    assert report["errors"] == 0
    # The driver's peak resident memory (VmHWM): well under what it was asked to show.
    assert report["vmhwm_kb"] < 300 * 1024, report
    assert took < 240  # streamed: not slowed to a crawl

    trial = report["path"]
    stdout = os.path.join(trial, "stdout")
    size = os.path.getsize(stdout)
    assert size <= OUTPUT_MAX_BYTES
    with open(stdout, "rb") as f:
        assert f.readline() == b"FIRST LINE OF A LOUD TRIAL\n"
        f.seek(size - 4096)
        end = f.read()
    assert end.endswith(b"\n000001023 " + b"z" * 1013 + b"\nLAST LINE OF A LOUD TRIAL\n")
    with open(stdout, "rb") as f:
        f.seek(OUTPUT_MAX_BYTES // 2 - 4096)
        middle = f.read(8192)
    note = middle[middle.index(b"[ftnb: "):].split(b"\n", 1)[0]
    total = (1 << 30) + len(b"FIRST LINE OF A LOUD TRIAL\nLAST LINE OF A LOUD TRIAL\n")
    assert int(note.split()[1]) == total - (size - len(note) - 1)
    stderr = open(os.path.join(trial, "stderr")).read()
    assert stderr.startswith("stderr: first\n") and stderr.endswith("stderr: last\n")
    rows = [json.loads(line) for line in open(os.path.join(trial, "result.json"))]
    assert [r["row"] for r in rows] == list(range(8))
    assert [r["training_iteration"] for r in rows] == list(range(1, 9))
    # The terminal showed the start, and said what it left out rather than buffering it.
    assert "FIRST LINE OF A LOUD TRIAL" in text
    assert "bytes of output not shown here" in text



def test_file_tail_follows_a_file_cut_to_its_cap(tmp_path):
    """The pump server cuts the file while the driver tails it: the tail goes on after the
    last line it handed over, where the cut moved it, showing each line once and in order."""
    path = str(tmp_path / "stdout")
    f = CappedFile(path, 8192)
    f.write(_lines(0, 50))  # 2000 bytes, before this attempt
    tail = FileTail("stdout", path, backlog=1 << 20, keep_first=True)
    shown = ""
    for start in range(50, 2000, 10):  # cut many times, read after each write
        f.write(_lines(start, 10))
        shown += tail.read(limit=100000) or ""
    f.close()
    assert shown == _lines(50, 1950).decode()

    # Behind by more than the cut kept: the lines it can no longer find are said to be missing.
    f = CappedFile(path, 8192)
    f.write(_lines(2000, 1000))
    f.close()
    text = tail.read(limit=100000)
    assert text.startswith("[ftnb: ") and "not shown here" in text
    assert text.endswith(_lines(2999, 1).decode())
    body = text.split("\n", 1)[1]
    assert _lines(2000, 1000).decode().endswith(body)


def test_file_tail_keeping_the_first_lines(tmp_path):
    """Far behind, the local tail shows the first lines waiting, then skips to the last ones."""
    path = tmp_path / "stdout"
    path.write_bytes(b"")
    tail = FileTail("stdout", str(path), backlog=4000, keep_first=True)
    path.write_bytes(_lines(0, 1000))  # 40000 bytes
    text = tail.read(limit=2000)
    assert text.startswith(_lines(0, 25).decode() + "[ftnb: ")
    assert "bytes of output not shown here" in text
