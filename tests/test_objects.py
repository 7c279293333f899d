"""ftnb.objects: put/get of shared objects, their files' lifetime, and binding them in spaces.

Every test stores objects under its own ``tmp_path`` (``FTNB_OBJECT_STORE``), never in /dev/shm.
Processes are real: children are Python scripts started with ``run_script``.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import signal
import tempfile
import threading

import numpy as np
import pandas as pd
import pytest

import ftnb
from ftnb.objects import (
    ObjectRef,
    ObjectUnavailableError,
    bind_objects,
    choose_store_dir,
    get,
    is_placeholder,
    put,
    resolve_refs,
    walk_placeholders,
)
from ftnb.objects.describe import format_size
from ftnb.objects.folders import pid_scope_tag, this_process_identity
from ftnb.search import choice, encode_space, generate_variants, grid_search, loguniform

from procs import run_script, wait_for

linux_only = pytest.mark.skipif(
    not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc"
)


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """The object folder of this test (created by the first put)."""
    path = tmp_path / "store"
    monkeypatch.setenv("FTNB_OBJECT_STORE", str(path))
    return path


@pytest.fixture
def children():
    """Start scripts with ``start(tmp_path, body, *args)``; every one is killed at the end."""
    started = []

    def start(tmp_path, body, *args, name="child.py"):
        proc = run_script(tmp_path, body, *args, name=name)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _ref_hex(ref: ObjectRef) -> str:
    return pickle.dumps(ref).hex()


def _wait_json(path, proc, what):
    """The JSON a child writes (atomically) to ``path``; fails early if the child died."""

    def ready():
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            raise AssertionError(f"child exited with {proc.returncode}:\n{proc.stdout.read()}")
        return None

    return wait_for(ready, timeout=60, what=what)


def _finish(proc, timeout=60):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


# A child's side of a handshake: write JSON to a file atomically.
CHILD_HELPERS = """
import json, os, pickle, sys

def write_json(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)

