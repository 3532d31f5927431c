"""Code blocks of README.md and docs/*.md, and how to run them (used by tests/test_docs.py).

A page's fenced blocks are read in order. Their info string says what they are:

- ``python``: run with the virtualenv's Python as a script (it must end without an
  exception), all blocks of a page in one interpreter of their own, one after another
  (tests/docs_block_runner.py: a block that starts Spark leaves its JVM to the next),
  which must then exit with 0;
- ``bash``, ``sh``, ``shell``: run with ``bash -euo pipefail`` in the repo root;
- ``console``: commands on lines starting with ``$ `` (a line ending in ``\\`` or inside
  an open quote continues on the next), each followed by the output it must print;
  ``...`` in the output matches anything (timestamps, random folder names). The
  commands of one block run in one ``bash -euo pipefail``, so a variable set by one is
  seen by the next;
- ``sql``: statements as a user types them into the command line, run by piping the
  block into ``python -m pipelines --url <the page's server>`` (the CLI splits them; it
  must exit with 0, so every statement must succeed);
- anything else (``json``, ``text``, ``promql``...) is not code and is not run.

A block that cannot run in a test is marked by an HTML comment on the line right
before its fence, ``<!-- docs-test: skip (the reason) -->``; the test reports each
one with its reason.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]
SHELL = frozenset({"bash", "sh", "shell"})
RUNNABLE = SHELL | {"python", "console", "sql"}
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^\s`]*)(.*)$")
_SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]*\S[^)]*)\)\s*-->\s*$")
_MARKER = "@@docs-test: end of command@@"


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason, when marked to be skipped

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no language'})"


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of a page (a path relative to the repo root), in order."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found = []
    index = 0
    previous = ""  # the last non-blank line before the current one
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            if lines[index].strip():
                previous = lines[index].strip()
            index += 1
            continue
        fence, lang = match.group(1), match.group(2).lower()
        start = index
        body = []
        index += 1
        while index < len(lines) and not lines[index].startswith(fence):
            body.append(lines[index])
            index += 1
        skip = _SKIP.match(previous)
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n",
                           skip.group("reason").strip() if skip else None))  # fmt: skip
        previous = ""
        index += 1
    return found


def skip_comments_without_block(page: str) -> list[int]:
    """Lines of ``docs-test: skip`` comments that are not right before a fence."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    bad = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("<!--") and "docs-test:" in line:
            following = next((text for text in lines[number:] if text.strip()), "")
            if not _SKIP.match(line.strip()) or not _FENCE.match(following):
                bad.append(number)
    return bad


