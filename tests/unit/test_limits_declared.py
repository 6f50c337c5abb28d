"""The limits a key may carry, and those it sets on each end user under it, are declared once
(settings.LIMITS, RATES, QUOTAS, END_USER_LIMITS) and every reader takes them from there: a
client profile, the key API's body, the keys command line, and the policy, which refuses on
each quota by its own name."""

from __future__ import annotations

import typing

import pytest

from model_boss.api.tenants.keys import KeyChange
from model_boss.cli.keys import END_USER_LIMITS as CLI_END_USER_LIMITS
from model_boss.cli.keys import LIMITS as CLI_LIMITS
from model_boss.settings import (
    END_USER_LIMITS,
    LIMITS,
    QUOTAS,
    RATES,
    ClientProfile,
    EndUserLimits,
)
from model_boss.tenancy.keys import refusal
from model_boss.tenancy.keys.policy import MinuteReading
from model_boss.tenancy.usage import Spent


def base_type(annotation: object) -> type:
    """int or float out of ``X | None`` and ``Annotated[X, ...]``."""
    for part in typing.get_args(annotation) or (annotation,):
        part = typing.get_args(part)[0] if typing.get_origin(part) is typing.Annotated \
            else part
        if part in (int, float):
            return part  # type: ignore[return-value]
    raise AssertionError(f"no number in {annotation!r}")


def test_rates_and_quotas_are_limits() -> None:
    assert set(RATES) | set(QUOTAS) <= set(LIMITS) and not set(RATES) & set(QUOTAS)


@pytest.mark.parametrize("model", [ClientProfile, KeyChange], ids=["profile", "key API"])
def test_every_limit_is_a_field_of_its_type(model) -> None:
    fields = model.model_fields
    assert set(LIMITS) <= set(fields), set(LIMITS) - set(fields)
    assert {name: base_type(fields[name].annotation) for name in LIMITS} == LIMITS


def test_the_command_line_takes_every_limit() -> None:
    assert CLI_LIMITS is LIMITS
    assert CLI_END_USER_LIMITS is END_USER_LIMITS


def test_every_end_user_limit_is_a_field_of_its_type() -> None:
    """``end_user_limits``: declared once (settings.END_USER_LIMITS), a field of a client
    profile and of the key API's body, each limit of the key's own name and type."""
    fields = EndUserLimits.model_fields
    assert {name: base_type(fields[name].annotation) for name in fields} == END_USER_LIMITS
    assert {name: LIMITS[name] for name in END_USER_LIMITS} == END_USER_LIMITS
    for model in (ClientProfile, KeyChange):
        assert EndUserLimits in typing.get_args(model.model_fields["end_user_limits"].annotation)


@pytest.mark.parametrize("quota", list(QUOTAS))
def test_the_policy_refuses_on_each_quota_by_its_name(quota: str) -> None:
    spent = Spent(requests=1, tokens=5, images=1, audio_seconds=1.0, gpu_seconds=1.0)
    error = refusal("k", ClientProfile(**{quota: 0}), now=1.8e9, minute=MinuteReading(),
                    day=spent, month=spent)
    assert error is not None and error.param == quota and error.status_code == 429


def test_the_routes_and_their_kinds_are_declared_once() -> None:
    """Every inference route's path is a constant of model_boss.endpoints, and each is of a
    kind a key's ``endpoints`` scope can name (settings.EndpointKind)."""
    from model_boss import endpoints
    from model_boss.settings import EndpointKind

    assert set(typing.get_args(EndpointKind)) == set(endpoints.KINDS)
    kinds = {name: endpoints.endpoint_kind(value) for name, value in vars(endpoints).items()
             if name.isupper() and isinstance(value, str)}
    assert kinds == {"CHAT": "chat", "COMPLETIONS": "chat", "RESPONSES": "chat",
                     "MESSAGES": "chat", "COUNT_TOKENS": "chat", "EMBEDDINGS": "embeddings",
                     "RERANK": "rerank", "IMAGES": "images", "EDITS": "images",
                     "VIDEOS": "video", "TRANSCRIPTIONS": "audio", "TRANSLATIONS": "audio",
                     "SPEECH": "audio", "JOBS": "chat", "REALTIME": "realtime"}
    assert endpoints.endpoint_kind("/sdapi/v1/txt2img") == "images"
    assert endpoints.endpoint_kind("/api/embed") == "embeddings"