def rollup():
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out
"""


def _rollup(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


# --------------------------------------------------------------------------- round trips


@linux_only
def test_numpy_array_round_trip_maps_the_file_copy_on_write(store):
    array = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)
    ref = put(array)
    loaded = get(ref)
    np.testing.assert_array_equal(loaded, array)
    assert loaded.flags.writeable
    with open("/proc/self/maps") as f:
        assert ref.path in f.read()  # the data is the file's mapping, not a copy
    assert ref.path.startswith(str(store) + os.sep)
    loaded[0, 0] = -1.0  # private to this process: the file keeps the original
    with open(ref.path, "rb") as f:
        assert np.float64(0.0).tobytes() + np.float64(1.0).tobytes() in f.read()


def test_other_array_layouts_round_trip():
    fortran = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    strided = np.arange(20)[::3]
    empty = np.zeros((0, 5))
    loaded = get(put({"f": fortran, "s": strided, "e": empty}))
    np.testing.assert_array_equal(loaded["f"], fortran)
    assert loaded["f"].flags.f_contiguous
    np.testing.assert_array_equal(loaded["s"], strided)
    assert loaded["e"].shape == (0, 5)


def test_dataframe_round_trip():
    df = pd.DataFrame(
        {
            "x": np.arange(1000, dtype=np.int64),
            "y": np.linspace(0, 1, 1000),
            "name": [f"row{i}" for i in range(1000)],
            "kind": pd.Categorical(["a", "b"] * 500),
            "when": pd.date_range("2024-01-01", periods=1000, freq="h"),
        }
    )
    ref = put(df)
    pd.testing.assert_frame_equal(get(ref), df)
    assert ref.type_name == "pandas.DataFrame"
    assert ref.summary == "DataFrame(shape=(1000, 5))"


def test_torch_tensors_round_trip_with_dtype_grad_and_shared_storage():
    torch = pytest.importorskip("torch")
    f32 = torch.randn(64, 32, requires_grad=True)
    bf16 = torch.randn(16, 8).to(torch.bfloat16).requires_grad_()
    param = torch.nn.Parameter(torch.randn(5), requires_grad=False)
    base = torch.arange(100, dtype=torch.int16)
    tensors = {
        "f32": f32,
        "bf16": bf16,
        "param": param,
        "view": base[10:20],  # shares base's storage
        "base": base,
        "transposed": f32.t(),  # not contiguous
        "bool": torch.tensor([True, False]),
    }
    loaded = get(put(tensors))
    for key, original in tensors.items():
        assert loaded[key].dtype == original.dtype, key
        assert torch.equal(loaded[key].detach(), original.detach()), key
        assert loaded[key].requires_grad == original.requires_grad, key
    assert type(loaded["param"]) is torch.nn.Parameter
    assert type(loaded["f32"]) is torch.Tensor and loaded["f32"].is_leaf
    assert loaded["transposed"].stride() == f32.t().stride()
    # Views still share memory with their base, as after torch's own unpickling.
    loaded["base"][10] = 999
    assert loaded["view"][0] == 999


def test_torch_module_round_trip_keeps_parameters_and_ties():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(
        torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16)
    )
    model[1].weight = model[0].weight  # tied weights: one Parameter used twice
    model[2].running_mean.add_(3.0)  # a buffer, not a parameter
    ref = put(model)
    loaded = get(ref)
    assert ref.type_name == "torch.nn.Sequential"
    assert ref.summary == f"Sequential({sum(p.numel() for p in model.parameters()):,} parameters)"
    for (name, p), (name2, q) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert name == name2 and torch.equal(p, q), name
    assert loaded[1].weight is loaded[0].weight
    out = loaded[0](torch.tensor([1, 2])).sum()
    out.backward()  # loaded parameters train like any other
    assert loaded[0].weight.grad is not None


def test_nested_builtin_objects_round_trip():
    value = {"a": [1, 2.5, "x", None, True], "b": {"c": (1, 2), "d": {3, 4}}, "e": b"\x00\xff"}
    ref = put(value)
    assert get(ref) == value
    assert ref.type_name == "dict"


def test_get_memoizes_and_pickled_refs_come_back_as_the_owners_ref():
    ref = put(np.ones(10))
    assert get(ref) is get(ref)
    assert pickle.loads(pickle.dumps(ref)) is ref
    assert copy.deepcopy(ref) is ref
    assert put(ref) is ref


def test_ref_is_small_hashable_and_describes_the_object():
    ref = put(np.zeros(1000, dtype=np.uint8))
    assert isinstance(ref.id, str) and len(ref.id) >= 12
    assert ref.size == os.path.getsize(ref.path)
    assert 1000 < ref.size < 10_000  # the data plus a small header
    assert repr(ref) == f"ObjectRef(numpy.ndarray, {ref.size / 1000:.1f} kB, id={ref.id[:6]})"
    assert ref.summary == "ndarray(shape=(1000,), dtype=uint8)"
    assert ref.placeholder() == {
        "__ftnb_ref__": ref.id,
        "type": "numpy.ndarray",
        "size": ref.size,
        "repr": ref.summary,
    }
    assert is_placeholder(ref.placeholder()) and not is_placeholder({"a": 1})
    assert json.loads(json.dumps(ref.placeholder())) == ref.placeholder()
    assert {ref: 1}[pickle.loads(pickle.dumps(ref))] == 1
    assert ref != put(np.zeros(3)) and ref != ref.id


def test_summary_is_short_for_any_object():
    ref = put(list(range(1_000_000)))
    assert len(ref.summary) <= 80 and ref.summary.startswith("[0, 1, 2, 3")

    class LongRepr:
        def __repr__(self):
            return "line\n" * 100

    assert len(put(LongRepr()).summary) <= 80


# --------------------------------------------------------------------------- between processes


@linux_only
def test_two_processes_share_one_copy_of_a_200mb_array(tmp_path, children):
    size = 200 * 2**20
    ref = put(np.full(size, 7, dtype=np.uint8))
    assert len(pickle.dumps(ref)) < 1024  # the ref travels, never the data
    body = CHILD_HELPERS + """
