"""``chat.send`` with the gateway's own commands: a message that is one (``sessions_app/commands.py``) is answered
here, in one transaction, and never reaches the model; any other message is a turn (``runs.chat_send``).

A command is recorded as a run that ends as it starts (``ok``, the caller's ``idempotencyKey`` as its id, so a
repeated send is that run and does nothing again), with the command and its reply appended to the transcript but
marked ``excludeFromContext`` (the model's context leaves them out). Its reply reaches clients as the run's one
``chat`` event (``final``, the reply as its message), after commit. ``/new`` or ``/reset`` followed by text start a
fresh transcript and then an ordinary turn with that text (no reply of their own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from gateway import scopes as sc
from gateway.exceptions import Busy, GatewayError, InvalidRequest

from .. import commands as cmd
from .. import events, selectors
from ..model_providers import default_model
from ..models import Run, RunStatus, Session, SessionWindow
from . import runs
from .runs import SubmitResult, clean_message
from .sessions import session_for_turn, session_lock, session_patch, session_reset
from .transcripts import message_body, transcript_append

# Replies are authored by the gateway, not a model (OpenClaw's provenance of such transcript entries).
REPLY_PROVIDER = "openclaw"
REPLY_MODEL = "gateway-injected"
# sessions.patch's bound on a model name (schemas.ModelName).
MODEL_MAX_LENGTH = 200


def chat_submit(
    *,
    session_key: str,
    message: str,
    idempotency_key: str,
    expected_session_id: str | None = None,
    origin_channel: str = "",
    scopes: Sequence[str] = (),
    interpret_commands: bool = True,
) -> SubmitResult:
    """``chat.send``: the command the message is, answered; otherwise (or with ``interpret_commands`` off, OpenClaw's
    ``suppressCommandInterpretation``) a turn for the model."""
    parsed = cmd.parse_command(message) if interpret_commands else None
    if parsed is None:
        return runs.chat_send(
            session_key=session_key,
            message=message,
            idempotency_key=idempotency_key,
            expected_session_id=expected_session_id,
            origin_channel=origin_channel,
        )
    text = clean_message(message)  # refused before anything is written, as a turn's text is
    request = _Request(
        command=parsed,
        text=text,
        idempotency_key=idempotency_key,
        origin_channel=origin_channel,
        scopes=tuple(scopes),
    )
    try:
        with transaction.atomic():
            session = session_lock(session_for_turn(key=session_key).key)
            # After the lock: two sends of one key (one session) are serialized here, so the second finds the first.
            repeated = runs.submitted_before(session_key=session.key, idempotency_key=idempotency_key)
            if repeated is not None:
                return repeated
            if expected_session_id is not None and expected_session_id != session.session_id:
                raise InvalidRequest(f"sessionId does not match the current session of {session.key}")
            if session.initialization_pending:
                raise Busy(f"Session {session.key} is initializing; retry later.", retryable=True)
            # No placement check of their own: a command is no turn (what it starts is checked as chat.send and
            # sessions.reset check theirs), so /status answers in every placement state.
            return _HANDLERS[parsed.command.name](session, request)
    except IntegrityError:
        # A concurrent send with the same key (for another session) won the run's insert: nothing here was kept.
        return runs.submitted_concurrently(session_key=session_key, idempotency_key=idempotency_key)


@dataclass(frozen=True)
class _Request:
    command: cmd.ParsedCommand
    text: str
    idempotency_key: str
    origin_channel: str
    scopes: tuple[str, ...]


def _help(session: Session, request: _Request) -> SubmitResult:
    return _answer(session, request, cmd.help_text())


def _status(session: Session, request: _Request) -> SubmitResult:
    return _answer(session, request, cmd.status_text(selectors.session_status(session)))


def _model(session: Session, request: _Request) -> SubmitResult:
    """``/model`` shows the session's model; ``/model <provider/model|model|default>`` sets it for this session,
    through the same service as ``sessions.patch {model}``. A refused choice changes nothing."""
    resolved = selectors.resolved_model(session)
    provider, default = resolved["modelProvider"], default_model()
    words = request.command.args.split()
    flags = {word for word in words if word.startswith("-")}
    chosen = [word for word in words if not word.startswith("-")]
    if flags & {"-a", "--agent", "-g", "--global"}:
        return _answer(session, request, cmd.MODEL_DEFAULTS_REFUSED)
    if flags - {"-s", "--session"} or len(chosen) > 1:
        return _answer(session, request, cmd.MODEL_USAGE)
    if not chosen or chosen[0].lower() in ("status", "list"):
        return _answer(
            session, request, cmd.model_text(provider=provider, model=resolved["model"], default_model=default)
        )
    # provider/model (a model id may hold slashes of its own), or a model id of the configured provider.
    asked_provider, slash, model = chosen[0].partition("/")
    if not slash:
        asked_provider, model = "", asked_provider
    if asked_provider and asked_provider.lower() != provider.lower():
        return _answer(session, request, cmd.model_unknown_provider_text(asked=asked_provider, provider=provider))
    if not model or len(model) > MODEL_MAX_LENGTH:
        return _answer(session, request, cmd.MODEL_USAGE)
    if model.lower() == "default" or model == default:
        session_patch(key=session.key, changes={"model": ""})
        return _answer(session, request, cmd.model_default_text(provider=provider, default_model=default))
    session_patch(key=session.key, changes={"model": model})
    return _answer(session, request, cmd.model_set_text(provider=provider, model=model))


def _new(session: Session, request: _Request) -> SubmitResult:
    return _renew(session, request, reason="new", done=cmd.NEW_DONE)


def _reset(session: Session, request: _Request) -> SubmitResult:
    return _renew(session, request, reason="reset", done=cmd.RESET_DONE)


def _renew(session: Session, request: _Request, *, reason: str, done: str) -> SubmitResult:
    """A fresh transcript for the session, as ``sessions.reset`` makes one; a running turn is ended first (as
    OpenClaw's ``/reset`` does). Refused without ``operator.admin``, or when the reset is (nothing changes then:
    the refusal is the reply). With text after the command, that text is the fresh transcript's first turn."""
    if not sc.scope_satisfied(request.scopes, request.command.command.scope):
        return _answer(session, request, cmd.RESET_REFUSED)
    try:
        # A savepoint: a refused reset leaves the running turn running.
        with transaction.atomic():
            runs.run_end_running(session=session)
            session = session_reset(key=session.key, reason=reason)
    except GatewayError as refused:
        return _answer(session, request, f"⚠️ {refused.message}")
    if request.command.args:
        return runs.run_submit(
            session_key=session.key,
            message=request.command.args,
            idempotency_key=request.idempotency_key,
            origin_channel=request.origin_channel,
        )
    return _answer(session, request, done)


