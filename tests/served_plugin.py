"""The rnnmon plugin served as TensorBoard serves it, over TensorBoard's data provider: for route tests.

Example:
    >>> plugin, client = served_plugin(str(tmp_path))
    >>> status, body = get(client, "workers", run="job/worker-0/rnnmon")
"""

from __future__ import annotations

from typing import Any

from rnnmon_tensorboard.plugin import RnnmonPlugin
from tensorboard.backend import application
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from werkzeug import test as werkzeug_test

ROUTE = "/data/plugin/rnnmon/"


def served_plugin(logdir: str) -> tuple[RnnmonPlugin, werkzeug_test.Client]:
    """The plugin for the runs in `logdir`, and a client of the TensorBoard app serving it."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"rnnmon": 0})
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    plugin = RnnmonPlugin(base_plugin.TBContext(logdir=logdir, data_provider=provider))
    return plugin, werkzeug_test.Client(application.TensorBoardWSGI([plugin], data_provider=provider))


def plugin_client(logdir: str) -> werkzeug_test.Client:
    """A client of the plugin over the runs in `logdir` (see `served_plugin`)."""
    return served_plugin(logdir)[1]


def get(client: werkzeug_test.Client, route: str, **params: Any) -> tuple[int, Any]:
    """(status, JSON body or text) of a GET of the plugin's `route`."""
    response = client.get(ROUTE + route, query_string=params)
    return response.status_code, (response.get_json() if response.is_json else response.get_data(as_text=True))
