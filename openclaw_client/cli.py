"""``gateway call``: one RPC against a gateway, printing the JSON result (like ``openclaw gateway call``).

Front ends sharing this module: ``python -m openclaw_client call`` and the console script ``openclaw-gateway call``
(:func:`main`, no Django, well under a second to start), and ``manage.py gateway call``, which hands a plain call to
:func:`main` before Django loads (``manage.py``) and otherwise takes its defaults from the project's settings.
Without ``--url`` the call goes to the gateway recorded in ``<state dir>/gateway.json``
(:mod:`openclaw_client.running_gateway`), else to the configured address. Success prints the method's payload as
JSON on stdout; every failure prints one line ``error: …`` on stderr and exits with a code that tells the kind of
failure apart (:data:`EXIT_CODES_HELP`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import websockets
from websockets.uri import parse_uri

from .client import ClientOptions, ConnectError, ConnectionClosed, GatewayClient, HandshakeClosed
from .identity import IdentityStore
from .running_gateway import DEFAULT_HOST, DEFAULT_PORT, gateway_file, gateway_url, read_gateway_file

DEFAULT_SCOPES = ["operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing"]
DEFAULT_URL = gateway_url(DEFAULT_HOST, DEFAULT_PORT)
DEFAULT_TIMEOUT_MS = 30_000
# Methods that wait on the server for up to ``params.timeoutMs`` (these defaults when it is absent): the
# client waits that long plus a margin, so that the gateway's own answer (``status: "timeout"``) arrives.
SERVER_WAIT_DEFAULT_MS = {"agent.wait": 30_000, "node.invoke": 30_000}
SERVER_WAIT_MARGIN_MS = 5_000
MAX_CONNECT_TIMEOUT_MS = 15_000
CLOSE_TIMEOUT_S = 5.0
# Details of a method error longer than this go on a second line.
INLINE_DETAILS_CHARS = 300
ROLE = "operator"

EXIT_OK = 0
EXIT_METHOD_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_REFUSED = 4
EXIT_TIMEOUT = 5
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_OK}    the method succeeded; its payload is printed as JSON on stdout
  {EXIT_METHOD_ERROR}    the gateway answered the method with an error ("error: <CODE>: <message>")
  {EXIT_USAGE}    bad arguments: invalid --params JSON, --url or --timeout, unusable --state-dir
  {EXIT_UNREACHABLE}    no connection: refused, unknown host, TLS failure, not a WebSocket, closed by the
       gateway during the handshake or before it answered
  {EXIT_REFUSED}    not authenticated: no credential to send, or the gateway refused it (bad token or
       password, revoked device token, pairing required, unsupported protocol)
  {EXIT_TIMEOUT}    the gateway did not answer the method within the timeout
  {EXIT_INTERNAL}   a bug in this CLI ("error: internal error: …")
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)

credentials: the first source that has one is the only one sent
  1. --token / --password, used as given: a refusal is an error, never a fallback
  2. the configured shared secret ({{configured}})
  3. the device token that an earlier successful call stored in --state-dir
     (announced on stderr: "using the device token stored in <dir>")
"""
STANDALONE_CONFIGURED = (
    "OPENCLAW_GATEWAY_TOKEN, OPENCLAW_GATEWAY_PASSWORD, <state dir>/gateway-token;\n"
    "     <state dir> is $OPENCLAW_STATE_DIR, by default ./.openclaw-state"
)


