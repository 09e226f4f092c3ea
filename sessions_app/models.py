from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


def new_id() -> str:
    return str(uuid.uuid4())


class Session(models.Model):
    """One logical conversation: a stable ``key`` whose transcript generation (``session_id``)
    rotates on reset and fork. ``lifecycle_revision`` rotates with every ownership change;
    guarded mutations compare both. ``revision`` counts every write of the row
    (``services.rows.session_write``): a caller that read revision N and sends it back changes
    the row only if nobody wrote it since.
    """

    key = models.CharField(max_length=300, unique=True)
    agent_id = models.CharField(max_length=100, default="main")
    session_id = models.CharField(max_length=64, unique=True, default=new_id)
    lifecycle_revision = models.CharField(max_length=64, default=new_id)
    # +1 on every write of this row, by compare-and-set (sessions.patch|reset|delete ``expectedRevision``).
    revision = models.PositiveBigIntegerField(default=1)
    # Initialization not finished: no turns, no forks, until the readiness commit.
    initialization_pending = models.BooleanField(default=False)
    label = models.CharField(max_length=200, blank=True)
    display_name = models.CharField(max_length=200, blank=True)
    category = models.CharField(max_length=100, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    pinned_at = models.DateTimeField(null=True, blank=True)
    created_via = models.CharField(max_length=32, default="operator")
    parent_session_key = models.CharField(max_length=300, blank=True)
    fork_source_session_key = models.CharField(max_length=300, blank=True)
    fork_source_session_id = models.CharField(max_length=64, blank=True)
    fork_source_entry_id = models.CharField(max_length=64, blank=True)
    cwd = models.TextField(blank=True)
    # {"id", "branch", "path", "repoRoot", "baseRef"} of a managed git worktree.
    worktree = models.JSONField(null=True, blank=True)
    model_provider = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    # Owned by an agent harness (native threads): only the harness's guarded rollback removes it.
    agent_harness_id = models.CharField(max_length=64, blank=True)
    model_selection_locked = models.BooleanField(default=False)
    plugin_extensions = models.JSONField(default=dict, blank=True)
    # Last turn: running | done | failed | killed (an aborted turn).
    status = models.CharField(max_length=16, blank=True)
    last_run_id = models.CharField(max_length=200, blank=True)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_interaction_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # sessions.list pages: newest first (ties by id), archived sessions left out by default;
            # the column order and directions match the ORDER BY exactly.
            models.Index(
                fields=["-updated_at", "-id"], condition=Q(archived_at__isnull=True), name="session_active_recent_idx"
            ),
            models.Index(
                fields=["agent_id", "-updated_at", "-id"],
                condition=Q(archived_at__isnull=True),
                name="session_agent_recent_idx",
            ),
            models.Index(fields=["-updated_at", "-id"], name="session_recent_idx"),
            models.Index(fields=["label"], name="session_label_idx"),
        ]

    def __str__(self) -> str:
        return self.key


class WindowReason(models.TextChoices):
    INITIAL = "initial"
    RESET = "reset"
    FORK = "fork"


class SessionWindow(models.Model):
    """One transcript generation of a session; its primary key is the wire ``sessionId``.

    (``session_id`` on this model is Django's foreign key to :class:`Session`, not the wire id.)
    """

    id = models.CharField(primary_key=True, max_length=64)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="windows")
    previous_session_id = models.CharField(max_length=64, blank=True)
    reason = models.CharField(max_length=16, choices=WindowReason.choices)
    # Appends are linear: the next seq and the current leaf, kept here so that an append is one
    # INSERT under the session lock instead of a MAX() and a leaf lookup over the whole transcript.
    next_seq = models.PositiveIntegerField(default=1)
    leaf_event_id = models.CharField(max_length=64, blank=True)
    message_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.id} ({self.reason})"


