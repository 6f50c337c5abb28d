"""Two (or more) real coordinators in one cluster on one real Redis, a declared GPU each: what
the cluster end-to-end files share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import httpx

from tests.conftest import RedisServer, ServerProcess, wait_for


@contextlib.contextmanager
def members_on_one_redis(tmp_path_factory, name: str, manifests: list[dict], config: dict,
                         secret: str, hosts: str = "ab",
                         env: Callable[[str], dict[str, str]] = lambda host: {},
                         ) -> Iterator[dict[str, ServerProcess]]:
    """Members ``hosts`` (their host ids) started with ``config`` and ``manifests`` (and each
    its ``env(host)``), each seeing the others before it is handed out; stopped, and Redis
    with them, after."""
    redis_server = RedisServer(tmp_path_factory.mktemp(f"{name}-redis")).start()
    servers = {host: ServerProcess(
        tmp_path_factory.mktemp(f"{name}-member-{host}"),
        {"redis_url": redis_server.url, "cluster": True, "host_id": host,
         "gpus": [{"index": 0, "name": f"sim-{host}", "vram_mb": 4096}], **config},
        manifests, env={"MODEL_BOSS_CLUSTER_SECRET": secret, **env(host)},
        # where the members take an admin key, the helpers here send it
        headers={"authorization": f"Bearer {config['admin_api_key']}"}
        if "admin_api_key" in config else None) for host in hosts}
    try:
        for server in servers.values():
            server.start(60)
        wait_for(lambda: all(len(cluster(s)["members"]) == len(hosts)
                             for s in servers.values()), timeout=15)
        yield servers
    finally:
        for server in servers.values():
            server.stop()
        redis_server.stop()


def cluster(server: ServerProcess) -> dict:
    return httpx.get(server.url + "/api/v1/cluster", headers=server.headers, timeout=10).json()
