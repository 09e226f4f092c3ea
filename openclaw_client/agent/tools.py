"""The agent's tools: what the model may call, how a call is checked, and how it runs inside a workspace.

    runner = ToolRunner(Workspace(directory), limits=ToolLimits(...), exec_slots=ExecSlots(dir, n))
    call = runner.prepare(name, arguments_json)       # ToolCallError: a malformed call, for the model
    request = runner.exec_request(call)               # exec only: what an approval shows
    result = runner.run(call, cancel=event)           # a ToolResult, never an exception for a tool failure

Tools (OpenClaw's names and arguments): ``read``, ``write``, ``edit``, ``ls``, ``find``, ``grep``, ``exec``;
their schemas are :func:`tool_specs`. Every path stays inside the workspace (``workspace.py``); ``exec``
runs bounded in time, output and number (``execution.py``). Standard library only: the worker child on a
node host runs this from the worker bundle. A runner holds no per-call state: ``run`` may be called from
any thread, and several runners may run at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .base import (
    ExecRequest,
    PreparedCall,
    ToolCallError,
    ToolLimits,
    ToolResult,
    aborted_result,
    capped_result,
    quoted,
)
from .execution import ExecSlots, ExecSlotsBusy, command_env, env_problem, exec_result, run_command
from .files import edit_file, list_directory, read_file, write_file
from .schema import TOOL_NAMES, checked_arguments, decoded_arguments, tool_schemas, tool_specs
from .search import find_files, grep_files
from .workspace import CallAborted, Workspace

__all__ = [
    "TOOL_NAMES",
    "ExecRequest",
    "ExecSlots",
    "ExecSlotsBusy",
    "PreparedCall",
    "ToolCallError",
    "ToolLimits",
    "ToolResult",
    "ToolRunner",
    "Workspace",
    "tool_specs",
]

# Every tool but exec: (workspace, limits, validated arguments, cancel) -> result.
FILE_TOOLS: dict[str, Callable[[Workspace, ToolLimits, dict[str, Any], threading.Event | None], ToolResult]] = {
    "read": read_file,
    "write": write_file,
    "edit": edit_file,
    "ls": list_directory,
    "find": find_files,
    "grep": grep_files,
}
# The legacy single-edit form some models were trained on: {path, oldText, newText}.
_LEGACY_EDIT_KEYS = ("oldText", "newText")


class ToolRunner:
    def __init__(self, workspace: Workspace, *, limits: ToolLimits | None = None, exec_slots: ExecSlots | None = None):
        self.workspace = workspace
        self.limits = limits or ToolLimits()
        self.exec_slots = exec_slots
        self._schemas = {name: parameters for name, (_description, parameters) in tool_schemas(self.limits).items()}

    def tool_specs(self, names: tuple[str, ...] = TOOL_NAMES) -> list[dict[str, Any]]:
        """The schemas the model is shown, with this runner's limits (what :meth:`prepare` enforces)."""
        return tool_specs(names, limits=self.limits)

    # --- checking a call ------------------------------------------------------------------------------------

    def prepare(self, name: str, raw_arguments: str | dict[str, Any]) -> PreparedCall:
        """The model's call checked against its tool's schema (and ``exec``'s env rules); raises
        :class:`ToolCallError` with a one-line message for the model. Touches no file."""
        if name not in self._schemas:
            raise ToolCallError(f"unknown tool {quoted(name)}; available: {', '.join(TOOL_NAMES)}")
        arguments = decoded_arguments(name, raw_arguments)
        if name == "edit":
            arguments = _legacy_edit(arguments)
        arguments = checked_arguments(name, arguments, self._schemas[name])
        if name == "edit":
            for index, edit in enumerate(arguments["edits"]):
                if not edit["oldText"]:
                    raise ToolCallError(f"invalid arguments for edit: edits[{index}].oldText is empty")
        if name == "exec":
            for key, value in arguments.get("env", {}).items():
                problem = env_problem(key, value)
                if problem is not None:
                    raise ToolCallError(f"invalid arguments for exec: {problem}")
        return PreparedCall(name, arguments)

    def exec_request(self, call: PreparedCall) -> ExecRequest:
        """What ``call`` (an ``exec``) would run, its working directory resolved inside the workspace."""
        if call.name != "exec":
            raise ValueError(f"exec_request is for exec calls, not {call.name!r}")
        arguments = call.arguments
        workdir = self.workspace.resolve(arguments.get("workdir", "."), what="workdir")
        if not self.workspace.is_directory(workdir):
            raise ToolCallError(f"workdir {quoted(arguments.get('workdir', '.'))} is not a directory in the workspace")
        timeout_s = min(
            float(arguments.get("timeoutSeconds", self.limits.exec_timeout_s)), self.limits.exec_max_timeout_s
        )
        return ExecRequest(
            command=arguments["command"],
            workdir=str(workdir),
            env_keys=tuple(sorted(arguments.get("env", {}))),
            timeout_s=timeout_s,
        )

    # --- running it -----------------------------------------------------------------------------------------

    def run(self, call: PreparedCall, *, cancel: threading.Event | None = None) -> ToolResult:
        """Run a prepared call. A refusal (a path outside the workspace, a missing file, a timeout, a busy
        host…) is an ``is_error`` result; only a programming error raises."""
        if cancel is not None and cancel.is_set():
            return aborted_result()
        try:
            if call.name == "exec":
                return self._exec(call, cancel)
            result = FILE_TOOLS[call.name](self.workspace, self.limits, call.arguments, cancel)
            return capped_result(result, self.limits)
        except ToolCallError as error:
            return ToolResult(error.message, True, {})
        except CallAborted:
            return aborted_result()
        except FileNotFoundError:
            return ToolResult(f"{self._named(call)}: no such file or directory", True, {})
        except PermissionError:
            return ToolResult(f"{self._named(call)}: permission denied", True, {})
        except OSError as error:
            return ToolResult(f"{self._named(call)}: {error.strerror or error}", True, {})

    def _named(self, call: PreparedCall) -> str:
        path = call.arguments.get("path", call.arguments.get("workdir", "."))
        return quoted(path) if isinstance(path, str) else "path"

    def _exec(self, call: PreparedCall, cancel: threading.Event | None) -> ToolResult:
        request = self.exec_request(call)
        env = command_env(call.arguments.get("env", {}))
        if self.exec_slots is None:
            return exec_result(request, run_command(request, env, self.limits, cancel))
        try:
            with self.exec_slots.acquire(self.limits.exec_slot_wait_s, cancel):
                return exec_result(request, run_command(request, env, self.limits, cancel))
        except ExecSlotsBusy as busy:
            if cancel is not None and cancel.is_set():
                return aborted_result("Command aborted: the turn was stopped before it ran")
            return ToolResult(busy.message, True, {"exitCode": None, "cwd": request.workdir})


def _legacy_edit(arguments: dict[str, Any]) -> dict[str, Any]:
    """The legacy ``{path, oldText, newText}`` as ``{path, edits: [{oldText, newText}]}`` (a missing half is then
    named by the schema); anything else unchanged."""
    if "edits" in arguments or not any(key in arguments for key in _LEGACY_EDIT_KEYS):
        return arguments
    rest = {key: value for key, value in arguments.items() if key not in _LEGACY_EDIT_KEYS}
    return {**rest, "edits": [{key: arguments[key] for key in _LEGACY_EDIT_KEYS if key in arguments}]}
