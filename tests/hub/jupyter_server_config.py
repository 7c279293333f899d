"""The users' servers: only the extensions the tests use (ftnb's and the hub's), so that a
server starts in seconds on a loaded 2-core machine."""

c = get_config()  # noqa: F821 (defined by Jupyter when it loads this file)
c.ServerApp.jpserver_extensions = {"jupyterlab": False, "jupyter_lsp": False,
                                   "notebook_shim": False, "jupyter_server_terminals": False}
