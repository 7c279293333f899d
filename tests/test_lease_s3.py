"""The owner lease on S3 is a compare-and-swap (ftnb/storage/lease.py, ``Storage.write_if``).

Against the real moto server. Each race is made certain rather than hoped for: a driver's S3
filesystem is wrapped so that, right after its GET of ``owner.json`` returns, a competitor
(another driver, with a filesystem of its own) does its whole write before the driver goes on
to its PUT. The wrapper sits under both the old lease code (``cat_file``) and the new one (one
``get_object`` with its ETag), so every race test here also ran against the lease without
compare-and-swap, where it failed.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import make_s3_filesystem
from ftnb.storage import ExperimentPaths
from ftnb.storage.lease import ExperimentLockedError, Lease, LeaseLostError, read_lease

pytestmark = pytest.mark.s3


@pytest.fixture(autouse=True)
def _clean_lease_env(monkeypatch):
    """Default TTL, "this machine", and no settle delay: the compare-and-swap needs none (on
    storage that relied on it, two acquisitions could now both win)."""
    for name in ("FTNB_HOST_ID", "FTNB_LEASE_TTL_S", "FTNB_LEASE_HEARTBEAT_S"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Lease, "SETTLE_S", 0.0)


def _driver(s3_storage, s3_endpoint, name="exp") -> ExperimentPaths:
    """The experiment as one driver sees it: through a filesystem of its own."""
    url, _ = s3_storage
    return ExperimentPaths.at(f"{url}/{name}", make_s3_filesystem(s3_endpoint))


def _then_before_the_next_call(paths: ExperimentPaths, methods: tuple, competitor) -> list:
    """Make the filesystem of ``paths`` run ``competitor()`` (a blocking call, on another
    thread) once, right after its next request of one of ``methods`` (``get_object``,
    ``head_object``, ``put_object``) on ``owner.json`` has been answered, and before its
    caller goes on. Returns a list that holds the competitor's result once it ran."""
    fs = paths.storage.fs
    real = fs._call_s3
    ran: list = []

    armed = [True]

    async def call_s3(name, *args, **kwargs):
        try:
            return await real(name, *args, **kwargs)
        finally:
            if name in methods and kwargs.get("Key", "").endswith("owner.json") and armed:
                armed.clear()
                ran.append(await asyncio.get_running_loop().run_in_executor(None, competitor))

    fs._call_s3 = call_s3
    return ran


def _owner(paths: ExperimentPaths) -> dict:
    return json.loads(paths.storage.read_bytes(paths.lease))


@pytest.mark.parametrize("released", [False, True], ids=["heartbeat", "release"])
def test_a_takeover_between_a_beat_s_read_and_its_put_is_never_overwritten(
        s3_storage, s3_endpoint, released):
    old = Lease.acquire(_driver(s3_storage, s3_endpoint))
    takeover = _then_before_the_next_call(
        old.paths, ("get_object",),
        lambda: Lease.acquire(_driver(s3_storage, s3_endpoint), takeover=True))

    assert old._write_if_ours(released=released) is False
    new = takeover[0]
    owner = _owner(old.paths)
    assert owner["token"] == new.token and owner["epoch"] == 2 and owner["released"] is False
    assert old.lost is not None and "took over" in old.lost
    with pytest.raises(LeaseLostError):
        old.check()
    new.check()
    new.release()
    assert read_lease(old.paths).released


def test_of_two_acquisitions_the_one_that_writes_second_is_refused_at_once(
        s3_storage, s3_endpoint):
    late = _driver(s3_storage, s3_endpoint)
    # The first driver finds no owner.json, and the second takes the lease before it writes
    # (s3fs asked a missing object's size first, before the compare-and-swap).
    first = _then_before_the_next_call(late, ("head_object", "get_object"),
                                       lambda: Lease.acquire(_driver(s3_storage, s3_endpoint)))
    with pytest.raises(ExperimentLockedError, match="at the same moment"):
        Lease.acquire(late)
    assert _owner(late)["token"] == first[0].token and _owner(late)["epoch"] == 1
    first[0].check()