import numpy as np
import ftnb.objects
ref = pickle.loads(bytes.fromhex(sys.argv[1]))
before = rollup()
array = ftnb.objects.get(ref)
assert int(array[::4096].sum()) == 7 * len(array[::4096])  # touches every page
write_json(sys.argv[2], {"pid": os.getpid(), "before": before})
import signal
signal.pause()  # mapped until the test kills it
"""
    procs = [
        children(tmp_path, body, _ref_hex(ref), str(tmp_path / f"ready{i}.json"), name=f"c{i}.py")
        for i in range(2)
    ]
    reports = [
        _wait_json(tmp_path / f"ready{i}.json", proc, "child ready") for i, proc in enumerate(procs)
    ]
    grown = []
    for report in reports:
        after = _rollup(report["pid"])  # both children are alive and hold the mapping now
        grown.append({k: after[k] - report["before"][k] for k in ("Rss", "Pss", "Private_Dirty")})
    for g in grown:
        assert g["Rss"] > 0.9 * size, grown  # each process sees all 200 MB ...
        assert g["Private_Dirty"] < 0.1 * size, grown  # ... without a private copy ...
        assert g["Pss"] < 0.75 * size, grown  # ... because the pages are shared (~1/2 each)
    assert sum(g["Pss"] for g in grown) < 1.5 * size, grown


def test_ref_unpickled_in_a_child_never_deletes_the_file(tmp_path, children):
    ref = put(np.arange(1000))
    body = """
import gc, pickle, sys
import ftnb.objects
ref = pickle.loads(bytes.fromhex(sys.argv[1]))
array = ftnb.objects.get(ref)
assert array[5] == 5
array[5] = -1  # copy-on-write: the owner never sees it
del ref, array
gc.collect()
"""
    _finish(children(tmp_path, body, _ref_hex(ref)))
    assert os.path.exists(ref.path)
    assert get(ref)[5] == 5


def test_forked_child_exiting_keeps_the_owners_file(tmp_path, children):
    body = """
import gc, json, os, sys
import ftnb.objects
ref = ftnb.objects.put([1, 2, 3])
pid = os.fork()
if pid == 0:
    del ref
    gc.collect()
    sys.exit(0)  # runs the inherited finalizer at exit: it must not delete the owner's file
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": status, "exists": os.path.exists(ref.path), "path": ref.path}))
"""
    result = json.loads(_finish(children(tmp_path, body)).strip().splitlines()[-1])
    assert result == {"status": 0, "exists": True, "path": result["path"]}
    assert not os.path.exists(result["path"])  # the owner removed it when it exited


def test_file_is_removed_when_the_owners_ref_is_collected():
    ref = put(np.arange(10))
    path = ref.path
    loaded = get(ref)
    assert os.path.exists(path)
    del ref
    gc.collect()
    assert not os.path.exists(path)
    assert loaded[3] == 3  # what was loaded stays valid: the mapping outlives the file


def test_missing_file_while_owner_runs_is_explained():
    ref = put([1, 2])
    os.remove(ref.path)
    with pytest.raises(ObjectUnavailableError) as info:
        get(ref)
    message = str(info.value)
    assert f"ftnb object {ref.id} (list, " in message
    assert "still running" in message and "keep that ref" in message


def test_files_of_a_killed_owner_are_swept_by_the_next_put(tmp_path, store, children):
    body = """
import os, pickle, sys
import numpy as np
import ftnb.objects

class Point:  # defined in __main__, as in a notebook: pickled by value
    def __init__(self, x):
        self.x = x

