"""The prompt cache's decisions and files, without a worker: what goes when over the bound
(a table), which files are complete saves, the save and restore calls against a stand-in
for llama.cpp's slot API (a save past its time bound among them), the bound kept before each
save and at start, and the admin key the clearing route asks for."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

from model_boss.backends.llama.prompt_cache import MB, PromptCache, Saved, over_bound
from model_boss.backends.llama.server import NativeLlamaBackend
from model_boss.catalog import CatalogEntry, ModelManifest
from model_boss.settings import Settings

from .fakes import coordinator, manifest, started_client


def saved(name: str, mb: int, used_at: float) -> Saved:
    return Saved(Path(name), mb * MB, used_at)


@pytest.mark.parametrize("files, bound_mb, out", [
    ([], 10, []),
    ([saved("a", 4, 1), saved("b", 4, 2)], 10, []),  # fits
    ([saved("a", 4, 1), saved("b", 4, 2), saved("c", 4, 3)], 10, ["a"]),  # oldest out
    ([saved("c", 4, 3), saved("a", 4, 1), saved("b", 4, 2)], 4, ["a", "b"]),
    ([saved("a", 20, 5), saved("b", 1, 1)], 10, ["b", "a"]),  # least recently used first
    ([saved("a", 4, 1), saved("b", 4, 1)], 4, ["a"]),  # a tie: by name, stable
    ([saved("a", 4, 1)], 0, ["a"]),  # off: everything goes
])
def test_what_goes_over_the_bound(files, bound_mb, out):
    assert [f.path.name for f in over_bound(files, bound_mb * MB)] == out


class SlotApi:
    """llama.cpp's ``/slots`` and ``/slots/{id}?action=save|restore`` on a shelf folder."""

    def __init__(self, shelf: Path, slots: list[dict], refuse_restore: bool = False,
                 size: int = 2000) -> None:
        self.shelf, self.slots, self.refuse_restore = shelf, slots, refuse_restore
        self.size = size  # bytes a save writes
        self.restored: list[tuple[int, str]] = []
        self.peak = 0  # the most bytes the whole cache held right after a write

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots":
            return httpx.Response(200, json=self.slots)
        if request.url.path == "/metrics":
            return httpx.Response(200, text="llamacpp:prompt_tokens_cached_total 1234\n")
        slot = int(request.url.path.rsplit("/", 1)[1])
        name = json.loads(request.content)["filename"]
        if request.url.params["action"] == "save":
            (self.shelf / name).write_bytes(b"k" * self.size)
            self.peak = max(self.peak, on_disk(self.shelf.parent.parent))
            return httpx.Response(200, json={"id_slot": slot, "n_saved": 700,
                                             "timings": {"save_ms": 1.0}})
        if self.refuse_restore:
            return httpx.Response(400, json={"error": {"message": "bad file"}})
        self.restored.append((slot, name))
        return httpx.Response(200, json={"id_slot": slot, "n_restored": 700})


class SlowSave(SlotApi):
    """llama.cpp writing a save slower than its bound: like the real server, it goes on
    writing after the caller gave up, and finishes the file late."""

    def __init__(self, shelf: Path, slots: list[dict], write_s: float) -> None:
        super().__init__(shelf, slots)
        self.write_s = write_s
        self.late: list[asyncio.Task] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.params.get("action") != "save":
            return self(request)
        name = json.loads(request.content)["filename"]
        (self.shelf / name).write_bytes(b"half")
        self.late.append(asyncio.get_running_loop().create_task(self.finish(name)))
        await asyncio.shield(self.late[-1])  # a cut-off stops the wait, not the write
        return httpx.Response(200, json={"id_slot": 0, "n_saved": 700})

    async def finish(self, name: str) -> None:
        await asyncio.sleep(self.write_s)
        (self.shelf / name).write_bytes(b"kv" * 1000)


