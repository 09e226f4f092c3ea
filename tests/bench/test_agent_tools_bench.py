"""``bench/agent_tools.py`` (issue 22's tool-loop benchmark): its pieces on their own, and the whole script run with
tiny counts on the embedded profile (a gateway, the mock model and a node host, all started and stopped by it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import agent_tools

ROOT = Path(__file__).resolve().parents[2]


def test_a_plan_message_asks_for_n_steps_of_one_call_each():
    message = agent_tools.plan_message(agent_tools.NO_OP_CALL, 3)
    assert message.startswith("TOOL_PLAN: ")
    plan = json.loads(message.removeprefix("TOOL_PLAN: "))
    assert plan == {"steps": [{"calls": [agent_tools.NO_OP_CALL]}] * 3, "final": "done"}
    assert json.loads(agent_tools.plan_message(None, 0).removeprefix("TOOL_PLAN: "))["steps"] == []


def test_a_recorded_model_request_is_classified_by_its_plan_and_the_steps_taken():
    message = agent_tools.plan_message(agent_tools.NO_OP_CALL, 4)
    call = {"id": "call_0_0", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "user", "content": message},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0_0", "content": "ok"},
        ]
    }
    assert agent_tools.request_kind(body) == ("read", 4, 1)
    plain = {"messages": [{"role": "user", "content": agent_tools.plan_message(None, 0)}]}
    assert agent_tools.request_kind(plain) == ("", 0, 0)
    assert agent_tools.request_kind({"messages": [{"role": "user", "content": "hello"}]}) is None


def test_a_pair_gives_the_per_step_overhead_and_the_timeline_of_the_turns_tool_events():
    series = agent_tools.Series(2)
    marks = [(0.010, "start"), (0.012, "result"), (0.020, "start"), (0.023, "result")]
    series.add(agent_tools.TurnSample(0.010, "plain"), agent_tools.TurnSample(0.030, "turn", marks))
    assert series.per_step == pytest.approx([0.010])
    assert series.head == pytest.approx([0.010])
    assert series.tool == pytest.approx([0.0025])
    assert series.gap == pytest.approx([0.008])
    assert series.tail == pytest.approx([0.007])


@pytest.mark.parametrize(("argv", "message"), [(["--steps", "0"], "step counts"), (["--places", "x"], "--places")])
def test_options_out_of_range_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        agent_tools.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_the_script_prints_every_figure_with_tiny_counts_on_the_embedded_profile(tmp_path):
    report = tmp_path / "tools.json"
    argv = ["--turns", "2", "--approvals", "2", "--warmup", "1", "--replays", "3", "--steps", "1,2"]
    finished = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "agent_tools.py"), *argv, "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    out = finished.stdout
    assert "OpenClaw tool-loop benchmark (issue 22)" in out
    assert "  database       SQLite" in out and "command        .venv/bin/python bench/agent_tools.py --turns 2" in out
    for title in ("1-2. tool step overhead", "3. approval round trip", "4. `exec true`"):
        assert title in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("local ", "node "))]
    # Steps (N = 1, 2) and their timelines for both places, the approvals and the exec of true.
    assert sum(1 for row in rows if row[0] == "local") == sum(1 for row in rows if row[0] == "node") == 6
    assert "ERROR records" in out and "0 ERROR records" in out
    figures = json.loads(report.read_text())
    assert figures["complete"] is True
    for place in ("local", "node"):
        assert figures["steps"][place]["2"]["pairs"] == 2
        assert figures["steps"][place]["2"]["perStep"]["p50"] is not None
        assert figures["approvals"][place]["n"] == 2
        assert figures["approvals"][place]["toCommand"]["p50"] > 0
        assert figures["exec"][place]["durationMs"]["n"] == 2
        assert isinstance(figures["exec"][place]["goalMet"], bool)
    assert figures["logs"]["gatewayExitCode"] == 0
    # Nothing of the run is left: its state dir and scratch dir are gone, no process it started runs.
    scratch = figures["scratch"]
    assert not Path(scratch["stateDir"]).exists() and not Path(scratch["scratchDir"]).exists()
    assert len(scratch["pids"]) == 3  # gateway, node host, mock (embedded: no Celery worker)
    assert not [pid for pid in scratch["pids"] if _running(pid)]


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