refs = [ftnb.objects.put(Point(3)), ftnb.objects.put(np.arange(5))]
with open(sys.argv[1] + ".tmp", "wb") as f:
    pickle.dump(refs, f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
import signal
signal.pause()
"""
    ready = tmp_path / "refs.pickle"
    proc = children(tmp_path, body, str(ready))
    wait_for(lambda: ready.exists() or proc.poll() is not None, timeout=60, what="child's refs")
    point_ref, array_ref = pickle.loads(ready.read_bytes())
    assert get(point_ref).x == 3  # a class defined in another process's __main__
    put(1)  # a live owner's files are kept
    assert os.path.exists(point_ref.path) and os.path.exists(array_ref.path)

    # Leftovers of this pid's previous life (same pid, other start time) and a dead temp file.
    pid, start = os.getpid(), this_process_identity()[1]
    tag = pid_scope_tag()
    stale = store / f"{tag}-{pid}-{start + 1}-abcdef.obj"
    dead_tmp = store / f".{tag}-{proc.pid}-0-abcdef.obj.tmp"
    foreign = store / "notes.txt"
    for path in (stale, foreign):
        path.write_bytes(b"x")

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    dead_tmp.write_bytes(b"x")
    put(2)
    assert not os.path.exists(point_ref.path) and not os.path.exists(array_ref.path)
    assert not stale.exists() and not dead_tmp.exists()
    assert foreign.exists()  # not an object file: never touched
    with pytest.raises(ObjectUnavailableError) as info:
        get(array_ref)
    assert str(info.value).startswith(
        f"ftnb object {array_ref.id} (numpy.ndarray, {format_size(array_ref.size)}) "
        f"is no longer available: it was created by process {proc.pid}, which has exited. "
        "Re-create it with ftnb.put(...)"
    )


# --------------------------------------------------------------------------- where files go


def test_the_objects_of_a_killed_trial_are_freed_before_its_retry(tmp_path, store):
    """A trial SIGKILLed after an ftnb.put() cannot delete its object file; the controller
    sweeps it when the attempt ends, so the retry starts with that memory free."""
    from scripted import puts_then_dies

    note = tmp_path / "note"
    grid = ftnb.Tuner(
        puts_then_dies, param_space={"note": str(note)},
        run_config=ftnb.RunConfig(storage_path=str(tmp_path / "runs"), name="puts", verbose=0,
                                  failure_config=ftnb.FailureConfig(max_failures=1)),
    ).fit()
    (result,) = grid
    assert result.metrics["leftover"] is False
    assert note.read_text().startswith(str(store))  # it was put in this test's store
    (trial,) = ftnb.attach(grid.experiment_path).state().trials
    assert grid.num_terminated == 1 and [f.signal for f in trial.failures] == ["SIGKILL"]
    assert os.listdir(store) == []


def test_store_env_var_is_honoured(store):
    ref = put("x")
    assert os.path.dirname(ref.path) == str(store)
    assert choose_store_dir(10**12) == str(store)


def test_shm_is_used_only_when_the_object_fits_with_a_margin(tmp_path, monkeypatch):
    monkeypatch.delenv("FTNB_OBJECT_STORE")
    shm = tmp_path / "shm"
    shm.mkdir()
    gb = 10**9
    in_shm = choose_store_dir(gb, shm_root=str(shm), shm_free=20 * gb, shm_total=24 * gb)
    assert os.path.dirname(in_shm) == str(shm) and "ftnb-objects-" in in_shm
    # 10 GB would leave 2 GB of a 24 GB /dev/shm: less than its 20% reserve.
    in_tmp = choose_store_dir(10 * gb, shm_root=str(shm), shm_free=12 * gb, shm_total=24 * gb)
    assert os.path.dirname(in_tmp) == tempfile.gettempdir()
    tiny = choose_store_dir(1000, shm_root=str(shm), shm_free=64 * 2**20, shm_total=64 * 2**20)
    assert os.path.dirname(tiny) == tempfile.gettempdir()  # Docker's default 64 MB /dev/shm
    missing = choose_store_dir(1000, shm_root=str(tmp_path / "none"))
    assert os.path.dirname(missing) == tempfile.gettempdir()


def test_import_stays_light(tmp_path, children):
    body = """
import sys
import ftnb.objects
print(sorted(m for m in ("numpy", "pandas", "torch", "cloudpickle") if m in sys.modules))
"""
    assert _finish(children(tmp_path, body)).strip() == "[]"


# --------------------------------------------------------------------------- spaces and configs


def test_bind_objects_puts_each_object_once_with_key_paths():
    model, train, test = np.ones(4), np.zeros(3), np.arange(2)
    existing = put(np.ones(2))
    lr = loguniform(1e-4, 1e-1)
    act = choice([test, "relu"])
    space = {
        "lr": lr,
        "model": model,
        "data": {"train": train, "test": test},
        "opt": grid_search(["sgd", model]),
        "act": act,
        "seed": 0,
        "scale": np.float64(0.5),  # 0-d scalars are numbers, not objects
        "zero_d": np.array(3),
        "layers": [64, 64],
        "batches": [train, test],  # a list of objects is stored whole
        "given": existing,
    }
    before = dict(space)
    new_space, bound = bind_objects(space)

    assert [path for path, _ in bound] == ["model", "data/train", "data/test", "batches"]
    refs = dict(bound)
    assert new_space["model"] is refs["model"]
    assert new_space["opt"] == {"grid_search": ["sgd", refs["model"]]}  # same object, same ref
    assert new_space["act"].categories == [refs["data/test"], "relu"]
    assert new_space["given"] is existing
    for key in ("lr", "seed", "scale", "zero_d", "layers"):
        assert new_space[key] is space[key], key
    # The caller's space and domains are untouched.
    assert all(space[k] is v for k, v in before.items())
    assert act.categories[0] is test
    assert space["opt"]["grid_search"][1] is model and space["data"]["train"] is train

    variants = generate_variants(new_space, seed=0)
    assert [type(v["opt"]) for v in variants] == [str, ObjectRef]
    config = resolve_refs(variants[1])
    np.testing.assert_array_equal(config["opt"], model)
    assert [b.tolist() for b in config["batches"]] == [train.tolist(), test.tolist()]

    def encode_leaf(value):
        return value.placeholder() if isinstance(value, ObjectRef) else repr(value)

    encoded = json.loads(json.dumps(encode_space(new_space, encode_leaf)))
    paths = [path for path, _ in walk_placeholders(encoded)]
    assert paths == [
        "model", "data/train", "data/test", "opt/grid_search[1]", "act/categories[0]",
        "batches", "given",
    ]
    assert walk_placeholders(encoded)[0][1] == refs["model"].placeholder()


def test_bind_objects_grid_of_objects_gives_one_ref_per_option():
    options = [np.full(2, i) for i in range(3)]
    new_space, bound = bind_objects({"opt": grid_search(options), "x": (1, options[0])})
    assert [path for path, _ in bound] == [
        "opt/grid_search[0]", "opt/grid_search[1]", "opt/grid_search[2]", "x",
    ]
    assert isinstance(new_space["x"], ObjectRef)  # a search-free tuple holding an object
    configs = [resolve_refs(v) for v in generate_variants(new_space)]
    assert [int(c["opt"][0]) for c in configs] == [0, 1, 2]
    assert configs[0]["x"][0] == 1 and configs[0]["x"][1] is configs[1]["x"][1]


def test_bind_objects_without_objects_returns_the_same_space():
    space = {"a": 1, "b": [1, "x", None], "c": grid_search([1, 2]), "d": choice(["p", "q"])}
    new_space, bound = bind_objects(space)
    assert new_space is space and bound == []


def test_bind_objects_names_the_key_path_of_an_unpicklable_object():
    with pytest.raises(TypeError) as info:
        bind_objects({"train": {"loader": threading.Lock()}})
    message = str(info.value)
    assert "param_space['train/loader']" in message
    assert "_thread.lock" in message and "inside the trainable" in message


def test_resolve_refs_preserves_identity_of_containers_without_refs():
    ref = put(np.arange(3))
    inner = {"b": [1, 2]}
    config = {"a": inner, "c": ref, "d": (1, ref), "e": "x"}
    resolved = resolve_refs(config)
    assert resolved["a"] is inner and resolved["e"] == "x"
    assert resolved["c"] is get(ref) and resolved["d"][1] is get(ref)
    assert isinstance(resolved["d"], tuple)
    assert config["c"] is ref  # the caller's config is not modified
    plain = {"x": [1, {"y": 2}]}
    assert resolve_refs(plain) is plain


def test_get_rejects_what_is_not_a_ref():
    with pytest.raises(TypeError, match="placeholder from a state file"):
        get(put(1).placeholder())
    with pytest.raises(TypeError, match="needs the ObjectRef returned by ftnb.put"):
        get("abc")


def test_put_of_an_unpicklable_object_says_how_to_fix_it():
    with pytest.raises(TypeError, match="cannot pickle the _thread.lock .*inside the trainable"):
        put(threading.Lock())


BIG_PLAIN_DRIVER = """
import json, os, sys, time
import ftnb

N = 200_000


def train(config):
    if config["x"] == 4:  # the last trial waits for the gate (the first driver is killed there)
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
            time.sleep(0.05)
    big = config["big"]
    ftnb.report({"n": len(big), "total": sum(big), "kind": type(big).__name__})


grid = ftnb.run(train, name="big", storage_path=sys.argv[1],
                param_space={"big": list(range(N)), "x": ftnb.grid_search([1, 2, 3, 4])},
                tune_config=ftnb.TuneConfig(max_concurrent_trials=1),
                run_config=ftnb.RunConfig(verbose=0))
print("RESULTS", json.dumps(sorted([r.metrics["n"], r.metrics["total"], r.metrics["kind"],
                                   r.config["x"], len(r.config["big"])] for r in grid)))
"""


def _folder_bytes(root) -> int:
    """What the experiment wrote (the space a driver reserves, .ftnb-reserve.N, aside)."""
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _, names in os.walk(root) for name in names
               if not name.startswith(".ftnb-reserve."))


def test_a_large_plain_value_in_the_space_is_shared_not_copied_and_resumes(tmp_path):
    """A plain list of 200,000 numbers (1.3 MB as JSON) in param_space: each trial's config
    holds the very list, but the experiment folder does not hold a copy per trial (the list
    is put once, as an object is: SHARED_PLAIN_BYTES), and the same run again resumes a
    killed driver's experiment, re-binding the list."""
    from ftnb.objects.binding import SHARED_PLAIN_BYTES

    n = 200_000
    assert len(json.dumps(list(range(n)))) > 10 * SHARED_PLAIN_BYTES
    gate = tmp_path / "gate"
    exp = tmp_path / "big"
    first = run_script(tmp_path, BIG_PLAIN_DRIVER, str(tmp_path), str(gate))
    try:
        wait_for(lambda: exp.is_dir() and sum(
            1 for d in exp.iterdir() if (d / "result.json").is_file()
            and (d / "result.json").read_text().strip()) == 3, 180, "three trials' results")
    finally:
        first.kill()
        first.communicate(timeout=30)
    # Copied into every trial's params.json and trial.json and the state (twice), the list
    # would make this folder over 10 MB.
    assert _folder_bytes(exp) < 200_000, _folder_bytes(exp)
    gate.touch()
    again = run_script(tmp_path, BIG_PLAIN_DRIVER, str(tmp_path), str(gate))
    out, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out
    results = json.loads(out.split("RESULTS ", 1)[1].splitlines()[0])
    assert results == [[n, n * (n - 1) // 2, "list", x, n] for x in (1, 2, 3, 4)], results
    assert _folder_bytes(exp) < 200_000, _folder_bytes(exp)


def test_a_large_plain_value_shared_now_matches_an_older_states_copy_of_it():
    """An experiment an older version started holds a large plain list in its state as it is;
    the same space given again binds it to a ref, which is not a difference (its trials keep
    their copies), while a ref where a string was, or a small value changed, still is."""
    from ftnb.lifecycle.rebinding import space_differences
    from ftnb.objects.binding import SHARED_PLAIN_BYTES

    big = list(range(SHARED_PLAIN_BYTES))
    bound, refs = bind_objects({"big": big, "lr": 0.1, "text": "x" * (SHARED_PLAIN_BYTES + 1)})
    assert [key for key, _ in refs] == ["big", "text"] and bound["lr"] == 0.1
    new = encode_space(bound, lambda v: v.placeholder() if isinstance(v, ObjectRef) else v)
    assert space_differences({"big": big, "lr": 0.1, "text": "x"}, new) == []
    assert space_differences({"big": "x", "lr": 0.2, "text": ["x"]}, new) == [
        'big: was "x", now an object (list)', "lr: was 0.2, now 0.1",
        'text: was ["x"], now an object (str)']


REFS_IN_GRID_DRIVER = """
import json, os, sys, time
import numpy as np
import ftnb


def train(config):
    model = ftnb.get(config["model_ref"])  # as a Ray script calls ray.get on its ObjectRef
    start = 0
    checkpoint = ftnb.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = json.load(open(os.path.join(folder, "step.json")))["step"]
    for step in range(start, 4):
        if step == 2 and model.shape[0] == 3:  # one trial waits at step 2 for the first kill
            deadline = time.monotonic() + 120
            while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
                time.sleep(0.05)
        import tempfile
        folder = tempfile.mkdtemp()
        json.dump({"step": step + 1}, open(os.path.join(folder, "step.json"), "w"))
        ftnb.report({"step": step, "total": float(model.sum()), "n": int(model.shape[0])},
                    checkpoint=ftnb.Checkpoint.from_directory(folder))


a, b = ftnb.put(np.ones(3)), ftnb.put(np.full(5, 2.0))
grid = ftnb.run(train, name="refs", storage_path=sys.argv[1],
                param_space={"model_ref": ftnb.grid_search([a, b])},
                tune_config=ftnb.TuneConfig(max_concurrent_trials=2),
                run_config=ftnb.RunConfig(verbose=0))
print("RESULTS", json.dumps(sorted([r.metrics["n"], r.metrics["total"], r.metrics["step"]]
                                   for r in grid)))
"""


def test_refs_in_a_grid_reach_the_trials_and_are_bound_again_on_resume(tmp_path):
    """Ray's pattern `grid_search([ray.put(a), ray.put(b)])` with `ray.get(config[...])` in the
    trainable, ported by its imports: each trial gets its object and `ftnb.get` of it works;
    the driver is SIGKILLed mid-run, and the same script again (new refs, the old owner gone)
    binds the new refs to the trials by their key path and finishes every trial from its
    checkpoint."""
    gate = tmp_path / "gate"
    exp = tmp_path / "refs"
    first = run_script(tmp_path, REFS_IN_GRID_DRIVER, str(tmp_path), str(gate))
    try:
        def waiting_trial_at_step_2():
            rows = [line for d in (exp.iterdir() if exp.is_dir() else [])
                    if (d / "result.json").is_file()
                    for line in (d / "result.json").read_text().splitlines()]
            return any(json.loads(r)["n"] == 3 and json.loads(r)["step"] == 1 for r in rows)
        wait_for(waiting_trial_at_step_2, 180, "the 3-item trial's second report")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    gate.touch()
    again = run_script(tmp_path, REFS_IN_GRID_DRIVER, str(tmp_path), str(gate))
    out, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out
    results = json.loads(out.split("RESULTS ", 1)[1].splitlines()[0])
    assert results == [[3, 3.0, 3], [5, 10.0, 3]], results
    for trial in (d for d in exp.iterdir() if (d / "result.json").is_file()):
        steps = [json.loads(r)["step"] for r in (trial / "result.json").read_text().splitlines()]
        assert steps == [0, 1, 2, 3], (trial.name, steps)  # every iteration exactly once


def test_get_of_an_object_from_a_ref_returns_it_and_refuses_an_equal_copy():
    value = [1, 2, 3]
    ref = put(value)
    got = get(ref)
    assert get(got) is got  # the object a trial's config holds, from a resolved ref
    with pytest.raises(TypeError, match="needs the ObjectRef returned by ftnb.put"):
        get(list(got))  # equal, but not an object a ref gave this process
