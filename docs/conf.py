"""Sphinx configuration of ftnb's documentation site.

Build it (the ``docs`` extra installs what it needs)::

    .venv/bin/pip install -c constraints.txt -e '.[docs]'
    .venv/bin/sphinx-build -W --keep-going -n -b html docs docs/_build/html

The tutorials are the notebooks in ``notebooks/`` (linked into ``docs/tutorials``), rendered
with their stored outputs: they are never executed here (the test suite runs them with nbval).
The reference pages are generated from the code (``docs/_ext/ftnb_docs.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # this checkout's ftnb, whatever the venv points at

import ftnb  # noqa: E402

project = "ftnb"
author = "the ftnb authors"
copyright = "the ftnb authors"  # noqa: A001
release = version = ftnb.__version__

extensions = [
    "myst_nb",  # MyST Markdown pages and the notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "ftnb_docs",  # the CLI, magics, environment and directory references, from the code
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
# .rst first: autosummary writes its generated pages (reference/api/) in the first suffix.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}

# Notebooks are shown with the outputs stored in them; nbval executes them in the tests.
nb_execution_mode = "off"
# Plotly figures are stored as plotly's JSON (drawn by its JavaScript in Jupyter) beside the
# text the notebooks also keep; the site shows the text.
suppress_warnings = ["mystnb.unknown_mime_type"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autoclass_content = "both"
# "Attributes:" sections as fields: a property of the same name is documented once.
napoleon_use_ivar = True

# Nitpicky: every cross-reference must resolve: links between pages, {doc} references, and
# references to ftnb's public names (``ftnb.Tuner``: the API reference documents each). Let
# through, because no page documents them: names of other projects (their inventories are not
# fetched: the build runs offline); ftnb's internal modules and the names in them
# (``ftnb.schedulers.trial_scheduler.SchedulerController``), which docstrings name for readers of
# the code; a docstring's bare names of its class's own members or module's neighbours (``STOP``,
# ``get_state``); and napoleon's reading of a "Name: what it is" line as a type (words with
# spaces).
nitpicky = True
_EXTERNAL = (r"(typing|collections|abc|argparse|concurrent|datetime|enum|os|pathlib|threading|"
             r"types|fsspec|pandas|pd|torch|ray|numpy|np|IPython|ipywidgets|optuna|gymnasium|" \
             r"mlflow|wandb|tensorboardX|logging|subprocess|dataclasses|multiprocessing|io|" \
             r"contextlib|signal|socket|queue|asyncio|weakref|inspect|json|re|uuid|time|s3fs|"
             r"sklearn|gym|jupyter_server|traitlets|tornado)(\..*)?")
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL),
    (r"py:.*", r"ftnb\.[a-z_]\w*(\..+)?"),  # ftnb.<module>...: internal (not ftnb.Tuner)
    (r"py:.*", r"[A-Za-z_]\w*"),  # a bare name, relative to the docstring's class or module
    (r"py:.*", r".* .*"),  # napoleon: "Returns: What the whole group takes" read as a type
    (r"py:class", r"(Any|Optional|Union|Callable|Mapping|Sequence|Iterable|Iterator|"
                  r"MutableMapping|Literal|TypeVar|T|NoneType|Path|ellipsis|function|"
                  r"DataFrame|AbstractFileSystem)"),
]

html_theme = "pydata_sphinx_theme"
html_title = f"ftnb {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list = []
# A class's page documents its members in full (docs/_templates/autosummary/class.rst), with
# no summary tables of them.
templates_path = ["_templates"]
