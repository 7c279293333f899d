"""Ray's ``ray.air.integrations.wandb.WandbLoggerCallback``: one Weights & Biases run per trial,
logged from the driver (``pip install 'ftnb[wandb]'``).

    from ftnb.air.integrations.wandb import WandbLoggerCallback

    ftnb.Tuner(train, param_space={"lr": ftnb.loguniform(1e-4, 1e-1)},
               run_config=ftnb.RunConfig(callbacks=[WandbLoggerCallback(project="sweep")])).fit()

Each trial's run has the trial's config, every numeric metric of each report at step
``training_iteration`` (W&B's ``_step``), and is grouped by the experiment's name. Exactly once
(see :mod:`ftnb.logger`): the run's id is kept in the trial's folder (``wandb_run.json``) before
the run starts, so a restored experiment resumes the same run (``resume="allow"``) and logs only
the iterations it does not hold: what the run's earlier pieces in the local ``wandb/`` folder
hold (offline mode writes one piece per driver; ``wandb sync`` uploads them in order as one
run), and, online, what W&B says the resumed run holds.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import secrets
import struct
import time
import zlib
from typing import Any, Iterator, Optional

from ...logger import (
    IterationLogger,
    numeric_metrics,
    require,
    shown_config,
    step_of,
    trial_name,
)

__all__ = ["WandbLoggerCallback", "read_history", "run_pieces"]

_log = logging.getLogger("ftnb")

#: The trial folder's record of its run: {"run_id", "project", "ended"}.
_RECORD = "wandb_run.json"
#: Settings for runs hosted by the driver: the driver's console and system metrics are not the
#: trial's (override with settings=wandb.Settings(...)).
_SETTINGS = {"console": "off", "x_disable_stats": True}
#: How long a finished run's local file may take to hold what was logged (s).
_WRITTEN_TIMEOUT_S = 30.0
#: ``wandb.init`` arguments that ftnb sets itself, per trial.
_OWN_INIT_ARGS = ("id", "resume", "reinit", "resume_from", "fork_from")


class WandbLoggerCallback(IterationLogger):
    """Log each trial to its own W&B run (Ray Tune's ``WandbLoggerCallback``).

    Args:
        project: the W&B project (or ``WANDB_PROJECT``). Required.
        group: the runs' group (or ``WANDB_RUN_GROUP``; default: the experiment's name).
        api_key_file, api_key: a W&B API key, from a file or as it is (or ``WANDB_API_KEY``, or
            ``wandb login``); not needed with ``WANDB_MODE=offline``.
        excludes: metrics (``"outer"`` also drops ``"outer/inner"``) and config keys not to log.
        log_config: update the run's config from the trial's config at each result (for
            schedulers that change it, such as PBT).
        upload_checkpoints: upload each checkpoint as a W&B artifact (type ``"model"``).
        save_checkpoints: the deprecated name of ``upload_checkpoints``.
        upload_timeout: when the experiment ends, how long to wait (s) for the runs still
            finishing (uploading) in the background.
        **kwargs: passed to ``wandb.init`` (``entity``, ``tags``, ``notes``, ``mode``, ``dir``,
            ``settings``, ...). By default a run's files go to ``wandb/`` in the trial's folder
            (``dir=`` or ``WANDB_DIR`` choose another), with console capture and system metrics
            off (they would be the driver's).
    """

    _exclude_results = ["done", "should_checkpoint"]

    def __init__(self, project: Optional[str] = None, group: Optional[str] = None,
                 api_key_file: Optional[str] = None, api_key: Optional[str] = None,
                 excludes: Optional[list] = None, log_config: bool = False,
                 upload_checkpoints: bool = False, save_checkpoints: bool = False,
                 upload_timeout: float = 1800, video_kwargs: Optional[dict] = None,
                 image_kwargs: Optional[dict] = None, **kwargs: Any) -> None:
        require("wandb", "wandb", "WandbLoggerCallback")
        for name, value in (("project", project), ("group", group),
                            ("api_key_file", api_key_file), ("api_key", api_key)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"WandbLoggerCallback({name}={value!r}) must be a non-empty "
                                f"string or None.")
        if not (project or os.environ.get("WANDB_PROJECT")):
            raise ValueError("WandbLoggerCallback() needs a W&B project. Fix: "
                             "WandbLoggerCallback(project='my-project'), or set WANDB_PROJECT.")
        if api_key and api_key_file:
            raise ValueError("WandbLoggerCallback got both api_key and api_key_file. Fix: pass "
                             "one of them.")
        if api_key_file and not os.path.isfile(os.path.expanduser(api_key_file)):
            raise ValueError(f"WandbLoggerCallback(api_key_file={api_key_file!r}): no such "
                             "file. Fix: the path of a file holding your W&B API key.")
        if excludes is not None and (not isinstance(excludes, (list, tuple))
                                     or not all(isinstance(e, str) for e in excludes)):
            raise TypeError(f"WandbLoggerCallback(excludes={excludes!r}) must be a list of "
                            "metric or config names. Fix: excludes=['time_this_iter_s'].")
        for name, value in (("log_config", log_config),
                            ("upload_checkpoints", upload_checkpoints),
                            ("save_checkpoints", save_checkpoints)):
            if not isinstance(value, bool):
                raise TypeError(f"WandbLoggerCallback({name}={value!r}) must be True or False.")
        if (isinstance(upload_timeout, bool) or not isinstance(upload_timeout, (int, float))
                or upload_timeout < 0):
            raise ValueError(f"WandbLoggerCallback(upload_timeout={upload_timeout!r}) must be "
                             "a number of seconds >= 0.")
        if video_kwargs or image_kwargs:
            raise ValueError(
                "WandbLoggerCallback(video_kwargs=..., image_kwargs=...): ftnb's results are "
                "JSON (numbers, strings, lists), so no images or videos reach the logger. Fix: "
                "leave them out, and log media from the trainable with wandb itself.")
        own = [k for k in kwargs if k in _OWN_INIT_ARGS]
        if own:
            raise ValueError(
                f"WandbLoggerCallback({own[0]}=...): ftnb sets it for each trial (one run per "
                "trial, resumed after a restore). Fix: leave it out.")
        if kwargs:
            import inspect

            import wandb

            known = inspect.signature(wandb.init).parameters
            unknown = [k for k in kwargs if k not in known]
            if unknown:
                raise TypeError(f"WandbLoggerCallback({unknown[0]}=...) is not an argument of "
                                f"wandb.init (it takes: {', '.join(known)}).")
        if save_checkpoints:
            import warnings

            warnings.warn("WandbLoggerCallback(save_checkpoints=...) is deprecated. Use "
                          "upload_checkpoints instead.", DeprecationWarning, stacklevel=2)
            upload_checkpoints = True
        self.project = project
        self.group = group
        self.api_key_path = api_key_file
        self.api_key = api_key
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints
        self.upload_timeout = float(upload_timeout)
        self.kwargs = kwargs

    # -- the sink ------------------------------------------------------------------------------
    def _open(self, **info: Any) -> None:
        self.project = self.project or os.environ.get("WANDB_PROJECT")
        self.group = self.group or os.environ.get("WANDB_RUN_GROUP")
        key = self.api_key
        if self.api_key_path:
            with open(os.path.expanduser(self.api_key_path)) as f:
                key = f.readline().strip()
        if key and os.environ.get("WANDB_MODE") not in ("offline", "disabled"):
            os.environ["WANDB_API_KEY"] = key
        self._runs: dict[str, Any] = {}  # trial id -> the open wandb Run
        self._held: dict[str, int] = {}  # trial id -> the last iteration its run holds
        self._finishing: list[concurrent.futures.Future] = []
        self._finisher: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _run(self, trial: Any) -> Any:
        """The trial's open run: started (or resumed, with the id in its record) if needed."""
        import wandb

        run = self._runs.get(trial.trial_id)
        if run is not None:
            return run
        record = self.read_record(trial, _RECORD)
        run_id = record["run_id"] if record else f"{trial.trial_id}_{secrets.token_hex(4)}"
        if not record or record.get("ended"):
            # Written before the run starts: a driver that dies now leaves the id to resume.
            self.write_record(trial, _RECORD, {"run_id": run_id, "project": self.project,
                                               "ended": False})
        config = {k: v for k, v in _config(trial).items() if k not in self.excludes}
        init = dict(id=run_id, name=trial_name(trial), resume="allow", reinit="create_new",
                    allow_val_change=True, project=self.project, config=config,
                    group=self.group or (self._paths.name if self._paths is not None else None))
        folder = self.trial_folder(trial)
        if folder is not None and "dir" not in self.kwargs and not os.environ.get("WANDB_DIR"):
            init["dir"] = folder  # as Ray's, which runs it in the trial's folder
        if "settings" not in self.kwargs:
            init["settings"] = wandb.Settings(**_SETTINGS)
        init.update(self.kwargs)
        run = wandb.init(**init)
        held = max(_held_before(run, run_id), (run.starting_step or 1) - 1)
        self._runs[trial.trial_id] = run
        self._held[trial.trial_id] = held
        return run

    def _log(self, run: Any, trial: Any, row: dict) -> None:
        step = step_of(row)
        if step <= self._held.get(trial.trial_id, 0):
            return  # the run holds it (W&B's steps only grow)
        if self.log_config:
            run.config.update(_config(trial), allow_val_change=True)
        metrics = numeric_metrics(row, tuple(self._exclude_results + self.excludes))
        run.log(metrics, step=step)
        self._held[trial.trial_id] = step

    def _replay(self, trial: Any, rows: list[dict]) -> int:
        if not rows:
            return 0
        run = self._run(trial)
        for row in rows:
            self._log(run, trial, row)
        return self._held[trial.trial_id]

    def _ended_before(self, trial: Any) -> bool:
        record = self.read_record(trial, _RECORD)
        return bool(record and record.get("ended"))

    # -- Ray's hooks ---------------------------------------------------------------------------
    def log_trial_start(self, trial: Any) -> None:
        self._run(trial)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        self._log(self._run(trial), trial, result)

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any,
                      **info: Any) -> None:
        if self._off or not self.upload_checkpoints:
            return
        import wandb

        run = self._run(trial)
        name = re.sub(r"[^\w.-]", "_", f"checkpoint_{trial_name(trial)}")
        artifact = wandb.Artifact(name=name, type="model")
        with checkpoint.as_directory() as folder:
            artifact.add_dir(folder)  # copied into W&B's staging area here
        run.log_artifact(artifact)

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        run = self._runs.pop(trial.trial_id, None)
        if run is None:
            record = self.read_record(trial, _RECORD)
            if record and not record.get("ended"):
                self.write_record(trial, _RECORD, {**record, "ended": True})
            return
        self._finish(run, trial, exit_code=1 if failed else 0, ended=True,
                     held=self._held.get(trial.trial_id, 0))

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        # Runs of trials that did not end (the experiment was stopped) are finished too, and
        # resumed if the experiment is.
        if self._off:
            return
        for trial_id in list(self._runs):
            trial = next((t for t in trials if t.trial_id == trial_id), None)
            self._finish(self._runs.pop(trial_id), trial, exit_code=0, ended=False,
                         held=self._held.get(trial_id, 0))
        done, pending = concurrent.futures.wait(self._finishing, timeout=self.upload_timeout)
        if pending:
            _log.warning("ftnb: %d W&B runs were still uploading after upload_timeout=%ss; "
                         "`wandb sync` uploads what is left.", len(pending), self.upload_timeout)
        for future in done:
            if future.exception() is not None:
                _log.error("ftnb: finishing a W&B run failed: %s", future.exception())
        self._finishing = []
        if self._finisher is not None:
            self._finisher.shutdown(wait=False)
            self._finisher = None

    def _finish(self, run: Any, trial: Any, exit_code: int, ended: bool, held: int) -> None:
        """Finish ``run`` in the background (it may upload for a while), wait until its local
        file holds iteration ``held`` (wandb's service writes it after ``finish`` returns: a
        reader, ``wandb sync`` or the next driver's catching up, must find it complete), then
        mark the trial's record ended."""
        if self._finisher is None:
            self._finisher = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="ftnb-wandb-finish")

        def finish() -> None:
            run.finish(exit_code=exit_code)
            piece = os.path.join(os.path.dirname(run.dir), f"run-{run.id}.wandb")
            deadline = time.monotonic() + _WRITTEN_TIMEOUT_S
            while held and os.path.isfile(piece) and time.monotonic() < deadline and max(
                    (step for step, _ in read_history(piece)), default=0) < held:
                time.sleep(0.05)
            if ended and trial is not None:
                record = self.read_record(trial, _RECORD) or {"run_id": run.id}
                self.write_record(trial, _RECORD, {**record, "ended": True})

        self._finishing.append(self._finisher.submit(finish))


