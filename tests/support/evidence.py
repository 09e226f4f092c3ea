"""What a seed's proof leaves for a person to read, written by its port under ``test-artifacts/<scenario>/`` (ignored
by git): the verdict file, the evidence summary ``qa-evidence.json`` (the shape of OpenClaw's qa-lab evidence
summary, schema version 2), the scenario's own log (``<scenario>.log``: ``pass: <verdict>`` or ``fail: <error>``) and
the logs of the processes it ran (``gateway.log``).

A run that fails still writes its verdict, ``{"status": "fail", "error": ...}``, so the folder never shows the
verdict of an earlier run: the files are removed when the scenario starts.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT

ARTIFACTS = ROOT / "test-artifacts"
EVIDENCE_FILENAME = "qa-evidence.json"
EVIDENCE_SUMMARY_KIND = "openclaw.qa.evidence-summary"
EVIDENCE_SUMMARY_SCHEMA_VERSION = 2
PROCESS_LOG_FILENAME = "gateway.log"


def describe_error(error: BaseException) -> str:
    """One readable text for an error, with every member of an exception group (the clean-up failures)."""
    if isinstance(error, BaseExceptionGroup):
        members = "; ".join(describe_error(member) for member in error.exceptions)
        return f"{error.message}: {members}"
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclass
class ScenarioEvidence:
    scenario_id: str
    title: str
    source_path: str
    verdict_file: str
    provider_mode: str
    primary_model: str
    directory: Path
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def begin(cls, *, scenario_id: str, subfolder: str, **fields: Any) -> ScenarioEvidence:
        evidence = cls(scenario_id=scenario_id, directory=ARTIFACTS / scenario_id / subfolder, **fields)
        evidence.directory.mkdir(parents=True, exist_ok=True)
        for name in evidence.file_names():
            (evidence.directory / name).unlink(missing_ok=True)
        return evidence

    def file_names(self) -> tuple[str, ...]:
        return (self.verdict_file, EVIDENCE_FILENAME, f"{self.scenario_id}.log", PROCESS_LOG_FILENAME)

    def append_process_log(self, heading: str, text: str) -> None:
        with open(self.directory / PROCESS_LOG_FILENAME, "a", encoding="utf-8") as log:
            log.write(f"===== {heading} =====\n{text}")
            if text and not text.endswith("\n"):
                log.write("\n")

    def finish(self, verdict: dict[str, Any] | None, error: BaseException | None) -> dict[str, Any]:
        """Write the verdict (``fail`` with the error when there is one), the scenario log and the summary."""
        if error is None and verdict is None:
            error = RuntimeError(f"{self.scenario_id} produced no verdict")
        if error is None:
            written, log_line, status, failure = verdict, f"pass: {json.dumps(verdict)}", "pass", None
        else:
            details = describe_error(error)
            written = {"status": "fail", "error": details}
            log_line, status, failure = f"fail: {details}", "fail", {"reason": details}
        (self.directory / self.verdict_file).write_text(f"{json.dumps(written, indent=2)}\n", encoding="utf-8")
        with open(self.directory / f"{self.scenario_id}.log", "a", encoding="utf-8") as log:
            log.write(f"{log_line}\n")
        summary = self.summary(status, failure)
        (self.directory / EVIDENCE_FILENAME).write_text(f"{json.dumps(summary, indent=2)}\n", encoding="utf-8")
        return written

    def summary(self, status: str, failure: dict[str, str] | None) -> dict[str, Any]:
        provider, _, model = self.primary_model.partition("/")
        result: dict[str, Any] = {
            "status": status,
            "timing": {"wallMs": max(1, round((time.monotonic() - self.started) * 1000))},
        }
        if failure is not None:
            result["failure"] = failure
        return {
            "kind": EVIDENCE_SUMMARY_KIND,
            "schemaVersion": EVIDENCE_SUMMARY_SCHEMA_VERSION,
            "generatedAt": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "entries": [
                {
                    "test": {
                        "kind": "script",
                        "id": self.scenario_id,
                        "title": self.title,
                        "source": {"path": self.source_path},
                    },
                    "coverage": [],
                    "execution": {
                        "runner": "host",
                        "environment": {
                            "ref": os.environ.get("GITHUB_SHA") or None,
                            "os": sys.platform,
                            "pythonVersion": platform.python_version(),
                        },
                        "provider": {
                            "id": "openai" if self.provider_mode == "mock-openai" else provider,
                            "live": False,
                            "model": {"name": model or None, "ref": self.primary_model},
                            "fixture": self.provider_mode,
                        },
                        "packageSource": {"kind": "source-checkout"},
                        "artifacts": [
                            {"kind": "verdict", "path": self.verdict_file, "source": self.scenario_id},
                            {"kind": "log", "path": f"{self.scenario_id}.log", "source": self.scenario_id},
                            {"kind": "process-log", "path": PROCESS_LOG_FILENAME, "source": self.scenario_id},
                        ],
                    },
                    "result": result,
                }
            ],
        }
