"""Session workspaces: a plain cwd, or a managed git worktree on branch ``openclaw/<name>``.

Git only; ``creation.py`` composes it with the session insert (and undoes a worktree whose
session could not be created).

Which directories a caller may name: ``cwd`` must resolve (symlinks and ``..`` followed) inside the
agent workspace (``<state dir>/workspace``) or one of ``OPENCLAW_WORKSPACE_ROOTS``; nothing else
on the gateway host is reachable through ``sessions.create``. The base ref is resolved to a commit
before anything is created, and every caller-supplied value reaches git after ``--end-of-options``,
so none can be read as an option.
"""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from gateway.exceptions import InvalidRequest

logger = logging.getLogger(__name__)

GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class WorkspacePlan:
    cwd: str
    worktree: bool
    repo_root: str = ""
    base_ref: str = ""
    name: str = ""


def agent_workspace_dir() -> Path:
    return Path(settings.STATE_DIR) / "workspace"


def workspace_roots() -> list[Path]:
    """Where a session's ``cwd`` may lie: the agent workspace and the configured roots, resolved."""
    return [agent_workspace_dir().resolve(), *(Path(root).resolve() for root in settings.OPENCLAW_WORKSPACE_ROOTS)]


def _inside_a_root(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved == root or resolved.is_relative_to(root) for root in workspace_roots())


def _git(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)


def plan_session_workspace(
    *, cwd: str | None, worktree: bool, worktree_base_ref: str | None, worktree_name: str | None, exec_node: str | None
) -> WorkspacePlan:
    """Validate the workspace options of sessions.create, with OpenClaw's messages, in its order."""
    if exec_node:
        if worktree:
            raise InvalidRequest("sessions.create worktree cannot target execNode")
        raise InvalidRequest("sessions.create execNode is not available on this gateway")
    if (worktree_base_ref or worktree_name) and not worktree:
        raise InvalidRequest("sessions.create worktreeBaseRef/worktreeName require worktree=true")
    if cwd is not None and not worktree:
        raise InvalidRequest("sessions.create cwd requires worktree=true or execNode")
    if cwd is not None and not os.path.isabs(cwd):
        raise InvalidRequest("sessions.create cwd must be absolute")
    if cwd is not None and not _inside_a_root(Path(cwd)):
        raise InvalidRequest(
            "sessions.create cwd is outside the gateway's workspace roots",
            details={"hint": "the agent workspace and OPENCLAW_WORKSPACE_ROOTS are allowed"},
        )
    if not worktree:
        return WorkspacePlan(cwd="", worktree=False)
    base_dir = cwd or str(agent_workspace_dir())
    if not os.path.isdir(base_dir):
        raise InvalidRequest("agent workspace is not a git checkout")
    top = _git(["rev-parse", "--show-toplevel"], base_dir)
    if top.returncode != 0:
        raise InvalidRequest("agent workspace is not a git checkout")
    base_ref = worktree_base_ref or "HEAD"
    resolved = _git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{base_ref}^{{commit}}"], base_dir)
    if base_ref.startswith("-") or resolved.returncode != 0:
        raise InvalidRequest(f"sessions.create worktreeBaseRef is not a commit: {base_ref}")
    return WorkspacePlan(
        cwd=base_dir,
        worktree=True,
        repo_root=top.stdout.strip(),
        base_ref=base_ref,
        name=worktree_name or f"session-{uuid.uuid4().hex[:8]}",
    )


def worktree_add(plan: WorkspacePlan) -> dict:
    worktree_id = uuid.uuid4().hex[:12]
    path = Path(settings.STATE_DIR) / "worktrees" / f"{plan.name}-{worktree_id}"
    path.parent.mkdir(parents=True, exist_ok=True)
    branch = f"openclaw/{plan.name}"
    added = _git(["worktree", "add", "-b", branch, "--end-of-options", str(path), plan.base_ref], plan.repo_root)
    if added.returncode != 0:
        reason = (added.stderr or added.stdout).strip().splitlines()
        raise InvalidRequest(
            f"sessions.create could not create the worktree: {reason[-1] if reason else 'git failed'}",
            details={"branch": branch, "baseRef": plan.base_ref},
        )
    return {
        "id": worktree_id,
        "branch": branch,
        "path": str(path),
        "repoRoot": plan.repo_root,
        "baseRef": plan.base_ref,
    }


def worktree_remove(worktree: dict) -> None:
    """Undo a managed worktree: the checkout and its branch. Failures are logged, not raised."""
    removed = _git(["worktree", "remove", "--force", "--end-of-options", worktree["path"]], worktree["repoRoot"])
    if removed.returncode != 0:
        logger.warning("could not remove worktree %s: %s", worktree["path"], removed.stderr.strip())
    deleted = _git(["branch", "-D", "--end-of-options", worktree["branch"]], worktree["repoRoot"])
    if deleted.returncode != 0:
        logger.warning("could not delete branch %s: %s", worktree["branch"], deleted.stderr.strip())


def session_workspace_dir(session) -> Path:
    """Where a turn of ``session`` run by this gateway works: its worktree (or cwd), else the agent workspace
    shared by the agent's sessions (OpenClaw's default ``agents.defaults.workspace``), created on first use."""
    if session.cwd:
        return Path(session.cwd)
    workspace = agent_workspace_dir()
    workspace.mkdir(parents=True, exist_ok=True)
    return workspace
