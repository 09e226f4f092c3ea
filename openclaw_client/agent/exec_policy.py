"""The exec approval policy: its document, the policy it resolves to for an agent, and the verdict on one command.

Standard library only: the gateway uses it, and so do the worker children on node hosts, which run from the
worker bundle with nothing else installed. The gateway keeps the documents (``approvals_app``); a worker gets
a resolved :class:`Policy` as a :class:`PolicySnapshot` (a JSON object) and evaluates its commands with it.

The document is OpenClaw's "exec approvals file" (version 1, closed objects)::

    {version: 1, defaults?: {security?, ask?, askFallback?, autoAllowSkills?},
     agents?: {<agentId>: {security?, ask?, askFallback?, autoAllowSkills?,
                           allowlist?: [{id?, pattern, source?: "allow-always", argPattern?,
                                         lastUsedAt?, lastUsedCommand?, lastResolvedPath?}]}}}

``socket {path?, token?}`` (OpenClaw's local approval socket) and an entry's ``commandText`` are accepted and
dropped, as OpenClaw drops ``commandText``; nothing else outside these fields is.

Verdicts (docs/exec-approvals.md):

* ``security: deny`` denies every command; ``full`` runs it, unless ``ask: always``;
* ``security: allowlist`` runs a command when every top-level segment of it (``;``, ``&&``, ``||``, ``|``,
  newlines) matches an allowlist entry, else it is a miss: ``ask: off`` denies a miss, ``on-miss`` asks,
  ``always`` asks for everything that is not denied. A command using anything the shell would expand or
  redirect (substitution, backticks, variables, globs, redirections, subshells, background jobs, comments,
  assignments, keywords) or that does not parse is never an allowlist match: what would run is not the
  text the entries were matched against.
* ``askFallback`` decides an approval nobody answered in time: ``deny``; ``allowlist`` (only a match
  runs); ``full``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import posixpath
import re
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

VERSION = 1
# Strictest first: combining two policies takes the lower index.
SECURITY_LEVELS = ("deny", "allowlist", "full")
# Least strict first: combining two policies takes the higher index.
ASK_LEVELS = ("off", "on-miss", "always")
DECISIONS = ("allow-once", "allow-always", "deny")
DEFAULT_AGENT_ID = "main"
# OpenClaw's agent entry that every agent inherits from before the defaults.
WILDCARD_AGENT = "*"
ALLOW_ALWAYS = "allow-always"

# This project's defaults when neither the agent nor the document's defaults say (issue 22: "ask" is the
# default, stricter than OpenClaw's full/off).
PROJECT_DEFAULTS: dict[str, Any] = {
    "security": "allowlist",
    "ask": "on-miss",
    "askFallback": "deny",
    "autoAllowSkills": False,
}
# The four modes of issue 22 as the fields they set.
MODES: dict[str, dict[str, str]] = {
    "deny": {"security": "deny"},
    "allowlist": {"security": "allowlist", "ask": "off"},
    "ask": {"security": "allowlist", "ask": "on-miss"},
    "full": {"security": "full", "ask": "off"},
}

MAX_AGENTS = 200
MAX_AGENT_ID_LENGTH = 200
MAX_ALLOWLIST_ENTRIES = 1000
MAX_PATTERN_LENGTH = 1024
MAX_ARG_PATTERN_LENGTH = 1024
MAX_ENTRY_ID_LENGTH = 200
MAX_LAST_USED_COMMAND_LENGTH = 8192
MAX_PATH_LENGTH = 4096

# An allow-always entry's argPattern: the sha256 of the working directory and the arguments (OpenClaw's
# current "cwd-bound" form, so documents move between the two). OpenClaw's older "sha256:argv:" form
# bound no directory; it never matches, in OpenClaw or here.
CWD_ARGV_HASH_PREFIX = "sha256:cwd-argv:v1:"
LEGACY_ARGV_HASH_PREFIX = "sha256:argv:"
_HASH_ARG_PATTERN = re.compile(re.escape(CWD_ARGV_HASH_PREFIX) + r"[0-9a-f]{64}")

_POLICY_FIELDS = ("security", "ask", "askFallback", "autoAllowSkills")
_ENTRY_FIELDS = frozenset(
    {"id", "pattern", "source", "commandText", "argPattern", "lastUsedAt", "lastUsedCommand", "lastResolvedPath"}
)
_ENTRY_TEXT_LIMITS = {
    "id": MAX_ENTRY_ID_LENGTH,
    "pattern": MAX_PATTERN_LENGTH,
    "argPattern": MAX_ARG_PATTERN_LENGTH,
    "lastUsedCommand": MAX_LAST_USED_COMMAND_LENGTH,
    "lastResolvedPath": MAX_PATH_LENGTH,
}

Which = Callable[[str], str | None]


class PolicyDocumentError(ValueError):
    """A document that is not a valid exec approvals file; ``path`` is a JSON pointer to the culprit."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"at {path or '/'}: {problem}")
        self.path = path or "/"
        self.problem = problem


