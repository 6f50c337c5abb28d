"""The prompt cache's decisions and files, without a worker: what goes when over the bound
(a table), which files are complete saves, and the save and restore calls against a stand-in
for llama.cpp's slot API."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from model_boss.backends.llama.prompt_cache import MB, PromptCache, Saved, over_bound


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

    def __init__(self, shelf: Path, slots: list[dict], refuse_restore: bool = False) -> None:
        self.shelf, self.slots, self.refuse_restore = shelf, slots, refuse_restore
        self.restored: list[tuple[int, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots":
            return httpx.Response(200, json=self.slots)
        slot = int(request.url.path.rsplit("/", 1)[1])
        name = __import__("json").loads(request.content)["filename"]
        if request.url.params["action"] == "save":
            (self.shelf / name).write_bytes(b"kv" * 1000)
            return httpx.Response(200, json={"id_slot": slot, "n_saved": 700,
                                             "timings": {"save_ms": 1.0}})
        if self.refuse_restore:
            return httpx.Response(400, json={"error": {"message": "bad file"}})
        self.restored.append((slot, name))
        return httpx.Response(200, json={"id_slot": slot, "n_restored": 700})


def cache(tmp_path: Path, bound_mb: int = 100) -> PromptCache:
    return PromptCache(tmp_path / "cache", bound_mb, min_tokens=500, save_s=5)


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
        (shelf / "0-1.bin").write_bytes(b"\0" * (MB // 2))
        (shelf / "0-1.json").write_bytes(b"{}")
        os.utime(shelf / "0-1.bin", (age, age))
    assert [s.path.parent.parent.name[:1] for s in prompts.enforce()] == ["a"]
    assert prompts.stats("a")["files"] == 0 and prompts.stats("b")["files"] == 1
    assert prompts.clear("c") == {"removed_files": 1, "freed_mb": 0.5}
    assert prompts.stats("c")["files"] == 0 and prompts.stats("b")["files"] == 1