def on_disk(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def client(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://w")


def cache(tmp_path: Path, bound_mb: int = 100, save_s: float = 5) -> PromptCache:
    return PromptCache(tmp_path / "cache", bound_mb, min_tokens=500, save_s=save_s)


async def test_slots_with_long_prompts_are_saved_and_the_newest_restored(tmp_path):
    prompts = cache(tmp_path)
    shelf = prompts.shelf("m", {"model": "x"})
    api = SlotApi(shelf, [{"id": 0, "n_prompt_tokens": 700}, {"id": 1, "n_prompt_tokens": 20}])
    async with httpx.AsyncClient(transport=httpx.MockTransport(api), base_url="http://w") as c:
        assert await prompts.save(c, shelf, "m") == 1  # slot 1's prompt is too short
        assert await prompts.save(c, shelf, "m") == 1  # a newer save of slot 0 replaces it
        assert len(list(shelf.glob("*.bin"))) == 1 and len(list(shelf.glob("*.json"))) == 1
        assert os.stat(next(shelf.glob("*.bin"))).st_mode & 0o777 == 0o600
        assert await prompts.restore(c, shelf, "m", slots=1) == 700
    assert api.restored == [(0, next(shelf.glob("*.bin")).name)]
    stats = prompts.stats("m")
    assert stats["last_save_s"] >= 0 and stats["last_restore_s"] >= 0
    assert {k: stats[k] for k in ("enabled", "files", "saves", "restores",
                                  "restored_tokens")} == {
        "enabled": True, "files": 1, "saves": 2, "restores": 1, "restored_tokens": 700}


async def test_incomplete_and_refused_files_are_never_restored_and_are_removed(tmp_path):
    prompts = cache(tmp_path)
    shelf = prompts.shelf("m", {"model": "x"})
    (shelf / "0-1.partial").write_bytes(b"cut short")
    (shelf / "0-2.bin").write_bytes(b"no description")
    (shelf / "0-3.json.tmp").write_bytes(b"{}")
    api = SlotApi(shelf, [])
    async with httpx.AsyncClient(transport=httpx.MockTransport(api), base_url="http://w") as c:
        assert await prompts.restore(c, shelf, "m", slots=1) == 0
        assert api.restored == [] and list(shelf.iterdir()) == []
        (shelf / "0-4.bin").write_bytes(b"foreign")
        (shelf / "0-4.json").write_bytes(b"{}")
        api.refuse_restore = True  # llama.cpp refuses a file it cannot read
        assert await prompts.restore(c, shelf, "m", slots=1) == 0
    assert list(shelf.iterdir()) == []


def test_shelves_part_models_and_settings(tmp_path):
    prompts = cache(tmp_path)
    a = prompts.shelf("a", {"model": "same.gguf", "ctx_size": 2048})
    assert prompts.shelf("b", {"model": "same.gguf", "ctx_size": 2048}) != a
    assert prompts.shelf("a", {"model": "same.gguf", "ctx_size": 4096}) != a
    assert prompts.shelf("a", {"ctx_size": 2048, "model": "same.gguf"}) == a
    assert prompts.shelf("org/m:q4", {}).parent.parent == prompts.root  # one folder per id
    assert os.stat(a).st_mode & 0o777 == 0o700


def test_the_bound_is_kept_across_models_and_a_clear_removes_one(tmp_path):
    prompts = cache(tmp_path, bound_mb=1)
    for model, age in (("a", 1), ("b", 2), ("c", 3)):
        shelf = prompts.shelf(model, {})
        (shelf / "0-1.bin").write_bytes(b"\0" * (MB // 2 - 2))  # with its 2-byte .json
        (shelf / "0-1.json").write_bytes(b"{}")
        os.utime(shelf / "0-1.bin", (age, age))
    assert [s.path.parent.parent.name[:1] for s in prompts.enforce()] == ["a"]
    assert prompts.stats("a")["files"] == 0 and prompts.stats("b")["files"] == 1
    assert prompts.clear("c") == {"removed_files": 1, "freed_mb": 0.5}
    assert prompts.stats("c")["files"] == 0 and prompts.stats("b")["files"] == 1


async def test_a_save_past_its_bound_is_cut_off_and_what_it_left_never_restored(tmp_path):
    prompts = cache(tmp_path, save_s=0.2)
    shelf = prompts.shelf("m", {"model": "x"})
    api = SlowSave(shelf, [{"id": 0, "n_prompt_tokens": 700}], write_s=1.5)
    async with client(api.handle) as c:
        assert await prompts.save(c, shelf, "m") == 0
        # cut off at its bound, not at the write's end: the write is still going on
        assert [task.done() for task in api.late] == [False]
        await asyncio.gather(*api.late)  # llama.cpp finishes writing after all
        assert [p.suffix for p in shelf.iterdir()] == [".partial"]  # never renamed, undescribed
        assert await prompts.restore(c, shelf, "m", slots=1) == 0
    assert api.restored == [] and list(shelf.iterdir()) == []
    assert prompts.stats("m")["saves"] == prompts.stats("m")["restores"] == 0


async def test_a_slow_save_does_not_hold_up_the_swap(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")

    class Running(NativeLlamaBackend):
        alive = True  # a worker that is up (no process here)

    worker = Running(CatalogEntry(ModelManifest(id="m", path=str(gguf)), gguf), Settings())
    worker.prompt_cache = cache(tmp_path, save_s=0.2)
    worker.server_flags(1, None)  # the load's shelf
    assert worker._shelf is not None
    api = SlowSave(worker._shelf, [{"id": 0, "n_prompt_tokens": 700}], write_s=30)
    worker._client = client(api.handle)
    await worker.retire()  # the owner stops the worker right after: the swap goes on
    assert [task.done() for task in api.late] == [False]  # not waited for (30 s of writing)
    assert worker.prompt_cache.stats("m")["files"] == 0
    assert worker.prompt_cache.stats("m")["reused_tokens"] == 1234  # llama.cpp's /metrics
    api.late[0].cancel()
    await worker._client.aclose()


async def test_each_save_makes_room_for_itself_first(tmp_path):
    prompts = cache(tmp_path, bound_mb=1)
    size = 400_000  # three of these do not fit in 1 MB
    for model in ("a", "b", "c"):
        shelf = prompts.shelf(model, {})
        api = SlotApi(shelf, [{"id": 0, "n_prompt_tokens": 600,
                               "next_token": [{"n_decoded": 100}]}], size=size)
        async with client(api) as c:
            assert await prompts.save(c, shelf, model) == 1
        # a's save came with nothing to foresee it by; b's and c's were foreseen
        assert api.peak <= MB, (model, api.peak)
    assert prompts.stats("a")["files"] == 0 and prompts.stats("c")["files"] == 1
    async with client(api) as c:  # c again: its older save goes first (it replaces it), not b
        assert await prompts.save(c, shelf, "c") == 1
    assert api.peak <= MB and prompts.stats("b")["files"] == prompts.stats("c")["files"] == 1
    assert on_disk(prompts.root) <= MB
    big = prompts.shelf("d", {})
    api = SlotApi(big, [{"id": 0, "n_prompt_tokens": 5000}], size=size * 8)
    async with client(api) as c:  # foreseen at about 4 MB: not even tried
        assert await prompts.save(c, big, "d") == 0
    assert api.peak == 0 and prompts.stats("c")["files"] == 1


def test_at_start_the_bound_is_kept_and_what_a_kill_left_goes(tmp_path):
    prompts = cache(tmp_path, bound_mb=100)
    for model, fingerprint, age in (("a", "old", 1), ("a", "new", 3), ("b", "x", 2)):
        shelf = prompts.shelf(model, {"settings": fingerprint})
        (shelf / "0-1.bin").write_bytes(b"\0" * (MB // 2))
        (shelf / "0-1.json").write_bytes(b"{}")
        os.utime(shelf / "0-1.bin", (age, age))
    (shelf / "0-2.partial").write_bytes(b"cut short")
    prompts.shelf("c", {})  # an empty shelf
    assert len(PromptCache(prompts.root, 100, 500, 5).files()) == 3  # within its bound: kept
    assert not list(prompts.root.rglob("*.partial"))
    again = PromptCache(prompts.root, 1, 500, 5)  # prompt_cache_mb lowered: now, not later
    assert on_disk(again.root) <= MB
    assert [f.path.parent.parent.name[:1] for f in again.files()] == ["a"]  # the newest
    assert {p.name[:1] for p in again.root.iterdir()} == {"a"}  # empty folders gone
    assert len(list(again.root.glob("*/*"))) == 1
    PromptCache(prompts.root, 0, 500, 5)  # off: none kept
    assert not list(prompts.root.rglob("*.bin"))


ADMIN = {"authorization": "Bearer admin-key"}
USER = {"authorization": "Bearer user-key"}


@pytest.mark.parametrize("headers, expected", [({}, 401), (USER, 401), (ADMIN, 200)],
                         ids=["no key", "user key", "admin key"])
async def test_clearing_a_models_cache_asks_for_the_admin_key(tmp_path, headers, expected):
    coord, _ = coordinator(tmp_path, [manifest("a")], api_key="user-key",
                           admin_api_key="admin-key")
    shelf = coord.pool.prompt_cache.shelf("a", {})
    (shelf / "0-1.bin").write_bytes(b"kv")
    (shelf / "0-1.json").write_bytes(b"{}")
    async with started_client(coord) as c:
        answer = await c.delete("/api/v1/models/a/cache", headers=headers)
    assert answer.status_code == expected, answer.text
    assert coord.pool.prompt_cache.stats("a")["files"] == (0 if expected == 200 else 1)
