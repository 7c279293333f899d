"""The training loop's stall per checkpoint (time inside ``report``) for ftnb SYNC and ASYNC, to
local disk and to an S3-protocol server on loopback (moto), and the upload's throughput against a
raw copy of the same bytes (issue 29).

    python -m bench.checkpoint_upload [--mb 200] [--checkpoints 4] [--step-s 1.0]

Each trial: ``checkpoints`` steps of ``step-s`` seconds of "training" (a sleep), each reporting a
checkpoint of ``mb`` MB (one file) from a TemporaryDirectory. Printed: median and max seconds
inside report per mode and storage, the trial's wall time, and MB/s of the upload (SYNC's time
inside report) next to a raw copy (``shutil.copyfile`` + fsync locally, one ``fs.put`` to S3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import ftnb


def _loop(config: dict) -> None:
    inside = []
    payload = os.urandom(1 << 20)
    begun = time.monotonic()
    for step in range(config["checkpoints"]):
        time.sleep(config["step_s"])
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "weights.bin"), "wb") as f:
                for _ in range(config["mb"]):
                    f.write(payload)
            started = time.monotonic()
            ftnb.report({"step": step}, checkpoint=ftnb.Checkpoint.from_directory(d),
                        checkpoint_upload_mode=ftnb.CheckpointUploadMode[config["mode"]])
            inside.append(time.monotonic() - started)
    with open(config["out"], "w") as f:
        json.dump({"inside": inside, "loop_s": time.monotonic() - begun}, f)


def _ray_loop(config: dict) -> None:
    """The same loop under Ray Train 2.60 with its ASYNC upload (a mkdtemp folder: Ray's
    upload reads it after report returns and deletes it)."""
    import ray.train

    inside = []
    payload = os.urandom(1 << 20)
    begun = time.monotonic()
    for step in range(config["checkpoints"]):
        time.sleep(config["step_s"])
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "weights.bin"), "wb") as f:
            for _ in range(config["mb"]):
                f.write(payload)
        started = time.monotonic()
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d),
                         checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC)
        inside.append(time.monotonic() - started)
    with open(config["out"], "w") as f:
        json.dump({"inside": inside, "loop_s": time.monotonic() - begun}, f)


def _ray_run(config: dict, storage_path: str, endpoint: "str | None") -> None:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    filesystem = None
    if endpoint is not None:
        import pyarrow.fs

        filesystem = pyarrow.fs.S3FileSystem(access_key="bench", secret_key="bench",
                                             endpoint_override=endpoint, scheme="http",
                                             region="us-east-1")
        storage_path = storage_path.replace("s3://", "")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True,
             log_to_driver=False)
    try:
        TorchTrainer(_ray_loop, train_loop_config=config,
                     scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(storage_path=storage_path,
                                          storage_filesystem=filesystem,
                                          name=f"ray-{time.time_ns()}")).fit()
    finally:
        ray.shutdown()


def _raw_copy(mb: int, where: str, fs) -> float:
    """MB/s of a plain copy of an ``mb`` MB file to ``where``."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "weights.bin")
        with open(src, "wb") as f:
            payload = os.urandom(1 << 20)
            for _ in range(mb):
                f.write(payload)
        started = time.monotonic()
        if fs is None:
            dest = os.path.join(where, "raw.bin")
            shutil.copyfile(src, dest)
            fd = os.open(dest, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            os.remove(dest)
        else:
            fs.put(src, where.rstrip("/") + "/raw/weights.bin")
        return mb / (time.monotonic() - started)


def _moto():
    from moto.server import ThreadedMotoServer
    import s3fs
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server.start()
    for key, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ[key] = value
    endpoint = f"http://127.0.0.1:{port}"
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False,
                           skip_instance_cache=True)
    fs.mkdir("bench-ckpt")
    return server, fs, endpoint


def _line(where: str, mode: str, got: dict, mb: int, raw: float) -> str:
    inside = got["inside"]
    line = (f"{where:5s} {mode:5s} inside report: median {statistics.median(inside):.3f} s, "
            f"max {max(inside):.3f} s (each: {', '.join(f'{x:.3f}' for x in inside)}); "
            f"loop {got['loop_s']:.1f} s")
    if mode == "SYNC":
        line += f"; upload {mb / statistics.median(inside):.0f} MB/s vs raw copy {raw:.0f} MB/s"
    return line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--storages", default="local,s3")
    parser.add_argument("--ray", action="store_true", help="Ray Train 2.60 ASYNC too")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="ftnb-bench-ckpt-")
    server = None
    lines = []
    try:
        for where in args.storages.split(","):
            fs = endpoint = None
            if where == "s3":
                server, fs, endpoint = _moto()
                storage_path = "s3://bench-ckpt/exp"
                raw = _raw_copy(args.mb, "bench-ckpt/raw", fs)
            else:
                storage_path = os.path.join(work, "exp")
                os.makedirs(storage_path)
                raw = _raw_copy(args.mb, storage_path, None)
            for mode in ("SYNC", "ASYNC", "RAY") if args.ray else ("SYNC", "ASYNC"):
                out = os.path.join(work, f"{where}-{mode}.json")
                config = {"mb": args.mb, "checkpoints": args.checkpoints,
                          "step_s": args.step_s, "mode": mode, "out": out}
                if mode == "RAY":
                    _ray_run(config, storage_path, endpoint)
                    lines.append(_line(where, "ray", json.load(open(out)), args.mb, raw))
                    print(lines[-1], flush=True)
                    continue
                run_config = ftnb.RunConfig(verbose=0, storage_path=storage_path,
                                            storage_filesystem=fs,
                                            name=f"{where}-{mode.lower()}")
                ftnb.Tuner(_loop, param_space=config, run_config=run_config).fit()
                lines.append(_line(where, mode, json.load(open(out)), args.mb, raw))
                print(lines[-1], flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
