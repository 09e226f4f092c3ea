"""Every console page and form asks a login for the scope the wire asks for the same work.

The table below names, for each of the console's URL patterns (read from ``operator_ui/urls.py``, so a new view
without a row fails here), the gateway methods whose work it does (or the scope of a page no method mirrors) and
the HTTP methods it serves. Each persona — no scope, each scope alone, staff status alone, a scope through a group,
a superuser — requests every pattern with GET and with POST: what its scopes allow is served (never 403), the
rest is 403 and changes nothing; a method the view does not serve is 405 for everyone. Then each page a persona
may open, drawn over a world where every button has something to act on, offers only forms and links whose
work the persona may do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import URLPattern, resolve, reverse

from approvals_app.models import ExecApproval
from devices_app.models import DevicePairingRequest, PairedDevice
from devices_app.services import pairing
from gateway import scopes as sc
from gateway.audit import Actor
from gateway.models import AuditLog
from gateway.registry import registry
from gateway.user_scopes import SCOPE_PERMISSIONS
from operator_ui import urls as console_urls
from sessions_app.models import Session
from tests.operator_ui.test_approvals import ask
from tests.operator_ui.test_nodes import pending_request
from tests.operator_ui.test_pairing import operator_request
from tests.operator_ui.test_session_fork import QUESTIONS, with_transcript
from tests.operator_ui.test_tool_transcript import running_turn
from tests.operator_ui.test_views import make
from tests.support.operators import operator_user
from tests.workers_app.test_rpc import dev_profile, failed_without_environment, use_profiles  # noqa: F401 (fixtures)
from workers_app.models import Placement

pytestmark = pytest.mark.django_db

UNKNOWN = "f" * 64
GET, POST = "get", "post"


@dataclass(frozen=True)
class Needs:
    """What a pattern asks: the wire's scope of each gateway method, and ``scope`` for work no method does;
    ``login`` False for the login page (anyone); ``any_scope`` for the page a login lands on (it sends the user to
    a page their scopes open, or refuses one that holds none)."""

    methods: tuple[str, ...] = ()
    scope: str | None = None
    login: bool = True
    any_scope: bool = False

    def scopes(self) -> list[str]:
        needed = [self.scope] if self.scope else []
        return needed + [scope for method in self.methods if (scope := registry.methods[method].scope)]


def mirrors(*methods: str) -> Needs:
    return Needs(methods=methods)


# name: (what it needs, kwargs for reverse, the HTTP methods it serves)
PATTERNS: dict[str, tuple[Needs, dict[str, str], frozenset[str]]] = {
    "home": (Needs(any_scope=True), {}, frozenset({GET})),
    "login": (Needs(login=False), {}, frozenset({GET, POST})),
    "logout": (Needs(), {}, frozenset({POST})),
    "sessions": (mirrors("sessions.list"), {}, frozenset({GET})),
    "session-new": (mirrors("sessions.create"), {}, frozenset({POST})),
    "sessions-archive": (mirrors("sessions.patch"), {}, frozenset({POST})),
    "sessions-reset": (mirrors("sessions.reset"), {}, frozenset({POST})),
    "session-send": (mirrors("chat.send"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-abort": (mirrors("chat.abort"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-dispatch": (mirrors("sessions.dispatch"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-move-to-gateway": (mirrors("sessions.move"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-reclaim": (mirrors("sessions.reclaim"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-fork": (mirrors("sessions.fork"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-patch": (mirrors("sessions.patch"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-reset": (mirrors("sessions.reset"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session-delete": (mirrors("sessions.delete"), {"key": "agent:main:nobody"}, frozenset({POST})),
    "session": (mirrors("sessions.describe", "chat.history"), {"key": "agent:main:nobody"}, frozenset({GET})),
    "artifact": (mirrors("chat.history"), {"artifact_id": "nothing"}, frozenset({GET})),
    "session-image": (
        mirrors("chat.history"),
        {"key": "agent:main:nobody", "entry_id": "nothing", "index": 0},
        frozenset({GET}),
    ),
    "approvals": (mirrors("exec.approval.list"), {}, frozenset({GET})),
    "approval-decide": (
        mirrors("exec.approval.resolve"),
        {"approval_id": "nothing", "decision": "deny"},
        frozenset({POST}),
    ),
    "runs": (Needs(scope=sc.READ), {}, frozenset({GET})),
    "logs": (mirrors("logs.tail"), {}, frozenset({GET})),
    "logs-follow": (mirrors("logs.tail"), {}, frozenset({GET})),
    "environments": (mirrors("environments.list"), {}, frozenset({GET})),
    "nodes": (mirrors("node.list"), {}, frozenset({GET})),
    "usage": (mirrors("usage.cost"), {}, frozenset({GET})),
    "node-request": (
        mirrors("node.pair.approve", "node.pair.reject"),
        {"request_id": UNKNOWN, "decision": "approve"},
        frozenset({POST}),
    ),
    "node-remove": (mirrors("node.pair.remove"), {"node_id": UNKNOWN}, frozenset({GET, POST})),
    "system": (Needs(scope=sc.ADMIN), {}, frozenset({GET})),
    "pairing": (mirrors("device.pair.list"), {}, frozenset({GET})),
    "pairing-request": (
        mirrors("device.pair.approve", "device.pair.reject"),
        {"request_id": UNKNOWN, "decision": "approve"},
        frozenset({POST}),
    ),
    "pairing-device-remove": (mirrors("device.pair.remove"), {"device_id": UNKNOWN}, frozenset({GET, POST})),
    "pairing-token-revoke": (
        mirrors("device.token.revoke"),
        {"device_id": UNKNOWN, "role": "operator"},
        frozenset({GET, POST}),
    ),
    "pairing-token-rotate": (
        mirrors("device.token.rotate"),
        {"device_id": UNKNOWN, "role": "operator"},
        frozenset({GET, POST}),
    ),
}


@dataclass(frozen=True)
class Persona:
    scopes: tuple[str, ...] = ()
    staff: bool = False
    superuser: bool = False
    through_group: bool = False

    def may(self, needs: Needs) -> bool:
        if self.superuser:
            return True
        if needs.any_scope and not self.scopes:
            return False
        return all(sc.scope_satisfied(self.scopes, scope) for scope in needs.scopes())


PERSONAS = {
    "no scope": Persona(),
    "staff status alone": Persona(staff=True),
    "read": Persona((sc.READ,)),
    "write": Persona((sc.WRITE,)),
    "pairing": Persona((sc.PAIRING,)),
    "approvals": Persona((sc.APPROVALS,)),
    "admin": Persona((sc.ADMIN,)),
    "write and pairing through their groups": Persona((sc.WRITE, sc.PAIRING), through_group=True),
    "superuser": Persona(superuser=True, staff=True),
}


def log_in(client: Client, persona: Persona):
    if persona.superuser:
        user = operator_user("root", is_staff=True, is_superuser=True)
    elif persona.through_group:
        user = operator_user("grouped", is_staff=persona.staff)
        for scope in persona.scopes:
            group, _ = Group.objects.get_or_create(name=scope)
            codename = SCOPE_PERMISSIONS[scope].removeprefix("gateway.")
            group.permissions.add(Permission.objects.get(content_type__app_label="gateway", codename=codename))
            user.groups.add(group)
    else:
        user = operator_user("persona", *persona.scopes, is_staff=persona.staff)
    client.force_login(user)
    return user


def world_counts() -> tuple[int, ...]:
    return (
        AuditLog.objects.count(),
        Session.objects.count(),
        PairedDevice.objects.count(),
        DevicePairingRequest.objects.filter(status="pending").count(),
        ExecApproval.objects.filter(status="pending").count(),
    )


def test_the_table_names_every_console_pattern_and_the_wire_s_scope_for_pairing_a_node():
    patterns = [entry for entry in console_urls.urlpatterns if isinstance(entry, URLPattern)]

    assert len(patterns) == len(console_urls.urlpatterns)  # no include() hides a view from this test
    assert sorted(pattern.name for pattern in patterns) == sorted(PATTERNS)
    # The reported escalation: approving and removing a node is operator.pairing, over the wire and here.
    assert PATTERNS["node-request"][0].scopes() == [sc.PAIRING, sc.PAIRING]
    assert PATTERNS["node-remove"][0].scopes() == [sc.PAIRING]


@pytest.mark.parametrize("persona_name", list(PERSONAS))
def test_each_pattern_serves_exactly_what_the_persona_s_scopes_allow(persona_name, client, settings):
    settings.OPENCLAW_LOG_FILE = None  # the logs page says so instead of reading this machine's log
    persona = PERSONAS[persona_name]
    user = log_in(client, persona)
    wrong = []
    for name, (needs, kwargs, served) in PATTERNS.items():
        url = reverse(f"ui:{name}", kwargs=kwargs)
        allowed = persona.may(needs)
        for method in (GET, POST):
            client.force_login(user)  # the logout pattern ends the login
            before = world_counts()
            status = getattr(client, method)(url).status_code
            if method not in served:
                expected = "405"
                ok = status == 405
            elif allowed:
                expected = "served"
                ok = status not in (403, 405)
            else:
                expected = "403, nothing changed"
                ok = status == 403 and world_counts() == before
            if not ok:
                wrong.append(f"{method.upper()} {url}: {status}, expected {expected}")

    assert wrong == []


def test_a_visitor_is_sent_to_the_login_from_every_pattern_but_the_login(client):
    wrong = []
    for name, (needs, kwargs, served) in PATTERNS.items():
        url = reverse(f"ui:{name}", kwargs=kwargs)
        for method in served:
            response = getattr(client, method)(url)
            to_login = response.status_code == 302 and response["Location"].startswith(reverse("ui:login"))
            if needs.login and name != "logout" and not to_login:
                wrong.append(f"{method.upper()} {url}: {response.status_code}")

    assert wrong == []


@pytest.fixture
def full_world(request):
    """Something for every button: a running turn with an approval waiting on it and user messages to fork from,
    a failed placement to recover, node and device pairing requests, a paired node, a paired device with a token,
    a worker profile to dispatch to."""
    request.getfixturevalue("dev_profile")
    busy, _events = with_transcript("agent:main:busy", *QUESTIONS)
    running_turn(busy, run_id="run-1")
    ask(session_key=busy.key, run_id="run-1")
    failed_without_environment(make("agent:main:failed"))
    pending_request()
    paired_node = pending_request("a" * 64)
    pairing.pairing_request_approve(request_id=str(paired_node.request_id), actor=Actor.system(), role="node")
    operator_request()
    paired_device = operator_request("b" * 64)
    pairing.pairing_request_approve(request_id=str(paired_device.request_id), actor=Actor.system())
    return {
        "session": [{"key": "agent:main:busy"}, {"key": "agent:main:failed"}],
        "node-remove": [{"node_id": "a" * 64}],
        "pairing-device-remove": [{"device_id": "b" * 64}],
        "pairing-token-revoke": [{"device_id": "b" * 64, "role": "operator"}],
        "pairing-token-rotate": [{"device_id": "b" * 64, "role": "operator"}],
    }


FORM = re.compile(r'<form\b[^>]*\bmethod="post"[^>]*\baction="([^"]+)"', re.I)
LINK = re.compile(r'<a\b[^>]*\bhref="(/ui/[^"#?]*)', re.I)


@pytest.mark.parametrize("persona_name", [name for name in PERSONAS if name != "staff status alone"])
def test_a_page_offers_only_the_forms_and_links_the_persona_may_use(persona_name, client, settings, full_world):
    settings.OPENCLAW_LOG_FILE = None
    persona = PERSONAS[persona_name]
    log_in(client, persona)
    pages = []
    for name, (needs, kwargs, served) in PATTERNS.items():
        # A page about one object is drawn for the world's objects (none for an artifact: plain text, no forms).
        objects = full_world.get(name, [] if kwargs else [{}])
        if GET in served and needs.login and name not in ("home", "logs-follow") and persona.may(needs):
            pages += [reverse(f"ui:{name}", kwargs=each) for each in objects]
    offered = set()
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        body = response.content.decode()
        offered |= {(POST, action) for action in FORM.findall(body)} | {(GET, href) for href in LINK.findall(body)}

    refused = []
    for method, target in sorted(offered):
        name = resolve(target).url_name
        needs, _kwargs, served = PATTERNS[name]
        if method not in served or not persona.may(needs):
            refused.append(f"{method.upper()} {target}")
    assert refused == []
    # And the pages are not empty of actions for those who may act: the reported buttons are there for pairing.
    if persona.may(Needs(scope=sc.WRITE)) and persona.may(Needs(scope=sc.PAIRING)):
        assert any(name.startswith("/ui/nodes/requests/") for _method, name in offered)
        assert any(name.startswith("/ui/nodes/") and name.endswith("/remove") for _method, name in offered)


def test_a_login_without_any_scope_is_told_so_and_one_with_approvals_lands_on_them(client):
    client.force_login(operator_user("nobody"))
    refused = client.get(reverse("ui:home"))
    client.force_login(operator_user("approver", sc.APPROVALS))
    landed = client.get(reverse("ui:home"))

    assert refused.status_code == 403
    assert landed.status_code == 302 and landed["Location"] == reverse("ui:approvals")


@pytest.mark.usefixtures("dev_profile")
def test_a_profile_dispatch_is_an_admin_s_as_on_the_wire(client):
    session = make("agent:main:to-profile")
    client.force_login(operator_user("writer", sc.WRITE))
    page = client.get(reverse("ui:session", kwargs={"key": session.key})).content.decode()

    response = client.post(reverse("ui:session-dispatch", kwargs={"key": session.key}), {"target": "profile:dev"})

    assert 'value="profile:dev"' not in page
    assert response.status_code == 302
    assert [message.message for message in get_messages(response.wsgi_request)] == [
        "choose a node or a profile to dispatch to"
    ]
    assert not Placement.objects.filter(pk=session.pk).exists()
