"""KeyStore: every key the box takes: the config file's (``api_keys``, ``api_key``,
``admin_api_key``) and the managed ones (created, changed, rotated and revoked through the
admin API without a restart), looked up by the SHA-256 of the secret a request carries.

Managed keys live in SQLite (``state_dir/keys.sqlite3``); only hashes are stored, the secret
is shown once. Lookups read an in-memory map (no I/O on a request's path); changes write
the database first, off the event loop, then swap the map."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ...errors import BadRequest, Conflict, NotFound
from ...settings import ClientProfile, Settings
from .record import CONFIG, MANAGED, SECRET_PREFIX, KeyRecord, hash_secret, new_secret

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
SHARED_KEY_NAME = "default"  # the config file's one shared ``api_key``
ADMIN_KEY_NAME = "admin"  # the config file's ``admin_api_key``

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
  name TEXT PRIMARY KEY, secret_hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,
  admin INTEGER NOT NULL, profile TEXT NOT NULL, created_at REAL NOT NULL,
  updated_at REAL NOT NULL, expires_at REAL, revoked_at REAL)
"""


class KeyNotFound(NotFound):
    """No key of that name (the admin API's 404)."""

    code = "key_not_found"


def config_keys(settings: Settings) -> list[KeyRecord]:
    """The config file's keys as records: each named key with its client profile; the admin
    key; the shared key. Without ``admin_api_key``, user keys open the admin routes (as
    they always did); with it, only it (and managed admin keys) do."""
    user_admin = not settings.admin_api_key
    records = [KeyRecord(name, hash_secret(secret.get_secret_value()),
                         settings.clients.get(name) or ClientProfile(), admin=user_admin,
                         source=CONFIG, prefix=_prefix(secret.get_secret_value()))
               for name, secret in settings.api_keys.items()]
    if settings.api_key:
        records.append(KeyRecord(SHARED_KEY_NAME, hash_secret(settings.api_key),
                                 settings.clients.get(SHARED_KEY_NAME) or ClientProfile(),
                                 admin=user_admin, source=CONFIG,
                                 prefix=_prefix(settings.api_key)))
    if settings.admin_api_key:
        records.append(KeyRecord(ADMIN_KEY_NAME, hash_secret(settings.admin_api_key),
                                 admin=True, source=CONFIG,
                                 prefix=_prefix(settings.admin_api_key)))
    return records