# --- the document ---------------------------------------------------------------------------------------


def empty_document() -> dict[str, Any]:
    """What a scope without a stored document reads as (OpenClaw's missing file)."""
    return {"version": VERSION, "defaults": {}, "agents": {}}


def canonical_json(document: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 text: the same document gives the same text (and hash) anywhere."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


MISSING_DOCUMENT_HASH = "missing:" + hashlib.sha256(b"").hexdigest()


def document_hash(document: Mapping[str, Any] | None) -> str:
    """The compare-and-set token of a scope's document; OpenClaw's form for a scope without one."""
    if document is None:
        return MISSING_DOCUMENT_HASH
    return hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()


def normalize_document(raw: Any, *, new_id: Callable[[], str] | None = None) -> dict[str, Any]:
    """A validated copy of ``raw`` in the stored form; raises :class:`PolicyDocumentError`.

    Entries without an ``id`` get one (as OpenClaw gives them); ``socket`` and entries' ``commandText`` are
    dropped. Every string must be free of NUL (PostgreSQL's JSON cannot hold it).
    """
    make_id = new_id or (lambda: str(uuid.uuid4()))
    document = _object(raw, "", {"version", "socket", "defaults", "agents"})
    version = document.get("version")
    if type(version) is not int or version != VERSION:
        raise PolicyDocumentError("/version", f"must be {VERSION}")
    if "socket" in document:
        socket = _object(document["socket"], "/socket", {"path", "token"})
        for key, value in socket.items():
            _text(value, f"/socket/{key}", MAX_PATH_LENGTH)
    defaults = _policy_fields(document.get("defaults", {}), "/defaults", allow_allowlist=False)
    agents_raw = _object(document.get("agents", {}), "/agents", None)
    if len(agents_raw) > MAX_AGENTS:
        raise PolicyDocumentError("/agents", f"at most {MAX_AGENTS} agents")
    agents: dict[str, Any] = {}
    for agent_id, agent in agents_raw.items():
        path = f"/agents/{_pointer(agent_id)}"
        if not agent_id.strip() or len(agent_id) > MAX_AGENT_ID_LENGTH or "\x00" in agent_id:
            raise PolicyDocumentError(path, f"an agent id must be 1 to {MAX_AGENT_ID_LENGTH} characters, not blank")
        agents[agent_id] = _policy_fields(agent, path, allow_allowlist=True, new_id=make_id)
    return {"version": VERSION, "defaults": defaults, "agents": agents}


def _object(value: Any, path: str, allowed: set[str] | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PolicyDocumentError(path, "must be an object")
    for key in value:
        if not isinstance(key, str):
            raise PolicyDocumentError(path, "keys must be strings")
        if allowed is not None and key not in allowed:
            raise PolicyDocumentError(f"{path}/{_pointer(key)}", "unexpected property")
    return value


def _text(value: Any, path: str, limit: int) -> str:
    if not isinstance(value, str):
        raise PolicyDocumentError(path, "must be a string")
    if len(value) > limit:
        raise PolicyDocumentError(path, f"at most {limit} characters")
    if "\x00" in value:
        raise PolicyDocumentError(path, "must not contain NUL characters")
    return value


def _policy_fields(
    value: Any, path: str, *, allow_allowlist: bool, new_id: Callable[[], str] | None = None
) -> dict[str, Any]:
    allowed = {*_POLICY_FIELDS, "allowlist"} if allow_allowlist else set(_POLICY_FIELDS)
    fields = _object(value, path, allowed)
    policy: dict[str, Any] = {}
    for name, choices in (("security", SECURITY_LEVELS), ("ask", ASK_LEVELS), ("askFallback", SECURITY_LEVELS)):
        if name in fields:
            if not isinstance(fields[name], str) or fields[name] not in choices:
                raise PolicyDocumentError(f"{path}/{name}", f"must be one of {', '.join(choices)}")
            policy[name] = fields[name]
    if "autoAllowSkills" in fields:
        if not isinstance(fields["autoAllowSkills"], bool):
            raise PolicyDocumentError(f"{path}/autoAllowSkills", "must be a boolean")
        policy["autoAllowSkills"] = fields["autoAllowSkills"]
    if "allowlist" in fields:
        entries = fields["allowlist"]
        if not isinstance(entries, list):
            raise PolicyDocumentError(f"{path}/allowlist", "must be an array")
        if len(entries) > MAX_ALLOWLIST_ENTRIES:
            raise PolicyDocumentError(f"{path}/allowlist", f"at most {MAX_ALLOWLIST_ENTRIES} entries")
        assert new_id is not None
        policy["allowlist"] = [_entry(entry, f"{path}/allowlist/{i}", new_id) for i, entry in enumerate(entries)]
    return policy


def _entry(value: Any, path: str, new_id: Callable[[], str]) -> dict[str, Any]:
    raw = _object(value, path, set(_ENTRY_FIELDS))
    if "pattern" not in raw:
        raise PolicyDocumentError(f"{path}/pattern", "is required")
    entry: dict[str, Any] = {}
    for name, limit in _ENTRY_TEXT_LIMITS.items():
        if name in raw:
            entry[name] = _text(raw[name], f"{path}/{name}", limit)
    if "commandText" in raw:
        _text(raw["commandText"], f"{path}/commandText", MAX_LAST_USED_COMMAND_LENGTH)  # checked, then dropped
    if not entry["pattern"].strip():
        raise PolicyDocumentError(f"{path}/pattern", "must not be blank")
    if "id" in entry and not entry["id"]:
        raise PolicyDocumentError(f"{path}/id", "must not be empty")
    entry.setdefault("id", new_id())
    if "source" in raw:
        if raw["source"] != ALLOW_ALWAYS:
            raise PolicyDocumentError(f"{path}/source", f'must be "{ALLOW_ALWAYS}"')
        entry["source"] = ALLOW_ALWAYS
    if "argPattern" in entry:
        problem = arg_pattern_problem(entry["argPattern"])
        if problem is not None:
            raise PolicyDocumentError(f"{path}/argPattern", problem)
    if "lastUsedAt" in raw:
        used = raw["lastUsedAt"]
        if isinstance(used, bool) or not isinstance(used, int | float) or not math.isfinite(used) or used < 0:
            raise PolicyDocumentError(f"{path}/lastUsedAt", "must be a number of milliseconds, at least 0")
        entry["lastUsedAt"] = used
    return entry


def arg_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable argPattern, or None: a cwd-bound hash, or a regular expression."""
    if pattern.startswith(CWD_ARGV_HASH_PREFIX):
        return None if _HASH_ARG_PATTERN.fullmatch(pattern) else "a sha256:cwd-argv:v1: hash must be 64 hex digits"
    try:
        re.compile(pattern)
    except re.error as error:
        return f"not a valid regular expression ({error})"
    return None


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# --- the resolved policy --------------------------------------------------------------------------------


class PolicySnapshot(TypedDict):
    """A resolved policy as JSON (what the gateway sends a worker with a turn)."""

    version: int
    security: str
    ask: str
    askFallback: str
    autoAllowSkills: bool
    allowlist: list[dict[str, Any]]


@dataclass(frozen=True)
class Policy:
    """The policy one agent's commands are judged by on one host."""

    security: str
    ask: str
    ask_fallback: str
    allowlist: tuple[dict[str, Any], ...] = ()
    auto_allow_skills: bool = False

    def snapshot(self) -> PolicySnapshot:
        return {
            "version": VERSION,
            "security": self.security,
            "ask": self.ask,
            "askFallback": self.ask_fallback,
            "autoAllowSkills": self.auto_allow_skills,
            "allowlist": [dict(entry) for entry in self.allowlist],
        }

    @classmethod
    def from_snapshot(cls, data: Any) -> Policy:
        """The policy a :meth:`snapshot` describes; raises :class:`PolicyDocumentError` for anything else."""
        fields = _object(data, "", {"version", *_POLICY_FIELDS, "allowlist"})
        if fields.get("version") != VERSION or type(fields.get("version")) is not int:
            raise PolicyDocumentError("/version", f"must be {VERSION}")
        missing = [name for name in (*_POLICY_FIELDS, "allowlist") if name not in fields]
        if missing:
            raise PolicyDocumentError(f"/{missing[0]}", "is required")
        checked = _policy_fields(
            {k: v for k, v in fields.items() if k != "version"},
            "",
            allow_allowlist=True,
            new_id=lambda: str(uuid.uuid4()),
        )
        return cls(
            security=checked["security"],
            ask=checked["ask"],
            ask_fallback=checked["askFallback"],
            allowlist=tuple(checked["allowlist"]),
            auto_allow_skills=checked["autoAllowSkills"],
        )


def resolved_defaults(document: Mapping[str, Any] | None) -> dict[str, Any]:
    """The document's defaults with this project's defaults under them (``resolvedDefaults`` on the wire)."""
    defaults = (document or {}).get("defaults") or {}
    return {name: defaults.get(name, PROJECT_DEFAULTS[name]) for name in _POLICY_FIELDS}


def resolved_policy(document: Mapping[str, Any] | None, agent_id: str | None) -> Policy:
    """The policy of ``agent_id`` (default ``main``) in a normalized document (None: no document).

    Field by field: the agent's entry, else the wildcard agent ``*``, else the document's defaults, else
    :data:`PROJECT_DEFAULTS`. The allowlist is the wildcard's entries followed by the agent's.
    """
    agents = (document or {}).get("agents") or {}
    key = agent_id or DEFAULT_AGENT_ID
    agent = agents.get(key) or {}
    wildcard = (agents.get(WILDCARD_AGENT) or {}) if key != WILDCARD_AGENT else {}
    defaults = resolved_defaults(document)

    def pick(name: str) -> Any:
        for source in (agent, wildcard):
            if name in source:
                return source[name]
        return defaults[name]

    allowlist = (*wildcard.get("allowlist", ()), *agent.get("allowlist", ()))
    return Policy(
        security=pick("security"),
        ask=pick("ask"),
        ask_fallback=pick("askFallback"),
        allowlist=tuple(dict(entry) for entry in allowlist),
        auto_allow_skills=bool(pick("autoAllowSkills")),
    )


def combine(gateway_policy: Policy, node_policy: Policy) -> Policy:
    """The policy of a command run on a node: the stricter of the two for each setting, and the node's own
    allowlist (the execution host's, which allow-always extends)."""
    return Policy(
        security=SECURITY_LEVELS[
            min(SECURITY_LEVELS.index(gateway_policy.security), SECURITY_LEVELS.index(node_policy.security))
        ],
        ask=ASK_LEVELS[max(ASK_LEVELS.index(gateway_policy.ask), ASK_LEVELS.index(node_policy.ask))],
        ask_fallback=SECURITY_LEVELS[
            min(SECURITY_LEVELS.index(gateway_policy.ask_fallback), SECURITY_LEVELS.index(node_policy.ask_fallback))
        ],
        allowlist=node_policy.allowlist,
        auto_allow_skills=gateway_policy.auto_allow_skills and node_policy.auto_allow_skills,
    )


# --- commands ---------------------------------------------------------------------------------------------

# Words the shell reads as syntax, not as a command to run: a segment starting with one is never a match.
_RESERVED_WORDS = frozenset(
    {
        "!",
        "case",
        "coproc",
        "do",
        "done",
        "elif",
        "else",
        "esac",
        "fi",
        "for",
        "function",
        "if",
        "in",
        "select",
        "then",
        "time",
        "until",
        "while",
        "{",
        "}",
        "[[",
        "]]",
    }
)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
# Unquoted, these make the shell expand, redirect, group or background: what runs is not the text.
_EXPANDING = frozenset("<>()`$*?[]{}")


def shell_segments(command: str) -> list[list[str]] | None:
    """The argv of each top-level command of a POSIX shell command line, or None when it is not a plain
    chain of simple commands (see the module's docstring): quotes and backslashes are removed as the shell
    removes them; ``;``, newlines, ``&&``, ``||`` and ``|`` separate segments."""
    segments: list[list[str]] = []
    argv: list[str] = []
    word: list[str] = []
    in_word = False
    needs_command = False  # after && || |: a command must follow
    i, length = 0, len(command)

    def end_word() -> None:
        nonlocal in_word
        if in_word:
            argv.append("".join(word))
        word.clear()
        in_word = False

    def end_segment(*, may_be_empty: bool) -> bool:
        nonlocal argv
        end_word()
        if not argv:
            return may_be_empty
        first = argv[0]
        if not first or first in _RESERVED_WORDS or _ASSIGNMENT.match(first):
            return False
        segments.append(argv)
        argv = []
        return True

    while i < length:
        ch = command[i]
        if ch == "'":
            end = command.find("'", i + 1)
            if end < 0:
                return None
            word.append(command[i + 1 : end])
            in_word, i = True, end + 1
        elif ch == '"':
            j, part = i + 1, []
            while True:
                if j >= length:
                    return None
                c = command[j]
                if c == '"':
                    break
                if c in "$`":
                    return None
                if c == "\\" and j + 1 < length and command[j + 1] in '$`"\\\n':
                    if command[j + 1] != "\n":
                        part.append(command[j + 1])
                    j += 2
                    continue
                part.append(c)
                j += 1
            word.append("".join(part))
            in_word, i = True, j + 1
        elif ch == "\\":
            if i + 1 >= length:
                return None
            if command[i + 1] != "\n":  # a backslash-newline joins lines
                word.append(command[i + 1])
                in_word = True
            i += 2
        elif ch in " \t":
            end_word()
            i += 1
        elif ch == "\n":
            if not end_segment(may_be_empty=True):
                return None
            i += 1
            continue
        elif ch == ";":
            if needs_command and not argv and not in_word:
                return None
            if not end_segment(may_be_empty=False):
                return None
            needs_command = False
            i += 1
            continue
        elif ch in "&|":
            pair = command[i : i + 2]
            if pair not in ("&&", "||") and ch == "&":
                return None  # a background job
            if pair == "|&":
                return None
            if not end_segment(may_be_empty=False):
                return None
            needs_command = True
            i += 2 if pair in ("&&", "||") else 1
            continue
        elif ch in _EXPANDING or (not in_word and ch in "#~"):
            return None
        else:
            word.append(ch)
            in_word = True
            i += 1
        if in_word or argv:
            needs_command = False
    if not end_segment(may_be_empty=not needs_command):
        return None
    if needs_command or not segments:
        return None
    return segments


def command_segments(command: str | Sequence[str]) -> list[list[str]] | None:
    """A shell command line's segments, or an argv (run without a shell) as its one segment."""
    if isinstance(command, str):
        return shell_segments(command)
    argv = [str(arg) for arg in command]
    return [argv] if argv and argv[0] else None


def cwd_argv_hash(argv: Sequence[str], cwd: str) -> str:
    """The argPattern binding an allow-always entry to these arguments in this directory (OpenClaw's
    ``sha256:cwd-argv:v1:`` form: the executable itself is bound by the entry's pattern)."""
    # As Node's path.posix.normalize (OpenClaw's): a trailing slash is kept, a leading "//" is not.
    directory = posixpath.normpath(cwd)
    if directory.startswith("//"):
        directory = "/" + directory.lstrip("/")
    if cwd.endswith("/") and directory != "/":
        directory += "/"

    def framed(text: str) -> str:
        return f"{len(text.encode('utf-8'))}\x00{text}\x00"

    args = list(argv[1:])
    subject = framed(directory) + f"{len(args)}\x00" + "".join(framed(arg) for arg in args)
    return CWD_ARGV_HASH_PREFIX + hashlib.sha256(subject.encode("utf-8")).hexdigest()


def _has_path(text: str) -> bool:
    return "/" in text or "\\" in text or "~" in text


def _executable_path(executable: str, cwd: str | None, which: Which) -> str | None:
    """Where the executable lives: a path as written (relative to ``cwd``), or a bare name found on PATH."""
    if _has_path(executable):
        if executable.startswith("~"):
            return None  # the shell never saw it unquoted (shell_segments refuses that), so it is a literal name
        if posixpath.isabs(executable):
            return posixpath.normpath(executable)
        return posixpath.normpath(posixpath.join(cwd, executable)) if cwd else None
    try:
        found = which(executable)
    except Exception:  # a lookup that fails is a command we cannot place: no path-pattern match
        return None
    return posixpath.normpath(found) if found else None


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    """OpenClaw's allowlist globs: ``**`` any text, ``*`` any text but ``/``, ``?`` one character but ``/``."""
    parts, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^/]")
            i += 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts), re.DOTALL)


