"""The tests' JupyterHub (tests/test_jupyterhub.py starts it with ``-f`` this file).

DummyAuthenticator, configurable-http-proxy from ``tests/hub/node_modules`` (``npm ci``), the
user's server a real ``jupyterhub-singleuser`` in the tests' environment, started and stopped by
:class:`spawners.IsolatingSpawner`. The fixture passes ports, paths and the API tokens through
``FTNB_HUB_*`` variables, and the servers' environment (the hub-wide ftnb settings an admin
sets once, here the ``command`` launcher through the launch agent) as JSON in
``FTNB_HUB_SERVER_ENV``.
"""

import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
env = os.environ
c = get_config()  # noqa: F821 (defined by JupyterHub when it loads this file)

c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.spawner_class = "spawners.IsolatingSpawner"
c.JupyterHub.bind_url = f"http://127.0.0.1:{env['FTNB_HUB_PORT']}"
c.JupyterHub.hub_port = int(env["FTNB_HUB_INTERNAL_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env['FTNB_HUB_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [os.path.join(here, "node_modules", ".bin",
                                                "configurable-http-proxy")]
c.JupyterHub.db_url = f"sqlite:///{env['FTNB_HUB_DIR']}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = f"{env['FTNB_HUB_DIR']}/cookie_secret"
c.JupyterHub.cleanup_servers = True

c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--allow-root",  # the hub's user is the current (root) user
                  f"--config={here}/jupyter_server_config.py"]
c.SimpleLocalProcessSpawner.home_dir_template = env["FTNB_HUB_DIR"] + "/home/{username}"
c.Spawner.environment = json.loads(env["FTNB_HUB_SERVER_ENV"])
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60

# The test drives users and servers through the REST API with this service's token; the idle
# culler is an externally managed service (the test that needs it runs it).
c.JupyterHub.services = [
    {"name": "driver", "api_token": env["FTNB_HUB_TOKEN"]},
    {"name": "idle-culler", "api_token": env["FTNB_HUB_CULLER_TOKEN"]},
]
c.JupyterHub.load_roles = [
    {"name": "driver", "services": ["driver"],
     "scopes": ["admin:users", "admin:servers", "access:servers", "tokens"]},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]
