"""The bundled harness's own store (database alias ``harness``): native threads and bindings.

Native threads stand for the conversations an external agent runtime keeps (a Codex app-server's
threads, say); a binding ties a gateway session to one of them.
"""

from __future__ import annotations

import uuid

from django.db import models


def new_thread_id() -> str:
    return f"thread-{uuid.uuid4()}"


class NativeThread(models.Model):
    thread_id = models.CharField(primary_key=True, max_length=80, default=new_thread_id)
    # Forked threads: which thread, and before which turn.
    source_thread_id = models.CharField(max_length=80, blank=True)
    forked_before_turn_id = models.CharField(max_length=80, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.thread_id


class NativeTurn(models.Model):
    """One message of a native thread's history."""

    thread = models.ForeignKey(NativeThread, on_delete=models.CASCADE, related_name="turns")
    seq = models.PositiveIntegerField()
    turn_id = models.CharField(max_length=80)
    role = models.CharField(max_length=16)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["thread", "seq"], name="native_turn_seq_unique")]
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.thread_id}#{self.seq}"


class BindingState(models.TextChoices):
    ACTIVE = "active"
    CLEARED = "cleared"


class NativeBinding(models.Model):
    """Binding of a gateway session generation (agentId, sessionId) to a native thread.

    ``binding`` holds threadId, cwd, connectionScope ("supervision"), supervisionSourceThreadId,
    model, modelProvider, preserveNativeModel, conversationSourceTransferComplete,
    pendingSupervisionBranch, historyCoveredThrough. ``version`` is the compare-and-set token.
    """

    agent_id = models.CharField(max_length=100)
    session_id = models.CharField(max_length=64)
    session_key = models.CharField(max_length=300)
    state = models.CharField(max_length=16, choices=BindingState.choices, default=BindingState.ACTIVE)
    binding = models.JSONField(default=dict)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent_id", "session_id"], name="native_binding_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.session_key} -> {self.binding.get('threadId')}"


class InitializationOwnership(models.Model):
    """What one session initialization wrote, so that only its own rollback undoes exactly that.

    Keyed by the initialization target (session key, sessionId, lifecycleRevision). Durable, so a
    pending session left by a crashed process can still be rolled back from the admin.
    """

    session_key = models.CharField(max_length=300)
    session_id = models.CharField(max_length=64)
    lifecycle_revision = models.CharField(max_length=64)
    agent_id = models.CharField(max_length=100)
    # The fresh thread this initialization created (fork) and must archive on rollback.
    fresh_thread_id = models.CharField(max_length=80, blank=True)
    written_binding = models.JSONField(null=True, blank=True)
    written_link = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session_key", "session_id", "lifecycle_revision"], name="initialization_ownership_target"
            )
        ]

    def __str__(self) -> str:
        return f"initialization of {self.session_key} ({self.session_id})"


class NativeConnection(models.Model):
    """The live connection to the native runtime; threads carry its fingerprint in their refs.

    Retiring it (after a cleanup that could not be verified) makes every ref to it unavailable.
    """

    fingerprint = models.CharField(primary_key=True, max_length=80)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.fingerprint
