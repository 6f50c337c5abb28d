"""``system_fingerprint`` (backends/llama/fingerprint.py): llama.cpp's ``b0-unknown`` (a build
without its git metadata, as the xllamacpp wheel's) becomes the build the worker kind knows,
in a whole answer and in a stream however its bytes were cut; a real build passes untouched."""

from __future__ import annotations

import importlib.metadata
from collections.abc import AsyncIterator

import orjson
import pytest

from model_boss.backends.base import HttpWorkerBackend, UpstreamResponse
from model_boss.backends.llama.fingerprint import rewrite, rewrite_stream
from model_boss.backends.llama.server import BinaryLlamaBackend, NativeLlamaBackend
from model_boss.catalog import CatalogEntry, ModelManifest
from model_boss.settings import Settings

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
         "system_fingerprint": "b0-unknown",
         "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
STREAM = b"".join(b"data: " + orjson.dumps(CHUNK) + b"\n\n" for _ in range(3)) \
    + b"data: [DONE]\n\n"


async def _cut(raw: bytes, at: list[int]) -> AsyncIterator[bytes]:
    for start, end in zip([0, *at], [*at, len(raw)], strict=True):
        yield raw[start:end]


async def _joined(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def test_a_stream_cut_anywhere_gets_the_build_in_every_event():
    expected = STREAM.replace(b'"b0-unknown"', b'"xllamacpp-1.2"')
    for cut in range(1, len(STREAM) - 3):  # every cut, and a three-byte piece after it
        for cuts in ([cut], [cut, cut + 3]):
            assert await _joined(rewrite_stream(_cut(STREAM, cuts), "xllamacpp-1.2")) \
                == expected, cuts


async def test_an_unknown_build_is_null_and_a_real_one_passes():
    nulled = await _joined(rewrite_stream(_cut(STREAM, [50]), None))
    assert b"b0-unknown" not in nulled
    assert orjson.loads(nulled.split(b"\n\n")[0][6:])["system_fingerprint"] is None
    real = STREAM.replace(b"b0-unknown", b"b6123-4f0ab12")
    assert await _joined(rewrite_stream(_cut(real, [77]), "xllamacpp-1.2")) == real
    assert rewrite(orjson.dumps(CHUNK), "x") == orjson.dumps(
        {**CHUNK, "system_fingerprint": "x"})


def _backend(kind: type, tmp_path) -> HttpWorkerBackend:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    entry = CatalogEntry(ModelManifest(id="m", path=str(model)), model)
    return kind(entry, Settings(state_dir=tmp_path, use_nvml=False))


@pytest.mark.parametrize("stream", [True, False])
async def test_the_native_worker_answers_with_the_wheels_build(tmp_path, monkeypatch, stream):
    async def upstream(self, endpoint, body, streamed):  # llama.cpp's server, as it answers
        return UpstreamResponse(200, {"content-type": "text/event-stream"},
                                stream=_cut(STREAM, [40, 41, 120]))

    monkeypatch.setattr(HttpWorkerBackend, "handle_request", upstream)
    build = "xllamacpp-" + importlib.metadata.version("xllamacpp")
    native = _backend(NativeLlamaBackend, tmp_path)
    assert native.llama_build() == build
    answer = await native.handle_request("/v1/chat/completions", {"messages": []}, stream)
    raw = await _joined(answer.stream) if stream else answer.body
    assert b"b0-unknown" not in raw and raw.count(build.encode()) == (3 if stream else 1)
    binary = _backend(BinaryLlamaBackend, tmp_path)
    assert binary.llama_build() is None  # its own build_info, when it knows one, stays
