"""What text leaving the process may say: no secret, and no path on the gateway's own host.

Errors shown to clients and operators, stored reasons, logs: model providers and workers quote what they were
told (an upstream error may echo a key or a header), and a failure on this host names its files. Whatever
passes through here keeps its meaning but not the secret, and names this host's files by reference — relative
to the state directory or to the installation — never by where they are. :func:`operator_text` is the one way
an error becomes operator-visible text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.conf import settings

_SECRETS = re.compile(
    r"(?i)(authorization:\s*(?:bearer\s+|basic\s+)?|bearer\s+|(?:api[_-]?key|token|password|secret)[\"']?\s*[:=]\s*[\"']?)"
    r"[^\s\"',;]+"
)
_OPENAI_KEYS = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")


def redact_secrets(text: str) -> str:
    """``text`` with bearer tokens, ``key=…``-style values and OpenAI-style keys replaced by ``***``."""
    return _OPENAI_KEYS.sub("sk-***", _SECRETS.sub(lambda m: f"{m.group(1)}***", text))


def _host_roots() -> list[tuple[str, str]]:
    """This host's directories an error may name, each with the words that stand for it, longest first (the
    state directory may lie inside the installation), as given and resolved."""
    roots: dict[str, str] = {}
    for root, words in ((settings.STATE_DIR, "the state directory"), (settings.BASE_DIR, "the installation")):
        for spelling in {str(root), os.path.realpath(root)}:
            if len(spelling) > 1:  # never "/": every absolute path would go
                roots.setdefault(spelling.rstrip("/"), words)
    return sorted(roots.items(), key=lambda item: len(item[0]), reverse=True)


def host_paths_out(text: str) -> str:
    """``text`` with each path under the state directory or the installation named relative to it
    (``local-workers/3f…/node-host.log``), and either directory itself by what it is."""
    for root, words in _host_roots():
        # Not a directory of the same name inside another path, nor one whose name only starts the same.
        pattern = r"(?<![\w.~/-])" + re.escape(root) + r"(?:/+|(?![\w.-]))"
        text = re.sub(pattern, lambda m, words=words: "" if m.group().endswith("/") else words, text)
    return text


def operator_text(source: str | BaseException) -> str:
    """What an operator or a client is shown of an error (or of text made from one): a project error's own
    message (an unexpected exception's text stays in the log: only its kind is named), without secrets or this
    host's paths."""
    if isinstance(source, BaseException):
        message = getattr(source, "message", None)
        source = message if isinstance(message, str) else f"unexpected {type(source).__name__}"
    return redact_secrets(host_paths_out(source))


def shown_path(path: str) -> str:
    """A path on this host as clients see it: relative to the state directory, else its last part only.

    Every ``operator.read`` client receives session rows and placements; where the gateway keeps its state (or an
    operator's checkout) is not theirs to know.
    """
    candidate = Path(path)
    try:
        return candidate.resolve().relative_to(Path(settings.STATE_DIR).resolve()).as_posix()
    except ValueError:
        return candidate.name
