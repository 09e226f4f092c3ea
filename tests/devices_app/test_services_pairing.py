"""Pairing services: idempotent requests, expiry, compare-and-set approval, audit, events."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from devices_app import selectors as device_selectors
from devices_app.models import DevicePairingRequest, PairedDevice, PairingStatus
from devices_app.services import pairing, tokens
from devices_app.services.pairing import PairingClaim
from gateway.audit import Actor
from gateway.exceptions import InvalidRequest, PermissionDenied
from gateway.models import AuditLog


def claim(device_id: str = "d" * 64, *, role: str = "node", commands: list[str] | None = None, **extra) -> PairingClaim:
    return PairingClaim(
        device_id=device_id,
        public_key="pk",
        role=role,
        scopes=[],
        reason="not-paired",
        is_repair=False,
        commands=commands if commands is not None else ["echo"],
        **extra,
    )


@pytest.fixture
def published(monkeypatch):
    """Events the services publish, captured where they would leave for the channel layer."""
    from gateway import events

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(events, "publish_rollback_unsafe", lambda event, payload, **_: sent.append((event, payload)))
    return sent


@pytest.mark.django_db
def test_a_device_has_one_open_request_which_follows_its_latest_claim(django_capture_on_commit_callbacks, published):
    with django_capture_on_commit_callbacks(execute=True):
        first, created = pairing.pairing_request_ensure(claim=claim())
    with django_capture_on_commit_callbacks(execute=True):
        again, created_again = pairing.pairing_request_ensure(claim=claim(commands=["echo", "run"]))
    assert created and not created_again
    assert first.pk == again.pk
    assert again.commands == ["echo", "run"]
    assert DevicePairingRequest.objects.get().commands == ["echo", "run"]
    # Announced once, when the request was created; the refresh is not a new request.
    assert [event for event, _ in published] == ["device.pair.requested", "node.pair.requested"]
    assert published[1][1]["requestId"] == str(first.pk)
    assert published[1][1]["commands"] == ["echo"]


@pytest.mark.django_db
def test_nothing_is_published_when_the_transaction_rolls_back(published):
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        pairing.pairing_request_ensure(claim=claim())
        raise RuntimeError("caller failed after the service")
    assert published == []
    assert not DevicePairingRequest.objects.exists()


@pytest.mark.django_db
def test_an_expired_request_is_replaced_by_a_new_one():
    old, _ = pairing.pairing_request_ensure(claim=claim())
    DevicePairingRequest.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    new, created = pairing.pairing_request_ensure(claim=claim())
    assert created and new.pk != old.pk
    assert DevicePairingRequest.objects.get(pk=old.pk).status == PairingStatus.EXPIRED
    with pytest.raises(InvalidRequest, match="unknown requestId"):
        pairing.pairing_request_approve(request_id=str(old.pk), actor=Actor.system())


@pytest.mark.django_db
def test_the_sweep_expires_overdue_requests():
    request, _ = pairing.pairing_request_ensure(claim=claim())
    DevicePairingRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now())
    assert pairing.pairing_sweep()["expiredRequests"] == 1
    assert DevicePairingRequest.objects.get().status == PairingStatus.EXPIRED


@pytest.mark.django_db
def test_approval_of_exec_commands_needs_admin():
    request, _ = pairing.pairing_request_ensure(claim=claim(commands=["system.run"]))
    pairer = Actor(label="device:x", scopes=("operator.pairing", "operator.write"))
    with pytest.raises(PermissionDenied, match=r"missing scope: operator\.admin"):
        pairing.pairing_request_approve(request_id=str(request.pk), actor=pairer)
    assert DevicePairingRequest.objects.get().status == PairingStatus.PENDING
    assert not PairedDevice.objects.exists()
    assert not AuditLog.objects.exists()


@pytest.mark.django_db
def test_approval_of_plain_commands_needs_write():
    request, _ = pairing.pairing_request_ensure(claim=claim(commands=["echo"]))
    with pytest.raises(PermissionDenied, match=r"missing scope: operator\.write"):
        pairing.pairing_request_approve(
            request_id=str(request.pk), actor=Actor(label="x", scopes=("operator.pairing",))
        )
    device = pairing.pairing_request_approve(
        request_id=str(request.pk), actor=Actor(label="y", scopes=("operator.pairing", "operator.write"))
    )
    assert device.approved_commands == ["echo"]
    assert AuditLog.objects.get().actor == "y"


@pytest.mark.django_db
def test_approving_twice_fails_the_second_time():
    request, _ = pairing.pairing_request_ensure(claim=claim())
    pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system())
    with pytest.raises(InvalidRequest, match="unknown requestId"):
        pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system())
    with pytest.raises(InvalidRequest, match="unknown requestId"):
        pairing.pairing_request_reject(request_id=str(request.pk), actor=Actor.system())
    assert AuditLog.objects.filter(action="device.pair.approve").count() == 1


@pytest.mark.django_db
def test_a_claim_approved_since_the_device_was_read_opens_no_new_request():
    request, _ = pairing.pairing_request_ensure(claim=claim())
    pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system())

    # The connect that read the device before the approval asks again: nothing for an operator to approve.
    with pytest.raises(pairing.ApprovedMeanwhile) as approved:
        pairing.pairing_request_ensure(claim=claim())

    assert approved.value.device.has_role("node")
    assert list(DevicePairingRequest.objects.values_list("status", flat=True)) == [PairingStatus.APPROVED]


@pytest.mark.django_db
def test_a_device_paired_for_another_role_still_gets_a_request_for_this_one():
    operator_request, _ = pairing.pairing_request_ensure(claim=claim(role="operator", commands=[]))
    pairing.pairing_request_approve(request_id=str(operator_request.pk), actor=Actor.system())

    node_request, created = pairing.pairing_request_ensure(claim=claim())

    assert created and node_request.status == PairingStatus.PENDING


@pytest.mark.django_db
def test_malformed_request_ids_are_unknown():
    with pytest.raises(InvalidRequest, match="unknown requestId"):
        pairing.pairing_request_approve(request_id="not-a-uuid", actor=Actor.system())


@pytest.mark.django_db(transaction=True)
def test_concurrent_approve_and_reject_resolve_the_request_once():
    request, _ = pairing.pairing_request_ensure(claim=claim())
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def decide(action):
        barrier.wait()
        try:
            action(request_id=str(request.pk), actor=Actor.system(action.__name__))
            outcomes.append(action.__name__)
        except InvalidRequest:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(pairing.pairing_request_approve,)),
        threading.Thread(target=decide, args=(pairing.pairing_request_reject,)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("refused") == 1
    status = DevicePairingRequest.objects.get().status
    assert (status == PairingStatus.APPROVED) == PairedDevice.objects.exists()
    assert AuditLog.objects.count() == 1


@pytest.mark.django_db
def test_token_ensure_mints_once_and_verify_reports_the_reason():
    device = PairedDevice.objects.create(
        device_id="e" * 64, public_key="pk", roles=["node"], approved_at=timezone.now()
    )
    token, issued_at = tokens.device_token_ensure(device=device, role="node", scopes=[])
    assert token and issued_at
    assert tokens.device_token_ensure(device=device, role="node", scopes=[]) == (None, None)
    assert tokens.device_token_verify(device_id=device.device_id, role="node", token=token).role == "node"
    for device_id, role, presented, reason in [
        ("f" * 64, "node", token, "device-not-paired"),
        (device.device_id, "operator", token, "token-missing"),
        (device.device_id, "node", "wrong", "token-mismatch"),
    ]:
        with pytest.raises(tokens.DeviceTokenRejected) as rejected:
            tokens.device_token_verify(device_id=device_id, role=role, token=presented)
        assert rejected.value.reason == reason
    tokens.device_token_revoke(device_id=device.device_id, role="node", actor=Actor.system())
    with pytest.raises(tokens.DeviceTokenRejected) as revoked:
        tokens.device_token_verify(device_id=device.device_id, role="node", token=token)
    assert revoked.value.reason == "token-revoked"
    # Revoking again is a no-op, not a second audit entry.
    tokens.device_token_revoke(device_id=device.device_id, role="node", actor=Actor.system())
    assert AuditLog.objects.filter(action="device.token.revoke").count() == 1


@pytest.mark.django_db(transaction=True)
def test_node_catalog_memo_is_invalidated_by_pairing_changes():

    assert device_selectors.node_catalog_snapshot() == []
    request, _ = pairing.pairing_request_ensure(claim=claim())
    (pending,) = device_selectors.node_catalog_snapshot()
    assert pending["approvalState"] == "pending-approval"
    pairing.pairing_request_approve(request_id=str(request.pk), actor=Actor.system())
    (approved,) = device_selectors.node_catalog_snapshot()
    assert approved["approvalState"] == "approved"
    pairing.node_rename(node_id=request.device_id, display_name="renamed", actor=Actor.system())
    assert device_selectors.node_catalog_snapshot()[0]["displayName"] == "renamed"
    pairing.node_remove(node_id=request.device_id, actor=Actor.system())
    assert device_selectors.node_catalog_snapshot() == []


@pytest.mark.django_db(transaction=True)
def test_the_memo_answers_without_a_read_only_while_fresh_and_checked(django_assert_num_queries):
    device_selectors.node_catalog_snapshot()
    # Just read and checked: the memo answers, no query and no cache read.
    with django_assert_num_queries(0):
        assert device_selectors.node_catalog_memoized() == []
    # A change here invalidates it at once (after commit).
    request, _ = pairing.pairing_request_ensure(claim=claim())
    assert device_selectors.node_catalog_memoized() is None
    (pending,) = device_selectors.node_catalog_snapshot()
    assert device_selectors.node_catalog_memoized() == [pending]
    # Past the version check interval the shared version must be read again first: not answered from memory.
    device_selectors._node_catalog_memo["checked_at"] -= device_selectors.NODE_CATALOG_VERSION_CHECK_S
    assert device_selectors.node_catalog_memoized() is None
    assert request.device_id == pending["nodeId"]