def console_commands(code: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    continued = False
    for line in code.splitlines():
        if continued:
            pairs[-1] = (pairs[-1][0] + "\n" + line, pairs[-1][1])
            continued = _incomplete(pairs[-1][0])
        elif line.startswith("$ "):
            pairs.append((line[2:], []))
            continued = _incomplete(line[2:])
        elif pairs:
            pairs[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block text before its first '$ ' command: {line!r}")
    return [(command, "\n".join(expected)) for command, expected in pairs]


def _incomplete(command: str) -> bool:
    """Whether a command goes on on the next line (a trailing backslash, an open quote)."""
    if command.endswith("\\"):
        return True
    try:
        shlex.split(command)
    except ValueError:  # "No closing quotation"
        return True
    return False


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is ``expected`` with each ``...`` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in _normalized(expected).split("..."))
    return re.fullmatch(pattern, _normalized(actual), re.DOTALL) is not None


def _venv_bin() -> Path:
    venv = ROOT / ".venv" / "bin"
    return venv if (venv / "python").exists() else Path(sys.executable).parent


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class Runner:
    """Runs the blocks of one page against one live server, in a scratch folder."""

    def __init__(
        self, scratch: Path, port: int, warehouse: Path, timeout: float = 180,
        extra_env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.scratch = scratch
        self.timeout = timeout
        self.python = str(_venv_bin() / "python")
        env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
        env.update(
            PATH=f"{_venv_bin()}{os.pathsep}{env.get('PATH', '')}",
            INGEST_PORT=str(port),
            INGEST_WAREHOUSE=str(warehouse),
            TMPDIR=str(scratch),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra_env or {})
        self.env = env
        self.url = f"http://127.0.0.1:{port}"
        self._blocks: subprocess.Popen[bytes] | None = None
        self._results: Any = None

    def _run(self, argv: list[str], stdin: str | None = None) -> Result:
        done = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True,
                              input=stdin, timeout=self.timeout, check=False)  # fmt: skip
        return Result(done.returncode, done.stdout, done.stderr)

    def _script(self, block: Block, suffix: str, text: str) -> Path:
        name = re.sub(r"[^A-Za-z0-9]+", "-", block.page) + f"-L{block.line}{suffix}"
        path = self.scratch / name
        path.write_text(text, encoding="utf-8")
        return path

    def run(self, block: Block) -> str | None:
        """Run one block; None if it did what it should, else what went wrong."""
        if block.lang == "python":
            return self._run_python(self._script(block, ".py", block.code))
        if block.lang in SHELL:
            script = self._script(block, ".sh", block.code)
            result = self._run(["bash", "-euo", "pipefail", str(script)])
            return None if result.returncode == 0 else _failed(result)
        if block.lang == "sql":
            result = self._run([self.python, "-m", "pipelines", "--url", self.url], block.code)
            return None if result.returncode == 0 else _failed(result)
        return self._run_console(block)

    def _run_python(self, script: Path) -> str | None:
        """A script run by the page's block runner (started on first use)."""
        if self._blocks is None:
            read, write = os.pipe()
            with open(self.scratch / "python-blocks.log", "ab") as log:
                self._blocks = subprocess.Popen(
                    [self.python, str(ROOT / "tests" / "docs_block_runner.py")], cwd=ROOT,
                    env={**self.env, "DOCS_RESULT_FD": str(write)}, pass_fds=(write,),
                    stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                )  # fmt: skip
            os.close(write)
            self._results = os.fdopen(read, "rb")
        assert self._blocks.stdin is not None and self._results is not None
        self._blocks.stdin.write(f"{script}\n".encode())
        self._blocks.stdin.flush()
        ready, _, _ = select.select([self._results], [], [], self.timeout)
        line = self._results.readline() if ready else b""
        if not line:
            self.close()
            return f"the block ran over {self.timeout:.0f} s, or its interpreter died"
        result = orjson.loads(line)
        return None if result["ok"] else f"--- output (end)\n{result['output'][-6000:]}"

    def finish(self) -> str | None:
        """End the block runner as a script ends (its input closed): None if it exited
        with 0 (or never started), else what it printed."""
        if self._blocks is None:
            return None
        assert self._blocks.stdin is not None
        self._blocks.stdin.close()
        try:
            status = self._blocks.wait(self.timeout)
        except subprocess.TimeoutExpired:
            status = None
        self.close()
        if status == 0:
            return None
        log = (self.scratch / "python-blocks.log").read_text(errors="replace")[-3000:]
        return f"the interpreter of the Python blocks ended with {status}:\n{log}"

    def close(self) -> None:
        """Kill the block runner, if it still runs."""
        if self._blocks is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._blocks.pid, signal.SIGKILL)
            self._blocks.wait()
            if self._blocks.stdin is not None:
                self._blocks.stdin.close()
            self._blocks = None
        if self._results is not None:
            self._results.close()
            self._results = None

    def _run_console(self, block: Block) -> str | None:
        commands = console_commands(block.code)
        text = "".join(f"{command}\nprintf '\\n%s\\n' '{_MARKER}'\n" for command, _ in commands)
        result = self._run(["bash", "-euo", "pipefail", str(self._script(block, ".sh", text))])
        outputs = result.stdout.split(f"\n{_MARKER}\n")
        for number, (command, expected) in enumerate(commands):
            if number >= len(outputs) - 1:  # this command failed (set -e stopped the script)
                return f"command failed: $ {command}\n" + _failed(result)
            if expected.strip() and not output_matches(expected, outputs[number]):
                return (
                    f"unexpected output of: $ {command}\n--- expected\n{expected}\n"
                    f"--- got\n{outputs[number]}\n--- stderr\n{result.stderr[-2000:]}"
                )
        return None if result.returncode == 0 else _failed(result)


def _failed(result: Result) -> str:
    return (
        f"exit code {result.returncode}\n--- stdout (end)\n{result.stdout[-3000:]}\n"
        f"--- stderr (end)\n{result.stderr[-3000:]}"
    )


class Server:
    """``python -m channel_server --port 0`` on a fresh warehouse, as a child process."""

    def __init__(self, folder: Path) -> None:
        self.warehouse = folder / "warehouse"
        self.log = folder / "server.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(_venv_bin() / "python"), "-m", "channel_server", "--port", "0",
                 "--warehouse", str(self.warehouse), "--no-auto-compaction"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                env={k: v for k, v in os.environ.items() if not k.startswith("INGEST_")},
            )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the listening line, or EOF if it died
        if not line:
            self.stop()
            raise RuntimeError(f"the server did not start:\n{self.log_tail()}")
        self.url = orjson.loads(line)["url"]
        self.port = int(self.url.rsplit(":", 1)[1])

    def log_tail(self, characters: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-characters:]

    def stop(self) -> int | None:
        """Stop it as an operator would (SIGTERM); kill it if it hangs. Its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:  # (it stops its Spark worker's JVM: over 30 s on two loaded cores)
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def have(program: str) -> bool:
    return shutil.which(program) is not None
