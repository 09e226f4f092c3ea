"""The failure paths of the seed ports' harness: a failed proof still writes a ``fail`` verdict with its error, and a
helper that does not stop cleanly is an error of the test (collected with the others, never swallowed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_seed_002_cloud_worker_disappearance import GatewayChild, clean_up
from tests.support.evidence import EVIDENCE_FILENAME, ScenarioEvidence, describe_error
from tests.support.processes import GatewayLaunch, MockOpenAIProcess, StopFailed, stop_process_checked

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def evidence_in(directory: Path) -> ScenarioEvidence:
    return ScenarioEvidence(
        scenario_id="some-scenario",
        title="Some scenario",
        source_path="tests/e2e/test_some_scenario.py",
        verdict_file="some-scenario-verdict.json",
        provider_mode="mock-openai",
        primary_model="mock-openai/gpt-5.6-luna",
        directory=directory,
    )


def exited_with(code: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"], stdout=subprocess.PIPE)
    process.wait(30)
    return process


def test_a_failed_proof_writes_a_fail_verdict_with_its_error(tmp_path):
    evidence = evidence_in(tmp_path)
    error = ExceptionGroup(
        "some scenario cleanup failed", [AssertionError("placement did not fail"), StopFailed("gateway exited with 1")]
    )

    written = evidence.finish({"status": "pass"}, error)

    verdict = json.loads((tmp_path / "some-scenario-verdict.json").read_text())
    assert (
        verdict
        == written
        == {
            "status": "fail",
            "error": "some scenario cleanup failed: AssertionError: placement did not fail; "
            "StopFailed: gateway exited with 1",
        }
    )
    assert (tmp_path / "some-scenario.log").read_text() == f"fail: {verdict['error']}\n"
    (entry,) = json.loads((tmp_path / EVIDENCE_FILENAME).read_text())["entries"]
    assert entry["result"]["status"] == "fail"
    assert entry["result"]["failure"] == {"reason": verdict["error"]}


def test_a_proof_without_a_verdict_or_an_error_is_a_failure(tmp_path):
    assert evidence_in(tmp_path).finish(None, None) == {
        "status": "fail",
        "error": "RuntimeError: some-scenario produced no verdict",
    }


def test_a_new_run_removes_the_previous_runs_verdict(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.support.evidence.ARTIFACTS", tmp_path)
    fields = {key: value for key, value in vars(evidence_in(tmp_path)).items() if key not in ("directory", "started")}
    first = ScenarioEvidence.begin(subfolder="sqlite", **fields)
    first.finish({"status": "pass"}, None)
    assert (first.directory / "some-scenario-verdict.json").exists()

    second = ScenarioEvidence.begin(subfolder="sqlite", **fields)

    assert not any((second.directory / name).exists() for name in second.file_names())


def test_describe_error_names_an_error_without_text():
    assert describe_error(AssertionError()) == "AssertionError"


def test_a_process_that_ignores_sigterm_fails_its_checked_stop_and_is_killed():
    process = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"ready\n"
        with pytest.raises(StopFailed, match=r"helper \(pid \d+\) did not stop within 1 s of SIGTERM; killed"):
            stop_process_checked(process, "helper", timeout=1)
        assert process.poll() is not None
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()


def test_an_error_exit_fails_the_checked_stop_and_a_clean_one_does_not():
    failed = exited_with(3)
    with pytest.raises(StopFailed, match=r"helper \(pid \d+\) exited with 3 before it was stopped"):
        stop_process_checked(failed, "helper")
    stop_process_checked(exited_with(0), "helper")
    failed.stdout.close()


def test_seed_002_clean_up_tries_every_step_and_returns_the_mock_models_failure(tmp_path):
    launch = GatewayLaunch.prepare(clean_env=True)
    mock = MockOpenAIProcess(exited_with(3), "http://127.0.0.1:9/v1")

    failures = clean_up(GatewayChild(launch, evidence_in(tmp_path)), mock)

    assert [type(failure) for failure in failures] == [StopFailed]
    assert "mock OpenAI server http://127.0.0.1:9/v1" in str(failures[0])
    assert not Path(launch.state_dir).exists(), "a failed step kept the next ones from running"
