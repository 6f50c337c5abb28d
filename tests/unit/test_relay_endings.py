"""How a relayed stream ends in the bill: a client that goes after its answer's last event was
delivered had its whole answer (``ok``, not cancelled); one that goes before is cancelled, and
charged the token events relayed to it; a stream that says its count is charged that."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from model_boss.scheduling.request import QueuedRequest, SlotTicket
from model_boss.services.served import relay

OPENAI = [b'data: {"choices":[{"delta":{"content":"He"}}]}\n\n',
          b'data: {"choices":[{"delta":{"content":"llo"}}]}\n\n',
          b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n',
          b"data: [DONE]\n\n"]
RESPONSES = [b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
             b'"delta":"Hi"}\n\n',
             b'event: response.completed\ndata: {"type":"response.completed","response":'
             b'{"usage":{"input_tokens":5,"output_tokens":1,"total_tokens":6}}}\n\n']
ANTHROPIC = [b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
             b'"delta":{"type":"text_delta","text":"Hi"}}\n\n',
             b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
             b'"end_turn"},"usage":{"output_tokens":1}}\n\n',
             b'event: message_stop\ndata: {"type":"message_stop"}\n\n']
OLLAMA = [b'{"message":{"content":"Hi"},"done":false}\n',
          b'{"message":{"content":""},"done":true,"eval_count":1}\n']


async def ticket_for() -> tuple[SlotTicket, list[tuple[bool, bool]]]:
    released: list[tuple[bool, bool]] = []
    request = QueuedRequest(model_id="m", priority=5)
    slot = SimpleNamespace(loaded_at=None, key="m", model_id="m")
    ticket = SlotTicket(lambda t, ok, fault: released.append((ok, fault)), request, slot)
    return ticket, released


async def stream(chunks: list[bytes], then_wait: bool) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
    if then_wait:  # the worker's stream stays open after its last event (as llama.cpp's may)
        await asyncio.sleep(3600)


@pytest.mark.parametrize("chunks", [OPENAI[:-1] + [OPENAI[-1]], RESPONSES, ANTHROPIC, OLLAMA],
                         ids=["openai", "responses", "anthropic", "ollama"])
async def test_a_client_that_goes_after_the_last_event_had_its_whole_answer(chunks) -> None:
    ticket, released = await ticket_for()
    relayed = relay(stream(chunks, then_wait=True), ticket, "m")
    for _ in chunks:  # the client reads every event, then closes (as codex exec does)
        await relayed.__anext__()
    waiting = asyncio.ensure_future(relayed.__anext__())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert released == [(True, False)]


@pytest.mark.parametrize("chunks, taken, generated", [
    (OPENAI, 2, 2), (RESPONSES, 1, 1), (ANTHROPIC, 1, 1), (OLLAMA, 1, 1)],
    ids=["openai", "responses", "anthropic", "ollama"])
async def test_a_client_that_goes_mid_answer_is_cancelled_and_charged_what_it_got(
        chunks, taken, generated) -> None:
    ticket, released = await ticket_for()
    relayed = relay(stream(chunks, then_wait=False), ticket, "m")
    for _ in range(taken):
        await relayed.__anext__()
    await relayed.aclose()
    assert released == [(False, True)]
    assert ticket.figures.completion_tokens == generated and ticket.tokens == generated


async def test_a_whole_stream_is_charged_what_it_says() -> None:
    ticket, released = await ticket_for()
    async for _ in relay(stream(OPENAI, then_wait=False), ticket, "m"):
        pass
    assert released == [(True, False)]
    assert ticket.figures.completion_tokens == 2 and ticket.figures.prompt_tokens == 5
