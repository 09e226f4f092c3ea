"""The tokens a run recorded, as SQL expressions: the usage reports (``operations_app``) and the console's session
index sum the same figures.

Tokens are what each finished run recorded in ``Run.usage`` (``input``, ``output`` and, when a provider reports
them, ``cacheRead`` / ``cacheWrite``); a value that is not a non-negative JSON number (a worker host reports its own
usage) counts as 0 instead of failing the read.
"""

from __future__ import annotations

from django.db.models import Case, FloatField, Q, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

TOKEN_KINDS = ("input", "output", "cacheRead", "cacheWrite")
# A run's count of one kind is at most this (far above any model's context): larger is not a token count.
MAX_RUN_TOKENS = 10**15


def recorded_tokens(kind: str) -> Case:
    """``Run.usage[kind]`` when it is a JSON number in [0, MAX_RUN_TOKENS), else 0.

    The range test is a JSON comparison on both databases, and JSON orders every text, boolean, array and object
    value above every number (PostgreSQL ``jsonb``; SQLite compares ``JSON_EXTRACT``'s text above its numbers), so
    only numbers pass it and the cast that follows never sees text.
    """
    lookup = f"usage__{kind}"
    is_count = Q(**{f"{lookup}__gte": 0, f"{lookup}__lt": MAX_RUN_TOKENS})
    return Case(When(is_count, then=Cast(KT(lookup), FloatField())), default=Value(0.0), output_field=FloatField())


def recorded_total_tokens():
    """Every kind of a run's recorded tokens added up (the usage page's "tokens")."""
    return sum((recorded_tokens(kind) for kind in TOKEN_KINDS[1:]), recorded_tokens(TOKEN_KINDS[0]))