class CallFailed(Exception):
    """A failure the CLI reports as one line (``error: <message>``) and exits with ``exit_code``."""

    def __init__(self, exit_code: int, message: str, extra: str | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.extra = extra


@dataclass(frozen=True)
class Secret:
    """A shared secret and where it came from (``source`` completes "the token …")."""

    kind: str  # "token" | "password"
    value: str = field(repr=False)
    source: str

    @property
    def label(self) -> str:
        return f"the {self.kind} {self.source}"


@dataclass(frozen=True)
class Credentials:
    token: Secret | None = None
    password: Secret | None = None
    # The state dir whose stored device token is sent (only when no shared secret is).
    device_token_dir: str | None = None

    def label_for(self, auth_reason: str | None) -> str:
        """Which credential a refusal with OpenClaw's ``authReason`` is about."""
        reason = auth_reason or ""
        if reason.startswith("password") and self.password:
            return self.password.label
        if reason.startswith("token") and self.token:
            return self.token.label
        if self.device_token_dir:
            return f"the device token stored in {self.device_token_dir}"
        sent = [secret.label for secret in (self.token, self.password) if secret]
        return " and ".join(sent) or "the credentials"


# --- arguments -----------------------------------------------------------------------------------


def _positive_ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 ms: {text!r}")
    return value


def call_parser_kwargs(configured: str = STANDALONE_CONFIGURED) -> dict[str, Any]:
    """What to pass to ``add_parser("call", …)``: help, and the exit codes and credential order as epilog."""
    return {
        "help": "Call one gateway method and print its JSON result",
        "description": "Call one gateway method and print its JSON payload on stdout.",
        "epilog": EXIT_CODES_HELP.replace("{configured}", configured),
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def add_call_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("method", help="Gateway method, e.g. health or node.list")
    parser.add_argument("--params", default="{}", help="JSON params of the method (default: {})")
    parser.add_argument(
        "--url",
        default=None,
        help=(
            "Gateway WebSocket URL (default: the running gateway recorded in <state dir>/gateway.json, else "
            f"OPENCLAW_GATEWAY_BIND and OPENCLAW_GATEWAY_PORT, by default {DEFAULT_URL})"
        ),
    )
    parser.add_argument("--token", default=None, help="Shared gateway token (used as given, no fallback)")
    parser.add_argument("--password", default=None, help="Shared gateway password (used as given, no fallback)")
    parser.add_argument(
        "--state-dir",
        default=None,
        help="Where this CLI keeps its device identity and device token (default: <state dir>/cli)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_ms,
        default=None,
        help=(
            f"How long to wait for the answer, in ms (default {DEFAULT_TIMEOUT_MS}); methods that wait on the "
            f"gateway (agent.wait, node.invoke) wait at least their params.timeoutMs (default 30000) "
            f"+ {SERVER_WAIT_MARGIN_MS}"
        ),
    )


# --- timeouts ------------------------------------------------------------------------------------


def request_timeout_ms(method: str, params: Any, timeout_ms: int | None) -> int:
    """How long the client waits for the answer: ``--timeout``, but never less than the wait the method asks the
    gateway for (``params.timeoutMs``, or the gateway's default for ``agent.wait``/``node.invoke``) plus a margin."""
    base = timeout_ms if timeout_ms is not None else DEFAULT_TIMEOUT_MS
    wait = params.get("timeoutMs") if isinstance(params, dict) else None
    if not (isinstance(wait, int) and not isinstance(wait, bool) and wait >= 0):
        wait = SERVER_WAIT_DEFAULT_MS.get(method)
    if wait is None:
        return base
    return max(base, wait + SERVER_WAIT_MARGIN_MS)


def _seconds(ms: float) -> str:
    return f"{ms / 1000:g} s"


# --- credentials ---------------------------------------------------------------------------------


def resolve_credentials(
    *,
    token: str | None,
    password: str | None,
    configured: list[Secret],
    state_dir: str,
    searched: list[str],
) -> Credentials:
    """One source of credentials: the given secret(s), else the configured one(s), else the stored device token;
    none at all is an error that says where the CLI looked."""
    if token or password:
        return Credentials(
            token=Secret("token", token, "given with --token") if token else None,
            password=Secret("password", password, "given with --password") if password else None,
        )
    if configured:
        first = {kind: next((s for s in configured if s.kind == kind), None) for kind in ("token", "password")}
        return Credentials(token=first["token"], password=first["password"])
    try:
        stored = IdentityStore(state_dir).device_token(ROLE)
    except (OSError, ValueError) as exc:
        raise CallFailed(EXIT_USAGE, f"cannot read the CLI state in {state_dir}: {_reason(exc)}") from None
    if stored:
        return Credentials(device_token_dir=state_dir)
    looked = f"none found in {', '.join(searched)}; " if searched else ""
    raise CallFailed(
        EXIT_REFUSED, f"no gateway token: pass --token or --password ({looked}no device token stored in {state_dir})"
    )


def state_root(environ: Mapping[str, str]) -> Path:
    """The state folder of the Django-free front ends: $OPENCLAW_STATE_DIR, else ``./.openclaw-state``."""
    return Path(environ.get("OPENCLAW_STATE_DIR") or ".openclaw-state").resolve()


def standalone_configured(environ: Mapping[str, str]) -> tuple[list[Secret], list[str], Path]:
    """The console script's configured secrets: OPENCLAW_GATEWAY_TOKEN / _PASSWORD, else the gateway token file
    in OPENCLAW_STATE_DIR (``./.openclaw-state``), as ``manage.py`` finds them. Returns (secrets, searched, root)."""
    root = state_root(environ)
    token_path = root / "gateway-token"
    secrets: list[Secret] = []
    token = (environ.get("OPENCLAW_GATEWAY_TOKEN") or "").strip()
    if token:
        secrets.append(Secret("token", token, "from OPENCLAW_GATEWAY_TOKEN"))
    else:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            stored = token_path.read_text(encoding="utf-8").strip()
            if stored:
                secrets.append(Secret("token", stored, f"in {token_path}"))
    password = (environ.get("OPENCLAW_GATEWAY_PASSWORD") or "").strip()
    if password:
        secrets.append(Secret("password", password, "from OPENCLAW_GATEWAY_PASSWORD"))
    return secrets, ["OPENCLAW_GATEWAY_TOKEN", "OPENCLAW_GATEWAY_PASSWORD", str(token_path)], root


# --- which gateway ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GatewayAddress:
    url: str
    # Why <state dir>/gateway.json was not used although it exists (added to a failure to connect).
    ignored_file: str | None = None


def default_address(root: Path, *, bind: str, port: int) -> GatewayAddress:
    """The running gateway of the state folder ``root``, else ``bind``:``port``; port 0 (the gateway picks one at
    start) names no address of its own."""
    reading = read_gateway_file(root)
    if reading.gateway is not None:
        return GatewayAddress(reading.gateway.url)
    if port == 0:
        why = reading.ignored_because or f"{gateway_file(root)} does not exist"
        raise CallFailed(
            EXIT_UNREACHABLE,
            f"no running gateway recorded ({why}) and OPENCLAW_GATEWAY_PORT is 0 (picked at start): pass --url",
        )
    return GatewayAddress(gateway_url(bind, port), reading.ignored_because)


def standalone_address(environ: Mapping[str, str], root: Path) -> GatewayAddress:
    """The Django-free front ends' default address: the state folder's running gateway, else
    OPENCLAW_GATEWAY_BIND / OPENCLAW_GATEWAY_PORT as ``manage.py`` reads them."""
    bind = (environ.get("OPENCLAW_GATEWAY_BIND") or "").strip() or DEFAULT_HOST
    port_text = (environ.get("OPENCLAW_GATEWAY_PORT") or "").strip()
    if not port_text:
        return default_address(root, bind=bind, port=DEFAULT_PORT)
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port < 65536:
        raise CallFailed(EXIT_USAGE, f"OPENCLAW_GATEWAY_PORT must be a port number from 0 to 65535: {port_text!r}")
    return default_address(root, bind=bind, port=port)


# --- failures as one line ------------------------------------------------------------------------


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return _one_line(exc) or type(exc).__name__


def _close_text(code: int | None, reason: str | None) -> str:
    if code is None:
        return "without a close frame"
    return f"code {code}" + (f": {_one_line(reason)}" if reason else "")


def _unreachable(url: str, exc: BaseException, connect_timeout_ms: int) -> CallFailed:
    """Why the socket or the WebSocket upgrade failed, in words."""
    host = parse_uri(url).host
    if isinstance(exc, ConnectionRefusedError):
        why = "connection refused (is the gateway running?)"
    elif isinstance(exc, socket.gaierror):
        why = f"cannot resolve host {host} ({_reason(exc)})"
    elif isinstance(exc, ssl.SSLCertVerificationError):
        why = f"TLS certificate not accepted ({_one_line(exc.verify_message or exc.reason or exc)})"
    elif isinstance(exc, ssl.SSLError):
        why = f"TLS handshake failed ({_one_line(exc.reason or exc.strerror or exc)})"
    elif isinstance(exc, TimeoutError):
        why = f"no handshake within {_seconds(connect_timeout_ms)}"
    elif isinstance(exc, websockets.InvalidStatus):
        why = f"the server answered HTTP {exc.response.status_code} instead of a WebSocket upgrade"
    elif isinstance(exc, HandshakeClosed):
        closed = _close_text(exc.close_code, exc.close_reason)
        why = f"the gateway closed the connection during the handshake ({closed})"
    elif isinstance(exc, websockets.InvalidHandshake | websockets.ConnectionClosed | ValueError | KeyError):
        why = f"not an OpenClaw gateway ({_reason(exc)})"
    else:
        why = _reason(exc)
    return CallFailed(EXIT_UNREACHABLE, f"cannot connect to {url}: {why}")


def _refused(error: ConnectError, credentials: Credentials) -> CallFailed:
    """The gateway answered ``connect`` with an error."""
    details = error.details if isinstance(error.details, dict) else {}
    detail_code = details.get("code")
    auth_reason = details.get("authReason")
    if auth_reason or str(detail_code or "").startswith("AUTH_"):
        message = f"gateway refused {credentials.label_for(auth_reason)} ({detail_code or error.code})"
        if error.retry_after_ms:
            message += f"; retry in {_seconds(error.retry_after_ms)}"
        elif credentials.device_token_dir and auth_reason in ("device_token_mismatch", "scope_mismatch"):
            message += "; pass --token to pair this CLI again"
        return CallFailed(EXIT_REFUSED, message)
    if detail_code == "PAIRING_REQUIRED":
        hint = details.get("remediationHint")
        message = f"gateway requires pairing ({_one_line(error.message)})" + (f"; {hint}" if hint else "")
        return CallFailed(EXIT_REFUSED, message)
    code = f"{error.code}/{detail_code}" if detail_code else error.code
    return CallFailed(EXIT_REFUSED, f"gateway refused the connection ({code}: {_one_line(error.message)})")


def _method_error(error: Any) -> CallFailed:
    shape = error if isinstance(error, dict) else {}
    code = shape.get("code") or "UNAVAILABLE"
    message = _one_line(shape.get("message") or "")
    line = f"{code}: {message}" if message else str(code)
    if shape.get("retryAfterMs"):
        line += f" (retry after {_seconds(shape['retryAfterMs'])})"
    extra = None
    if shape.get("details") is not None:
        details = json.dumps(shape["details"], separators=(",", ":"), ensure_ascii=False, sort_keys=True)
        if len(details) <= INLINE_DETAILS_CHARS:
            line += f"; details: {details}"
        else:
            extra = f"details: {details}"
    return CallFailed(EXIT_METHOD_ERROR, line, extra)


# --- the call ------------------------------------------------------------------------------------


async def call(
    *,
    url: str,
    method: str,
    params: Any,
    credentials: Credentials,
    state_dir: str,
    timeout_ms: int | None = None,
    scopes: list[str] | None = None,
) -> Any:
    """One RPC; returns the payload, raises :class:`CallFailed` for every expected failure."""
    answer_ms = request_timeout_ms(method, params, timeout_ms)
    connect_ms = min(timeout_ms or DEFAULT_TIMEOUT_MS, MAX_CONNECT_TIMEOUT_MS)
    options = ClientOptions(
        url=url,
        token=credentials.token.value if credentials.token else None,
        password=credentials.password.value if credentials.password else None,
        role=ROLE,
        scopes=scopes or list(DEFAULT_SCOPES),
        state_dir=state_dir,
        # A given or configured secret is sent alone: a refusal must not be rescued by the stored device token.
        use_device_token=credentials.device_token_dir is not None,
        request_timeout=answer_ms / 1000,
        connect_timeout=connect_ms / 1000,
    )
    try:
        client = GatewayClient(options)
    except (OSError, ValueError) as exc:
        raise CallFailed(EXIT_USAGE, f"cannot use the CLI state in {state_dir}: {_reason(exc)}") from None
    try:
        try:
            await client.connect()
        except HandshakeClosed as exc:
            raise _unreachable(url, exc, connect_ms) from None
        except ConnectError as exc:
            raise _refused(exc, credentials) from None
        except (OSError, TimeoutError, websockets.WebSocketException, ValueError, KeyError) as exc:
            raise _unreachable(url, exc, connect_ms) from None
        try:
            frame = await client.request_frame(method, params, timeout=answer_ms / 1000)
        except TimeoutError:
            raise CallFailed(EXIT_TIMEOUT, f"gateway did not answer {method} within {_seconds(answer_ms)}") from None
        except (ConnectionClosed, websockets.ConnectionClosed) as exc:
            code = getattr(exc, "code", None)
            reason = getattr(exc, "reason", None)
            if isinstance(exc, websockets.ConnectionClosed) and exc.rcvd is not None:
                code, reason = exc.rcvd.code, exc.rcvd.reason
            raise CallFailed(
                EXIT_UNREACHABLE,
                f"connection to {url} closed before the gateway answered {method} ({_close_text(code, reason)})",
            ) from None
        if not frame.get("ok"):
            raise _method_error(frame.get("error"))
        return frame.get("payload")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), CLOSE_TIMEOUT_S)