class KeyStore:
    """The keys; ``path`` None keeps managed keys in memory only (tests, no state)."""

    def __init__(self, settings: Settings, path: Path | None) -> None:
        self.path = path
        self._config = {record.name: record for record in config_keys(settings)}
        self._config_users = settings.user_keys_set
        self._managed: dict[str, KeyRecord] = {}
        self._by_hash: dict[str, KeyRecord] = {}
        self._lock = asyncio.Lock()
        # told of every change after it is written here (a cluster writes it through)
        self.on_saved: Callable[[KeyRecord], Awaitable[None]] | None = None
        self._index()

    # -- reading: synchronous, from memory ------------------------------------------------

    def lookup(self, secret: str) -> KeyRecord | None:
        """The key whose secret is ``secret`` (revoked and expired ones too: the caller
        says why it refuses them), else None."""
        return self._by_hash.get(hash_secret(secret)) if secret else None

    def get(self, name: str) -> KeyRecord | None:
        return self._managed.get(name) or self._config.get(name)

    def __iter__(self) -> Iterator[KeyRecord]:
        yield from sorted([*self._config.values(), *self._managed.values()],
                          key=lambda r: r.name)

    def managed(self) -> list[KeyRecord]:
        """The keys made through the API (revoked ones too)."""
        return list(self._managed.values())

    def adopt(self, records: Iterable[KeyRecord]) -> None:
        """Take ``records`` as the managed keys (a cluster's, as Redis has them): the newer
        of each name wins; a config file's key of the same name stays."""
        managed = dict(self._managed)
        for record in records:
            held = managed.get(record.name)
            if record.name not in self._config and (held is None
                                                    or held.updated_at <= record.updated_at):
                managed[record.name] = record
        self._managed = managed
        self._index()

    @property
    def enforced(self) -> bool:
        """Whether requests need a key: any config key, or any managed key ever made."""
        return bool(self._config or self._managed)

    @property
    def users_enforced(self) -> bool:
        """Whether the user routes need a key too (a user key exists, or a managed key
        ever did); with only ``admin_api_key``, only the admin routes are guarded."""
        return self._config_users or bool(self._managed)

    # -- changes: the database first (off the loop), then the map --------------------------

    async def start(self) -> None:
        if self.path is None:
            return
        rows = await asyncio.to_thread(self._read_all)
        self._managed = {row.name: row for row in rows if row.name not in self._config}
        self._index()

    async def create(self, name: str, profile: ClientProfile, *, admin: bool = False,
                     expires_at: float | None = None) -> tuple[KeyRecord, str]:
        """A new key; its secret (returned here only)."""
        if not NAME.match(name):
            raise BadRequest(f"key name {name!r}: letters, digits and _.@- only, at most 64, "
                             "starting with a letter or digit", param="name",
                             code="invalid_name")
        async with self._lock:
            existing = self.get(name)
            if existing is not None and not (existing.source == MANAGED and existing.revoked):
                raise Conflict(f"a key named '{name}' exists"
                               + (" in the config file" if existing.source == CONFIG else
                                  "; rotate or change it instead"), param="name",
                               code="key_exists")
            if not admin and not self.has_admin():
                raise BadRequest(
                    "no key can use the admin API yet: make this first key an admin one "
                    "(admin: true, --admin) or set admin_api_key; else the key API would "
                    "lock itself out", param="admin", code="admin_key_first")
            secret = new_secret()
            record = KeyRecord(name, hash_secret(secret), profile, admin=admin,
                               prefix=_prefix(secret), expires_at=expires_at)
            await self._save(record)
            return record, secret

    async def update(self, name: str, **changes: Any) -> KeyRecord:
        """Change a managed key's ``profile``, ``admin`` or ``expires_at``."""
        async with self._lock:
            record = self._managed_named(name)
            if changes.get("admin") is False:
                self._not_the_last_admin(record)
            updated = record.changed(**changes)
            await self._save(updated)
            return updated

    async def rotate(self, name: str) -> tuple[KeyRecord, str]:
        """A new secret for a managed key; the old one stops working at once."""
        async with self._lock:
            record = self._managed_named(name)
            secret = new_secret()
            updated = record.changed(secret_hash=hash_secret(secret), prefix=_prefix(secret))
            await self._save(updated)
            return updated, secret

    async def revoke(self, name: str) -> KeyRecord:
        """Stop a managed key: refused from its next request on (kept, listed as revoked)."""
        async with self._lock:
            record = self._managed_named(name)
            self._not_the_last_admin(record)
            updated = record.changed(revoked_at=record.revoked_at or time.time())
            await self._save(updated)
            return updated

    def has_admin(self, *, but: str | None = None) -> bool:
        """Whether some key (other than ``but``) opens the admin API."""
        return any(r.admin and not r.revoked and r.name != but for r in self)

    def _not_the_last_admin(self, record: KeyRecord) -> None:
        if record.admin and not self.has_admin(but=record.name):
            raise BadRequest(f"'{record.name}' is the last key that can use the admin API: "
                             "make another admin key first (or set admin_api_key)",
                             param="name", code="last_admin_key")

    def _managed_named(self, name: str) -> KeyRecord:
        record = self.get(name)
        if record is None or (record.source == MANAGED and record.revoked):
            raise KeyNotFound(f"no key named '{name}'", param="name")
        if record.source == CONFIG:
            raise BadRequest(f"the key '{name}' comes from the config file: change it there",
                             param="name", code="config_key")
        return record

    async def _save(self, record: KeyRecord) -> None:
        if self.path is not None:
            await asyncio.to_thread(self._write, record)
        self._managed = {**self._managed, record.name: record}
        self._index()
        if self.on_saved is not None:
            await self.on_saved(record)

    def _index(self) -> None:
        self._by_hash = {r.secret_hash: r for r in (*self._config.values(),
                                                   *self._managed.values())}

    # -- the database (in a worker thread) -------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.path, timeout=10)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(_SCHEMA)
        self.path.chmod(0o600)
        return connection

    def _read_all(self) -> list[KeyRecord]:
        if self.path is None or not self.path.exists():
            return []
        with _closing(self._connect()) as db:
            return [_from_row(row) for row in db.execute(
                "SELECT name, secret_hash, prefix, admin, profile, created_at, updated_at, "
                "expires_at, revoked_at FROM keys")]

    def _write(self, record: KeyRecord) -> None:
        with _closing(self._connect()) as db, db:
            db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (record.name, record.secret_hash, record.prefix, int(record.admin),
                        record.profile.model_dump_json(exclude_none=True), record.created_at,
                        record.updated_at, record.expires_at, record.revoked_at))


def record_to_dict(record: KeyRecord) -> dict[str, Any]:
    """A managed key as JSON-ready data (its secret's hash, never the secret)."""
    return {"name": record.name, "secret_hash": record.secret_hash, "prefix": record.prefix,
            "admin": record.admin, "profile": record.profile.model_dump(exclude_none=True),
            "created_at": record.created_at, "updated_at": record.updated_at,
            "expires_at": record.expires_at, "revoked_at": record.revoked_at}


def record_from_dict(data: dict[str, Any]) -> KeyRecord:
    return KeyRecord(str(data["name"]), str(data["secret_hash"]),
                     ClientProfile.model_validate(data.get("profile") or {}),
                     admin=bool(data.get("admin")), prefix=str(data.get("prefix", "")),
                     created_at=float(data["created_at"]), updated_at=float(data["updated_at"]),
                     expires_at=data.get("expires_at"), revoked_at=data.get("revoked_at"))


def _from_row(row: Iterable[Any]) -> KeyRecord:
    name, secret_hash, prefix, admin, profile, created, updated, expires, revoked = row
    return KeyRecord(name, secret_hash, ClientProfile.model_validate(json.loads(profile)),
                     admin=bool(admin), prefix=prefix, created_at=created, updated_at=updated,
                     expires_at=expires, revoked_at=revoked)


class _closing:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def __enter__(self) -> sqlite3.Connection:
        return self.connection

    def __exit__(self, *exc: object) -> None:
        self.connection.close()


def _prefix(secret: str) -> str:
    """The start of a secret shown in lists: a managed key's prefix and 4 random characters
    (enough to tell keys apart); of a config file's key, 3 characters."""
    shown = 7 if secret.startswith(SECRET_PREFIX) else 3
    return secret[:shown] + "…"