class TranscriptEvent(models.Model):
    """Append-only transcript entry. ``seq`` is dense per window; ``parent_id`` links the active path."""

    window = models.ForeignKey(SessionWindow, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    event_id = models.CharField(max_length=64, default=new_id)
    parent_id = models.CharField(max_length=64, blank=True)
    type = models.CharField(max_length=32, default="message")
    body = models.JSONField(default=dict)
    # Message appends carry one; a repeated append with the same key is a no-op.
    # NULL = no key; the partial unique index covers keyed rows only.
    idempotency_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["window", "seq"], name="transcript_seq_unique"),
            models.UniqueConstraint(fields=["window", "event_id"], name="transcript_event_id_unique"),
            models.UniqueConstraint(
                fields=["window", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="transcript_idempotency_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.window_id}#{self.seq} {self.type}"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"
    ABORTED = "aborted"


TERMINAL_RUN_STATUSES = (RunStatus.OK, RunStatus.ERROR, RunStatus.ABORTED)


class Run(models.Model):
    """A chat turn. ``run_id`` is the caller's idempotencyKey: a repeated chat.send is this run."""

    run_id = models.CharField(primary_key=True, max_length=200)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    session_key = models.CharField(max_length=300)
    # The transcript generation (wire sessionId) the turn was sent to; a reset in between fails it.
    window = models.ForeignKey(SessionWindow, on_delete=models.CASCADE, related_name="runs")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    message = models.TextField()
    user_event_id = models.CharField(max_length=64, blank=True)
    assistant_event_id = models.CharField(max_length=64, blank=True)
    model_provider = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    output_text = models.TextField(blank=True)
    stop_reason = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    error_kind = models.CharField(max_length=32, blank=True)
    usage = models.JSONField(null=True, blank=True)
    abort_requested_at = models.DateTimeField(null=True, blank=True)
    # The connection that sent the turn receives its stream without subscribing.
    origin_channel = models.CharField(max_length=200, blank=True)
    # Which process executes it ("celery:<host>:<pid>" or "gateway:<bootId>") and its proof of life.
    # The column keeps its first name; "worker" now means a worker environment (workers_app).
    executor = models.CharField(max_length=200, blank=True, db_column="worker")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Next queued turn of a session, and "is a turn of this session running?".
            models.Index(fields=["session", "status", "created_at"], name="run_session_status_idx"),
            # The sweep: running turns whose executor stopped heartbeating.
            models.Index(fields=["status", "heartbeat_at"], name="run_status_heartbeat_idx"),
            # The runs list (JSON API, console): newest first, keyset on (created_at, run_id) in exactly this order,
            # so a page deep in the cursor chain reads one index range instead of sorting every run.
            models.Index(fields=["-created_at", "-run_id"], name="run_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


class SessionUpstreamLink(models.Model):
    """A session's link to a thread in an external agent runtime (``session_upstream_links``)."""

    session_key = models.CharField(max_length=300)
    agent_id = models.CharField(max_length=100)
    catalog_id = models.CharField(max_length=100)
    host_id = models.CharField(max_length=200)
    thread_id = models.CharField(max_length=200)
    upstream_kind = models.CharField(max_length=64)
    upstream_ref = models.JSONField(default=dict)
    marker = models.JSONField(null=True, blank=True)
    last_scanned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # Composite identity: agents may share bare keys.
            models.UniqueConstraint(fields=["session_key", "agent_id"], name="upstream_link_identity"),
        ]
        indexes = [models.Index(fields=["catalog_id"], name="upstream_link_catalog_idx")]

    def __str__(self) -> str:
        return f"{self.session_key} -> {self.upstream_kind}:{self.thread_id}"


class ToolArtifact(models.Model):
    """The whole output of a tool call whose transcript copy was truncated (the operator can open it).

    Bounded by the tool layer (``ToolLimits.artifact_max_bytes``); it goes with its run.
    """

    id = models.CharField(primary_key=True, max_length=64, default=new_id)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    session_key = models.CharField(max_length=300)
    # Which message of the run: its step and place (a model may reuse a tool call id from one step to the next).
    message_key = models.CharField(max_length=64)
    tool_call_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=64)
    content = models.TextField()
    size_bytes = models.PositiveBigIntegerField()
    # What the tool produced in all, when even the artifact had to stop short of it.
    total_bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # One per tool result of a run: a repeated record of the same result is the same artifact.
            models.UniqueConstraint(fields=["run", "message_key"], name="tool_artifact_per_message"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.tool_call_id} ({self.size_bytes} bytes)"
