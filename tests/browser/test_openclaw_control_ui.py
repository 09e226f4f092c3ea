"""OpenClaw's own Control UI (the static files of the npm ``openclaw`` package the workplace's ``openclaw-cli`` tool
installs, served by a static server with SPA fallback) in Debian's Chromium, pointed at a real gateway process
with ``?gatewayUrl=…#token=…``: the sessions sidebar lists a session created over the wire, its chat page sends a
typed message and shows the streamed reply, a reload shows both, and the chat, sessions, devices, logs and usage
pages call no method the gateway answers with ``unknown method``.

Every WebSocket frame between the page and the gateway is recorded (Playwright's ``websocket`` events), so a
failure names the calls the gateway refused. Screenshots under ``test-artifacts/screenshots/``. Skipped without
the tool; under ``CI=true`` it fails instead.

The side-by-side test behind docs/operator-console.md ("Compared with OpenClaw's Control UI") opens fifteen of the
UI's pages and ten of this console's against one gateway holding the same session (a Markdown reply), asserts
each page drew its own content, and saves each at 1440×900 and 390×844 (``openclaw-control-ui/`` and
``console-compared/``), with ``openclaw-control-ui/pages.json``: per page its scroll width at both sizes (wider
than the viewport: it scrolls sideways), what it loaded over HTTP, axe-core's WCAG 2.2 AA findings at 1440×900
and, for OpenClaw's, the calls this gateway refused. Last, both chat pages with scripts turned off.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect
from pytest_playwright_axe import OPTIONS_WCAG_22AA, Axe

from gateway import scopes as sc
from sessions_app.models import Run, RunStatus
from tests.browser.test_console import PASSWORD, log_in
from tests.browser.test_console_flows import call_beside_the_browser
from tests.support.browser import AXE_REPORTS, SCREENSHOTS
from tests.support.openclaw_cli import ControlUIServer, control_ui_dir, require_openclaw_cli
from tests.support.operators import operator_user

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


# --- The side-by-side comparison of docs/operator-console.md ("Compared with OpenClaw's Control UI") ---

COMPARED_SIZES = {"1440x900": {"width": 1440, "height": 900}, "390x844": {"width": 390, "height": 844}}
COMPARED_SESSION_KEY = "agent:main:side-by-side"
COMPARED_SESSION_LABEL = "Side by side"
# One reply both UIs draw from the same stored transcript: emphasis, inline code, a link, a list, a table, code.
MARKDOWN_REPLY = (
    "Here is **bold**, `inline code` and a [link](https://example.org/docs).\n\n"
    "- first item\n- second item\n\n"
    "| column | value |\n|---|---|\n| a | 1 |\n\n"
    "```python\nprint('hello')\n```"
)
# OpenClaw's pages: (shot name, path, a text only that page draws once it rendered). The Control UI has more
# (profile, talk, MCP, memory, secrets, worktrees, …); these are the ones with a counterpart in this console, or
# the first an operator of this gateway would look for. ``/settings/general`` opens the appearance page.
OPENCLAW_PAGES = (
    ("chat", "/chat/main/side-by-side", "print('hello')"),
    ("sessions", "/sessions", "Search transcripts"),
    ("devices", "/settings/devices", "Paired devices, pairing approvals, and exec bindings."),
    ("approvals", "/settings/approvals", "Approval history"),
    ("logs", "/logs", "Gateway file logs (JSONL)."),
    ("usage", "/usage", "Daily Token Usage"),
    ("automations", "/automations", "Scheduled tasks and recurring agent runs."),
    ("appearance", "/settings/appearance", "Color mode"),
    ("connection", "/settings/connection", "Gateway endpoint, credentials, and handshake status."),
    ("debug", "/debug", "Refresh to update status and health snapshots."),
    ("agents", "/agents", "Who is on your team and what they are doing"),
    ("skills", "/skills", "Manage your agent skills"),
    ("channels", "/settings/channels", "Pick a service and follow the guided setup."),
    ("systems", "/systems", "Select a machine"),
    ("home", "/dashboard", "Type a message below"),
)
# This console's pages: (shot name, path, its heading).
CONSOLE_PAGES = (
    ("sessions", "/ui/sessions/", "Sessions"),
    ("session", f"/ui/sessions/{COMPARED_SESSION_KEY}/", COMPARED_SESSION_LABEL),
    ("runs", "/ui/runs/", "Runs"),
    ("nodes", "/ui/nodes/", "Nodes"),
    ("pairing", "/ui/pairing/", "Pairing"),
    ("approvals", "/ui/approvals/", "approvals"),
    ("logs", "/ui/logs/", "Logs"),
    ("usage", "/ui/usage/", "Usage"),
    ("environments", "/ui/environments/", "environments"),
    ("system", "/ui/system/", "System"),
)
# What the page loaded over HTTP (the document, scripts, styles, fonts, images; not the WebSocket frames), the
# browser's cache being off.
PAGE_WEIGHT_JS = """() => {
  const entries = [...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")];
  return {requests: entries.length, bytes: entries.reduce((sum, entry) => sum + (entry.decodedBodySize || 0), 0)};
}"""


def compared_shots(folder: Path, page, number: int, name: str) -> dict[str, int]:
    """``NN-<name>-<size>.png`` at both compared sizes; the page's scroll width at each (wider than the
    viewport means the page scrolls sideways)."""
    widths = {}
    for size_name, size in COMPARED_SIZES.items():
        page.set_viewport_size(size)
        page.wait_for_timeout(300)  # the layout's media queries and resize observers settle
        widths[size_name] = page.evaluate("document.documentElement.scrollWidth")
        page.screenshot(path=folder / f"{number:02d}-{name}-{size_name}.png", full_page=True)
    page.set_viewport_size(COMPARED_SIZES["1440x900"])
    return widths


def axe_findings(page, name: str) -> dict[str, list[str]]:
    """axe-core's WCAG 2.2 AA violations of the page, rule ids by impact (full report: ``test-artifacts/axe/``)."""
    results = Axe(output_directory=AXE_REPORTS, use_minified_file=True).run(
        page, filename=name, options=OPTIONS_WCAG_22AA
    )
    findings: dict[str, list[str]] = {}
    for violation in results["violations"]:
        findings.setdefault(violation["impact"] or "unknown", []).append(violation["id"])
    return findings


