"""The inference routes, declared once: each path a request is served on (the queue, the
accounting, the serving path and the backends name a request's route by it) and the kind of
route a key's ``endpoints`` scope names it by (``chat``, ``embeddings``, ``rerank``,
``images``, ``video``, ``audio``, ``realtime``)."""

from __future__ import annotations

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
EMBEDDINGS = "/v1/embeddings"
RERANK = "/v1/rerank"
IMAGES = "/v1/images/generations"
EDITS = "/v1/images/edits"
VIDEOS = "/v1/videos"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
SPEECH = "/v1/audio/speech"
JOBS = "/api/v1/jobs"
REALTIME = "/v1/realtime"

KINDS = ("chat", "embeddings", "rerank", "images", "video", "audio", "realtime")


def endpoint_kind(path: str) -> str:
    """The kind of route ``path`` is, as a key's ``endpoints`` scope names it (Ollama's,
    AUTOMATIC1111's and llama.cpp's own routes included)."""
    if "embed" in path:
        return "embeddings"
    if "rerank" in path:
        return "rerank"
    if "/images/" in path or path.startswith("/sdapi/"):
        return "images"
    if path.startswith(VIDEOS):
        return "video"
    if "/audio/" in path:
        return "audio"
    if path == REALTIME:
        return "realtime"
    return "chat"
