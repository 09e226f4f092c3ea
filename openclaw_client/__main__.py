"""``python -m openclaw_client call <method> --params '<json>'``: one gateway call without Django.

The same program as the console script ``openclaw-gateway`` (:func:`openclaw_client.cli.main`): the token and the
gateway's address come from the state folder ($OPENCLAW_STATE_DIR, by default ``./.openclaw-state``).
"""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m openclaw_client"))
