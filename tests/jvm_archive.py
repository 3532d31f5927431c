"""A class-data archive of the classes a Spark session loads, made once and shared by
every JVM the suite starts.

The suite starts a JVM for each Spark session, and one more in each killed child, service
worker and docs block that needs Spark: 87 in one full run. Each spends most of its start
loading and verifying the same thousands of classes from Spark's jars. A dynamic
class-data-sharing archive (JDK 13+: ``-XX:ArchiveClassesAtExit`` writes it,
``-XX:SharedArchiveFile`` maps it) holds them parsed and verified: measured here, a
Spark start and its first queries took 8 s of JVM CPU instead of 17-18 s, and half the
wall time.

The archive belongs to one JVM and one class path, so its file name carries a digest
of the Java binary, the pyspark jars and this interpreter; it is made by a throwaway
Spark session that exits normally, written under a temporary name and renamed, and kept
between runs in the user's cache folder. A JVM whose class path does not match an
archive ignores it, so a stale one costs speed, never a result. Without an archive (the
JVM cannot write one, or the session failed) the suite runs as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["class_archive"]

#: What the archiving session loads: SQL with a shuffle, an Arrow frame, Parquet both ways.
_WORKLOAD = """
import sys, tempfile
sys.path.insert(0, {root!r})
import pyarrow as pa
from flush.spark_tables import spark_session
spark = spark_session("local[2]", app_name="class-archive")
spark.sql("SELECT k, count(*) FROM VALUES (1), (2), (1) AS t(k) GROUP BY k").collect()
frame = spark.createDataFrame(pa.table({{"a": [1, 2], "b": ["x", "y"]}}).to_pandas())
folder = tempfile.mkdtemp()
frame.write.parquet(folder + "/p")
spark.read.parquet(folder + "/p").where("a > 1").toArrow()
spark.stop()
"""


def _digest() -> str:
    import pyspark

    java = shutil.which("java") or ""
    jars = Path(pyspark.__file__).parent / "jars"
    parts = [os.path.realpath(java), sys.executable, str(jars),
             *sorted(p.name for p in jars.glob("*.jar"))]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def class_archive(root: Path, options: str) -> Path | None:
    """The archive for JVMs started with ``options`` (``SPARK_SUBMIT_OPTS``), made if
    missing; None if it cannot be made."""
    folder = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "streaming-ingest"
    archive = folder / f"spark-classes-{_digest()}.jsa"
    if archive.exists():
        archive.touch()  # in use: kept by _prune
        return archive
    folder.mkdir(parents=True, exist_ok=True)
    _prune(folder)
    partial = folder / f".{archive.name}.{os.getpid()}"
    env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{options} -XX:ArchiveClassesAtExit={partial}"}
    try:
        subprocess.run([sys.executable, "-c", _WORKLOAD.format(root=str(root))], env=env,
                       check=True, timeout=600, capture_output=True)  # fmt: skip
        if partial.exists():
            os.replace(partial, archive)
    except (OSError, subprocess.SubprocessError):
        partial.unlink(missing_ok=True)
    return archive if archive.exists() else None


#: An archive unused this long is deleted when another is made (each is ~180 MB, one per
#: virtual environment and Spark version; a used one is touched at every run).
UNUSED_FOR_S = 7 * 86_400


def _prune(folder: Path) -> None:
    """Delete the archives of this folder no run has used for :data:`UNUSED_FOR_S`."""
    now = time.time()
    for old in folder.glob("spark-classes-*.jsa"):
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > UNUSED_FOR_S:
                old.unlink()
