"""The docs run as written: every shell, console and Python block of README.md and docs/*.md.

Each page gets its own ``python -m channel_server --port 0`` on a fresh warehouse; its
blocks run in order (a block may use what an earlier block of the page created) with
``INGEST_PORT`` and ``INGEST_WAREHOUSE`` set to that server's port and warehouse, which
is how the snippets find it (``http://127.0.0.1:${INGEST_PORT:-8080}`` in shell,
``os.environ.get("INGEST_PORT", "8080")`` in Python). Blocks marked
``<!-- docs-test: skip (reason) -->`` are reported as skipped tests with their reason.
See docs/operations.md, "How the docs are tested".
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.docs_snippets import (
    PAGES,
    ROOT,
    Block,
    Runner,
    Server,
    blocks,
    console_commands,
    have,
    output_matches,
    skip_comments_without_block,
)

ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
SKIPPED = [block for block in ALL_BLOCKS if block.runnable and block.skip]


#: Pages whose blocks need servers besides the service's, started by the tests' fixtures.
EXTERNAL = {"docs/several-machines.md": ("postgres", "s3")}


def external_env(page: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """What a page's blocks find the servers it needs by: libpq's ``PGHOST``, ``PGPORT``
    and ``PGUSER`` for a throwaway PostgreSQL cluster; the ``AWS_*`` variables for moto's
    S3 and ``BUCKET``, a fresh bucket."""
    env: dict[str, str] = {}
    needs = EXTERNAL.get(page, ())
    if "postgres" in needs:
        postgres = request.getfixturevalue("postgres_server")
        env.update(PGHOST="127.0.0.1", PGPORT=str(postgres.port), PGUSER="postgres")
    if "s3" in needs:
        s3 = request.getfixturevalue("s3_server")
        env.update(s3.env, BUCKET=s3.create_bucket().name)
    return env


@pytest.mark.parametrize("page", PAGES)
def test_page_runs(page: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every runnable block of the page, in order, against a live server of its own."""
    runnable = [block for block in blocks(page) if block.runnable and not block.skip]
    if not runnable:
        pytest.skip(f"{page} has no runnable blocks")
    if not have("curl") and any("curl" in block.code for block in runnable):
        pytest.skip(f"{page}: curl is not installed; its shell blocks call curl")
    server = Server(tmp_path)
    runner = Runner(tmp_path, server.port, server.warehouse,
                    extra_env=external_env(page, request))  # fmt: skip
    try:
        for block in runnable:
            started = time.monotonic()
            problem = runner.run(block)
            if problem is not None:
                pytest.fail(
                    f"{block.where} failed after {time.monotonic() - started:.1f} s:\n"
                    f"{block.code}\n{problem}\n--- server log (end)\n{server.log_tail()}",
                    pytrace=False,
                )
        problem = runner.finish()
        if problem is not None:
            pytest.fail(f"{page}: {problem}", pytrace=False)
    finally:
        runner.close()
        status = server.stop()
    assert status == 0, f"the server of {page} exited with {status}:\n{server.log_tail()}"


@pytest.mark.parametrize("block", SKIPPED, ids=lambda block: f"{block.page}:{block.line}")
def test_skipped_block(block: Block) -> None:
    """Listed so that no block is skipped silently (``pytest -ra`` shows the reasons)."""
    pytest.skip(f"{block.where} not run: {block.skip}")


def test_blocks_are_labelled() -> None:
    """Every fence names its language, and every skip mark has a reason and a block."""
    unlabelled = [block.where for block in ALL_BLOCKS if not block.lang]
    assert not unlabelled, f"code blocks without a language (use `text` if not code): {unlabelled}"
    stray = [(page, line) for page in PAGES for line in skip_comments_without_block(page)]
    assert not stray, f"docs-test marks without a reason or not right before a fence: {stray}"
    for block in ALL_BLOCKS:
        if block.lang == "console":
            assert console_commands(block.code), f"{block.where}: no '$ ' command"


def test_every_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [page for page in PAGES[1:] if f"]({page})" not in readme]
    assert not missing, f"README.md does not link to {missing}"
    assert "](examples/kafka_bridge/README.md)" in readme


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a page."""
    anchors: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        candidate, number = slug, 0
        while candidate in anchors:
            number += 1
            candidate = f"{slug}-{number}"
        anchors.add(candidate)
    return anchors


@pytest.mark.parametrize("page", PAGES)
def test_links_stay_in_the_repo_and_resolve(page: str) -> None:
    """Relative links point at files (and headings) of this repository, nothing outside."""
    source = ROOT / page
    text = source.read_text(encoding="utf-8")
    assert "../shared" not in text and "/work/" not in text, f"{page} cites a path outside"
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path_part, _, anchor = target.partition("#")
        path = (source.parent / path_part).resolve() if path_part else source
        assert path.is_relative_to(ROOT), f"{page}: link {target} leaves the repository"
        assert path.exists(), f"{page}: link {target} points at nothing"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page}: link {target}: no such heading"


def test_output_matching() -> None:
    """The console checker: ``...`` matches anything, everything else must be equal."""
    assert output_matches('{"a":1,...,"c":3}', '{"a":1,"b":2,"c":3}\n')
    assert not output_matches('{"a":1}', '{"a":2}')
    assert output_matches("", "")


def test_a_sql_block_that_fails_fails_its_page(tmp_path: Path) -> None:
    """A ``sql`` block goes through the command line, whose exit status decides: with no
    service at the URL, the CLI exits non-zero and the runner reports the block."""
    import socket

    with socket.socket() as unused:  # a port nothing listens on once it is closed
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    runner = Runner(tmp_path, port, tmp_path / "warehouse", timeout=60)
    problem = runner.run(Block("x.md", 1, "sql", "SELECT 1;\n", None))
    assert problem is not None and "exit code" in problem, problem
