"""``GET /api/v1/usage``: the ledger's rows grouped and summed, as JSON or CSV. A user key
sees only its own rows; an admin (or a daemon without keys) sees every key's."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from ...errors import BadRequest
from ...tenancy.keys.identity import identity_of
from ...tenancy.usage import SUMMED, day_start, group_names, rows_to_csv
from ..context import coordinator_of
from ..errors import OpenAIError, documented

router = APIRouter(tags=["usage"], responses=documented(OpenAIError))

FORMATS = ("json", "csv")


def parse_moment(value: str, param: str, *, end: bool = False) -> float:
    """An ISO 8601 date or datetime as Unix seconds (no zone: UTC). A bare date is its
    midnight; as ``end`` (the ``to`` bound, exclusive) the midnight after it, so
    ``to=2025-05-31`` takes in all of the 31st."""
    text = value.strip()
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return (moment + timedelta(days=1 if end else 0)).timestamp()
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{param}: '{value}' is not an ISO 8601 date or datetime "
                         "(e.g. 2025-05-01 or 2025-05-01T12:00:00Z)", param=param) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def _names(group_by: str) -> list[str]:
    return group_names([name.strip() for name in group_by.split(",") if name.strip()])


@router.get("/api/v1/usage")
async def usage(
    request: Request,
    group_by: str = Query(default="key,model", description=(
        "comma-separated: key, end_user, model, endpoint, outcome, day, hour, member "
        "(empty: one row of totals)")),
    from_: str | None = Query(default=None, alias="from", description=(
        "ISO 8601 date or datetime, UTC when no zone is given (default: today's start)")),
    to: str | None = Query(default=None, description=(
        "ISO 8601, exclusive; a bare date takes in that whole day (default: now)")),
    format_: str = Query(default="json", alias="format", description="json or csv"),
    key: str | None = Query(default=None, description="only this key's rows"),
    model: str | None = Query(default=None, description="only this model's rows"),
    endpoint: str | None = Query(default=None, description="only this endpoint's rows"),
) -> Any:
    """Usage between ``from`` and ``to`` grouped by ``group_by``: each row holds its group
    columns, ``requests`` and the sums of tokens, images, audio and GPU-seconds."""
    if format_ not in FORMATS:
        raise BadRequest(f"format: '{format_}' is not one of json, csv", param="format")
    groups = _names(group_by)
    now = time.time()
    start = parse_moment(from_, "from") if from_ else day_start(now)
    end = parse_moment(to, "to", end=True) if to else now
    if start > end:
        raise BadRequest(f"from: {_iso(start)} is after to ({_iso(end)})", param="from")
    key = key or None  # an empty ``key=`` asks for no filter
    identity = identity_of(request.scope)
    if identity is not None and identity.key is not None and not identity.admin:
        key = identity.key  # a user key sees its own rows, whatever it asked
    rows = await coordinator_of(request).usage_report(
        start=start, end=end, group_by=groups, key=key, model=model or None,
        endpoint=endpoint or None)
    if format_ == "csv":
        return Response(rows_to_csv(rows, [*groups, "requests", *SUMMED]),
                        media_type="text/csv; charset=utf-8",
                        headers={"content-disposition": 'attachment; filename="usage.csv"'})
    return {"rows": rows, "from": _iso(start), "to": _iso(end), "group_by": groups}
