"""The hidden columns of the engine's frames: a row's id, its sign in a delta, and the
scratch names the rules use. All begin with ``_INGEST_``, which no column of a query the
engine maintains may (its check refuses them: RESERVED_NAME)."""

from __future__ import annotations

__all__ = ["COUNT", "HIT_LEFT", "HIT_RIGHT", "ID", "KEY", "LEFT", "RIGHT", "SIGN"]

ID, SIGN = "_INGEST_ROW_ID", "_INGEST_SIGN"
LEFT, RIGHT, KEY, COUNT = "_INGEST_L", "_INGEST_R", "_INGEST_K", "_INGEST_N"
HIT_LEFT, HIT_RIGHT = "_INGEST_HL", "_INGEST_HR"
