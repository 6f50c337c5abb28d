"""Keys across a cluster, as an operator meets them: a key made on one member through
``POST /api/v1/keys`` opens the other member too, and revoked there through ``DELETE`` it is
refused on the other, each within a moment, by the members' own Redis notices (no member is
told by hand)."""

from __future__ import annotations

import httpx
import pytest

from tests.cluster_members import members_on_one_redis
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

ADMIN = "cluster-keys-admin-0123456789"
SECRET = "cluster-keys-secret-0123456789"


def models_with(server, key: str) -> int:
    return httpx.get(server.url + "/v1/models", timeout=10,
                     headers={"authorization": f"Bearer {key}"}).status_code


def test_a_key_made_on_one_member_opens_the_other_until_revoked_there(tmp_path_factory):
    with members_on_one_redis(tmp_path_factory, "keys", [], {"admin_api_key": ADMIN},
                              SECRET) as members:
        a, b = members["a"], members["b"]
        admin = {"authorization": f"Bearer {ADMIN}"}
        made = httpx.post(a.url + "/api/v1/keys", json={"name": "alice"}, headers=admin,
                          timeout=10)
        assert made.status_code == 201, made.text
        secret = made.json()["key"]
        assert models_with(a, secret) == 200
        # the notice, within 2 s (the periodic read of the keys is every 5 s)
        wait_for(lambda: models_with(b, secret) == 200, timeout=2,
                 what=lambda: models_with(b, secret))
        revoked = httpx.delete(a.url + "/api/v1/keys/alice", headers=admin, timeout=10)
        assert revoked.status_code == 200, revoked.text
        assert models_with(a, secret) == 401
        wait_for(lambda: models_with(b, secret) == 401, timeout=2,
                 what=lambda: models_with(b, secret))
        listed = httpx.get(b.url + "/api/v1/keys", headers=admin, timeout=10).json()["keys"]
        alice = [key for key in listed if key["name"] == "alice"]
        assert len(alice) == 1 and alice[0]["revoked_at"], listed  # listed revoked there too
