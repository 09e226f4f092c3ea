"""Settings are checked at start: a value that cannot be used is one line naming the variable."""

from __future__ import annotations

import os
import re

from tests.support.processes import ROOT, manage_check

CODE_DIRS = ("openclaw_site", "sessions_app", "native_harness", "workers_app", "openclaw_client")
READS = re.compile(r'(?:env_[a-z_]+|os\.environ\.get|getenv)\(\s*"([A-Z][A-Z0-9_]+)"')


def test_good_settings_pass_the_check(tmp_path):
    result = manage_check(
        tmp_path,
        OPENCLAW_GATEWAY_PORT="0",
        DJANGO_DEBUG="off",
        OPENCLAW_MODEL_BASE_URL="http://127.0.0.1:9/v1",
        OPENCLAW_WORKSPACE_ROOTS=f"{tmp_path}{os.pathsep}/srv",
    )
    assert result.returncode == 0, result.stderr


def test_the_readme_documents_every_variable_the_code_reads():
    names = set()
    for directory in CODE_DIRS:
        for path in (ROOT / directory).rglob("*.py"):
            names.update(READS.findall(path.read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    undocumented = sorted(name for name in names - {"DJANGO_SETTINGS_MODULE"} if f"`{name}`" not in readme)
    assert names, "the scan found no variables"
    assert undocumented == []
