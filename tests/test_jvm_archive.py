"""The suite's class-data-sharing archives: one kept per environment in use, old ones
deleted (each is about 180 MB)."""

import os
import time

from tests.jvm_archive import UNUSED_FOR_S, _prune


def test_archives_unused_for_a_week_are_pruned_and_others_kept(tmp_path):
    stale, fresh, other = (tmp_path / name for name in (
        "spark-classes-aaaa.jsa", "spark-classes-bbbb.jsa", "notes.txt"))  # fmt: skip
    for path in (stale, fresh, other):
        path.write_text("x")
    long_ago = time.time() - UNUSED_FOR_S - 60
    for path in (stale, other):
        os.utime(path, (long_ago, long_ago))
    _prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "spark-classes-bbbb.jsa"]