def fresh_folder(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def wait_for_reply(session_key: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not Run.objects.filter(session__key=session_key, status=RunStatus.OK).exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"no finished turn in {session_key} after {timeout_s:.0f} s")
        time.sleep(0.2)


def test_openclaw_control_ui_and_this_console_side_by_side(control_ui, browser, page, gateway, django_user_model):
    call_beside_the_browser(gateway, "sessions.create", {"key": COMPARED_SESSION_KEY, "label": COMPARED_SESSION_LABEL})
    call_beside_the_browser(
        gateway,
        "chat.send",
        {
            "sessionKey": COMPARED_SESSION_KEY,
            "message": f"Reply exactly: {MARKDOWN_REPLY}",
            "idempotencyKey": "side-by-side-1",
        },
    )
    wait_for_reply(COMPARED_SESSION_KEY)
    openclaw_folder = fresh_folder(SCREENSHOTS / "openclaw-control-ui")
    console_folder = fresh_folder(SCREENSHOTS / "console-compared")
    report: dict[str, dict] = {"openclaw": {}, "console": {}}

    frames = GatewayFrames(gateway.url)
    frames.attach(page)
    page.set_viewport_size(COMPARED_SIZES["1440x900"])
    # Every load is a cold one, so each page's weight counts all it needs, whatever page came before it.
    devtools = page.context.new_cdp_session(page)
    devtools.send("Network.enable")
    devtools.send("Network.setCacheDisabled", {"cacheDisabled": True})
    page.goto(ui_link(control_ui, gateway, "/chat/main"))
    page.get_by_role("button", name=f"Switch to 127.0.0.1:{gateway.port}").click()
    frames.wait_connected(page, 0)
    for number, (name, path, rendered_text) in enumerate(OPENCLAW_PAGES, start=1):
        refused_before = len(frames.refusals)
        open_page(page, frames, control_ui, gateway, path)
        expect(page.get_by_text(rendered_text).filter(visible=True).first).to_be_visible(timeout=UI_WAIT_MS)
        with contextlib.suppress(AssertionError):
            frames.settle(page, timeout_s=10)  # a page that keeps polling never falls quiet: shot as it is
        expect(page.locator("#openclaw-mount-fallback")).to_be_hidden()
        report["openclaw"][name] = {
            "path": path,
            "scrollWidth": compared_shots(openclaw_folder, page, number, name),
            "weight": page.evaluate(PAGE_WEIGHT_JS),
            "axe": axe_findings(page, f"openclaw-control-ui-{name}"),
            "refused": sorted({f"{method}: {message}" for method, _, message in frames.refusals[refused_before:]}),
        }
    # The chat page drew the stored reply as Markdown: emphasis, a table and a highlighted code block.
    open_page(page, frames, control_ui, gateway, "/chat/main/side-by-side")
    expect(page.locator("strong", has_text="bold").first).to_be_visible(timeout=UI_WAIT_MS)
    expect(page.get_by_role("table").first).to_be_visible(timeout=UI_WAIT_MS)

    operator_user("ops", sc.ADMIN, password=PASSWORD)
    log_in(page, gateway, "ops", PASSWORD)
    expect(page).to_have_url(f"{gateway.http_url}/ui/sessions/")
    for number, (name, path, heading) in enumerate(CONSOLE_PAGES, start=1):
        response = page.goto(f"{gateway.http_url}{path}")
        assert response.status == 200, (path, response.status)
        expect(page.get_by_role("heading", level=1)).to_contain_text(
            re.compile(heading, re.IGNORECASE), timeout=UI_WAIT_MS
        )
        report["console"][name] = {
            "path": path,
            "scrollWidth": compared_shots(console_folder, page, number, name),
            "weight": page.evaluate(PAGE_WEIGHT_JS),
            "axe": axe_findings(page, f"console-compared-{name}"),
        }
    page.goto(f"{gateway.http_url}/ui/sessions/{COMPARED_SESSION_KEY}/")
    expect(page.locator('[data-live-region="transcript"]')).to_contain_text("first item", timeout=UI_WAIT_MS)

    # With scripts off the Control UI draws nothing; the console's session page still reads.
    without_scripts = browser.new_context(java_script_enabled=False, viewport=COMPARED_SIZES["1440x900"])
    try:
        bare = without_scripts.new_page()
        bare.goto(control_ui.url("/chat/main/side-by-side"))
        report["openclaw"]["without-javascript"] = {"text": bare.locator("body").inner_text().strip()}
        bare.screenshot(path=openclaw_folder / f"{len(OPENCLAW_PAGES) + 1:02d}-without-javascript-1440x900.png")
        assert report["openclaw"]["without-javascript"]["text"] == ""
        log_in(bare, gateway, "ops", PASSWORD)
        bare.goto(f"{gateway.http_url}/ui/sessions/{COMPARED_SESSION_KEY}/")
        expect(bare.locator('[data-live-region="transcript"]')).to_contain_text("first item")
        bare.screenshot(path=console_folder / f"{len(CONSOLE_PAGES) + 1:02d}-without-javascript-1440x900.png")
    finally:
        without_scripts.close()

    (openclaw_folder / "pages.json").write_text(json.dumps(report, indent=2))
