"""A statement naming a table, view, stream, dynamic table or change stream that does not
exist is told the existing object of that kind, in the same schema, whose name is close:
every "does not exist" of those objects goes through catalog.did_you_mean."""

from __future__ import annotations

import pytest

from tests.pipelines.refusals import assert_refused


@pytest.fixture(scope="module")
def objects(tmp_path_factory, spark):
    from pipelines import Session

    session = Session(tmp_path_factory.mktemp("did_you_mean") / "warehouse", spark=spark)
    for text in (
        "CREATE TABLE ORDERS (ID NUMBER PRIMARY KEY)",
        "CREATE VIEW V_ORDERS AS SELECT ID FROM ORDERS",
        "CREATE STREAM S_ORDERS ON TABLE ORDERS",
        "CREATE DYNAMIC TABLE DT_ORDERS TARGET_LAG = '1 minute' INITIALIZE = ON_SCHEDULE AS "
        "SELECT ID FROM ORDERS",
        "CREATE CHANGE STREAM BALANCES FOR ORDERS",
        "CREATE SCHEMA OTHER",
        "CREATE TABLE OTHER.INVOICES (ID NUMBER)",
        "USE SCHEMA PUBLIC",  # CREATE SCHEMA made OTHER the current one
    ):
        session.sql(text)
    yield session
    session.close()


def _catalog(session):
    catalog = session.catalog
    return ([t.full_name for t in catalog.list_tables()], [v.full_name for v in catalog.list_views()],
            [s.full_name for s in catalog.list_streams()],
            [c.full_name for c in catalog.list_change_streams()])  # fmt: skip


ORDERS = "(did you mean DB.PUBLIC.ORDERS?)"


@pytest.mark.parametrize(
    ("statement", "hint"),
    [
        ("SELECT * FROM ORDRES", ORDERS),
        ('SELECT * FROM "orders"', ORDERS),
        ("SELECT * FROM DB.PUBLIC.ORDER", ORDERS),
        ("INSERT INTO ORDRES VALUES (1)", ORDERS),
        ("DROP TABLE ORDRES", ORDERS),
        ("TRUNCATE TABLE ORDRES", ORDERS),
        ("DESCRIBE TABLE ORDRES", ORDERS),
        ("SELECT * FROM V_ORDRES", "(did you mean DB.PUBLIC.V_ORDERS?)"),
        ("DROP VIEW V_ORDRES", "(did you mean DB.PUBLIC.V_ORDERS?)"),
        ("DESCRIBE VIEW V_ORDER", "(did you mean DB.PUBLIC.V_ORDERS?)"),
        ("CREATE STREAM S2 ON VIEW V_ORDRES", "(did you mean DB.PUBLIC.V_ORDERS?)"),
        ("DROP STREAM S_ORDRES", "(did you mean DB.PUBLIC.S_ORDERS?)"),
        ("SELECT SYSTEM$STREAM_HAS_DATA('S_ORDER')", "(did you mean DB.PUBLIC.S_ORDERS?)"),
        ("ALTER DYNAMIC TABLE DT_ORDRES REFRESH", "(did you mean DB.PUBLIC.DT_ORDERS?)"),
        ("DROP DYNAMIC TABLE DT_ORDER", "(did you mean DB.PUBLIC.DT_ORDERS?)"),
        ("DROP CHANGE STREAM BALANCE", "(did you mean DB.PUBLIC.BALANCES?)"),
        ("ALTER CHANGE STREAM BALANSES SET FOR ALL", "(did you mean DB.PUBLIC.BALANCES?)"),
        ("SELECT * FROM READ_BALANCE(start_timestamp => '2020-01-01T00:00:00Z')",
         "(did you mean DB.PUBLIC.BALANCES?)"),
        ("CREATE CHANGE STREAM CS FOR ORDRES", ORDERS),
        ("SELECT * FROM OTHER.INVOICE", "(did you mean DB.OTHER.INVOICES?)"),
    ],
)  # fmt: skip
def test_a_missing_name_close_to_an_object_of_its_kind_is_told_that_object(
    objects, statement, hint
):
    error = assert_refused(objects, statement, "OBJECT_NOT_FOUND", "does not exist", hint,
                           collect=False, unchanged=_catalog)  # fmt: skip
    assert str(error).count("did you mean") == 1


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM INVOICE",  # OTHER.INVOICES is in another schema
        "SELECT * FROM OTHERDB.PUBLIC.ORDERS",  # and DB.PUBLIC.ORDERS in another database
        "SELECT * FROM PAYMENTS",  # nothing close
        "DROP STREAM ORDRES",  # ORDERS is a table, not a stream
        "DROP CHANGE STREAM ORDRES",  # nor a change stream
        "ALTER DYNAMIC TABLE ORDRES REFRESH",  # nor a dynamic table
    ],
)
def test_no_object_of_another_schema_or_kind_is_suggested(objects, statement):
    error = assert_refused(objects, statement, "OBJECT_NOT_FOUND", "does not exist",
                           collect=False, unchanged=_catalog)  # fmt: skip
    assert "did you mean" not in str(error)
