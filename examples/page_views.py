"""Page views per user and minute: the first app of the getting-started guide.

Each view carries its own time (``ts``); a minute's count is sent to ``views-per-minute``
once the minute has closed, that is once a view of a later minute has arrived (windows
have no grace unless given one). Run it with ``python examples/page_views.py`` (or
``streamkit worker examples.page_views:app``) against a broker (``STREAMKIT_BROKER``).
"""

from typing import Any

import streamkit
from streamkit import Tumbling

app = streamkit.App("page-views")
views = app.topic("page-views", timestamp="ts")  # a view's time: its "ts" field, not when it was sent
per_minute = app.table("views_per_minute", default=int, window=Tumbling(60))


@app.processor(views)
def count(user: str, view: dict[str, Any], ctx: streamkit.Context) -> None:
    per_minute[user] += 1  # the minute holding the view's time


@app.on_window_close(per_minute)
def publish(user: str, window: streamkit.Window, views: int, ctx: streamkit.Context) -> None:
    ctx.send("views-per-minute", user, {"minute": window.start, "views": views})  # once per minute, final


if __name__ == "__main__":
    app.run()  # a worker of this app, until Ctrl-C
