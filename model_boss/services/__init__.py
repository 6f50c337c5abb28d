"""Transport-neutral services: what a request means and how it is served, apart from how it
arrived (HTTP today, a job tomorrow). Nothing here knows FastAPI or Starlette."""

from .cancel import ClientDisconnected, Departure, unless_disconnected
from .extensions import Extensions, pop_extensions
from .jobs import accept_job, job_key, run_job, submitted
from .load_wait import serve_streaming
from .media.images import EDITS, FILES_PATH, IMAGES, edit_images, generate_images
from .schemas import (
    ENDPOINT_BODIES,
    ChatRequest,
    CompletionRequest,
    EditRequest,
    EmbeddingRequest,
    ImageRequest,
    ResponsesRequest,
    SpeechRequest,
    VideoRequest,
)
from .served import CACHED_PREFIX_HEADER, MODEL_HEADER, REPLICA_HEADER, WAIT_HEADER, Served
from .serving import serve
from .validation import bad_request, parse

__all__ = [
    "Departure",
    "EDITS",
    "EditRequest",
    "VideoRequest",
    "edit_images",
    "ENDPOINT_BODIES",
    "FILES_PATH",
    "IMAGES",
    "CACHED_PREFIX_HEADER",
    "MODEL_HEADER",
    "REPLICA_HEADER",
    "WAIT_HEADER",
    "ChatRequest",
    "ClientDisconnected",
    "CompletionRequest",
    "EmbeddingRequest",
    "Extensions",
    "ImageRequest",
    "ResponsesRequest",
    "Served",
    "SpeechRequest",
    "accept_job",
    "job_key",
    "bad_request",
    "generate_images",
    "parse",
    "pop_extensions",
    "run_job",
    "submitted",
    "serve",
    "serve_streaming",
    "unless_disconnected",
]
