"""Who may read the dashboard: beyond this machine only with the queries' token and TLS,
the status asked for with the token, which the page (in a real headless Chromium) takes
from its address's fragment."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamkit.cli.status_view import StatusView
from streamkit.ops.dashboard import serve_dashboard
from tests.ports import listen_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "dash+7f/3a91=="  # as base64 makes them: "+" must stay "+"


def _dashboard_cli(*options: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "streamkit.cli", "dashboard", "examples.orders:app", *options],
        cwd=ROOT, env={**clean, "STREAMKIT_BROKER": "127.0.0.1:1", **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_the_dashboard_beyond_this_machine_needs_the_token_and_tls() -> None:
    bare = _dashboard_cli("--host", "0.0.0.0", "--port", str(listen_port()))
    lines = bare.stderr.strip().splitlines()
    assert bare.returncode == 1 and len(lines) == 1, bare.stderr
    assert "--host 0.0.0.0 shows the job's status beyond this machine" in lines[0], lines
    assert "needs query_token and query_tls_certfile and query_tls_keyfile" in lines[0], lines
    token_only = _dashboard_cli("--host", "0.0.0.0", "--port", str(listen_port()), STREAMKIT_QUERY_TOKEN=TOKEN)
    assert token_only.returncode == 1 and "needs query_tls_certfile and query_tls_keyfile" in token_only.stderr
    assert TOKEN not in token_only.stderr


@pytest.fixture
def dashboard() -> Iterator[str]:
    """``serve_dashboard`` with a token, on its own loop in a thread: its address."""
    port, loop, started = listen_port(), asyncio.new_event_loop(), threading.Event()
    stop: list[Any] = []

    async def snapshot() -> dict[str, Any]:
        return StatusView("orders", "streamkit-orders", "orders-dead-letters", time.time()).as_dict()

    async def serve() -> None:
        stop.append(await serve_dashboard(snapshot, port, "127.0.0.1", token=TOKEN))
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(30)
    assert started.wait(30)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        asyncio.run_coroutine_threadsafe(stop[0](), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_the_status_is_asked_for_with_the_token_and_the_page_takes_it_from_its_address(
    dashboard: str, browser: Any
) -> None:
    assert _get(dashboard) == 200  # the page holds nothing of the job
    assert _get(dashboard + "api/status") == 401
    assert _get(dashboard + "api/status", "not-the-token") == 401
    assert _get(dashboard + "api/status", TOKEN) == 200

    def shown(url: str) -> dict[str, Any]:
        browser.get(url)
        deadline = time.monotonic() + 30
        while True:
            state = browser.execute_script(
                "const s = window.streamkitDashboard; return {polls: s.polls,"
                " error: document.getElementById('error').textContent,"
                " title: document.getElementById('title').textContent};"
            )
            if state["polls"] > 0 or state["error"]:
                return dict(state)
            assert time.monotonic() < deadline, f"the page showed nothing within 30 s: {state}"
            time.sleep(0.2)

    with_token = shown(f"{dashboard}#token={TOKEN}")
    assert with_token["error"] == "" and with_token["title"].startswith("app orders"), with_token
    without = shown(dashboard)
    assert without["polls"] == 0 and "no query token" in without["error"], without
    assert "#token=TOKEN" in without["error"], without


def test_the_printed_address_is_one_a_browser_can_open() -> None:
    from streamkit.cli.dashboard import page_address

    assert page_address("127.0.0.1", 8088, False, None, False) == "http://127.0.0.1:8088/"
    assert page_address("127.0.0.1", 8088, False, None, True) == "http://127.0.0.1:8088/#token=YOUR_QUERY_TOKEN"
    assert page_address("0.0.0.0", 8088, True, "dash.example", True) == (
        "https://dash.example:8088/#token=YOUR_QUERY_TOKEN"
    )  # the name the certificate holds
    assert page_address("10.0.0.7", 8088, True, "dash.example", True).startswith("https://dash.example:8088/")
    assert page_address("::", 8088, False, "fe80::1", False) == "http://[fe80::1]:8088/"
    assert "0.0.0.0" not in page_address("0.0.0.0", 8088, False, None, False)


def test_the_query_server_refuses_without_the_token_whatever_a_refusal_is_worth_as_a_bool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before aiohttp 3.12 a response with no headers is falsy: a check written as
    ``refused(...) or handler(...)`` let every query in there."""
    from aiohttp import web

    from streamkit.ops import queries

    real = queries.refused

    class Falsy(web.Response):
        def __bool__(self) -> bool:
            return False

    def refused_falsy(request: web.Request, token: str | None) -> web.Response | None:
        answer = real(request, token)
        return None if answer is None else Falsy(status=answer.status, body=answer.body)

    monkeypatch.setattr(queries, "refused", refused_falsy)
    port, loop = listen_port(), asyncio.new_event_loop()

    async def lookup(table: str, key: str, forwarded: bool, windows: bool) -> queries.Answer:
        return queries.Answer(200, {"table": table, "key": key, "value": 42})

    stop = loop.run_until_complete(queries.serve_queries(lookup, port, "127.0.0.1", token=TOKEN))
    try:
        url = f"http://127.0.0.1:{port}/tables/t/k"
        codes = [loop.run_until_complete(asyncio.to_thread(_get, url, t)) for t in (None, "wrong", TOKEN)]
    finally:
        loop.run_until_complete(stop())
        loop.close()
    assert codes == [401, 401, 200], codes