def _config(trial: Any) -> dict:
    config = shown_config(trial.config)
    config = config if isinstance(config, dict) else {"config": config}
    return {**config, "trial_id": trial.trial_id}


def _held_before(run: Any, run_id: str) -> int:
    """The last iteration the run's earlier pieces in its local ``wandb/`` folder hold (0:
    none), each piece written by one driver."""
    own = os.path.dirname(run.dir)  # <wandb folder>/<offline-run|run>-<time>-<id>[-<n>]/files
    held = 0
    for path in run_pieces(os.path.dirname(own), run_id):
        if os.path.dirname(path) != own:
            held = max([held] + [step for step, _ in read_history(path)])
    return held


def run_pieces(wandb_folder: str, run_id: str) -> list[str]:
    """The transaction logs (``run-<id>.wandb``) of the run ``run_id`` in ``wandb_folder``
    (a ``wandb/`` folder), one per process that logged to it, oldest first. Their folders are
    ``<offline-run|run>-<YYYYmmdd_HHMMSS>-<id>``, with ``-<n>`` added by wandb when one of the
    same second exists."""
    found = []
    for folder in os.listdir(wandb_folder) if os.path.isdir(wandb_folder) else []:
        match = re.fullmatch(r"(?:offline-run|run)-(\d{8}_\d{6})-" + re.escape(run_id)
                             + r"(?:-(\d+))?", folder)
        path = os.path.join(wandb_folder, folder, f"run-{run_id}.wandb")
        if match and os.path.isfile(path):
            found.append(((match.group(1), int(match.group(2) or 0)), path))
    return [path for _, path in sorted(found)]


