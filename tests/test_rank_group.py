"""RankGroup (ftnb/execution/rank_group.py): one rank's two threads use the group's store at
once, as the training thread (reports in step) and the upload thread of asynchronous
checkpoints (the ranks' files of a merged checkpoint) do. A torch ``TCPStore`` client holds its
lock for the whole of a call, a ``wait`` until its keys come: on one client, each thread would
hold up the ``set`` the other rank waits for, and the group would deadlock.

A real ``TCPStore`` served in this process; the other rank is a client of it, in a thread. It
gives up waiting after PEER_GIVES_UP, then sets its key all the same, so that a deadlock ends
as a failed assertion instead of a hang."""

from __future__ import annotations

import datetime
import linecache
import sys
import threading
import time

import pytest

dist = pytest.importorskip("torch.distributed")

from ftnb.execution.rank_group import RankGroup, RankPlace  # noqa: E402

pytestmark = pytest.mark.timeout(150)

#: Far longer than any set takes: a peer still waiting then is a deadlock, not a slow machine.
PEER_GIVES_UP = datetime.timedelta(seconds=60)


@pytest.fixture(autouse=True)
def _environment(monkeypatch):
    """RankGroup.join sets MASTER_ADDR and MASTER_PORT: restored after each test."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")


def _wait_until_blocked_in(ident: int, function: str) -> None:
    """Wait until the thread ``ident`` is at the line of ``function`` that calls the store's
    ``wait``, then a little longer, for it to be inside the call (which holds the client's
    lock)."""
    while True:
        frame = sys._current_frames().get(ident)
        while frame is not None and frame.f_code.co_name != function:
            frame = frame.f_back
        if frame is not None and ".wait(" in linecache.getline(frame.f_code.co_filename,
                                                              frame.f_lineno):
            break
        time.sleep(0.01)
    time.sleep(0.2)


def _peer(store_factory, waits_for: str, then_sets: str, seen: list) -> threading.Thread:
    """The other rank: waits for ``waits_for`` (giving up after PEER_GIVES_UP), notes whether
    it came, then sets ``then_sets``."""

    def run() -> None:
        store = store_factory()
        try:
            store.wait([waits_for], PEER_GIVES_UP)
            seen.append(True)
        except Exception:
            seen.append(False)
        store.set(then_sets, '{"error": null, "end": null}')

    thread = threading.Thread(target=run, name="peer", daemon=True)
    thread.start()
    return thread


def test_rank_0_publishes_while_its_upload_thread_waits_for_the_ranks_files():
    """Rank 0's upload thread waits for rank 1's files of a checkpoint; meanwhile its training
    thread publishes the next report, which rank 1 waits for before it says its files are
    written."""
    ports = []

    def rendezvous(port):
        ports.append(port)
        return "127.0.0.1", port

    group = RankGroup.join(RankPlace(0, 2, 0, 2), rendezvous, timeout_s=60)
    errors: list = []
    upload = threading.Thread(target=lambda: errors.append(group.shards_written(1, [1])),
                              name="ftnb-uploads", daemon=True)
    upload.start()
    _wait_until_blocked_in(upload.ident, "shards_written")

    seen: list = []
    peer = _peer(lambda: dist.TCPStore("127.0.0.1", ports[0], 2, False,
                                       timeout=datetime.timedelta(seconds=60)),
                 "ftnb/report/2", "ftnb/shard/1/1", seen)
    group.publish(2, None)
    peer.join()
    upload.join()
    assert seen == [True], "rank 1 never saw the report: the training thread's set was held " \
        "up behind the upload thread's wait on one store client"
    assert errors == [[]]


def test_rank_1_says_its_files_are_written_while_its_training_thread_waits_for_a_decision():
    """Rank 1's training thread waits for rank 0's decision on a report; meanwhile its upload
    thread says its files of a checkpoint are written, which rank 0 waits for before it
    decides."""
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=60),
                           wait_for_workers=False)
    group = RankGroup.join(RankPlace(1, 2, 1, 2), lambda _: ("127.0.0.1", server.port),
                           timeout_s=60)
    training = threading.get_ident()
    upload = threading.Thread(target=lambda: (_wait_until_blocked_in(training, "decision"),
                                              group.shard_written(1, None)),
                              name="ftnb-uploads", daemon=True)
    upload.start()

    seen: list = []
    peer = _peer(lambda: server, "ftnb/shard/1/1", "ftnb/report/2", seen)
    assert group.decision(2) is None
    peer.join()
    upload.join()
    assert seen == [True], "rank 0 never saw rank 1's files written: the upload thread's set " \
        "was held up behind the training thread's wait on one store client"
