"""exec_policy without Django: the document's validation, the policy an agent resolves to, the verdict on each
path (deny, full, allowlist match and miss, ask modes, askFallback), shell chains and what is never a match,
argPattern, allow-always entries bound to argv and cwd, combining a gateway's and a node's policy."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from openclaw_client.agent import exec_policy as ep
from openclaw_client.agent.exec_policy import Policy, PolicyDocumentError

ROOT_CWD = "/srv/work"


def which_in(*names: str, prefix: str = "/usr/bin"):
    """A PATH lookup that finds exactly ``names`` under ``prefix``."""
    return lambda name: f"{prefix}/{name}" if name in names else None


def policy(security: str = "allowlist", ask: str = "on-miss", fallback: str = "deny", *entries: dict) -> Policy:
    return Policy(security=security, ask=ask, ask_fallback=fallback, allowlist=tuple(entries))


def entry(pattern: str, arg_pattern: str | None = None, **extra) -> dict:
    made = {"id": f"e-{pattern}-{arg_pattern}", "pattern": pattern, **extra}
    if arg_pattern is not None:
        made["argPattern"] = arg_pattern
    return made


WHICH = which_in("ls", "git", "cat", "less", "echo", "rm", "python3")


def verdict(p: Policy, command, cwd: str | None = ROOT_CWD):
    return ep.evaluate(p, command, cwd, which=WHICH)


# --- the document ------------------------------------------------------------------------------------


def test_a_document_is_normalized_ids_added_and_socket_and_command_text_dropped():
    raw = {
        "version": 1,
        "socket": {"path": "/tmp/s", "token": "secret"},
        "defaults": {"security": "allowlist", "ask": "always"},
        "agents": {
            "main": {
                "askFallback": "full",
                "allowlist": [{"pattern": "ls", "commandText": "ls -la"}, {"id": "keep", "pattern": "/usr/bin/*"}],
            }
        },
    }
    before = copy.deepcopy(raw)

    document = ep.normalize_document(raw, new_id=lambda: "new-id")

    assert document == {
        "version": 1,
        "defaults": {"security": "allowlist", "ask": "always"},
        "agents": {
            "main": {
                "askFallback": "full",
                "allowlist": [{"id": "new-id", "pattern": "ls"}, {"id": "keep", "pattern": "/usr/bin/*"}],
            }
        },
    }
    assert raw == before  # the caller's object is not changed
    # Normalizing the stored form again changes nothing: its hash is stable.
    assert ep.normalize_document(document) == document
    assert ep.document_hash(document) == ep.document_hash(json.loads(json.dumps(document)))


@pytest.mark.parametrize(
    ("raw", "path", "problem"),
    [
        ([], "/", "must be an object"),
        ({"version": 2}, "/version", "must be 1"),
        ({"version": True}, "/version", "must be 1"),
        ({"version": 1, "extra": 1}, "/extra", "unexpected property"),
        ({"version": 1, "socket": {"path": "/x", "port": 1}}, "/socket/port", "unexpected property"),
        (
            {"version": 1, "defaults": {"security": "open"}},
            "/defaults/security",
            "must be one of deny, allowlist, full",
        ),
        ({"version": 1, "defaults": {"ask": "sometimes"}}, "/defaults/ask", "must be one of off, on-miss, always"),
        (
            {"version": 1, "defaults": {"askFallback": "ask"}},
            "/defaults/askFallback",
            "must be one of deny, allowlist, full",
        ),
        ({"version": 1, "defaults": {"autoAllowSkills": "yes"}}, "/defaults/autoAllowSkills", "must be a boolean"),
        ({"version": 1, "defaults": {"allowlist": []}}, "/defaults/allowlist", "unexpected property"),
        ({"version": 1, "agents": []}, "/agents", "must be an object"),
        ({"version": 1, "agents": {" ": {}}}, "/agents/ ", "an agent id must be 1 to 200 characters, not blank"),
        ({"version": 1, "agents": {"a/b": {"mcpTools": []}}}, "/agents/a~1b/mcpTools", "unexpected property"),
        ({"version": 1, "agents": {"main": {"allowlist": {}}}}, "/agents/main/allowlist", "must be an array"),
        ({"version": 1, "agents": {"main": {"allowlist": ["ls"]}}}, "/agents/main/allowlist/0", "must be an object"),
        ({"version": 1, "agents": {"main": {"allowlist": [{}]}}}, "/agents/main/allowlist/0/pattern", "is required"),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": " "}]}}},
            "/agents/main/allowlist/0/pattern",
            "must not be blank",
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls", "source": "manual"}]}}},
            "/agents/main/allowlist/0/source",
            'must be "allow-always"',
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls", "argPattern": "("}]}}},
            "/agents/main/allowlist/0/argPattern",
            "not a valid regular expression (missing ), unterminated subpattern at position 0)",
        ),
        (
            {
                "version": 1,
                "agents": {"main": {"allowlist": [{"pattern": "ls", "argPattern": "sha256:cwd-argv:v1:abc"}]}},
            },
            "/agents/main/allowlist/0/argPattern",
            "a sha256:cwd-argv:v1: hash must be 64 hex digits",
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls", "lastUsedAt": -1}]}}},
            "/agents/main/allowlist/0/lastUsedAt",
            "must be a number of milliseconds, at least 0",
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls", "id": ""}]}}},
            "/agents/main/allowlist/0/id",
            "must not be empty",
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "l\x00s"}]}}},
            "/agents/main/allowlist/0/pattern",
            "must not contain NUL characters",
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "x" * 1025}]}}},
            "/agents/main/allowlist/0/pattern",
            "at most 1024 characters",
        ),
        (
            {"version": 1, "agents": {"main": {"allowlist": [{"pattern": "ls", "argPattern": "x" * 1025}]}}},
            "/agents/main/allowlist/0/argPattern",
            "at most 1024 characters",
        ),
    ],
)
def test_an_invalid_document_is_refused_naming_the_field(raw, path, problem):
    with pytest.raises(PolicyDocumentError) as refused:
        ep.normalize_document(raw)
    assert (refused.value.path, refused.value.problem) == (path, problem)
    assert str(refused.value) == f"at {path}: {problem}"


def test_the_document_limits_on_agents_and_entries():
    agents = {f"agent-{i}": {} for i in range(ep.MAX_AGENTS)}
    assert len(ep.normalize_document({"version": 1, "agents": agents})["agents"]) == ep.MAX_AGENTS
    with pytest.raises(PolicyDocumentError, match="at /agents: at most 200 agents"):
        ep.normalize_document({"version": 1, "agents": {**agents, "one-more": {}}})

    entries = [{"pattern": f"cmd{i}"} for i in range(ep.MAX_ALLOWLIST_ENTRIES)]
    assert (
        len(
            ep.normalize_document({"version": 1, "agents": {"main": {"allowlist": entries}}})["agents"]["main"][
                "allowlist"
            ]
        )
        == 1000
    )
    with pytest.raises(PolicyDocumentError, match="at /agents/main/allowlist: at most 1000 entries"):
        ep.normalize_document({"version": 1, "agents": {"main": {"allowlist": [*entries, {"pattern": "x"}]}}})


def test_a_missing_document_has_openclaws_missing_hash():
    assert ep.document_hash(None) == "missing:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert ep.document_hash(ep.empty_document()) != ep.document_hash(None)


# --- resolution --------------------------------------------------------------------------------------


def test_without_a_document_an_agent_gets_this_projects_defaults_ask_on_a_miss():
    resolved = ep.resolved_policy(None, "main")
    assert (resolved.security, resolved.ask, resolved.ask_fallback, resolved.allowlist) == (
        "allowlist",
        "on-miss",
        "deny",
        (),
    )
    assert ep.resolved_defaults(None) == {
        "security": "allowlist",
        "ask": "on-miss",
        "askFallback": "deny",
        "autoAllowSkills": False,
    }


def test_agent_entries_override_the_wildcard_and_the_defaults_field_by_field():
    document = ep.normalize_document(
        {
            "version": 1,
            "defaults": {"security": "full", "ask": "off", "askFallback": "full"},
            "agents": {
                "*": {"ask": "always", "allowlist": [{"id": "w", "pattern": "ls"}]},
                "ops": {"security": "allowlist", "allowlist": [{"id": "o", "pattern": "git"}]},
            },
        }
    )
    ops = ep.resolved_policy(document, "ops")
    other = ep.resolved_policy(document, "other")
    assert (ops.security, ops.ask, ops.ask_fallback) == ("allowlist", "always", "full")
    assert [e["id"] for e in ops.allowlist] == ["w", "o"]
    assert (other.security, other.ask, other.ask_fallback) == ("full", "always", "full")
    assert [e["id"] for e in other.allowlist] == ["w"]
    # No agent id: the default agent, main.
    assert ep.resolved_policy(document, None) == ep.resolved_policy(document, "main")


@pytest.mark.parametrize(
    ("mode", "command", "decision"),
    [
        ("deny", "ls", "deny"),
        ("allowlist", "ls", "allow"),
        ("allowlist", "rm -rf /", "deny"),
        ("ask", "ls", "allow"),
        ("ask", "rm -rf /", "ask"),
        ("full", "rm -rf /", "allow"),
    ],
)
def test_the_four_modes_of_the_issue_map_to_security_and_ask(mode, command, decision):
    document = ep.normalize_document(
        {"version": 1, "defaults": ep.MODES[mode], "agents": {"main": {"allowlist": [{"pattern": "ls"}]}}}
    )
    assert verdict(ep.resolved_policy(document, "main"), command).decision == decision


# --- verdicts ----------------------------------------------------------------------------------------


def test_security_deny_denies_everything_even_an_allowlisted_command():
    result = verdict(policy("deny", "off", "full", entry("ls")), "ls")
    assert (result.decision, result.reason) == ("deny", "security=deny: the exec policy denies every command")


def test_security_full_runs_without_asking_unless_ask_always():
    assert verdict(policy("full", "off"), "rm -rf / $(id)").decision == "allow"
    assert verdict(policy("full", "on-miss"), "anything").decision == "allow"
    assert verdict(policy("full", "always"), "ls").decision == "ask"


def test_allowlist_match_miss_and_the_ask_modes():
    ls_only = (entry("ls"),)
    assert verdict(policy("allowlist", "off", "deny", *ls_only), "ls -la").decision == "allow"
    assert verdict(policy("allowlist", "off", "deny", *ls_only), "cat x").reason == "not on the allowlist (ask=off)"
    assert verdict(policy("allowlist", "on-miss", "deny", *ls_only), "cat x").decision == "ask"
    assert verdict(policy("allowlist", "on-miss", "deny", *ls_only), "ls").decision == "allow"
    # ask=always asks even for a match (and the match is reported).
    always = verdict(policy("allowlist", "always", "deny", *ls_only), "ls")
    assert (always.decision, always.matched_entry_id) == ("ask", "e-ls-None")


def test_every_segment_of_a_chain_must_match():
    p = policy("allowlist", "off", "deny", entry("git"), entry("less"))
    assert verdict(p, "git status && git diff | less").decision == "allow"
    chain = verdict(p, "git status; git log\ngit diff || less")
    assert chain.matched_entry_ids == ("e-git-None", "e-git-None", "e-git-None", "e-less-None")
    assert verdict(p, "git status && rm -rf /").decision == "deny"
    assert verdict(p, "git status | cat").decision == "deny"


@pytest.mark.parametrize(
    "command",
    [
        "ls $(rm -rf /)",
        "ls `id`",
        "ls $HOME",
        'ls "$HOME"',
        "ls > /etc/passwd",
        "ls < x",
        "ls 2>&1",
        "ls &",
        "(ls)",
        "ls *.py",
        "ls ~",
        "ls {a,b}",
        "FOO=bar ls",
        "if ls; then ls; fi",
        "ls # comment",
        "ls 'unterminated",
        'ls "unterminated',
        "ls &&",
        "&& ls",
        "ls ;; ls",
        "ls |& ls",
        "",
        "   ",
    ],
)
def test_substitution_redirection_expansion_and_unparsable_commands_are_never_a_match(command):
    anything = policy("allowlist", "off", "deny", entry("*"), entry("ls"))
    assert ep.shell_segments(command) is None
    assert verdict(anything, command).decision == "deny"
    # The bare wildcard entry allows any plain command, but not these.
    assert verdict(anything, "ls -la && echo hi").decision == "allow"


def test_quotes_and_backslashes_are_removed_as_the_shell_removes_them():
    assert ep.shell_segments("echo 'a b' \"c \\\"d\\\"\" e\\ f 'it'\\''s'") == [["echo", "a b", 'c "d"', "e f", "it's"]]
    assert ep.shell_segments("ls \\\n  -la") == [["ls", "-la"]]
    assert ep.shell_segments("ls;") == [["ls"]]
    assert ep.shell_segments("ls &&\n  cat x") == [["ls"], ["cat", "x"]]


def test_bare_names_match_only_commands_invoked_by_name_and_paths_match_the_resolved_executable():
    by_name = policy("allowlist", "off", "deny", entry("python*"))
    assert verdict(by_name, "python3 -V").decision == "allow"
    assert verdict(by_name, "./python3 -V").decision == "deny"  # a path, not the name
    assert verdict(by_name, "/usr/bin/python3 -V").decision == "deny"

    by_path = policy("allowlist", "off", "deny", entry("/usr/bin/*"))
    assert verdict(by_path, "python3 -V").decision == "allow"  # found on PATH under /usr/bin
    assert verdict(by_path, "/usr/bin/python3").decision == "allow"
    assert verdict(by_path, "/usr/bin/../../tmp/evil").decision == "deny"  # normalized first
    assert verdict(by_path, "/usr/bin/sub/dir/tool").decision == "deny"  # * stops at /
    assert verdict(policy("allowlist", "off", "deny", entry("/usr/**")), "/usr/bin/sub/dir/tool").decision == "allow"
    assert verdict(by_path, "notonpath").decision == "deny"  # nothing resolved, no path match

    relative = policy("allowlist", "off", "deny", entry(f"{ROOT_CWD}/scripts/*.sh"))
    assert verdict(relative, "./scripts/build.sh").decision == "allow"
    assert verdict(relative, "./scripts/build.sh", cwd=None).decision == "deny"  # nowhere to resolve it from


def test_arg_patterns_search_the_arguments_joined_by_spaces():
    git_read = policy("allowlist", "off", "deny", entry("git", "^(status|diff|log)( |$)"))
    assert verdict(git_read, "git status").decision == "allow"
    assert verdict(git_read, "git log --oneline").decision == "allow"
    assert verdict(git_read, "git push --force").decision == "deny"
    # A search, not a full match (OpenClaw's RegExp.test): an unanchored pattern matches anywhere.
    loose = policy("allowlist", "off", "deny", entry("rm", "-i"))
    assert verdict(loose, "rm -rf -i /").decision == "allow"
    # An entry with an argPattern is preferred to one for any arguments when both match.
    both = policy("allowlist", "off", "deny", entry("git"), entry("git", "status"))
    assert verdict(both, "git status").matched_entry_id == "e-git-status"


def test_fallback_verdicts_when_nobody_answered():
    ls_only = (entry("ls"),)
    assert (
        ep.fallback_verdict(policy("allowlist", "on-miss", "deny", *ls_only), "ls", ROOT_CWD, which=WHICH).decision
        == "deny"
    )
    assert (
        ep.fallback_verdict(policy("allowlist", "on-miss", "full", *ls_only), "rm x", ROOT_CWD, which=WHICH).decision
        == "allow"
    )
    allowlist_fallback = policy("allowlist", "always", "allowlist", *ls_only)
    assert ep.fallback_verdict(allowlist_fallback, "ls", ROOT_CWD, which=WHICH).decision == "allow"
    assert ep.fallback_verdict(allowlist_fallback, "rm x", ROOT_CWD, which=WHICH).decision == "deny"


# --- allow-always -------------------------------------------------------------------------------------


def test_allow_always_binds_the_exact_argv_and_the_directory():
    entries = ep.allow_always_entries("git push origin main", ROOT_CWD, now_ms=5)
    assert len(entries) == 1
    made = entries[0]
    assert made["pattern"] == "git" and made["source"] == "allow-always" and made["lastUsedAt"] == 5
    assert made["argPattern"] == ep.cwd_argv_hash(["git", "push", "origin", "main"], ROOT_CWD)
    document = ep.normalize_document({"version": 1, "agents": {"main": {"allowlist": entries}}})
    kept = ep.resolved_policy(document, "main")
    strict = Policy("allowlist", "off", "deny", kept.allowlist)

    assert verdict(strict, "git push origin main").decision == "allow"
    assert verdict(strict, "git  push 'origin' main").decision == "allow"  # the same argv
    assert verdict(strict, "git push origin main --force").decision == "deny"
    assert verdict(strict, "git push origin main", cwd="/srv/other").decision == "deny"
    assert verdict(strict, "git push origin main", cwd=None).decision == "deny"
    assert verdict(strict, "git push origin main && rm -rf /").decision == "deny"


def test_allow_always_of_a_chain_keeps_each_segment_and_of_a_path_its_location():
    entries = ep.allow_always_entries("./build.sh --fast && make test && make test", ROOT_CWD)
    assert [e["pattern"] for e in entries] == [f"{ROOT_CWD}/build.sh", "make"]  # duplicates once
    kept = Policy("allowlist", "off", "deny", tuple(entries))
    assert verdict(kept, "./build.sh --fast && make test").decision == "allow"
    assert verdict(kept, f"{ROOT_CWD}/build.sh --fast").decision == "allow"  # the same executable


def test_allow_always_is_unavailable_without_a_directory_or_for_what_never_matches():
    assert ep.allow_always_entries("ls", None) == []
    assert ep.allow_always_entries("ls", "relative/dir") == []
    assert ep.allow_always_entries("ls $(id)", ROOT_CWD) == []
    assert ep.allow_always_entries(["we*rd", "x"], ROOT_CWD) == []  # a glob cannot pin that name
    assert len(ep.allow_always_entries(["ls", "-la"], ROOT_CWD)) == 1  # an argv runs without a shell


def test_generated_entries_never_match_by_regex_or_without_their_hash_and_legacy_hashes_never_match():
    generated_any_args = policy("allowlist", "off", "deny", entry("ls", source="allow-always"))
    assert verdict(generated_any_args, "ls").decision == "deny"
    generated_regex = policy("allowlist", "off", "deny", entry("ls", ".*", source="allow-always"))
    assert verdict(generated_regex, "ls -la").decision == "deny"
    legacy = policy("allowlist", "off", "deny", entry("ls", "sha256:argv:" + "0" * 64))
    assert verdict(legacy, "ls").decision == "deny"


def test_the_cwd_argv_hash_is_openclaws_form():
    # Computed by OpenClaw 2026.9.6's buildCwdBoundHashedArgPattern for the same argv and directory.
    assert ep.cwd_argv_hash(["ls", "-la"], "/tmp") == (
        "sha256:cwd-argv:v1:0eae1d4f905e0fa3d0dc518f8e6e1bfc17fe9dd1620d5e1889a3c3cab4ce85ce"
    )
    assert ep.cwd_argv_hash(["echo", "héllo", "a b"], "/home/x/") == (
        "sha256:cwd-argv:v1:e8cf8ccac5046735dbcf05d71ae65dfb2771e97de82c4fdca1a48dc768fe1187"
    )


# --- combining and snapshots -------------------------------------------------------------------------


def test_combine_takes_the_stricter_setting_and_the_nodes_allowlist():
    gateway = policy("full", "off", "full", entry("gw-only"))
    node = policy("allowlist", "on-miss", "allowlist", entry("node-only"))
    combined = ep.combine(gateway, node)
    assert (combined.security, combined.ask, combined.ask_fallback) == ("allowlist", "on-miss", "allowlist")
    assert [e["pattern"] for e in combined.allowlist] == ["node-only"]
    assert ep.combine(policy("deny", "off", "full"), node).security == "deny"
    assert ep.combine(policy("full", "always", "full"), policy("full", "off", "full")).ask == "always"


def test_a_policy_snapshot_round_trips_through_json_and_is_checked():
    original = policy("allowlist", "always", "allowlist", entry("ls", "^-l"))
    snapshot = json.loads(json.dumps(original.snapshot()))
    assert Policy.from_snapshot(snapshot) == original
    with pytest.raises(PolicyDocumentError, match="at /security: must be one of"):
        Policy.from_snapshot({**snapshot, "security": "sometimes"})
    with pytest.raises(PolicyDocumentError, match="at /allowlist: is required"):
        Policy.from_snapshot({k: v for k, v in snapshot.items() if k != "allowlist"})


def test_the_module_imports_nothing_but_the_standard_library():
    # As a worker child runs it: a fresh interpreter without site-packages, the module alone; all it loaded is stdlib.
    code = (
        "import sys, importlib.util\n"
        "spec = importlib.util.spec_from_file_location('exec_policy', sys.argv[1])\n"
        "module = sys.modules['exec_policy'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "loaded = {m.split('.')[0] for m in sys.modules} - {'exec_policy', '__main__'}\n"
        "third = sorted(loaded - set(sys.stdlib_module_names))\n"
        "print(','.join(third))\n"
    )
    found = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, ep.__file__], capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == ""