def _write(stream: TextIO, text: str) -> None:
    """One write of ``text`` and a newline; characters the stream cannot encode are escaped, not fatal."""
    try:
        stream.write(text + "\n")
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "backslashreplace").decode(encoding) + "\n")
    stream.flush()


def run_call(
    args: argparse.Namespace,
    *,
    configured: list[Secret] | None = None,
    searched: list[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    traceback: bool = False,
    ignored_file: str | None = None,
) -> int:
    """Run ``call`` for parsed arguments (``url`` and ``state_dir`` already defaulted); returns the exit code.

    ``configured`` are the shared secrets the front end found (environment, settings, the state dir), tried only
    when neither ``--token`` nor ``--password`` is given; ``searched`` names where it looked, for the message
    when there is no credential at all. ``traceback`` re-raises unexpected exceptions instead of one line.
    ``ignored_file`` says why the state folder's gateway.json was not used for the default ``url``: a failure to
    connect names it.
    """
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        payload = _run(args, configured or [], searched or [], stderr)
    except CallFailed as failure:
        if failure.exit_code == EXIT_UNREACHABLE and ignored_file:
            failure.message += f" ({ignored_file})"
        _write(stderr, f"error: {failure.message}")
        if failure.extra:
            _write(stderr, failure.extra)
        return failure.exit_code
    except KeyboardInterrupt:
        _write(stderr, "error: interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if traceback:
            raise
        _write(stderr, f"error: internal error: {type(exc).__name__}: {_one_line(exc)}")
        return EXIT_INTERNAL
    try:
        _write(stdout, json.dumps(payload, indent=2, ensure_ascii=False))
    except BrokenPipeError:
        # stdout closed early (``| head``): nothing left to say; keep Python from complaining at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def _run(args: argparse.Namespace, configured: list[Secret], searched: list[str], stderr: TextIO) -> Any:
    try:
        params = json.loads(args.params) if args.params else {}
    except json.JSONDecodeError as exc:
        raise CallFailed(EXIT_USAGE, f"--params is not valid JSON: {exc}") from None
    url = args.url or DEFAULT_URL
    try:
        parse_uri(url)
    except websockets.InvalidURI as exc:
        raise CallFailed(EXIT_USAGE, f"--url {url} is not a WebSocket URL ({exc.msg})") from None
    except ValueError as exc:
        raise CallFailed(EXIT_USAGE, f"--url {url} is not a WebSocket URL ({_reason(exc)})") from None
    state_dir = str(Path(args.state_dir or Path(".openclaw-state") / "cli").resolve())
    credentials = resolve_credentials(
        token=args.token,
        password=getattr(args, "password", None),
        configured=configured,
        state_dir=state_dir,
        searched=searched,
    )
    if credentials.device_token_dir:
        _write(stderr, f"using the device token stored in {credentials.device_token_dir}")
    return asyncio.run(
        call(
            url=url,
            method=args.method,
            params=params,
            credentials=credentials,
            state_dir=state_dir,
            timeout_ms=args.timeout,
        )
    )


def main(argv: list[str] | None = None, *, prog: str = "openclaw-gateway") -> int:
    """``<prog> call <method> …`` without Django: the console script, ``python -m openclaw_client`` and the fast
    path of ``manage.py gateway call``."""
    parser = argparse.ArgumentParser(prog=prog, description="Talk to an OpenClaw gateway over its WebSocket protocol.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_call_arguments(sub.add_parser("call", **call_parser_kwargs()))
    args = parser.parse_args(argv)
    configured, searched, root = standalone_configured(os.environ)
    if not args.state_dir:
        args.state_dir = str(root / "cli")
    ignored_file = None
    if not args.url:
        try:
            address = standalone_address(os.environ, root)
        except CallFailed as failure:
            _write(sys.stderr, f"error: {failure.message}")
            return failure.exit_code
        args.url, ignored_file = address.url, address.ignored_file
    return run_call(args, configured=configured, searched=searched, ignored_file=ignored_file)


if __name__ == "__main__":
    raise SystemExit(main())
