"""Plans over stand-ins kept between refreshes (pipelines.incremental.plan_cache): reused
only for the same bound text over the same stand-ins, and a refresh through a kept plan
gives the query's answer."""

from __future__ import annotations

import string
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_sdk.schema import TableSchema
from pipelines.incremental import plan_cache
from tests.pipelines.dynamic_tables.checks import assert_same_as_query


def _info(table_id: int, columns: str = "ID NUMBER, V VARCHAR"):
    declarations = dict(column.split(" ", 1) for column in columns.split(", "))
    return SimpleNamespace(id=table_id, schema=TableSchema.parse(declarations))


def test_the_key_names_stand_ins_by_position_and_what_they_stand_for():
    a = plan_cache._key("SELECT * FROM ingest_v7 JOIN ingest_v9", {"ingest_v7": _info(1),
                                                                   "ingest_v9": _info(2)})
    b = plan_cache._key("SELECT * FROM INGEST_V70 JOIN ingest_v91", {"ingest_v70": _info(1),
                                                                     "ingest_v91": _info(2)})
    swapped = plan_cache._key("SELECT * FROM ingest_v7 JOIN ingest_v9", {"ingest_v7": _info(2),
                                                                         "ingest_v9": _info(1)})
    wider = plan_cache._key("SELECT * FROM ingest_v7 JOIN ingest_v9",
                            {"ingest_v7": _info(1, "ID NUMBER, V VARCHAR, W NUMBER"),
                             "ingest_v9": _info(2)})  # fmt: skip
    assert a is not None and a == b
    assert swapped != a and wider != a


def test_text_that_spells_a_made_view_twice_or_names_another_is_not_cached():
    views = {"ingest_v7": _info(1)}
    assert plan_cache._key("SELECT 'ingest_v7' FROM ingest_v7", views) is None
    assert plan_cache._key("SELECT * FROM ingest_v7 JOIN ingest_v8", views) is None
    assert plan_cache._key("SELECT 1", views) is None
    assert plan_cache._key("SELECT * FROM ingest_v7x", views) is None


#: Pieces of the user's own text: what spells, or nearly spells, a made view's name too.
_PIECES = st.one_of(st.sampled_from(["ingest_v1", "INGEST_V2", "ingest_v900", "ingest_v901",
                                     "'", " ", "x", "_", "$", "1", "ingest_v", "ingest_v12"]),
                    st.text(string.printable, max_size=3))  # fmt: skip


def _bound(template: list[str | int], names: list[str]) -> str:
    """The text a binder gives: the user's pieces, each slot (an int) filled by the name
    of the view it made for that table reference (a whole identifier, as the name of
    the table it replaces was)."""
    return "".join(f" {names[p]} " if isinstance(p, int) else p for p in template)


@st.composite
def _templates(draw, slots):
    pieces: list[str | int] = draw(st.lists(_PIECES, max_size=10))
    for slot in range(slots):
        pieces.insert(draw(st.integers(0, len(pieces))), slot)
    return pieces


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 3).flatmap(lambda n: st.tuples(_templates(n), _templates(n))),
       st.booleans())  # fmt: skip
def test_two_bindings_share_a_key_only_if_they_bind_the_same_text(templates, same):
    """Two bindings (their views named anew: ``ingest_v1...`` then ``ingest_v900...``)
    of one text share a key when it can be keyed; of two texts, never."""
    template_a, template_b = (templates[0], templates[0]) if same else templates
    slots = sum(isinstance(p, int) for p in template_a)
    names_a = [f"ingest_v{1 + i}" for i in range(slots)]
    names_b = [f"ingest_v{900 + i}" for i in range(slots)]
    key_a = plan_cache._key(_bound(template_a, names_a), {n: _info(i) for i, n in enumerate(names_a)})
    key_b = plan_cache._key(_bound(template_b, names_b), {n: _info(i) for i, n in enumerate(names_b)})
    if template_a == template_b and key_a is not None:
        assert key_a == key_b
    if key_a is not None and key_a == key_b:
        assert _bound(template_a, names_a) == _bound(template_b, names_a)


def test_a_text_without_a_literal_that_spells_a_made_name_is_keyed():
    names = ["ingest_v5", "ingest_v6"]
    text = _bound(["SELECT * FROM ", 0, " JOIN ", 1, " ON 'ingest_v' = 'x'"], names)
    assert plan_cache._key(text, {n: _info(i) for i, n in enumerate(names)}) is not None


def _cache(session):
    return plan_cache._CACHES[session.spark]


def test_a_second_refresh_reuses_the_plan_and_keeps_the_answer(session):
    query = ("SELECT C.REGION, count(*) AS N, sum(T.AMOUNT) AS S FROM T JOIN C ON T.CID = C.ID "
             "GROUP BY C.REGION")  # fmt: skip
    session.sql("CREATE TABLE T (ID NUMBER, CID NUMBER, AMOUNT NUMBER(10, 2))")
    session.sql("CREATE TABLE C (ID NUMBER, REGION VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 1, 1.5), (2, 2, 2.5), (3, 1, NULL)")
    session.sql("INSERT INTO C VALUES (1, 'a'), (2, 'b')")
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL "
                f"AS {query}")  # fmt: skip
    statements = ["UPDATE T SET AMOUNT = AMOUNT + 1 WHERE ID = 1",
                  "INSERT INTO C VALUES (3, 'a'); INSERT INTO T VALUES (4, 3, 4)",
                  "DELETE FROM C WHERE ID = 2"]  # fmt: skip
    for statements_of_round in statements:
        for statement in statements_of_round.split("; "):
            session.sql(statement)
        hits = _cache(session).hits if session.spark in plan_cache._CACHES else 0
        for name in ("D",):  # (twins sharing a plan: test_plan_cache_attack)
            status = session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status
            assert "INCREMENTAL" in status, status
            assert_same_as_query(session, name, query)
        assert _cache(session).hits >= hits + 1


def test_a_source_created_again_under_its_name_is_planned_anew(session):
    """A new table of the name (a new id, another column type) is a new stand-in: the
    kept plan over the old one is not used for it."""
    query = "SELECT K, max(V) AS M FROM S GROUP BY K"
    session.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    session.sql("INSERT INTO S VALUES (1, 5), (1, 7), (2, 1)")
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 hour' AS {query}")
    session.sql("INSERT INTO S VALUES (2, 9)")
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(session, "D", query)
    misses = _cache(session).misses
    session.sql("CREATE OR REPLACE TABLE S (K NUMBER, V VARCHAR)")
    session.sql("INSERT INTO S VALUES (1, 'b'), (1, 'a')")
    session.sql("CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 hour' AS " + query)
    session.sql("INSERT INTO S VALUES (3, 'c')")
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert _cache(session).misses > misses
    assert_same_as_query(session, "D", query)
