"""ON_ERROR modes and the per-row validation report returned by every insert."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ingest_sdk.wire import MAX_OFFSET_TOKEN_LENGTH

__all__ = [
    "ChannelStatus",
    "InsertError",
    "InsertValidationResponse",
    "OnErrorOption",
    "check_offset_token",
]


def check_offset_token(token: Any, name: str = "offset token") -> str | None:
    """An offset token as the commit path can carry it, or ValueError saying why not.

    Text of at most :data:`MAX_OFFSET_TOKEN_LENGTH` characters, valid Unicode (no lone
    surrogates, which is how undecodable bytes arrive) and without NUL. The SDK checks
    before sending; the server checks again at its door.
    """
    if token is None:
        return None
    if not isinstance(token, str) or len(token) > MAX_OFFSET_TOKEN_LENGTH:
        raise ValueError(f"{name} must be a str of at most {MAX_OFFSET_TOKEN_LENGTH} characters")
    try:
        token.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} must be UTF-8 text; it holds characters that are not ({exc.reason})"
        ) from exc
    if "\x00" in token:
        raise ValueError(f"{name} must not contain NUL characters")
    return token


class OnErrorOption(enum.Enum):
    """What an insert does with the rest of a batch when some rows are bad."""

    #: Insert the good rows; report every bad one.
    CONTINUE = "CONTINUE"
    #: Insert nothing if any row is bad; report every bad one.
    SKIP_BATCH = "SKIP_BATCH"
    #: Insert nothing and raise on the first bad row (the default).
    ABORT = "ABORT"

    @classmethod
    def parse(cls, value: OnErrorOption | str) -> OnErrorOption:
        """Accept the enum or its name in any case (``"continue"``)."""
        if isinstance(value, OnErrorOption):
            return value
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            raise ValueError(
                f"unknown ON_ERROR option {value!r}; use CONTINUE, SKIP_BATCH or ABORT"
            ) from None


@dataclass(slots=True)
class InsertError:
    """Everything wrong with one row.

    Attributes:
        row_index: index of the row in the batch given to the insert call.
        message: all problems of the row, each naming the column, value and fix.
        extra_col_names: row keys that match no column.
        missing_not_null_col_names: NOT NULL columns the row does not mention.
        null_value_for_not_null_col_names: NOT NULL columns given a NULL.
        exception: the first exception behind the problems (a conversion error
            for bad values).
    """

    row_index: int
    message: str
    extra_col_names: list[str] = field(default_factory=list)
    missing_not_null_col_names: list[str] = field(default_factory=list)
    null_value_for_not_null_col_names: list[str] = field(default_factory=list)
    exception: Exception | None = None


@dataclass(slots=True)
class InsertValidationResponse:
    """The outcome of validating one batch: which rows failed and why.

    Attributes:
        insert_errors: one entry per bad row, in row order.
        row_count: rows in the batch as given.
        inserted_row_count: rows that went into the converted batch.
    """

    insert_errors: list[InsertError] = field(default_factory=list)
    row_count: int = 0
    inserted_row_count: int = 0

    def has_errors(self) -> bool:
        return bool(self.insert_errors)

    @property
    def error_row_count(self) -> int:
        return len(self.insert_errors)


@dataclass(frozen=True, slots=True)
class ChannelStatus:
    """The answer of a committed-token lookup for one channel; never silent about trouble.

    Attributes:
        status: ``OK``; ``INVALIDATED`` (the handle's generation is no longer open; the
            token is still the committed one); ``FLUSH_FAILING`` (commits are being
            retried; the token is the last committed one); ``CHANNEL_NOT_FOUND``;
            ``TABLE_NOT_FOUND``.
        offset_token: the latest committed offset token (``None`` if none yet).
    """

    table: str
    channel: str
    status: str
    offset_token: str | None = None
    generation: int | None = None
    committed_batch_seq: int | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "OK"
