"""OpenClaw's own Control UI (the static files of the npm ``openclaw`` package the workplace's ``openclaw-cli`` tool
installs, served by a static server with SPA fallback) in Debian's Chromium, pointed at a real gateway process
with ``?gatewayUrl=…#token=…``: the sessions sidebar lists a session created over the wire, its chat page sends a
typed message and shows the streamed reply, a reload shows both, and the chat, sessions, devices, logs and usage
pages call no method the gateway answers with ``unknown method``.

Every WebSocket frame between the page and the gateway is recorded (Playwright's ``websocket`` events), so a
failure names the calls the gateway refused. Screenshots under ``test-artifacts/screenshots/``. Skipped without
the tool; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from tests.browser.test_console_flows import call_beside_the_browser
from tests.support.openclaw_cli import ControlUIServer, control_ui_dir, require_openclaw_cli

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.openclaw_cli, pytest.mark.django_db(transaction=True)]

SESSION_LABEL = "Proof from the wire"
SESSION_KEY = "agent:main:proof-from-the-wire"
# The built-in echo model answers what follows this marker, a word per delta.
REPLY = "the streamed proof reply"
MESSAGE = f"Reply exactly: {REPLY}"
UI_WAIT_MS = 30_000
# A page has made its calls once none is unanswered for this long.
QUIET_S = 1.0


@pytest.fixture(scope="module")
def control_ui():
    require_openclaw_cli()
    with ControlUIServer(control_ui_dir()) as server:
        yield server


@pytest.fixture(scope="module")
def browser_context_args(browser_context_args):
    # The UI's service worker would answer later loads from its cache, not from the server under test.
    return {**browser_context_args, "service_workers": "block"}


@dataclass
class GatewayFrames:
    """The page's calls to one gateway and the gateway's answers and events, as the browser saw them."""

    gateway_url: str
    methods: dict[str, str] = field(default_factory=dict)  # request id -> method
    params: dict[str, dict] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    # The calls of the newest connection: an earlier page's connection closed with it, unanswered calls and all.
    current: set[str] = field(default_factory=set)
    refusals: list[tuple[str, dict, str]] = field(default_factory=list)  # (method, params, message)
    events: list[dict] = field(default_factory=list)
    connections: int = 0  # hello-ok answers
    last_frame_at: float = 0.0

    def attach(self, page) -> None:
        page.on("websocket", self._socket)

    def _socket(self, socket) -> None:
        if not socket.url.rstrip("/").startswith(self.gateway_url):
            return  # the UI's first try, at its own origin
        sent_here: set[str] = set()
        self.current = sent_here
        socket.on("framesent", lambda payload: sent_here.add(self._sent(payload)))
        socket.on("framereceived", self._received)

    def _sent(self, payload) -> str | None:
        """The request's id (None for other frames)."""
        frame = json.loads(payload)
        self.last_frame_at = time.monotonic()
        if frame.get("type") != "req":
            return None
        self.methods[frame["id"]] = frame["method"]
        self.params[frame["id"]] = frame.get("params") or {}
        return frame["id"]

    def _received(self, payload) -> None:
        frame = json.loads(payload)
        self.last_frame_at = time.monotonic()
        if frame.get("type") == "event":
            self.events.append(frame)
            return
        if frame.get("type") != "res":
            return
        self.answered.add(frame["id"])
        payload = frame.get("payload")
        if frame.get("ok") and isinstance(payload, dict) and payload.get("type") == "hello-ok":
            self.connections += 1
        if not frame.get("ok"):
            method = self.methods.get(frame["id"], "?")
            self.refusals.append((method, self.params.get(frame["id"], {}), frame["error"].get("message", "")))

    def unknown_methods(self) -> list[tuple[str, dict, str]]:
        return [refusal for refusal in self.refusals if "unknown method" in refusal[2]]

    def chat_delta_texts(self, session_key: str) -> list[str]:
        """The reply so far, as each ``chat`` delta event of the session carried it."""
        return [
            "".join(part.get("text", "") for part in event["payload"]["message"]["content"])
            for event in self.events
            if event["event"] == "chat"
            and event["payload"].get("sessionKey") == session_key
            and event["payload"].get("state") == "delta"
        ]

    def wait_connected(self, page, more_than: int) -> None:
        """Until the page's connection number ``more_than + 1`` is accepted."""
        deadline = time.monotonic() + UI_WAIT_MS / 1000
        while self.connections <= more_than:
            if time.monotonic() > deadline:
                raise AssertionError(f"the page did not connect; refused: {self.refusals[-5:]}")
            page.wait_for_timeout(100)

    def unanswered(self) -> list[str]:
        return sorted({self.methods[i] for i in self.current - self.answered if i is not None})

    def settle(self, page, timeout_s: float = 20.0) -> None:
        """Until every call the page made is answered and no frame came for ``QUIET_S``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            page.wait_for_timeout(250)
            if self.unanswered() == [] and time.monotonic() - self.last_frame_at >= QUIET_S:
                return
        unanswered = self.unanswered()
        raise AssertionError(f"calls still unanswered after {timeout_s:.0f} s: {unanswered}")


def ui_link(control_ui, gateway, path: str) -> str:
    return control_ui.url(f"{path}?gatewayUrl={quote(gateway.url, safe='')}#token={gateway.token}")


def open_page(page, frames: GatewayFrames, control_ui, gateway, path: str) -> None:
    connected = frames.connections
    page.goto(ui_link(control_ui, gateway, path))
    frames.wait_connected(page, connected)


def refusals_text(frames: GatewayFrames) -> str:
    return "\n".join(f"{method} {json.dumps(params)}: {message}" for method, params, message in frames.refusals)


def test_openclaw_control_ui_chats_over_this_gateway(control_ui, page, gateway, screenshots):
    call_beside_the_browser(gateway, "sessions.create", {"key": SESSION_KEY, "label": SESSION_LABEL})
    frames = GatewayFrames(gateway.url)
    frames.attach(page)

    # The link names another gateway than the page's own origin: the UI asks before it switches.
    page.goto(ui_link(control_ui, gateway, "/chat/main"))
    page.get_by_role("button", name=f"Switch to 127.0.0.1:{gateway.port}").click()
    frames.wait_connected(page, 0)

    sidebar_link = page.get_by_role("link", name=SESSION_LABEL)
    expect(sidebar_link).to_be_visible(timeout=UI_WAIT_MS)
    frames.settle(page)
    screenshots.take(page, "sidebar")

    sidebar_link.click()
    expect(page).to_have_url(control_ui.url("/chat/main/proof-from-the-wire"), timeout=UI_WAIT_MS)
    composer = page.get_by_role("textbox", name="Chat composer")
    composer.fill(MESSAGE)
    composer.press("Enter")
    transcript_reply = page.get_by_text(REPLY, exact=True)
    expect(transcript_reply).to_be_visible(timeout=UI_WAIT_MS)
    expect(page.get_by_text(MESSAGE, exact=True)).to_be_visible()
    frames.settle(page)
    screenshots.take(page, "chat-replied")
    # The reply came as it was written: deltas, each a beginning of the reply.
    streamed = frames.chat_delta_texts(SESSION_KEY)
    assert streamed and all(REPLY.startswith(text) for text in streamed), streamed

    # A reload, through the chat page's own link, shows the exchange from the gateway's history.
    page.reload()
    expect(page.get_by_text(REPLY, exact=True)).to_be_visible(timeout=UI_WAIT_MS)
    expect(page.get_by_text(MESSAGE, exact=True)).to_be_visible()
    frames.settle(page)
    screenshots.take(page, "chat-reloaded")
    assert "unknown method" not in page.locator("body").inner_text()

    open_page(page, frames, control_ui, gateway, "/sessions")
    expect(page.get_by_text(SESSION_LABEL).filter(visible=True).first).to_be_visible(timeout=UI_WAIT_MS)
    frames.settle(page)
    screenshots.take(page, "sessions")
    assert "unknown method" not in page.locator("body").inner_text()

    for path, name in (("/settings/devices", "devices"), ("/logs", "logs"), ("/usage", "usage")):
        open_page(page, frames, control_ui, gateway, path)
        frames.settle(page)
        screenshots.take(page, name)
        assert "unknown method" not in page.locator("body").inner_text(), name

    assert frames.unknown_methods() == [], refusals_text(frames)
    # And every param the UI sends is one the gateway takes (OpenClaw's params for every method).
    assert [refusal for refusal in frames.refusals if " params: " in refusal[2]] == [], refusals_text(frames)