def _glob_matches(pattern: str, target: str) -> bool:
    return _glob(pattern).fullmatch(target) is not None


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _entry_matches(entry: Mapping[str, Any], argv: Sequence[str], cwd: str | None, resolved: str | None) -> bool:
    pattern = str(entry.get("pattern", "")).strip()
    arg_pattern = entry.get("argPattern")
    generated = entry.get("source") == ALLOW_ALWAYS
    if not pattern:
        return False
    if pattern == "*" and not arg_pattern and not generated:
        return True  # everything
    if _has_path(pattern):
        target_pattern = os.path.expanduser(pattern) if pattern.startswith("~") else pattern
        if resolved is None or not _glob_matches(target_pattern, resolved):
            return False
    else:
        # A bare name matches only a command invoked by its name (never one given as a path).
        if pattern == "*" or _has_path(argv[0]):
            return False
        names = {argv[0], *([posixpath.basename(resolved)] if resolved else [])}
        if not any(_glob_matches(pattern, name) for name in names):
            return False
    if not arg_pattern:
        return not generated  # a generated entry without its binding matches nothing
    if arg_pattern.startswith(CWD_ARGV_HASH_PREFIX):
        return cwd is not None and arg_pattern == cwd_argv_hash(argv, cwd)
    if generated or arg_pattern.startswith(LEGACY_ARGV_HASH_PREFIX):
        return False
    regex = _regex(arg_pattern)
    # OpenClaw tests a JavaScript RegExp without anchors: a search. Python's syntax is the one used here.
    return regex is not None and regex.search(" ".join(argv[1:])) is not None