_HANDLERS: dict[str, Callable[[Session, _Request], SubmitResult]] = {
    "help": _help,
    "status": _status,
    "model": _model,
    "new": _new,
    "reset": _reset,
}


def _answer(session: Session, request: _Request, reply: str) -> SubmitResult:
    """Record the command as a run that ended with ``reply``: both in the transcript (out of the model's context),
    the run ``ok``; after commit, its ``chat`` final event (and agent.wait's answer) and ``sessions.changed``."""
    session = session_lock(session.key)  # the row as the command left it (its model, its transcript)
    window = SessionWindow.objects.get(pk=session.session_id)
    key = request.idempotency_key
    # first_time: no run has this key (checked under this lock), and only this run appends under its key.
    asked = transcript_append(
        session=session,
        window=window,
        type="message",
        body=message_body("user", request.text, excludeFromContext=True, idempotencyKey=f"{key}:user"),
        idempotency_key=f"{key}:user",
        first_time=True,
    )
    reply_body = message_body(
        "assistant",
        reply,
        stopReason="stop",
        provider=REPLY_PROVIDER,
        model=REPLY_MODEL,
        excludeFromContext=True,
        idempotencyKey=key,
        runId=key,
    )
    answered = transcript_append(
        session=session,
        window=window,
        type="message",
        body=reply_body,
        idempotency_key=f"{key}:assistant",
        first_time=True,
    )
    now = timezone.now()
    run = Run.objects.create(
        run_id=key,
        session=session,
        session_key=session.key,
        window=window,
        message=request.text,
        status=RunStatus.OK,
        origin_channel=request.origin_channel,
        user_event_id=asked.event_id,
        assistant_event_id=answered.event_id,
        output_text=reply,
        stop_reason="stop",
        started_at=now,
        ended_at=now,
    )
    session.last_interaction_at = now
    session.last_run_id = key
    session.save(update_fields=["last_interaction_at", "last_run_id", "updated_at"])
    events.publish_command_reply_on_commit(run, session, reply_body)
    events.publish_session_changed_on_commit(session, reason="send", run_id=key)
    return SubmitResult(run, created=True)
