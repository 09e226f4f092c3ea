"""The agent's ``exec`` tool and the host's command slots (``openclaw_client.agent``), with real processes.

This machine's PID 1 does not reap orphans, so a killed background process can stay a zombie: "gone" below
means no such process, or a zombie (see :func:`alive`). Time bounds are generous (the machine is shared):
they tell "killed" from "ran its 60 or 300 seconds", nothing finer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from openclaw_client.agent import execution
from openclaw_client.agent.execution import ExecSlotsBusy
from openclaw_client.agent.tools import (
    ExecRequest,
    ExecSlots,
    ToolCallError,
    ToolLimits,
    ToolResult,
    ToolRunner,
    Workspace,
)

ROOT = Path(__file__).resolve().parents[2]
# Far below the 60 s and 300 s sleeps the commands start, far above any normal delay.
PROMPTLY_S = 30
# Starts a process in a session of its own (out of the command's group) holding the output pipe, and
# returns once it is there (its pid in ``daemon``).
DAEMON = (
    "setsid sh -c 'echo $$ > daemon.tmp; mv daemon.tmp daemon; exec sleep 300' & "
    "while [ ! -s daemon ]; do sleep 0.05; done"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    directory = tmp_path / "ws"
    directory.mkdir()
    return directory


def runner_for(root: Path, slots: ExecSlots | None = None, **limits) -> ToolRunner:
    return ToolRunner(Workspace(root), limits=ToolLimits(**limits), exec_slots=slots)


def run_exec(runner: ToolRunner, cancel: threading.Event | None = None, **arguments) -> ToolResult:
    return runner.run(runner.prepare("exec", json.dumps(arguments)), cancel=cancel)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def eventually(condition, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


# --- environment -------------------------------------------------------------------------------------------


def test_the_command_gets_an_allowlisted_environment_without_the_callers_secrets(root, monkeypatch):
    secrets = {
        "OPENCLAW_GATEWAY_TOKEN": "gateway-token-value",
        "OPENCLAW_DEVICE_KEY": "device-key-value",
        "DATABASE_URL": "postgres://user:pw@db/openclaw",
        "REDIS_URL": "redis://secret@redis:6379/0",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
        "DJANGO_SETTINGS_MODULE": "openclaw_site.settings",
    }
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("HOME", "/home/tester")
    monkeypatch.setenv("TERM", "xterm-256color")

    result = run_exec(runner_for(root), command="env")

    assert not result.is_error, result.text
    env = dict(line.split("=", 1) for line in result.text.splitlines() if "=" in line)
    for key, value in secrets.items():
        assert key not in env
        assert value not in result.text
    assert env["LANG"] == "C.UTF-8"
    assert env["HOME"] == "/home/tester"
    assert env["TERM"] == "dumb"
    assert set(env) <= set(execution.INHERITED_ENV) | {"TERM", "PWD", "SHLVL", "_", "OLDPWD"}


def test_the_models_env_overrides_are_passed_and_loader_keys_refused(root):
    runner = runner_for(root)
    result = run_exec(runner, command='printf "%s|%s" "$GREETING" "$LANG"', env={"GREETING": "hi there", "LANG": "C"})
    assert result.text == "hi there|C"
    for key in ("PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "ld_preload"):
        with pytest.raises(ToolCallError, match="may not be set"):
            runner.prepare("exec", {"command": "true", "env": {key: "/tmp/evil"}})


def test_path_comes_from_the_caller_or_a_default(root, monkeypatch):
    monkeypatch.delenv("PATH")
    assert execution.command_env({})["PATH"] == execution.DEFAULT_PATH
    assert run_exec(runner_for(root), command="echo $PATH").text == execution.DEFAULT_PATH + "\n"


# --- running -----------------------------------------------------------------------------------------------


def test_output_exit_code_and_details(root):
    (root / "sub").mkdir()
    runner = runner_for(root)

    result = run_exec(runner, command="echo out; echo err >&2; exit 3")
    assert result.is_error
    assert result.text == "out\nerr\n\n(Command exited with code 3)"
    assert result.details["exitCode"] == 3
    assert result.details["timedOut"] is False
    assert result.details["truncated"] is False
    assert result.details["outputBytes"] == 8
    assert result.details["cwd"] == str(root.resolve())
    assert isinstance(result.details["durationMs"], int)
    assert result.full_text is None

    success = run_exec(runner, command="pwd", workdir="sub")
    assert not success.is_error
    assert success.text == f"{root.resolve()}/sub\n"
    assert success.details["exitCode"] == 0
    assert run_exec(runner, command="true").text == "(no output)"
    assert run_exec(runner, command="printf x; exit 1").text == "x\n\n(Command exited with code 1)"


def test_stdin_is_empty(root):
    result = run_exec(runner_for(root), command="cat; echo done", timeoutSeconds=5)
    assert result.text == "done\n"
    assert result.details["timedOut"] is False


def test_a_command_killed_by_a_signal_is_an_error(root):
    result = run_exec(runner_for(root), command="kill -KILL $$")
    assert result.is_error
    assert result.text == "(Command terminated by SIGKILL)"
    assert result.details["exitCode"] == -signal.SIGKILL


def test_a_command_that_cannot_start_is_an_error(root, monkeypatch):
    monkeypatch.setattr(execution, "SHELL", str(root / "no-such-shell"))
    result = run_exec(runner_for(root), command="true")
    assert result.is_error
    assert result.text.startswith("Command could not start:")


def test_exec_request_is_what_an_approval_shows(root):
    (root / "sub").mkdir()
    runner = runner_for(root, exec_timeout_s=20)
    call = runner.prepare("exec", {"command": "make test", "workdir": "sub/", "env": {"B": "1", "A": "2"}})
    assert runner.exec_request(call) == ExecRequest(
        command="make test", workdir=f"{root.resolve()}/sub", env_keys=("A", "B"), timeout_s=20.0
    )
    assert runner.exec_request(runner.prepare("exec", {"command": "x", "timeoutSeconds": 7})).timeout_s == 7.0
    (root / "file").write_text("")
    with pytest.raises(ToolCallError, match='workdir "file" is not a directory'):
        runner.exec_request(runner.prepare("exec", {"command": "x", "workdir": "file"}))
    with pytest.raises(ToolCallError, match='workdir "missing" is not a directory'):
        runner.exec_request(runner.prepare("exec", {"command": "x", "workdir": "missing"}))
    with pytest.raises(ValueError):
        runner.exec_request(runner.prepare("read", {"path": "file"}))


# --- time and process groups -------------------------------------------------------------------------------


def test_a_timeout_kills_the_whole_process_group(root):
    command = "echo $$ > pgid; sleep 60 & echo $! >> children; sleep 60 & echo $! >> children; echo started; wait"
    started = time.monotonic()

    result = run_exec(runner_for(root), command=command, timeoutSeconds=1)

    assert time.monotonic() - started < PROMPTLY_S
    assert result.is_error
    assert result.details["timedOut"] is True
    assert result.text == "started\n\n(Command timed out after 1 seconds and was killed)"
    pgid = pids(root / "pgid")[0]
    assert eventually(lambda: not group_members(pgid))
    assert not any(alive(pid) for pid in pids(root / "children"))


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(root):
    command = "trap '' TERM; echo $$ > pgid; sleep 60 & echo $! > child; while :; do sleep 1; done"
    started = time.monotonic()

    result = run_exec(runner_for(root, exec_kill_grace_s=0.5), command=command, timeoutSeconds=1)

    assert time.monotonic() - started < PROMPTLY_S
    assert result.details["timedOut"] is True
    assert eventually(lambda: not group_members(pids(root / "pgid")[0]))
    assert not alive(pids(root / "child")[0])


def test_a_background_child_left_behind_is_killed_when_the_shell_exits(root):
    started = time.monotonic()

    result = run_exec(runner_for(root), command="sleep 300 & echo $! > child; echo $$ > pgid; echo left")

    assert time.monotonic() - started < PROMPTLY_S
    assert result.text == "left\n"
    assert not result.is_error
    assert eventually(lambda: not alive(pids(root / "child")[0]))
    assert eventually(lambda: not group_members(pids(root / "pgid")[0]))


def test_a_daemon_that_left_the_group_and_holds_the_output_cannot_hold_the_call(root):
    started = time.monotonic()
    result = run_exec(runner_for(root), command=f"{DAEMON}; echo main done")
    daemon = pids(root / "daemon")[0]
    try:
        assert time.monotonic() - started < PROMPTLY_S
        assert result.text.startswith("main done\n")
        assert "still holds its output open" in result.text
        assert result.details["exitCode"] == 0
    finally:
        os.kill(daemon, signal.SIGKILL)


def test_cancel_kills_a_running_command_at_once(root):
    runner = runner_for(root)
    cancel = threading.Event()
    outcome: list[ToolResult] = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            run_exec(runner, cancel, command="echo $$ > pgid; echo working; sleep 60 & sleep 60", timeoutSeconds=120)
        )
    )
    started = time.monotonic()
    worker.start()
    assert eventually(lambda: (root / "pgid").exists() and (root / "pgid").read_text().strip() != "")
    cancel.set()
    worker.join(PROMPTLY_S)

    assert not worker.is_alive()
    assert time.monotonic() - started < PROMPTLY_S
    result = outcome[0]
    assert result.is_error
    assert result.details["aborted"] is True
    assert result.details["timedOut"] is False
    assert result.text.startswith("Command aborted:")
    assert "working" in result.text
    assert eventually(lambda: not group_members(pids(root / "pgid")[0]))


def test_a_cancel_before_the_run_runs_nothing(root):
    cancel = threading.Event()
    cancel.set()
    result = run_exec(runner_for(root), cancel, command="touch ran")
    assert result.is_error and result.details["aborted"] is True
    assert not (root / "ran").exists()


# --- output ------------------------------------------------------------------------------------------------


def test_long_output_keeps_head_and_tail_for_the_model_and_more_as_full_text(root):
    command = "i=0; while [ $i -lt 2000 ]; do printf 'line %04d\\n' $i; i=$((i+1)); done"
    result = run_exec(runner_for(root, result_max_bytes=1000, artifact_max_bytes=8000), command=command)

    assert not result.is_error
    assert result.details["outputBytes"] == 20000
    assert result.details["truncated"] is True
    assert result.text.startswith("line 0000\n")
    assert result.text.endswith("line 1999\n")
    assert "…[19000 bytes omitted]…" in result.text
    assert len(result.text.encode()) < 1100
    assert result.full_text is not None
    assert result.full_text.startswith("line 0000\nline 0001\n")
    assert result.full_text.endswith("\n…[12000 more bytes not kept]")
    assert len(result.full_text.encode()) < 8100


def test_output_past_the_artifact_cap_is_read_counted_and_dropped(root):
    size = 64 * 1024 * 1024
    result = run_exec(
        runner_for(root, result_max_bytes=1024, artifact_max_bytes=64 * 1024),
        command=f"head -c {size} /dev/zero | tr '\\0' a",
        timeoutSeconds=60,
    )
    assert not result.is_error
    assert result.details["outputBytes"] == size
    assert result.full_text is not None
    assert len(result.full_text) < 65 * 1024


def test_the_exit_note_follows_a_cut_output(root):
    result = run_exec(runner_for(root, result_max_bytes=100), command="head -c 5000 /dev/zero | tr '\\0' b; exit 2")
    assert result.text.endswith("b" * 50 + "\n\n(Command exited with code 2)")
    assert "bytes omitted" in result.text


def test_output_capture_bounds_what_it_keeps():
    capture = execution.OutputCapture(text_max_bytes=10, artifact_max_bytes=20)
    for _ in range(1000):
        capture.feed(b"0123456789")
    assert capture.total == 10_000
    assert len(capture.kept) == 20
    assert len(capture.tail) <= 10
    assert capture.text() == "01234\n…[9990 bytes omitted]…\n56789"


# --- host slots --------------------------------------------------------------------------------------------


HOLDER = """
import sys, time
from pathlib import Path
from openclaw_client.agent.execution import ExecSlots
with ExecSlots(Path(sys.argv[1]), int(sys.argv[2])).acquire(wait_s=5):
    print("held", flush=True)
    time.sleep(300)