def _segment_match(
    allowlist: Sequence[Mapping[str, Any]], argv: Sequence[str], cwd: str | None, which: Which
) -> Mapping[str, Any] | None:
    """The entry ``argv`` matches: one with an argPattern first, else one for any arguments."""
    resolved = _executable_path(argv[0], cwd, which)
    any_args: Mapping[str, Any] | None = None
    for entry in allowlist:
        if _entry_matches(entry, argv, cwd, resolved):
            if entry.get("argPattern"):
                return entry
            any_args = any_args or entry
    return any_args


def allowlist_match(
    policy: Policy, command: str | Sequence[str], cwd: str | None, *, which: Which = shutil.which
) -> tuple[str, ...] | None:
    """The ids of the entries every segment of ``command`` matches (one per segment), or None on a miss."""
    segments = command_segments(command)
    if segments is None:
        return None
    ids = []
    for argv in segments:
        entry = _segment_match(policy.allowlist, argv, cwd, which)
        if entry is None:
            return None
        ids.append(str(entry.get("id", "")))
    return tuple(ids)


VerdictDecision = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class Verdict:
    decision: VerdictDecision
    reason: str
    # The allowlist entries that let the command run, one per segment (allowlist matches only).
    matched_entry_ids: tuple[str, ...] = field(default=())

    @property
    def matched_entry_id(self) -> str | None:
        return self.matched_entry_ids[0] if self.matched_entry_ids else None


