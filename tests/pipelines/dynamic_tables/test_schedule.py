"""When dynamic tables refresh (issue 19, "Scheduling"), on a controllable clock.

The clock is a plain integer of microseconds that the tests step; nothing sleeps and no Spark
runs. ``Loop`` plays the scheduler's part: at each step it asks what is due, records every
refresh as run and its tick as handled. The expected times are the reference's (004), from
2022-12-01T00:00:00Z, written as the reference writes them.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.dynamic_tables.schedule import (
    MAX_TARGET_LAG_US,
    MIN_TARGET_LAG_US,
    Node,
    Refresh,
    TargetLag,
    check_graph,
    due,
    effective_periods,
    format_target_lag,
    parse_target_lag,
    period,
    topological,
)

S = 1_000_000
MIN = 60 * S
T0 = int(datetime(2022, 12, 1, tzinfo=UTC).timestamp()) * S


def at(clock: str) -> int:
    """'00:01:36' on 2022-12-01 in µs since the epoch."""
    h, m, s = (int(part) for part in clock.split(":"))
    return T0 + ((h * 60 + m) * 60 + s) * S


def clock_text(us: int) -> str:
    return datetime.fromtimestamp(us // S, UTC).strftime("%H:%M:%S")


class Loop:
    """The scheduler's loop on a controllable clock: ask what is due, run it, remember the
    handled ticks (``last``) and what ran when (``log`` of (now, refresh))."""

    def __init__(self, nodes, now=T0):
        self.nodes = list(nodes)
        self.now = now
        self.last: dict[str, int | None] = {}
        self.log: list[tuple[int, Refresh]] = []

    def step(self, now):
        assert now >= self.now, "the clock only moves forward"
        self.now = now
        refreshes = due(self.nodes, self.last, now)
        for refresh in refreshes:
            self.last[refresh.name] = refresh.tick_us
            self.log.append((now, refresh))
        return refreshes

    def run_until(self, end, every=S):
        for now in range(self.now, end + 1, every):
            self.step(now)

    def timeline(self):
        """{'00:01:36': ['B', 'A'], ...}: the tables refreshed for each data timestamp."""
        ticks = defaultdict(list)
        for _, refresh in self.log:
            ticks[clock_text(refresh.tick_us)].append(refresh.name)
        return dict(ticks)

    def ticks(self, name):
        """Seconds after T0 of ``name``'s refreshes."""
        return [(r.tick_us - T0) // S for _, r in self.log if r.name == name]


# The reference's examples


def test_a_2_minutes_reading_b_1_minute_b_every_48_s_a_every_96_s_together_at_0_and_1_36():
    loop = Loop([Node("A", 2 * MIN, ("B",)), Node("B", MIN)])
    loop.run_until(at("00:03:12"))
    assert loop.timeline() == {
        "00:00:00": ["B", "A"],
        "00:00:48": ["B"],
        "00:01:36": ["B", "A"],
        "00:02:24": ["B"],
        "00:03:12": ["B", "A"],
    }
    # Each ran when the clock reached its data timestamp (the clock steps by 1 s).
    assert all(0 <= now - r.tick_us < S and r.skipped_ticks == 0 for now, r in loop.log)


def test_a_5_minutes_reading_b_5_minutes_and_c_1_minute_coincides_with_c():
    nodes = [Node("A", 5 * MIN, ("B", "C")), Node("B", 5 * MIN), Node("C", MIN)]
    check_graph(nodes)
    loop = Loop(nodes)
    loop.run_until(at("00:06:24"))
    assert loop.timeline() == {
        "00:00:00": ["B", "C", "A"],
        "00:00:48": ["C"],
        "00:01:36": ["C"],
        "00:02:24": ["C"],
        "00:03:12": ["B", "C", "A"],
        "00:04:00": ["C"],
        "00:04:48": ["C"],
        "00:05:36": ["C"],
        "00:06:24": ["B", "C", "A"],
    }


def test_a_4_minutes_reading_b_5_minutes_is_refused_with_the_lag_to_set():
    nodes = [Node("A", 4 * MIN, ("B", "C")), Node("B", 5 * MIN), Node("C", MIN)]
    message = (
        "A's target lag 4 minutes is shorter than 5 minutes of B, which A reads; "
        "set TARGET_LAG to at least 5 minutes"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        check_graph(nodes)


def test_a_lag_shorter_than_one_read_through_a_downstream_table_is_refused():
    nodes = [Node("U", 10 * MIN), Node("X", None, ("U",)), Node("D", MIN, ("X",))]
    with pytest.raises(ValueError) as refused:
        check_graph(nodes)
    text = str(refused.value)
    assert "D's target lag 1 minute is shorter than 10 minutes of U" in text
    assert "through X" in text and "at least 10 minutes" in text


def test_the_refusal_asks_for_the_longest_upstream_lag():
    nodes = [Node("A", MIN, ("B", "C")), Node("B", 2 * MIN), Node("C", 5 * MIN)]
    with pytest.raises(ValueError, match="at least 5 minutes"):
        check_graph(nodes)


CHAIN = range(0, 1537, 384)  # 0 .. 4 periods of 384 s: the period of a 10 minute lag


@pytest.mark.parametrize(
    ("dt1", "dt2", "dt1_ticks", "dt2_ticks"),
    [
        pytest.param(
            None, 10 * MIN, CHAIN, CHAIN, id="DT1 DOWNSTREAM, DT2 10 min: both every 384 s"
        ),
        pytest.param(10 * MIN, None, CHAIN, [], id="DT1 10 min, DT2 DOWNSTREAM: DT2 never"),
        pytest.param(
            5 * MIN, 10 * MIN, range(0, 1537, 192), CHAIN, id="DT1 5 min, DT2 10 min: coinciding"
        ),
        pytest.param(None, None, [], [], id="both DOWNSTREAM: none scheduled"),
    ],
)
def test_the_reference_downstream_chains(dt1, dt2, dt1_ticks, dt2_ticks):
    nodes = [Node("DT1", dt1), Node("DT2", dt2, ("DT1",))]
    check_graph(nodes)
    loop = Loop(nodes)
    loop.run_until(T0 + 1536 * S, every=4 * S)
    assert loop.ticks("DT1") == list(dt1_ticks)
    assert loop.ticks("DT2") == list(dt2_ticks)
    # Whenever DT2 refreshes, DT1 refreshed for the same data timestamp just before it.
    order = [(r.tick_us, r.name) for _, r in loop.log]
    for tick, name in order:
        if name == "DT2":
            assert order.index((tick, "DT1")) < order.index((tick, "DT2"))


def test_a_downstream_table_refreshes_as_often_as_its_most_demanding_reader():
    nodes = [Node("X", None), Node("fast", MIN, ("X",)), Node("slow", 10 * MIN, ("X",))]
    periods = effective_periods(nodes)
    assert periods["X"] == periods["fast"] == 48 * S
    assert periods["slow"] == 384 * S


# Periods


@pytest.mark.parametrize(
    ("lag", "expected"),
    [(MIN, 48 * S), (2 * MIN, 96 * S), (5 * MIN, 192 * S), (5 * S, 3 * S), (10 * MIN, 384 * S), (S, 750_000)],
)  # fmt: skip
def test_period_of_the_reference_lags(lag, expected):
    assert period(lag) == expected


@given(
    st.integers(MIN_TARGET_LAG_US, MAX_TARGET_LAG_US),
    st.integers(MIN_TARGET_LAG_US, MAX_TARGET_LAG_US),
)
def test_periods_leave_a_fifth_of_the_lag_and_divide_each_other(lag, other):
    p = period(lag)
    assert 5 * p <= 4 * lag < 10 * p  # at most 0.8 * lag, and the largest such on the ladder
    assert (p * 64) % (48 * S) == 0 and ((p * 64) // (48 * S)).bit_count() == 1
    small, large = sorted([p, period(other)])
    assert large % small == 0  # every slower period is a multiple of every faster one


def test_period_refuses_a_lag_under_a_second():
    with pytest.raises(ValueError):
        period(S - 1)


# Skipping


def test_a_stalled_clock_runs_the_latest_tick_once_and_reports_the_others_skipped():
    loop = Loop([Node("B", MIN)])
    assert loop.step(T0) == [Refresh("B", T0)]
    assert loop.step(T0 + 10 * 48 * S + 5 * S) == [
        Refresh("B", T0 + 480 * S, skipped_ticks=9, last_skipped_us=T0 + 432 * S)
    ]
    assert loop.step(T0 + 500 * S) == []  # no backlog left to work off
    assert loop.step(T0 + 528 * S) == [Refresh("B", T0 + 528 * S)]


def test_after_a_stall_a_graph_still_refreshes_for_one_data_timestamp():
    loop = Loop([Node("A", 2 * MIN, ("B",)), Node("B", MIN)])
    loop.step(T0)
    assert loop.step(T0 + 485 * S) == [
        Refresh("B", T0 + 480 * S, skipped_ticks=9, last_skipped_us=T0 + 432 * S),
        Refresh("A", T0 + 480 * S, skipped_ticks=4, last_skipped_us=T0 + 384 * S),
    ]


def test_a_stall_ending_between_a_readers_ticks_refreshes_the_upstream_for_the_reader():
    # B every 48 s, A every 96 s, nothing ran from 0:00:00 until 0:02:30: A's latest tick is
    # 0:01:36, B's 0:02:24. A at 0:01:36 reads B at 0:01:36, so B runs then too.
    loop = Loop([Node("A", 2 * MIN, ("B",)), Node("B", MIN)])
    loop.step(at("00:00:00"))
    assert loop.step(at("00:02:30")) == [
        Refresh("B", at("00:01:36"), skipped_ticks=1, last_skipped_us=at("00:00:48")),
        Refresh("A", at("00:01:36")),
        Refresh("B", at("00:02:24")),
    ]


def test_a_new_table_starts_at_its_latest_tick_without_skips():
    assert due([Node("B", MIN)], {}, T0 + 30 * S) == [Refresh("B", T0)]


def test_after_the_initial_refresh_the_next_tick_is_due():
    # Created (and refreshed for its data timestamp) at 0:00:30: nothing until 0:00:48.
    last = {"B": T0 + 30 * S}
    assert due([Node("B", MIN)], last, T0 + 47 * S) == []
    assert due([Node("B", MIN)], last, T0 + 48 * S) == [Refresh("B", T0 + 48 * S)]


def test_a_changed_lag_skips_from_the_last_handled_tick_on_the_new_grid():
    # Ran at 0:01:36 with 2 minutes; now 1 minute (48 s): 2:24, 3:12, 4:00 were missed.
    last = {"B": at("00:01:36")}
    assert due([Node("B", MIN)], last, at("00:01:40")) == []
    assert due([Node("B", MIN)], last, at("00:04:50")) == [
        Refresh("B", at("00:04:48"), skipped_ticks=3, last_skipped_us=at("00:04:00"))
    ]


# Suspend and resume


def test_suspend_stops_the_table_and_a_downstream_table_only_it_needs():
    def graph(a_active):
        return [
            Node("X", None),  # read by A and C
            Node("Y", None),  # read by A only
            Node("A", MIN, ("X", "Y"), active=a_active),
            Node("C", 5 * MIN, ("X",)),
        ]

    loop = Loop(graph(True))
    loop.run_until(at("00:03:12"))
    assert {name: loop.ticks(name)[-1] for name in "ACXY"} == {
        "A": 192,
        "C": 192,
        "X": 192,
        "Y": 192,
    }
    loop.nodes = graph(False)
    loop.run_until(at("00:09:36"))
    assert loop.ticks("A")[-1] == loop.ticks("Y")[-1] == 192
    after = {name: [t for t in loop.ticks(name) if t > 192] for name in "CX"}
    assert after == {"C": [384, 576], "X": [384, 576]}  # X goes on for C, at C's pace
    loop.nodes = graph(True)
    resumed = loop.step(at("00:10:00"))
    # X already holds 0:09:36 (for C); the ticks A and Y missed while suspended are
    # reported skipped, not run.
    assert resumed == [
        Refresh("Y", at("00:09:36"), skipped_ticks=7, last_skipped_us=at("00:08:48")),
        Refresh("A", at("00:09:36"), skipped_ticks=7, last_skipped_us=at("00:08:48")),
    ]


def test_downstream_tables_pass_on_what_their_readers_need():
    chain = [Node("X", None), Node("Y", None, ("X",)), Node("A", MIN, ("Y",))]
    assert effective_periods(chain) == {"X": 48 * S, "Y": 48 * S, "A": 48 * S}
    # Through a suspended DOWNSTREAM table nothing is needed: A's refreshes would skip.
    chain[1] = Node("Y", None, ("X",), active=False)
    assert effective_periods(chain) == {"X": None, "Y": None, "A": 48 * S}


def test_a_suspended_upstream_has_no_period_but_its_readers_keep_theirs():
    periods = effective_periods([Node("B", MIN, active=False), Node("A", 2 * MIN, ("B",))])
    assert periods == {"B": None, "A": 96 * S}


# Graph rules


@pytest.mark.parametrize(
    ("nodes", "cycle"),
    [
        ([Node("A", MIN, ("A",))], "A reads A"),
        ([Node("A", MIN, ("B",)), Node("B", MIN, ("A",))], "A reads B reads A"),
        (
            [
                Node("A", None, ("B",)),
                Node("B", None, ("C",)),
                Node("C", None, ("A",)),
                Node("D", MIN, ("A",)),
            ],
            "A reads B reads C reads A",
        ),
    ],
)
def test_cycles_are_refused_naming_the_cycle(nodes, cycle):
    for check in (check_graph, topological, effective_periods):
        with pytest.raises(ValueError, match=re.escape(cycle)):
            check(nodes)
    with pytest.raises(ValueError, match=re.escape(cycle)):
        due(nodes, {}, T0)


def test_topological_order_is_upstream_first_and_independent_of_input_order():
    nodes = [Node("c", None), Node("a", None, ("c", "b")), Node("b", None), Node("d", None, ("a",))]
    expected = topological(nodes)
    assert expected == ["b", "c", "a", "d"]
    assert topological(nodes[::-1]) == topological(nodes[1:] + nodes[:1]) == expected


def test_sources_that_are_not_dynamic_tables_are_ignored():
    nodes = [Node("A", MIN, ("orders", "B")), Node("B", MIN, ("orders",))]
    check_graph(nodes)
    assert topological(nodes) == ["B", "A"]


def test_a_name_given_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        topological([Node("A", MIN), Node("A", None)])


def test_a_node_with_a_lag_out_of_range_is_refused():
    with pytest.raises(ValueError, match="A's target lag"):
        check_graph([Node("A", 500_000)])


# TARGET_LAG text


@pytest.mark.parametrize(
    ("text", "lag_us", "canonical"),
    [
        ("5 seconds", 5 * S, "5 seconds"),
        ("1 second", S, "1 second"),
        ("1 MINUTE", MIN, "1 minute"),
        ("  2 Hours ", 2 * 3600 * S, "2 hours"),
        ("7 days", MAX_TARGET_LAG_US, "7 days"),
        ("120 seconds", 2 * MIN, "2 minutes"),
        ("05\tminutes", 5 * MIN, "5 minutes"),
        ("604800 seconds", MAX_TARGET_LAG_US, "7 days"),
        ("DOWNSTREAM", None, "DOWNSTREAM"),
        ("downstream", None, "DOWNSTREAM"),
    ],
)
def test_target_lag_text(text, lag_us, canonical):
    lag = parse_target_lag(text)
    assert lag == TargetLag(lag_us)
    assert format_target_lag(lag) == str(lag) == canonical


BAD = [
    "", " ", "5", "minutes", "0 seconds", "00 minutes", "-5 minutes", "+5 minutes", "1.5 seconds",
    "5 weeks", "500 ms", "8 days", "604801 seconds", "DOWNSTREAM 5", "'5 minutes'",
    "5 minutes ago", "1e3 seconds", "1_000 seconds", "0x10 seconds", "\u0665 minutes",
    "1 \u017fecond", "down\u017ftream", "5\u00a0minutes", "5 minutes\x00", "9" * 5000 + " seconds",
    "5 secondss", "5 m s", "5..0 s", ". s",
]  # fmt: skip


@pytest.mark.parametrize("text", BAD)
def test_bad_target_lags_are_refused_naming_the_accepted_forms(text):
    with pytest.raises(ValueError) as refused:
        parse_target_lag(text)
    assert str(refused.value).startswith("TARGET_LAG ")
    assert "'5 seconds', '5 second', '5 sec', '5 s' or '5s'" in str(refused.value)
    assert "DOWNSTREAM" in str(refused.value)


@pytest.mark.parametrize(
    "text", ["90 seconds", "90 second", "90 sec", "90 s", "90s", "90 SECS", "1.5 minutes",
             "1.5 min", "1.5m", "1.5 MINUTE", "0.025 hours", "0.025h", "90000 ms"],
)  # fmt: skip
def test_every_spelling_of_the_one_duration_grammar_is_a_lag(text):
    assert parse_target_lag(text) == TargetLag(90 * S)


def test_target_lag_values_out_of_range_are_refused():
    for lag_us in (0, S - 1, S + 1, MAX_TARGET_LAG_US + S):
        with pytest.raises(ValueError):
            TargetLag(lag_us)


@given(st.integers(1, MAX_TARGET_LAG_US // S))
def test_format_then_parse_round_trips(seconds):
    lag = TargetLag(seconds * S)
    assert parse_target_lag(format_target_lag(lag)) == lag


UNITS = {"second": S, "minute": MIN, "hour": 3600 * S, "day": 86400 * S}


@given(
    st.integers(0, 10**6),
    st.sampled_from(sorted(UNITS)),
    st.booleans(),
    st.lists(st.booleans(), min_size=7, max_size=7),
    st.sampled_from(["", " ", "\t", "  "]),
    st.sampled_from([" ", "\t", "   "]),
)
def test_written_forms_parse_to_their_value_and_format_canonically(
    n, unit, plural, upper, pad, gap
):
    word = "".join(c.upper() if u else c for c, u in zip(unit + "s" * plural, upper, strict=False))
    text = f"{pad}{n}{gap}{word}{pad}"
    lag_us = n * UNITS[unit]
    if not MIN_TARGET_LAG_US <= lag_us <= MAX_TARGET_LAG_US:
        with pytest.raises(ValueError):
            parse_target_lag(text)
        return
    lag = parse_target_lag(text)
    assert lag.lag_us == lag_us
    canonical = format_target_lag(lag)
    assert parse_target_lag(canonical) == lag
    assert format_target_lag(parse_target_lag(canonical)) == canonical


PIECES = ["1", "5", "0", "9" * 30, " ", "\t", "\n", "\u00a0", "-", ".", "seconds", "minute", "HOURS", "day", "s", "DOWNSTREAM", "'", "\u017f", "\u0665", "\x00"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(st.sampled_from(PIECES), max_size=6).map("".join)))
def test_any_text_is_a_target_lag_or_a_value_error(text):
    try:
        lag = parse_target_lag(text)
    except ValueError as exc:
        assert "DOWNSTREAM" in str(exc)
    else:
        assert parse_target_lag(format_target_lag(lag)) == lag


# Properties of the schedule on random graphs and clocks

LAGS = [None, 5 * S, MIN, 2 * MIN, 5 * MIN, 10 * MIN]


@st.composite
def graphs(draw):
    """Valid graphs: each table reads earlier ones; a time lag is raised to the longest
    time lag upstream of it, as the lag rule asks."""
    nodes: dict[str, Node] = {}
    for i in range(draw(st.integers(1, 6))):
        upstream = (
            tuple(draw(st.lists(st.sampled_from(sorted(nodes)), unique=True, max_size=3)))
            if nodes
            else ()
        )
        lag = draw(st.sampled_from(LAGS))
        if lag is not None:
            seen, pending = set(), list(upstream)
            while pending:
                up = nodes[pending.pop()]
                if up.name not in seen:
                    seen.add(up.name)
                    pending.extend(up.upstream)
                    lag = max(lag, up.lag_us or 0)
        active = draw(st.sampled_from([True, True, True, False]))
        nodes[f"T{i}"] = Node(f"T{i}", lag, upstream, active)
    return list(nodes.values())


@settings(max_examples=150, deadline=None)
@given(graphs(), st.integers(0, 10**7), st.lists(st.integers(1, 2000 * S), min_size=1, max_size=25))
def test_due_on_any_graph_and_clock(nodes, start, steps):
    check_graph(nodes)  # the generator builds what the lag rule allows
    periods = effective_periods(nodes)
    order = topological(nodes)
    upstream = {node.name: set(node.upstream) for node in nodes}
    loop = Loop(nodes, now=T0 + start)
    ran: set[tuple[str, int]] = set()
    first: dict[str, int] = {}
    accounted: dict[str, int] = defaultdict(int)
    now = loop.now
    for step in [0, *steps]:
        now += step
        refreshes = loop.step(now)
        keys = [(r.tick_us, order.index(r.name)) for r in refreshes]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        # No backlog: a table runs at most once per distinct period (its own, its readers').
        runs = Counter(r.name for r in refreshes)
        assert max(runs.values(), default=0) <= len({p for p in periods.values() if p})
        for r in refreshes:
            p = periods[r.name]
            assert p is not None, "only tables with a period are scheduled"
            assert r.tick_us <= now and r.tick_us % p == 0
            # Snapshot: every scheduled upstream has refreshed for this data timestamp.
            for up in upstream[r.name]:
                if periods.get(up) is not None:
                    assert (up, r.tick_us) in ran, (up, r)
            ran.add((r.name, r.tick_us))
            first.setdefault(r.name, r.tick_us)
            accounted[r.name] += 1 + r.skipped_ticks
            assert r.last_skipped_us == (r.tick_us - p if r.skipped_ticks else None)
        for name, p in periods.items():
            if p is not None:  # the latest tick has been handled, none later
                assert loop.last[name] == now // p * p
    for name, p in periods.items():
        if p is not None:  # every tick since the first was run or reported skipped, once
            assert accounted[name] == (loop.last[name] - first[name]) // p + 1
        else:
            assert name not in first
