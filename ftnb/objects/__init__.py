"""Shared objects for trials: ``ftnb.put`` stores a large object once, every trial maps it.

A dataset, a DataFrame or a model passed in a ``param_space`` would otherwise be pickled into
every trial's launch message and unpickled into every trial's own memory. :func:`put` writes it
once to a file on this machine, :func:`get` memory-maps that file, so numpy arrays, DataFrame
blocks and CPU tensors of all trials point at the same physical pages (the page cache, or
``/dev/shm``)::

    ref = ftnb.put(big_dataframe)          # ObjectRef(pandas.DataFrame, 1.2 GB, id=3fa2c1)
    df = ftnb.get(ref)                     # in any process of this machine: no copy

The package: :mod:`~ftnb.objects.store` (:class:`ObjectRef`, :func:`put`, :func:`get`,
:func:`adopt`, the files' lifetime), :mod:`~ftnb.objects.file_format` (the object file and its
format), :mod:`~ftnb.objects.folders` (where files live, their names, the sweep of dead owners'
files), :mod:`~ftnb.objects.binding` (objects in param spaces and configs) and
:mod:`~ftnb.objects.describe` (type names, sizes, summaries). Only the standard library (and
cloudpickle, when writing) is imported here.
"""

from .binding import bind_objects, resolve_refs, walk_placeholders
from .folders import OBJECT_STORE_ENV, choose_store_dir, sweep_orphans
from .store import (
    PLACEHOLDER_KEY,
    ObjectRef,
    ObjectUnavailableError,
    adopt,
    get,
    is_placeholder,
    put,
)

__all__ = [
    "OBJECT_STORE_ENV",
    "PLACEHOLDER_KEY",
    "ObjectRef",
    "ObjectUnavailableError",
    "adopt",
    "bind_objects",
    "choose_store_dir",
    "get",
    "is_placeholder",
    "put",
    "resolve_refs",
    "sweep_orphans",
    "walk_placeholders",
]