def evaluate(policy: Policy, command: str | Sequence[str], cwd: str | None, *, which: Which = shutil.which) -> Verdict:
    """Whether ``command`` (a shell command line, or an argv run without a shell) may run in ``cwd``."""
    if policy.security == "deny":
        return Verdict("deny", "security=deny: the exec policy denies every command")
    if policy.security == "full":
        if policy.ask == "always":
            return Verdict("ask", "ask=always: every command needs an operator's approval")
        return Verdict("allow", "security=full: commands run without approval")
    matched = allowlist_match(policy, command, cwd, which=which)
    if matched is not None:
        if policy.ask == "always":
            return Verdict("ask", "ask=always: every command needs an operator's approval", matched)
        return Verdict("allow", "allowlist match", matched)
    if policy.ask == "off":
        return Verdict("deny", "not on the allowlist (ask=off)")
    return Verdict("ask", "not on the allowlist: an operator's approval is needed")


def fallback_verdict(
    policy: Policy, command: str | Sequence[str], cwd: str | None, *, which: Which = shutil.which
) -> Verdict:
    """The verdict when an approval expired without a decision (``askFallback``); never "ask"."""
    if policy.security == "deny" or policy.ask_fallback == "deny":
        return Verdict("deny", "the approval timed out (askFallback=deny)")
    if policy.ask_fallback == "full":
        return Verdict("allow", "the approval timed out (askFallback=full)")
    matched = allowlist_match(policy, command, cwd, which=which)
    if matched is not None:
        return Verdict("allow", "the approval timed out; the allowlist allows it (askFallback=allowlist)", matched)
    return Verdict("deny", "the approval timed out and the command is not on the allowlist (askFallback=allowlist)")


