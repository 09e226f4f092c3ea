"""``bench/gateway_bench.py --against``, repeatable: each other gateway with its token, pid and label in order,
every one measured once per round, and the side-by-side table with a column and a ratio for each."""

from __future__ import annotations

import pytest

from bench import gateway_bench


def _args(*argv: str):
    return gateway_bench.parse_args(list(argv))


def test_each_against_takes_its_token_pid_and_label_in_order():
    args = _args(
        *("--against", "ws://127.0.0.1:1", "--against-token", "t1", "--against-pid", "11"),
        *("--against-label", "before"),
        *("--against", "ws://127.0.0.1:2", "--against-token", "t2", "--against-pid", "0"),
        *("--against-label", "openclaw"),
    )
    targets = gateway_bench.other_targets(args)
    assert [(t.name, t.url, t.token, t.pid) for t in targets] == [
        ("before", "ws://127.0.0.1:1", "t1", 11),
        ("openclaw", "ws://127.0.0.1:2", "t2", None),  # 0: a gateway whose process is not known here
    ]


def test_without_labels_or_pids_the_others_are_numbered_and_their_processes_unknown():
    one = gateway_bench.other_targets(_args("--against", "ws://a", "--against-token", "t"))
    two = gateway_bench.other_targets(
        _args("--against", "ws://a", "--against-token", "t", "--against", "ws://b", "--against-token", "u")
    )
    assert [(t.name, t.pid) for t in one] == [("other", None)]
    assert [(t.name, t.pid) for t in two] == [("other-1", None), ("other-2", None)]


TWO = ("--against", "ws://a", "--against-token", "t", "--against", "ws://b", "--against-token", "u")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--against", "ws://a"), "each --against needs its --against-token"),
        (("--against", "ws://a", "--against-token", "t", "--against-token", "u"), "each --against needs"),
        (("--against-token", "t"), "each --against needs"),
        ((*TWO, "--against-pid", "5"), "--against-pid is given for every --against"),
        ((*TWO, "--against-label", "x", "--against-label", "x"), "must differ"),
        (("--against", "ws://a", "--against-token", "t", "--against-label", "project"), "must differ"),
        (("--url", "ws://a", "--token", "t", "--against", "ws://b", "--against-token", "u"), "one or the other"),
    ],
)
def test_against_options_that_do_not_line_up_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        _args(*argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_every_target_is_measured_once_per_round_in_the_same_order():
    targets = [gateway_bench.Target(name=name, url=f"ws://{name}", token="t") for name in ("project", "a", "b")]
    order = gateway_bench.alternating(targets, 2)
    assert [t.name for t in order] == ["project", "a", "b", "project", "a", "b"]


def _result(target: str, scale: float, *, floor: bool = False) -> dict:
    result = {
        "target": target,
        "handshake": {"newDevice": {"p50": 10.0 * scale}, "knownDevice": {"p50": 5.0 * scale}},
        "latency": {"health": {"p50": 1.0 * scale, "p99": 2.0 * scale}},
        "throughput": {"health": {"connections": 8, "callsPerSecond": 1000.0 / scale}},
    }
    if floor:
        result["floor"] = {
            "handshake": {"p50": 2.0},
            "latency": {"p50": 0.5, "p99": 1.0},
            "throughput": {"callsPerSecond": 4000.0},
        }
    return result


def test_the_side_by_side_table_has_a_column_and_a_ratio_for_each_other_gateway():
    runs = [
        _result("project", 1.0, floor=True),
        _result("before", 2.0),
        _result("openclaw", 4.0),
        _result("project", 1.0, floor=True),
        _result("before", 2.0),
        _result("openclaw", 4.0),
    ]
    lines = gateway_bench.render_side_by_side(runs, ["before", "openclaw"])
    header = lines[1].split()
    assert header == ["figure", "project", "before", "openclaw", "project/before", "project/openclaw", "project/floor"]
    row = next(line for line in lines if line.startswith("health p50, one connection (ms)"))
    assert row.split()[-5:] == ["2.00", "4.00", "0.50x", "0.25x", "2.00x"]
    calls = next(line for line in lines if line.startswith("health calls/s"))
    assert calls.split()[-6:] == ["500.00", "250.00", "2.00x", "4.00x", "25", "%"]


def test_a_figure_another_gateway_lacks_shows_as_a_dash():
    other = _result("openclaw", 2.0)
    other["latency"] = {}
    runs = [_result("project", 1.0, floor=True), other]
    lines = gateway_bench.render_side_by_side(runs, ["openclaw"])
    row = next(line for line in lines if line.startswith("health p50, one connection (ms)"))
    assert row.split()[-3:] == ["-", "-", "2.00x"]
