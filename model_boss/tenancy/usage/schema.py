"""The ``usage`` table: one column per :class:`UsageRow` field, plus an integer id."""

from __future__ import annotations

import sqlite3
from dataclasses import fields
from operator import attrgetter

from .row import UsageRow

_SQL_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "REAL"}
_DEFAULTS = {"str": "''", "int": "0", "float": "0.0"}

# (name, SQLite type, default) for each field, in the dataclass's order
COLUMNS: tuple[tuple[str, str, str], ...] = tuple(
    (f.name, _SQL_TYPES[str(f.type)], _DEFAULTS[str(f.type)]) for f in fields(UsageRow))
NAMES: tuple[str, ...] = tuple(name for name, _, _ in COLUMNS)
INTEGER_COLUMNS = frozenset(name for name, kind, _ in COLUMNS if kind == "INTEGER")

INSERT = (f"INSERT INTO usage ({', '.join(NAMES)}) "
          f"VALUES ({', '.join('?' for _ in NAMES)})")

# a row's values in column order (attrgetter: no per-row Python loop)
values_of = attrgetter(*NAMES)


def create(conn: sqlite3.Connection) -> None:
    """Create the table and its indexes, and add any column a newer UsageRow has that the
    file lacks (a file written by an older model-boss keeps its rows)."""
    columns = ", ".join(f"{name} {kind} NOT NULL DEFAULT {default}"
                        for name, kind, default in COLUMNS)
    with conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS usage (id INTEGER PRIMARY KEY, {columns})")
        have = {info[1] for info in conn.execute("PRAGMA table_info(usage)")}
        for name, kind, default in COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE usage ADD COLUMN {name} {kind} "
                             f"NOT NULL DEFAULT {default}")
        conn.execute("CREATE INDEX IF NOT EXISTS usage_at ON usage (at)")
        conn.execute("CREATE INDEX IF NOT EXISTS usage_key_at ON usage (key, at)")


def connect(target: str) -> sqlite3.Connection:
    """A connection to the ledger file (``:memory:``: a database in memory), WAL journal
    and synchronous=NORMAL: a commit is one append to the log, durable across a crash of
    the daemon (a power cut may lose the last commits, never corrupt the file)."""
    conn = sqlite3.connect(target, check_same_thread=False, isolation_level="DEFERRED")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def insert(conn: sqlite3.Connection, rows: list[UsageRow]) -> None:
    """Write ``rows`` in one transaction (all or none)."""
    with conn:
        conn.executemany(INSERT, map(values_of, rows))