# -- W&B's transaction log ---------------------------------------------------------------------
# A run's ``run-<id>.wandb`` file: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
# LevelDB-log records in 32 KiB blocks (crc32, length, type: full, first, middle, last), each a
# protobuf ``wandb_internal_pb2.Record``. wandb (>= 0.2x) reads it only in its Go core; ftnb reads
# the history records to know what a run holds. A torn tail (a driver killed while writing) ends
# the reading.
_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(data: bytes) -> Iterator[bytes]:
    if len(data) < _HEADER or data[:4] != b":W&B":
        return
    index, pending = _HEADER, b""
    while True:
        left = _BLOCK - index % _BLOCK
        if left < _HEADER:  # padding at a block's end
            index += left
            continue
        if index + _HEADER > len(data):
            return
        crc, length, kind = struct.unpack("<IHB", data[index:index + _HEADER])
        chunk = data[index + _HEADER:index + _HEADER + length]
        if len(chunk) < length or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            return  # torn or unwritten tail
        index += _HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
        else:
            return


def read_history(path: str) -> list[tuple[int, dict]]:
    """The history of one piece of a W&B run (its ``run-<id>.wandb`` file): ``(step,
    {metric: value})`` in the order logged; nested keys joined with ``/``."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    out = []
    for raw in _records(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        values = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                  for item in record.history.item}
        out.append((record.history.step.num, values))
    return out