"""


def start_holder(directory: Path, count: int) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), str(count)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    return holder


def test_slots_bound_commands_across_processes_and_a_crashed_holder_frees_its_slot(root, tmp_path):
    directory = tmp_path / "slots"
    slots = ExecSlots(directory, 1)
    holder = start_holder(directory, 1)
    try:
        with pytest.raises(ExecSlotsBusy, match=r"too many commands running on this host \(limit 1\); try again later"):
            with slots.acquire(wait_s=0.3):
                pass
        result = run_exec(runner_for(root, slots, exec_slot_wait_s=0.3), command="touch ran")
        assert result.is_error
        assert result.text == "too many commands running on this host (limit 1); try again later"
        assert not (root / "ran").exists()
    finally:
        holder.kill()
        holder.wait()
    with slots.acquire(wait_s=5):
        pass
    assert not run_exec(runner_for(root, slots), command="touch ran").is_error
    assert (root / "ran").exists()


def test_a_free_slot_is_found_among_several(tmp_path):
    directory = tmp_path / "slots"
    holder = start_holder(directory, 2)
    try:
        with ExecSlots(directory, 2).acquire(wait_s=0.3):
            with pytest.raises(ExecSlotsBusy):
                with ExecSlots(directory, 2).acquire(wait_s=0.2):
                    pass
    finally:
        holder.kill()
        holder.wait()


def test_a_slot_is_waited_for_and_taken_when_freed(tmp_path):
    slots = ExecSlots(tmp_path / "slots", 1)
    taken = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with slots.acquire(wait_s=1):
            taken.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(10)
    threading.Timer(0.3, release.set).start()
    with slots.acquire(wait_s=PROMPTLY_S):
        pass
    holder.join()


def test_a_cancel_while_waiting_for_a_slot_aborts_the_call(root, tmp_path):
    slots = ExecSlots(tmp_path / "slots", 1)
    cancel = threading.Event()
    with slots.acquire():
        threading.Timer(0.2, cancel.set).start()
        started = time.monotonic()
        result = run_exec(runner_for(root, slots, exec_slot_wait_s=60), cancel, command="touch ran")
    assert time.monotonic() - started < PROMPTLY_S
    assert result.is_error and result.details["aborted"] is True
    assert not (root / "ran").exists()


def test_what_a_command_leaves_running_does_not_keep_its_slot(root, tmp_path):
    slots = ExecSlots(tmp_path / "slots", 1)
    runner = runner_for(root, slots, exec_slot_wait_s=0.5)
    result = run_exec(runner, command=DAEMON)
    try:
        assert not result.is_error
        assert not run_exec(runner, command="true").is_error
    finally:
        os.kill(pids(root / "daemon")[0], signal.SIGKILL)


def test_concurrent_execs_share_the_slots(root, tmp_path):
    runner = runner_for(root, ExecSlots(tmp_path / "slots", 2), exec_slot_wait_s=PROMPTLY_S)
    results: list[ToolResult] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(run_exec(runner, command=f"sleep 0.2; echo {n}")))
        for n in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(result.text for result in results) == [f"{n}\n" for n in range(6)]


def test_slots_need_a_positive_count(tmp_path):
    with pytest.raises(ValueError):
        ExecSlots(tmp_path / "slots", 0)


def test_a_command_holding_a_nul_byte_is_a_tool_error_not_a_failed_turn(root):
    result = run_exec(runner_for(root), command="echo a\0b")

    assert result.is_error
    assert "Command could not start: the command contains a NUL byte" in result.text