def allow_always_entry(argv: Sequence[str], cwd: str, *, now_ms: int | None = None) -> dict[str, Any]:
    """The entry "always allow here" adds for one argv: its executable (as typed when invoked by name, else
    its path from ``cwd``) and a hash binding its exact arguments and the directory."""
    executable = argv[0]
    if _has_path(executable):
        pattern = posixpath.normpath(executable if posixpath.isabs(executable) else posixpath.join(cwd, executable))
    else:
        pattern = executable
    return {
        "id": str(uuid.uuid4()),
        "pattern": pattern,
        "argPattern": cwd_argv_hash(argv, cwd),
        "source": ALLOW_ALWAYS,
        "lastUsedAt": now_ms if now_ms is not None else int(time.time() * 1000),
    }


def allow_always_entries(
    command: str | Sequence[str], cwd: str | None, *, now_ms: int | None = None
) -> list[dict[str, Any]]:
    """One entry per segment of ``command`` (empty: "always allow" cannot be kept for it — no working
    directory, or a command the allowlist never matches)."""
    if not cwd or not posixpath.isabs(cwd):
        return []
    segments = command_segments(command)
    if segments is None:
        return []
    entries = [allow_always_entry(argv, cwd, now_ms=now_ms) for argv in segments]
    # The globs have no escape: an executable whose name has a wildcard in it cannot be pinned by one.
    if any(len(entry["pattern"]) > MAX_PATTERN_LENGTH or set(entry["pattern"]) & {"*", "?"} for entry in entries):
        return []
    unique: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in entries:
        unique.setdefault((entry["pattern"], entry["argPattern"]), entry)
    return list(unique.values())
