"""Every registered method × every kind of caller, over real sockets: the role and scope rules hold.

The matrix is generated from the method registry, so a method added later is covered without
touching this test: a caller of the wrong role is refused with ``unauthorized role: <role>``, an
operator without the method's scope (or one implying it) with ``missing scope: <scope>``, and
everyone else gets past authorization (to a result or to a params error, never a refusal).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from gateway import scopes as sc
from gateway.registry import MethodSpec, registry
from openclaw_client.client import GatewayError
from tests.support.clients import operator, paired_node

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@dataclass(frozen=True)
class Caller:
    name: str
    role: str
    scopes: tuple[str, ...]


OPERATORS = [
    Caller("operator without scopes", "operator", ()),
    *(Caller(f"operator with only {scope}", "operator", (scope,)) for scope in sc.KNOWN_OPERATOR_SCOPES),
]
NODE = Caller("paired node", "node", ())


def expected_refusal(spec: MethodSpec, caller: Caller) -> str | None:
    if spec.name == "health":
        return None
    if spec.role != caller.role:
        return f"unauthorized role: {caller.role}"
    if caller.role == "node" or spec.scope is None:
        return None
    if sc.scope_satisfied(caller.scopes, spec.scope):
        return None
    return f"missing scope: {spec.scope}"


async def outcome(client, method: str) -> str | None:
    """The authorization refusal this call got, or None when it got past authorization."""
    try:
        await client.request(method, {}, timeout=10)
    except GatewayError as error:
        message = error.message or ""
        if message.startswith(("unauthorized role:", "missing scope:")):
            return message
    return None


def test_every_method_refuses_exactly_the_callers_it_must(gateway):
    methods = sorted(registry.methods.values(), key=lambda spec: spec.name)
    # Methods whose effects would end the caller's own connection are asked last.
    methods.sort(key=lambda spec: spec.name in ("device.pair.remove", "node.pair.remove", "device.token.revoke"))

    async def scenario() -> dict[tuple[str, str], tuple[str | None, str | None]]:
        results = {}
        admin = operator(gateway)
        await admin.connect()
        try:
            for caller in OPERATORS:
                client = operator(gateway, scopes=list(caller.scopes))
                await client.connect()
                try:
                    for spec in methods:
                        results[(caller.name, spec.name)] = (
                            expected_refusal(spec, caller),
                            await outcome(client, spec.name),
                        )
                finally:
                    await client.close()
            node_client = await paired_node(gateway, admin)
            try:
                for spec in methods:
                    results[(NODE.name, spec.name)] = (
                        expected_refusal(spec, NODE),
                        await outcome(node_client, spec.name),
                    )
            finally:
                await node_client.close()
        finally:
            await admin.close()
        return results

    results = asyncio.run(scenario())
    assert len(results) == (len(OPERATORS) + 1) * len(registry.methods)
    wrong = {cell: got for cell, got in results.items() if got[0] != got[1]}
    assert wrong == {}
    # The matrix is not vacuous: both refusals and admissions happened for every kind of caller.
    for caller in [*OPERATORS, NODE]:
        answers = [got for (name, _), (_, got) in results.items() if name == caller.name]
        assert None in answers
        assert any(answer is not None for answer in answers)