def test_an_acquisition_that_meets_the_owner_s_heartbeat_judges_it_again(
        s3_storage, s3_endpoint, monkeypatch):
    old = Lease.acquire(_driver(s3_storage, s3_endpoint))
    taker = _driver(s3_storage, s3_endpoint)
    # The owner beats between the takeover's versioned read and its write (a takeover reads
    # owner.json before that too): the write is refused, the lease read again (the same
    # token: the lease it came to take) and taken.
    beat: list = []
    read_versioned = taker.storage.read_versioned

    def read_then_beat(path):
        read = read_versioned(path)
        if not beat:
            beat.append(old._write_if_ours(released=False))
        return read

    monkeypatch.setattr(taker.storage, "read_versioned", read_then_beat)
    new = Lease.acquire(taker, takeover=True)
    assert beat == [True]
    assert _owner(taker)["token"] == new.token and new.previous.token == old.token
    assert old._write_if_ours(released=False) is False and old.lost is not None


def test_a_conditional_put_retried_after_its_answer_was_lost_counts_as_written(
        s3_storage, s3_endpoint, monkeypatch):
    monkeypatch.setattr("ftnb.storage.backend.RETRY_FIRST_S", 0.01)
    paths = _driver(s3_storage, s3_endpoint)

    def answer_lost() -> None:
        raise ConnectionResetError("the answer to a PUT that landed was lost")

    # Each PUT of owner.json lands and its answer does not come back; the retry's condition
    # then no longer holds (the object is the one it wrote).
    _then_before_the_next_call(paths, ("put_object",), answer_lost)
    lease = Lease.acquire(paths)
    assert _owner(paths)["token"] == lease.token
    _then_before_the_next_call(paths, ("put_object",), answer_lost)
    assert lease._write_if_ours(released=False) is True and lease.lost is None
    owner = _owner(paths)
    assert owner["token"] == lease.token and owner["heartbeat"] > owner["acquired"]


@pytest.mark.parametrize("server", ["ignores", "refuses"])
def test_a_server_without_conditional_writes_leaves_the_lease_on_its_settle_delay(
        s3_storage, s3_endpoint, monkeypatch, capsys, server):
    # An S3-protocol server that takes If-Match / If-None-Match and ignores them, or answers
    # 501 Not Implemented (neither can be had here otherwise: moto honours them).
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    monkeypatch.setattr(Lease, "SETTLE_S", 0.05)
    paths = _driver(s3_storage, s3_endpoint)
    fs = paths.storage.fs
    real = fs._call_s3

    async def without_conditions(name, *args, **kwargs):
        if name == "put_object" and ("IfMatch" in kwargs or "IfNoneMatch" in kwargs):
            if server == "refuses":
                raise translate_boto_error(ClientError(
                    {"Error": {"Code": "NotImplemented", "Message": "A header you provided "
                               "implies functionality that is not implemented"},
                     "ResponseMetadata": {"HTTPStatusCode": 501}}, "PutObject"))
            kwargs.pop("IfMatch", None)
            kwargs.pop("IfNoneMatch", None)
        return await real(name, *args, **kwargs)

    fs._call_s3 = without_conditions
    lease = Lease.acquire(paths)
    assert "does not honour conditional writes" in capsys.readouterr().err
    assert paths.storage.read_versioned(paths.lease)[1] is None  # no versions: no CAS
    assert lease._write_if_ours(released=False) and _owner(paths)["token"] == lease.token
    assert [name for name in fs.ls(paths.dir, detail=False)
            if "probe" in name] == []  # the probe object is gone
    lease.release()
    assert read_lease(paths).released


def test_the_conditional_write_probe_stays_out_of_the_experiment_s_folder(s3_storage,
                                                                           s3_endpoint):
    """A driver's storage is the storage_path: the one-off probe of the server goes there (as
    the writability probe does), not next to owner.json, where anyone listing the experiment's
    folder at that moment would meet an object that is gone when they read it."""
    from ftnb.storage import Storage

    url, _ = s3_storage
    storage = Storage(url, make_s3_filesystem(s3_endpoint))
    paths = ExperimentPaths.of(storage, "exp")
    fs = storage.fs
    real = fs._call_s3
    written: list[str] = []

    async def recording(name, *args, **kwargs):
        if name == "put_object":
            written.append(f"{kwargs['Bucket']}/{kwargs['Key']}")
        return await real(name, *args, **kwargs)

    fs._call_s3 = recording
    Lease.acquire(paths).release()
    root, folder = url.removeprefix("s3://"), paths.dir.removeprefix("s3://")
    probes = [key for key in written if ".ftnb-cas-probe-" in key]
    assert probes and all(key.rsplit("/", 1)[0] == root for key in probes), written
    assert {key for key in written if key.startswith(folder + "/")} == {f"{folder}/owner.json"}
