"""The command line's statement splitting (:mod:`pipelines.cli.split`) and its client-side
pieces that need no service: error shortening, CSV, the transaction matcher."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.cli.output import print_rows, short
from pipelines.cli.service import service_error, transaction_kind
from pipelines.cli.split import SplitError, split, split_all


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SHOW CHANGE STREAMS LIKE 'BAL%';  -- note\nSELECT 1",
         ["SHOW CHANGE STREAMS LIKE 'BAL%'", "SELECT 1"]),
        ("SELECT 1;  -- a trailing comment is no statement\n", ["SELECT 1"]),
        ("SELECT 'a;b', \"c;d\"", ["SELECT 'a;b', \"c;d\""]),
        ("SELECT 'it''s; here'; SELECT 2", ["SELECT 'it''s; here'", "SELECT 2"]),
        (r"SELECT 'a\';b'; SELECT 2", [r"SELECT 'a\';b'", "SELECT 2"]),
        (r"SELECT 'a\\'; SELECT 2", [r"SELECT 'a\\'", "SELECT 2"]),
        (r"SELECT r'a\'; SELECT 2", [r"SELECT r'a\'", "SELECT 2"]),
        ("SELECT `a;``b` FROM t; SELECT 2", ["SELECT `a;``b` FROM t", "SELECT 2"]),
        ("SELECT 1 /* ; /* nested ; */ still ; */ + 1; x", ["SELECT 1 /* ; /* nested ; */ still ; */ + 1", "x"]),
        ("CREATE FUNCTION f() AS $$ a; b $$; SELECT 2", ["CREATE FUNCTION f() AS $$ a; b $$", "SELECT 2"]),
        ("-- only\n/* comments */ ;; ", []),
        ("SELECT 1 -- the end; not a cut\n, 2", ["SELECT 1 -- the end; not a cut\n, 2"]),
        ("SELECT 'x' -- 'unclosed in a comment\n", ["SELECT 'x'"]),
    ],
)  # fmt: skip
def test_splits_at_semicolons_outside_comments_quotes_and_bodies(text, expected):
    assert split_all(text) == expected


@pytest.mark.parametrize(
    ("text", "what", "where"),
    [
        ("SELECT 1;\nSELECT 'abc", "string", "line 2, column 8"),
        ("SELECT \"abc", "string", "line 1, column 8"),
        ("SELECT `abc", "quoted name", "line 1, column 8"),
        ("SELECT 1 /* a /* b */", "comment", "line 1, column 10"),
        ("x AS $$ body", "$$ body", "line 1, column 6"),
        (r"SELECT 'a\'", "string", "line 1, column 8"),
    ],
)  # fmt: skip
def test_unterminated_input_names_what_and_where(text, what, where):
    with pytest.raises(SplitError) as raised:
        split_all(text)
    message = str(raised.value)
    assert message == f"unterminated {what} starting at {where}: nothing was run"
    assert "\n" not in message


def test_a_blank_line_ends_a_statement_only_where_the_prompt_asks():
    assert split_all("SELECT 1\n\nSELECT 2", blank_line_ends=True) == ["SELECT 1", "SELECT 2"]
    assert split_all("SELECT 1\n\nSELECT 2") == ["SELECT 1\n\nSELECT 2"]
    # Not inside a body or string: it goes on.
    assert split_all("SELECT $$a\n\nb$$", blank_line_ends=True) == ["SELECT $$a\n\nb$$"]


def test_the_prompt_sees_what_is_still_open():
    cut = split("SELECT 1; SELECT 'a\n", blank_line_ends=True)
    assert cut.statements == ["SELECT 1"]
    assert cut.open == ("string", 17)


def test_large_and_binary_input_is_cut_without_error():
    big = "SELECT '" + "x;" * 500_000 + "'"
    assert split_all(big + "; SELECT 2") == [big, "SELECT 2"]
    binary = "SELECT '\x00\x01\udcff\x7f'; SELECT 2"
    assert split_all(binary) == ["SELECT '\x00\x01\udcff\x7f'", "SELECT 2"]


_WORD = st.text(alphabet="abcXYZ019_ ,()=+*<>.", min_size=1, max_size=12)
_LITERAL = st.one_of(
    st.text(alphabet="ab;-/*$ \n'\"`", max_size=8).map(lambda t: "'" + t.replace("'", "''") + "'"),
    st.text(alphabet="ab;-/*$ \n'\"`", max_size=8).map(lambda t: '"' + t.replace('"', '\\"') + '"'),
    st.text(alphabet="ab;-/*$ \n'\"`", max_size=8).map(lambda t: "`" + t.replace("`", "``") + "`"),
    st.text(alphabet="ab;-/* \n'\"`", max_size=8).map(lambda t: "$$" + t + "$$"),
)
_STATEMENT = (
    st.lists(st.one_of(_WORD, _LITERAL), min_size=1, max_size=6).map(" ".join).map(str.strip)
).filter(bool)
_GAP = st.lists(
    st.one_of(
        st.sampled_from([" ", "\n", "\t", "  \n "]),
        st.text(alphabet="ab ;'\"`$*/", max_size=10).map(lambda t: f"-- {t}\n"),
        st.text(alphabet="ab ;'\"`$\n", max_size=10).map(lambda t: f"/* {t} */"),
    ),
    max_size=4,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_GAP, _STATEMENT, _GAP), max_size=6), st.booleans())
def test_statements_joined_with_comments_come_back(parts, last_semicolon):
    """Words hold no ``-``, ``/``, ``$`` or ``r`` and are glued to literals with blanks, so
    no comment or body opens outside a literal: each statement is one whole."""
    statements = [statement for _, statement, _ in parts]
    text = ";".join(f"{before}{statement}{after}" for before, statement, after in parts)
    if last_semicolon and text:
        text += ";"
    assert split_all(text) == statements


def test_an_unsupported_statement_error_fits_on_a_line():
    long = ("unsupported statement 'SHOW NOPE'; supported: " + "CREATE X, " * 160).strip()
    shown = short(long)
    assert shown == "unsupported statement 'SHOW NOPE' (--verbose prints the whole message)"
    assert short("plain message") == "plain message"
    assert len(short("x" * 2000)) < 400
    assert short("first line\nsecond line\n at foo") == (
        "first line (--verbose prints the whole message)"
    )


def test_auth_errors_name_the_command_line_flags():
    body = (b'{"error": {"code": "UNAUTHENTICATED", "message": "missing or wrong token: send '
            b"'Authorization: Bearer <token>' with a token the server was started with\"}}")  # fmt: skip
    error = service_error(401, body)
    assert error.code == "UNAUTHENTICATED"
    assert str(error).startswith("missing or wrong token: pass --token TOKEN or set $INGEST_TOKEN")
    assert "Authorization" not in str(error)


def test_csv_is_rfc_4180_with_lf_line_ends():
    out = io.StringIO()
    print_rows(["A", "B"], [(1, 'say "hi", ok'), (None, "two\nlines")], "csv", 10, out)
    assert out.getvalue() == 'A,B\n1,"say ""hi"", ok"\nNULL,"two\nlines"\n'


@pytest.mark.parametrize(
    "statement",
    ["BEGIN", "begin transaction", "START WORK", "BEGIN NAME t1", " COMMIT ", "commit work",
     "ROLLBACK", "ROLLBACK WORK;", "SELECT 1", "BEGINNING", "COMMITTED", "SHOW TABLES"],
)  # fmt: skip
def test_the_transaction_matcher_agrees_with_the_statement_classifier(statement):
    from pipelines.errors import SqlError
    from pipelines.sql.statements import classify

    try:
        kind: str | None = classify(statement).kind
    except SqlError:
        kind = None
    expected = kind if kind in ("begin", "commit", "rollback") else None
    assert transaction_kind(statement) == expected


def test_the_prompt_reads_on_while_a_quote_or_body_is_open(monkeypatch, capsys):
    """A terminal's lines: a statement runs at its ``;`` or a blank line, but not while
    a quote or ``$$`` body is open; a trailing comment is no statement."""
    import argparse

    import pipelines.__main__ as cli

    lines = iter(
        ["SELECT 'a;", "b'; -- note", "SELECT 2", "", "SELECT $$ x", "", "y $$;", "SELECT 3"]
    )

    def typed(_prompt: str = "") -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    ran: list[str] = []

    class Runner:
        where = "here"

        def rows(self, statement: str, limit: int):
            ran.append(statement)
            return ["A"], [(1,)]

        def close(self) -> None: ...

    monkeypatch.setattr("builtins.input", typed)
    args = argparse.Namespace(max_rows=10, format="csv", verbose=False)
    assert cli.prompt(Runner(), args) == 0
    assert ran == ["SELECT 'a;\nb'", "SELECT 2", "SELECT $$ x\n\ny $$", "SELECT 3"]
    assert capsys.readouterr().out == "A\n1\n" * 4
