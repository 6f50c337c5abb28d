"""RuntimeConfig: camelCase on the wire, validation, persistence in state_dir."""

from __future__ import annotations

import pytest

from model_boss.errors import BadRequest, StoreUnavailable
from model_boss.runtime_config import RuntimeConfig, RuntimeValues


async def test_update_validates_and_persists(tmp_path):
    state = tmp_path / "runtime_config.json"
    config = RuntimeConfig(RuntimeValues(), state_file=state)
    assert config.values.wire() == {"allowCloudFallback": True}
    assert await config.update({"allowCloudFallback": False}) == {"allowCloudFallback": False}
    for bad in ({"allowCloudFallback": "nope"}, {"allowCloudFallback": 1}, {"other": True},
                ["x"]):
        with pytest.raises(BadRequest):
            await config.update(bad)
    assert config.allow_cloud_fallback is False
    again = RuntimeConfig(RuntimeValues(allow_cloud_fallback=True), state_file=state)
    await again.restore()
    assert again.allow_cloud_fallback is False


async def test_seed_applies_when_nothing_persisted(tmp_path):
    config = RuntimeConfig(RuntimeValues(allow_cloud_fallback=False),
                           state_file=tmp_path / "none.json")
    await config.restore()
    assert config.allow_cloud_fallback is False


async def test_failed_write_changes_nothing(tmp_path):
    (tmp_path / "not-a-dir").write_text("")
    config = RuntimeConfig(RuntimeValues(), state_file=tmp_path / "not-a-dir" / "config.json")
    with pytest.raises(StoreUnavailable) as failed:
        await config.update({"allowCloudFallback": False})
    assert failed.value.status_code == 503 and failed.value.headers() == {"Retry-After": "5"}
    assert config.allow_cloud_fallback is True
