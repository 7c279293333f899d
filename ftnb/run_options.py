"""The options that start and resume experiments, shared by ``%ftrun`` and ``ftnb run``.

One table per command feeds argparse (the CLI's subcommands and the magics' plain parser) and
IPython's ``@magic_arguments`` (``%ftrun?``), so a help text never disagrees with what is parsed,
and the notebook and the terminal never disagree with each other. Each front-end adds only its
own options (the notebook's ``-o``/``--wait``/``--no-widget``/``-q``, the CLI's
``--detach``/``--json``) and says how it finds the objects a command names (:class:`Names`): the
notebook looks them up in its namespace, the CLI imports ``module:attr`` or ``path/file.py:attr``.

:func:`launch_arguments` turns parsed options into the arguments of :func:`ftnb.launch` (and of
the foreground run): the trainable, the space, TuneConfig, RunConfig with its FailureConfig and
CheckpointConfig, and the resources per trial. A search space may also be given as a dict literal
(``'{"lr": 0.1}'``, Python or JSON), which :func:`space_literal` reads. With the data-parallel
options (``--num-workers``...), or a :class:`ftnb.TorchTrainer` named, each trial is a group of
ranks: the trainable is a TorchTrainer and the space its ``train_loop_config``
(:func:`scaling_config_of`, :func:`as_group`); :func:`resumed_space` wraps a space given again to
resume such an experiment.

No IPython here: ``ftnb run`` parses with these tables without it.

(Over 500 lines because the shared option table is one long declaration, kept next to the
function that turns its options into configs, so that an option and what it does change in one
diff.)
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import difflib
import functools
import json
import os
import re
import shlex
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

from .train.torch_trainer import group_space

__all__ = [
    "CommandSpec",
    "FrontEnd",
    "Group",
    "InputError",
    "LaunchArguments",
    "Names",
    "Opt",
    "OptionParser",
    "RunDefaults",
    "amount",
    "as_group",
    "env_int",
    "group_space",
    "is_trainer",
    "launch_arguments",
    "launcher_of",
    "launcher_options",
    "opt",
    "resume_options",
    "resumed_space",
    "run_config_of",
    "run_options",
    "scaling_config_of",
    "space_from",
    "space_literal",
    "stop_from",
    "whole",
]


class InputError(ValueError):
    """A mistake in a command's input (its options, or an object it names): one line for the
    user, which says what was received and how to fix it."""


# -- tables ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Opt:
    """One option or positional argument: ``argparse.add_argument(*flags, **kwargs)``."""

    flags: tuple[str, ...]
    kwargs: dict


@dataclass(frozen=True)
class Group:
    """A titled group of the options that follow it (a section of the help)."""

    title: str
    description: Optional[str] = None


Item = Union[Opt, Group]


def opt(*flags: str, **kwargs: Any) -> Opt:
    """An :class:`Opt`; a ``%`` in its help is kept literally (argparse %-formats help)."""
    if "help" in kwargs:
        kwargs["help"] = kwargs["help"].replace("%", "%%")
    return Opt(flags, kwargs)


class OptionParser(argparse.ArgumentParser):
    """argparse that raises :class:`InputError` (one line, ending with ``hint``) instead of
    printing its usage and exiting the process."""

    hint = ""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}. {self.hint}".rstrip(". "))


@dataclass(frozen=True)
class CommandSpec:
    """A command's name, description and options; ``ftnb NAME`` (the magics: ``%NAME``)."""

    name: str
    description: str
    items: tuple[Item, ...]

    @property
    def prog(self) -> str:
        return f"ftnb {self.name}"

    @property
    def help_hint(self) -> str:
        """The end of every parse error: where the options are listed."""
        return f"`{self.prog} --help` shows the options"

    def add_to(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add this command's options (and their groups) to ``parser``; return it."""
        target: Any = parser
        for item in self.items:
            if isinstance(item, Group):
                target = parser.add_argument_group(item.title, item.description)
            else:
                target.add_argument(*item.flags, **item.kwargs)
        if isinstance(parser, OptionParser):
            parser.hint = self.help_hint
        return parser

    def parser(self) -> argparse.ArgumentParser:
        """A plain parser with this command's options and no ``--help`` (the magics' own help
        is ``%ftrun?``)."""
        parser = OptionParser(prog=self.prog, description=self.description, add_help=False,
                              allow_abbrev=False)
        return self.add_to(parser)

    def parse(self, line: str) -> argparse.Namespace:
        """Parse a line the way a shell splits it (quotes group words)."""
        try:
            words = shlex.split(line)
        except ValueError as exc:  # an unclosed quote
            raise InputError(f"{self.prog}: cannot split {line!r}: {exc}") from None
        return self.parse_words(words, self.parser())

    def parse_words(self, words: Sequence[str],
                    parser: argparse.ArgumentParser) -> argparse.Namespace:
        """Parse ``words`` with ``parser`` (built by :meth:`add_to`); an unknown option gets
        one line with the closest known one."""
        args, unknown = parser.parse_known_args(list(words))
        self.check_parsed(args, unknown, parser)
        return args

    def check_parsed(self, args: argparse.Namespace, unknown: Sequence[str],
                     parser: argparse.ArgumentParser) -> None:
        """Raise :class:`InputError` for words the parser did not take, naming the likely
        cause (a misspelt option, a dict literal whose quotes the shell took away)."""
        for dest in ("param_space", "stop"):
            values = getattr(args, dest, None)
            for value in values if isinstance(values, list) else [values]:
                if isinstance(value, str) and value.lstrip().startswith("{") and unknown \
                        and not _is_dict_literal(value):
                    flag = "--param-space" if dest == "param_space" else "--stop"
                    cut = " ".join([value, *unknown])
                    raise InputError(
                        f"{self.prog}: {flag} {cut!r} is cut into words: a dict literal must be "
                        f"quoted as one word. Fix: {flag} '{{\"lr\": 0.1}}' (quotes around it, "
                        "double quotes inside)"
                    )
        if unknown:
            raise InputError(self.unknown_message(parser, unknown))

    def unknown_message(self, parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
        """One line about the first word ``parser`` did not take."""
        option = next((w for w in unknown if w.startswith("-")), None)
        if option is None:
            return (f"{self.prog}: unexpected argument {unknown[0]!r} (quote values with spaces)."
                    f" {self.help_hint}")
        known = [f for a in parser._actions for f in a.option_strings]
        close = difflib.get_close_matches(option.split("=", 1)[0], known, n=1)
        guess = f" Did you mean {close[0]}?" if close else ""
        return f"{self.prog}: unknown option {option}.{guess} {self.help_hint}"


# -- value types (argparse puts their message after the option's name) ---------------------------
@functools.lru_cache(maxsize=None)  # one type per minimum: tables built twice compare equal
def whole(minimum: int) -> Callable[[str], int]:
    """The type of an option that takes a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def samples(text: str) -> int:
    """The type of --num-samples: a whole number >= 1, or -1 (sample until the experiment's
    time budget or a stop ends it, as Ray Tune's num_samples=-1)."""
    value = whole(-1)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more, or -1 (sample until "
                                         "--time-budget-s or a stop ends it), got 0")
    return value


def worker_count(text: str) -> "int | tuple[int, int]":
    """The type of ``--num-workers``: ``N`` (0: local mode), or ``MIN:MAX`` for an elastic group
    (ScalingConfig checks the numbers)."""
    try:
        values = tuple(int(part) for part in text.split(":"))
    except ValueError:
        values = ()
    if len(values) not in (1, 2):
        raise argparse.ArgumentTypeError(
            f"expected N or MIN:MAX (an elastic group, e.g. 2:4), got {text!r}")
    return values[0] if len(values) == 1 else values


def amount(text: str) -> float:
    """The type of an option that takes a finite number >= 0 (an int when it is whole)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return int(value) if value.is_integer() else value


# -- the shared tables ----------------------------------------------------------------------------
@dataclass(frozen=True)
class FrontEnd:
    """What the shared tables say differently in each front-end.

    ``names``: how an object is named there (``"a name in the notebook's namespace"``);
    ``space_forms``: every form ``--param-space`` takes there; ``defaults``: where each setting's
    default comes from (``{"max_failures": "FtnbMagics.max_failures", ...}``);
    ``resume_default``: how ``--trainable`` of a resume defaults.
    """

    names: str
    space_forms: str
    defaults: Mapping[str, str]
    resume_default: str


def target_option() -> Opt:
    """The ``NAME_OR_PATH`` of a command that acts on one experiment."""
    return opt("target", metavar="NAME_OR_PATH",
               help="the experiment's name under the storage path, or its folder (a path or "
                    "an fsspec URL)")


def storage_option(front: FrontEnd) -> Opt:
    """``--storage PATH`` (dest ``storage_path``)."""
    return opt("--storage", metavar="PATH", dest="storage_path",
               help="the storage path: a folder or an fsspec URL such as s3://bucket/runs "
                    f"(default: {front.defaults['storage_path']}, else ~/ftnb_results)")


def filesystem_option(front: FrontEnd) -> Opt:
    """``--filesystem NAME``: an fsspec filesystem object to reach the storage with."""
    return opt("--filesystem", metavar="NAME",
               help="an fsspec filesystem object to reach the storage with (e.g. "
                    f"s3fs.S3FileSystem(endpoint_url=...)); {front.names}")


_ALLOW_DIFFERENT_TRAINABLE = opt(
    "--allow-different-trainable", action="store_true",
    help="resume an existing experiment with a function of another name than the one it was "
         "started with (the same training, renamed or fixed; default: refused, since it is "
         "usually the wrong function)")


def launcher_options(front: FrontEnd) -> tuple[Item, ...]:
    """``--launcher`` and ``--launcher-command``: where a detached supervisor runs
    (:mod:`ftnb.launchers`)."""
    default = front.defaults
    return (
        Group("where the supervisor runs (ftnb.launchers)"),
        opt("--launcher", choices=("local", "ray", "command"),
            help="'local': a process on this machine; 'command': started by the admin's "
                 "command template (outside a Jupyter server's unit, container or pod); "
                 "'ray': a detached actor on the Ray cluster, restarted by Ray if it dies "
                 f"(trials on Ray too). Default: {default.get('launcher', '$FTNB_LAUNCHER')}, "
                 "else local"),
        opt("--launcher-command", metavar="TEMPLATE",
            help="the command template of the 'command' launcher (implies --launcher "
                 "command), e.g. 'systemd-run --user --collect {command}'; placeholders "
                 "{command}, {quoted_command}, {name}, {id}, {log}. Default: "
                 f"{default.get('launcher_command', '$FTNB_LAUNCHER_COMMAND')}"),
    )


def run_options(front: FrontEnd, trainable: Opt) -> tuple[Item, ...]:
    """The options of starting an experiment, after the front-end's own ``trainable``
    positional; the front-end appends its own options (in a group of their own)."""
    return (
        trainable,
        *_experiment_options(front),
        *_executor_options(front),
        *_trial_options(front),
        *_data_parallel_options(),
        *_failure_options(front),
        *_checkpoint_options(),
    )


def _experiment_options(front: FrontEnd) -> tuple[Item, ...]:
    """The experiment itself: its space, name, storage, stop criterion and log."""
    default = front.defaults
    return (
        opt("-p", "--param-space", metavar="SPACE",
            help=f"the search space, a dict: {front.space_forms}"),
        opt("-n", "--name", metavar="NAME",
            help="the experiment's name: its folder under the storage path (default: "
                 "TRAINABLE and the time). An existing experiment of that name is resumed"),
        storage_option(front),
        filesystem_option(front),
        opt("--stop", action="append", metavar="CRITERION",
            help="when a trial is done: METRIC=VALUE[,METRIC=VALUE...] (e.g. "
                 "training_iteration=10; repeatable), a dict literal, or a dict or a function "
                 f"(trial_id, result) -> bool; {front.names}"),
        opt("--verbose", type=int, choices=(0, 1, 2),
            help=f"RunConfig.verbose for the experiment's log (default: {default['verbose']}, "
                 "else 1)"),
    )


def _executor_options(front: FrontEnd) -> tuple[Item, ...]:
    """Where trials run (``RunConfig.executor``), and where the supervisor runs."""
    return (
        Group("where trials run (RunConfig.executor)"),
        opt("--executor", choices=("local", "ray"),
            help="'local': processes on this machine (default: $FTNB_EXECUTOR, else local); "
                 "'ray': actors on a Ray cluster (pip install 'ftnb[ray]'; the cluster at "
                 "--ray-address, else $RAY_ADDRESS)"),
        opt("--ray-address", metavar="ADDR",
            help="the Ray cluster to run on (implies --executor ray), e.g. 10.0.0.5:6379 or "
                 "ray://head:10001"),
        opt("--shared-storage", action="store_true",
            help="the storage path is a filesystem every Ray node mounts at the same place "
                 "(NFS): allow a local path on a cluster of several nodes"),
        *launcher_options(front),
    )


def _trial_options(front: FrontEnd) -> tuple[Item, ...]:
    """Trials and search: ``TuneConfig`` and the resources of a trial."""
    default = front.defaults
    return (
        Group("trials and search (TuneConfig, resources)"),
        opt("--num-samples", type=samples, metavar="N",
            help="how many times the search space is sampled (default 1); -1: until "
                 "--time-budget-s or a stop ends the experiment"),
        opt("--time-budget-s", type=amount, metavar="SECONDS",
            help="end the experiment after this long: its running trials are stopped "
                 "(TuneConfig(time_budget_s))"),
        opt("--concurrency", type=whole(1), metavar="N",
            help=f"at most N trials at once (default: {default['concurrency']}, else as many "
                 "as the CPUs and GPUs allow)"),
        opt("--cpus-per-trial", type=amount, metavar="N", help="CPUs per trial (default 1)"),
        opt("--gpus-per-trial", type=amount, metavar="N",
            help="GPUs per trial (default 0; a fraction below 1 shares a GPU)"),
        opt("--metric", metavar="NAME",
            help="the metric that ranks trials (and the one shown first)"),
        opt("--mode", choices=("max", "min"), help="whether a higher or lower --metric is better"),
        opt("--seed", type=int, metavar="N", help="makes the random draws reproducible"),
    )


def _data_parallel_options() -> tuple[Item, ...]:
    """Each trial a group of ranks (``ScalingConfig``)."""
    return (
        Group("data-parallel (ScalingConfig)",
              "each trial is a group of ranks in one torch.distributed process group, which\n"
              "fails and restarts as one; every rank runs TRAINABLE with the trial's config\n"
              "(for a TorchTrainer these options replace those of its ScalingConfig)"),
        opt("--num-workers", type=worker_count, metavar="N",
            help="ranks per trial (default 1, or a TorchTrainer's own); MIN:MAX an elastic "
                 "group, 0 the loop in this process (local mode)"),
        opt("--gpus-per-worker", type=amount, metavar="N",
            help="GPUs per rank, whole ones (a rank sees only its own; NCCL) unless there is "
                 "one rank (default 0: CPUs and gloo)"),
        opt("--cpus-per-worker", type=amount, metavar="N",
            help="CPUs per rank (default 1); a trial takes --num-workers times this"),
        opt("--collective-timeout", type=amount, metavar="SECONDS",
            help="how long a rank may wait on its peers (an all-reduce, a barrier) or stay "
                 "stopped before the group counts as hung and restarts from its latest "
                 "checkpoint (default 30)"),
    )


def _failure_options(front: FrontEnd) -> tuple[Item, ...]:
    """Failures (``FailureConfig``) and how a resume treats errored trials."""
    default = front.defaults
    return (
        Group("failures (FailureConfig)"),
        opt("--max-failures", type=whole(-1), metavar="N",
            help="retries per trial: 0 none, N up to N, -1 forever (default: "
                 f"{default['max_failures']}, else 0)"),
        opt("--fail-fast", action="store_true",
            help="stop the experiment at the first trial that ends ERRORED"),
        opt("--retry-repeated-errors", action="store_true",
            help="keep retrying a trial that fails twice with the same error at the same "
                 "iteration (default: it is ERRORED at once, since retrying will not fix it)"),
        opt("--preemption-grace", type=amount, metavar="SECONDS",
            help="how long a preempted (SIGTERMed) trial may take to checkpoint (default 30)"),
        opt("--hang-timeout", type=amount, metavar="SECONDS",
            help="a trial that has not reported for this long is killed and fails as hung, "
                 "then is retried from its latest checkpoint (default: never)"),
        opt("--storage-wait", type=amount, metavar="SECONDS",
            help="how long writers wait for storage that refused a write (disk full, "
                 "read-only, permission denied) to take it (default: the experiment stops at "
                 "once, resumable)"),
        opt("--restart-errored", action="store_true",
            help="when resuming an existing experiment, start its errored trials over from "
                 "scratch (default: continue them from their latest checkpoint)"),
        _ALLOW_DIFFERENT_TRAINABLE,
    )


def _checkpoint_options() -> tuple[Item, ...]:
    """Checkpoints (``CheckpointConfig``)."""
    return (
        Group("checkpoints (CheckpointConfig)"),
        opt("--num-to-keep", type=whole(1), metavar="N",
            help="keep at most N checkpoints per trial (default: all)"),
        opt("--checkpoint-score-attribute", metavar="METRIC",
            help="rank checkpoints by this metric for --num-to-keep (default: keep the newest)"),
        opt("--checkpoint-score-order", choices=("max", "min"),
            help="whether a higher or lower checkpoint score is better (default max)"),
    )


def resume_options(front: FrontEnd) -> tuple[Item, ...]:
    """The options of resuming an experiment; the front-end appends its own."""
    return (
        target_option(),
        opt("--trainable", metavar="NAME",
            help=f"the function to run; {front.names} (default: {front.resume_default})"),
        opt("-p", "--param-space", metavar="SPACE",
            help=f"the search space with its objects re-created: {front.space_forms} "
                 "(default: the one it was started with, if it can be found again)"),
        opt("--restart-errored", action="store_true",
            help="start errored trials over from scratch (default: continue them from their "
                 "latest checkpoint)"),
        opt("--takeover", action="store_true",
            help="take it over at once from a driver that is silent but not yet counted dead "
                 "(its machine or container was killed less than the lease TTL ago, or it is "
                 "stopped); refused while that driver runs on this machine. The old driver is "
                 "fenced: should it wake up, it stops before writing anything"),
        _ALLOW_DIFFERENT_TRAINABLE,
        storage_option(front),
        filesystem_option(front),
        *launcher_options(front),
    )


# -- defaults -------------------------------------------------------------------------------------
def env_int(name: str, fallback: Optional[int], minimum: int) -> Optional[int]:
    """The whole number in ``$name`` (>= ``minimum``); ``fallback`` when it is unset, or, with
    a warning that names the variable, when it is not such a number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return fallback
    try:
        value = int(raw)
        if value < minimum:
            raise ValueError
    except ValueError:
        warnings.warn(f"ignoring ${name}={raw!r}: expected a whole number >= {minimum}",
                      stacklevel=2)
        return fallback
    return value


@dataclass(frozen=True)
class RunDefaults:
    """What an option of :func:`run_options` that is not given falls back to."""

    storage_path: Optional[str] = None
    max_failures: int = 0
    concurrency: Optional[int] = None
    verbose: int = 1

    @classmethod
    def from_environment(cls) -> "RunDefaults":
        """``$FTNB_STORAGE_PATH``, ``$FTNB_MAX_FAILURES``, ``$FTNB_CONCURRENCY``,
        ``$FTNB_VERBOSE`` (as the ``%ftrun`` magics read them)."""
        max_failures = env_int("FTNB_MAX_FAILURES", 0, -1)
        verbose = env_int("FTNB_VERBOSE", 1, 0)
        return cls(
            storage_path=os.environ.get("FTNB_STORAGE_PATH") or None,
            max_failures=0 if max_failures is None else max_failures,
            concurrency=env_int("FTNB_CONCURRENCY", None, 1),
            verbose=verbose if verbose in (0, 1, 2) else 1,
        )


# -- names ----------------------------------------------------------------------------------------
class Names(Protocol):
    """How a front-end finds the objects a command names; each raises :class:`InputError`
    (one line: what was asked for, what was found, the fix)."""

    def trainable(self, ref: str) -> Callable[..., Any]:
        """The function ``ref`` names (or the :class:`ftnb.TorchTrainer`)."""

    def space(self, ref: str) -> Mapping[str, Any]:
        """The search space ``ref`` names (a dict literal is read before this is asked)."""

    def value(self, ref: str, what: str) -> Any:
        """Any object ``ref`` names; ``what`` is the option it was given to."""


_CALL = re.compile(r"[A-Za-z_][\w.]*\s*\(")


def _is_dict_literal(text: str) -> bool:
    try:
        space_literal(text.strip(), "")
    except InputError:
        return False
    return True


def space_literal(text: str, forms: str, option: str = "--param-space") -> dict:
    """The dict that ``text`` writes as a Python or JSON literal (``{"lr": 0.1}``,
    ``{"x": {"grid_search": [1, 2]}}``); :class:`InputError` naming the accepted ``forms``
    otherwise."""
    value: Any = None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
    if isinstance(value, dict):
        return value
    if value is not None:
        why = f"it is a {type(value).__name__}"
    elif _CALL.search(text):
        why = ("a literal holds plain values only, no calls: write a grid as "
               '{"grid_search": [...]}, or name a dict that holds the objects')
    elif '"' not in text and "'" not in text and ":" in text:
        why = "its quotes were lost: quote the whole dict, with double quotes inside"
    else:
        why = "it does not parse as Python or JSON"
    raise InputError(f"{option} {text!r} is not a dict literal ({why}). Accepted: {forms}")


def space_from(text: str, names: Names, forms: str,
               option: str = "--param-space") -> Mapping[str, Any]:
    """The search space ``text`` gives: a dict literal, or whatever ``names`` finds for it."""
    if text.lstrip().startswith("{"):
        return space_literal(text.strip(), forms, option)
    return names.space(text)


def stop_from(given: Sequence[str], names: Names) -> Any:
    """``--stop`` values: METRIC=VALUE pairs, a dict literal, or a name (dict or function)."""
    merged: dict[str, Any] = {}
    for text in given:
        text = text.strip()
        if text.startswith("{"):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = None
            if not isinstance(value, dict):
                raise InputError(
                    f"--stop {text!r} is not a dict literal. Fix: --stop training_iteration=10"
                )
            merged.update(value)
        elif "=" in text:
            merged.update(_metric_thresholds(text))
        else:
            value = names.value(text, "--stop")
            if len(given) > 1:
                raise InputError(
                    f"--stop {text} names an object; it cannot be combined with other --stop "
                    "values. Fix: give it alone, or only METRIC=VALUE pairs"
                )
            if not (callable(value) or isinstance(value, Mapping)):
                raise InputError(
                    f"--stop {text} is a {type(value).__name__}; it must be a dict of "
                    "thresholds or a function (trial_id, result) -> bool"
                )
            return value
    return merged


def _metric_thresholds(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, _, raw = (s.strip() for s in part.partition("="))
        number: Any = None
        for convert in (int, float):
            try:
                number = convert(raw)
                break
            except ValueError:
                continue
        if not key or number is None:
            raise InputError(
                f"--stop {text!r}: {part.strip()!r} is not METRIC=NUMBER. "
                "Fix: --stop training_iteration=10,loss=0.05"
            )
        out[key] = number
    return out


# -- parsed options -> launch arguments -----------------------------------------------------------
@dataclass
class LaunchArguments:
    """``ftnb.launch(trainable, **kwargs)``: what a parsed ``%ftrun`` / ``ftnb run`` starts
    (``trainable``: the function, or the :class:`ftnb.TorchTrainer` of a data-parallel run).

    ``kwargs``: ``param_space``, ``name``, ``storage_path``, ``tune_config``, ``run_config``,
    ``resources_per_trial``, ``origin``, ``restart_errored``, ``allow_different_trainable``,
    ``launcher``.
    """

    trainable: Callable[..., Any]
    kwargs: dict = field(default_factory=dict)


def _given(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def executor_choice(args: argparse.Namespace) -> Any:
    """``RunConfig.executor`` from ``--executor``, ``--ray-address`` and ``--shared-storage``:
    None (the default), a name, or a RayExecutor for an address or shared storage."""
    name = getattr(args, "executor", None)
    address = getattr(args, "ray_address", None)
    shared = getattr(args, "shared_storage", False)
    if (address or shared) and name == "local":
        raise InputError(
            f"--executor local with {'--ray-address' if address else '--shared-storage'}: "
            "those are the Ray executor's. Fix: --executor ray (or leave --executor out)."
        )
    if not (address or shared):
        return name
    from .execution import executor_class

    try:
        ray_executor = executor_class("ray")
    except ImportError as exc:
        raise InputError(str(exc)) from None
    return ray_executor(address, shared_storage=True if shared else None)


def launch_arguments(args: argparse.Namespace, names: Names, *, trainable: str,
                     param_space: Optional[str], space_forms: str, defaults: Any,
                     origin: dict) -> LaunchArguments:
    """Find the objects the parsed ``args`` name (through ``names``) and build the arguments
    of ``ftnb.launch``. ``defaults`` has the fields of :class:`RunDefaults`; ``origin`` is
    recorded in the state (how to find the trainable and the space again).
    Raises :class:`InputError` for a missing or wrong object or an invalid value.

    A :class:`ftnb.TorchTrainer` named as the trainable keeps its own RunConfig (its name,
    storage path, failure and checkpoint configs, stop): only the options given replace what
    they set (:func:`run_config_of`)."""
    from .config import TuneConfig

    a = args
    function = names.trainable(trainable)
    space = space_from(param_space, names, space_forms) if param_space else None
    stop = stop_from(a.stop, names) if a.stop else None
    filesystem = names.value(a.filesystem, "--filesystem") if a.filesystem else None
    resources = {k: v for k, v in (("cpu", a.cpus_per_trial), ("gpu", a.gpus_per_trial))
                 if v is not None}
    scaling = scaling_config_of(a, function)
    if scaling is not None and resources:
        raise InputError(_per_trial_with_group(a, function))
    own = function.run_config if is_trainer(function) else None
    try:  # the config classes check their values with ValueError/TypeError
        tune_config = TuneConfig(
            num_samples=_given(a.num_samples, 1),
            max_concurrent_trials=_given(a.concurrency, defaults.concurrency),
            metric=a.metric, mode=a.mode, seed=a.seed,
            **({"time_budget_s": a.time_budget_s} if a.time_budget_s is not None else {}),
        )
        run_config = run_config_of(a, defaults, own, filesystem=filesystem, stop=stop)
    except (ValueError, TypeError) as exc:
        raise InputError(" ".join(str(exc).split())) from None
    if scaling is not None:
        function, space = as_group(function, space, scaling, run_config)
    storage_path = a.storage_path or (own.storage_path if own is not None else None)
    kwargs: dict[str, Any] = dict(
        param_space=space,
        name=a.name or (own.name if own is not None else None),
        storage_path=_given(storage_path, defaults.storage_path),
        tune_config=tune_config,
        run_config=run_config,
        resources_per_trial=resources or None,
        origin=origin,
        restart_errored=a.restart_errored,
        allow_different_trainable=a.allow_different_trainable,
        launcher=launcher_of(a, defaults),
    )
    return LaunchArguments(function, kwargs)


def run_config_of(args: argparse.Namespace, defaults: Any, own: Any = None, *,
                  filesystem: Any = None, stop: Any = None) -> Any:
    """The :class:`ftnb.RunConfig` of a run: ``own`` (a TorchTrainer's own RunConfig: its
    failure, checkpoint and stop settings, its executor and verbosity) with only the options
    given in ``args`` replacing what they set. ``own`` None (a function's run): the front
    end's ``defaults`` (``max_failures``, ``verbose``) stand for what is not given.
    ``filesystem`` and ``stop``: the objects ``--filesystem`` and ``--stop`` named (None: not
    given). Raises ValueError/TypeError where a config class refuses a value."""
    from .config import CheckpointConfig, FailureConfig, RunConfig

    a = args
    base = own if own is not None else RunConfig(
        verbose=defaults.verbose, failure_config=FailureConfig(max_failures=defaults.max_failures))
    failure: dict[str, Any] = {}
    if a.max_failures is not None:
        failure["max_failures"] = a.max_failures
    if a.fail_fast:
        failure["fail_fast"] = True
    if a.retry_repeated_errors:
        failure["stop_on_repeated_error"] = False
    if a.preemption_grace is not None:
        failure["preemption_grace_period_s"] = float(a.preemption_grace)
    if a.hang_timeout is not None:
        failure["hang_timeout_s"] = float(a.hang_timeout)
    if a.storage_wait is not None:
        failure["storage_wait_s"] = float(a.storage_wait)
    checkpoint = {key: value for key, value in (
        ("num_to_keep", a.num_to_keep),
        ("checkpoint_score_attribute", a.checkpoint_score_attribute),
        ("checkpoint_score_order", a.checkpoint_score_order)) if value is not None}
    executor = executor_choice(a)
    return dataclasses.replace(
        base,
        storage_filesystem=_given(filesystem, base.storage_filesystem),
        failure_config=dataclasses.replace(base.failure_config or FailureConfig(), **failure),
        checkpoint_config=dataclasses.replace(base.checkpoint_config or CheckpointConfig(),
                                              **checkpoint),
        stop=_given(stop, base.stop),
        verbose=_given(a.verbose, base.verbose),
        executor=_given(executor, base.executor),
    )


def launcher_of(args: argparse.Namespace, defaults: Any) -> Any:
    """``launch(launcher=...)`` from ``--launcher`` / ``--launcher-command``, else from the
    front-end's configured ``defaults.launcher`` / ``defaults.launcher_command`` (the magics'
    ``%config``); None leaves it to ``$FTNB_LAUNCHER``. Raises :class:`InputError` for a
    template that cannot work."""
    from .launchers import LauncherError, launcher_setting

    try:
        return launcher_setting(getattr(args, "launcher", None),
                                getattr(args, "launcher_command", None),
                                getattr(defaults, "launcher", None),
                                getattr(defaults, "launcher_command", None))
    except LauncherError as exc:
        raise InputError(str(exc)) from None


# -- data-parallel runs (a TorchTrainer per trial) ------------------------------------------------
#: The options of the "data-parallel (ScalingConfig)" group: dest -> flag.
_WORKER_FLAGS = {"num_workers": "--num-workers", "gpus_per_worker": "--gpus-per-worker",
                 "cpus_per_worker": "--cpus-per-worker",
                 "collective_timeout": "--collective-timeout"}
_TRIAL_FLAGS = {"cpus_per_trial": "--cpus-per-trial", "gpus_per_trial": "--gpus-per-trial"}
#: The keys of a TorchTrainer's search space (see ``TorchTrainer.param_space``).


def is_trainer(value: Any) -> bool:
    """Whether ``value`` is a trainer (:class:`ftnb.TorchTrainer`) rather than a function."""
    return bool(getattr(value, "_ftnb_trainer", False))


def _given_flags(args: argparse.Namespace, flags: Mapping[str, str]) -> list[str]:
    """The options of ``flags`` given in ``args``, as typed (``--num-workers 2``)."""
    return [f"{flag} {getattr(args, dest):g}" if isinstance(getattr(args, dest), float)
            else f"{flag} {':'.join(map(str, getattr(args, dest)))}"
            if isinstance(getattr(args, dest), tuple) else f"{flag} {getattr(args, dest)}"
            for dest, flag in flags.items() if getattr(args, dest, None) is not None]


def scaling_config_of(args: argparse.Namespace, trainable: Any) -> Any:
    """The :class:`ftnb.ScalingConfig` of a data-parallel run: ``trainable``'s own (a
    TorchTrainer's) or the default one, with the ``--num-workers``, ``--gpus-per-worker``,
    ``--cpus-per-worker`` and ``--collective-timeout`` given in ``args`` replacing what they
    set; None for a plain function with none of them given (a trial of one process).
    Raises :class:`InputError` with ScalingConfig's message for values it refuses."""
    from .config import ScalingConfig

    given = _given_flags(args, _WORKER_FLAGS)
    if not given and not is_trainer(trainable):
        return None
    base = trainable.scaling_config if is_trainer(trainable) else ScalingConfig()
    changes: dict[str, Any] = {}
    if getattr(args, "num_workers", None) is not None:
        changes["num_workers"] = args.num_workers
    if getattr(args, "collective_timeout", None) is not None:
        changes["collective_timeout_s"] = float(args.collective_timeout)
    cpus, gpus = getattr(args, "cpus_per_worker", None), getattr(args, "gpus_per_worker", None)
    if cpus is not None or gpus is not None:
        per_worker = dict(base.resources_per_worker or {})
        if cpus is not None:
            per_worker = {k: v for k, v in per_worker.items() if str(k).lower() != "cpu"}
            per_worker["CPU"] = cpus
        if gpus is not None:
            per_worker = {k: v for k, v in per_worker.items() if str(k).lower() != "gpu"}
            if gpus > 0:
                per_worker["GPU"] = gpus
            changes["use_gpu"] = gpus > 0
        changes["resources_per_worker"] = per_worker or None
    try:  # ScalingConfig checks its values (0 ranks, a GPU shared by the ranks of a group)
        return dataclasses.replace(base, **changes)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{' '.join(given)}: {' '.join(str(exc).split())}") from None


def _per_trial_with_group(args: argparse.Namespace, trainable: Any) -> str:
    """Why ``--cpus-per-trial``/``--gpus-per-trial`` do not go with a data-parallel run."""
    trial = " ".join(_given_flags(args, _TRIAL_FLAGS))
    workers = " ".join(_given_flags(args, _WORKER_FLAGS))
    what = f"{trial} with {workers}" if workers else f"{trial} with a TorchTrainer"
    fixes = [flag.replace("-per-trial", "-per-worker")
             for flag in _given_flags(args, _TRIAL_FLAGS)]
    return (f"{what}: in a data-parallel run each rank gets --cpus-per-worker and "
            "--gpus-per-worker (a trial takes --num-workers times that), so there is no "
            f"per-trial amount to give. Fix: {' '.join(fixes)} instead of {trial}")


def as_group(trainable: Any, space: Optional[Mapping[str, Any]], scaling: Any,
             run_config: Any) -> tuple[Any, Optional[Mapping[str, Any]]]:
    """``(trainer, space)`` of a data-parallel run: a plain ``f(config)`` wrapped as
    ``TorchTrainer(f, scaling_config=scaling, run_config=run_config)``, or a TorchTrainer
    copied with ``scaling`` (the caller's object is left as it was); the space as a trainer's
    (see :func:`group_space`), so that each rank's ``f`` gets the config a plain trial would."""
    if is_trainer(trainable):
        trainer = copy.copy(trainable)
        trainer.scaling_config = scaling
        trainer.run_config = run_config
        return trainer, group_space(space, plain=False)
    from .train.torch_trainer import TorchTrainer

    try:
        trainer = TorchTrainer(trainable, scaling_config=scaling, run_config=run_config)
    except (ValueError, TypeError) as exc:
        raise InputError(" ".join(str(exc).split())) from None
    return trainer, group_space(space, plain=True)


def resumed_space(space: Optional[Mapping[str, Any]],
                  settings: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The space to resume an experiment with: for a TorchTrainer's experiment (its state's
    ``settings["trainer"]``) a plain space given again is wrapped as its trainer's
    (:func:`group_space`), as ``ftnb run --num-workers`` / ``%ftrun --num-workers`` wrapped it
    when they started it."""
    return group_space(space) if settings.get("trainer") else space
