"""Media sent in and kept: uploads, pictures' sides, finished videos."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MediaSettings(BaseModel):
    """Bounds on uploads and pictures, and the disk finished videos may hold."""

    # an upload: audio to transcribe (OpenAI's limit: 25 MB), pictures to edit, a video's
    # reference; a picture's sides at most max_image_side; finished videos kept in videos_mb
    max_upload_bytes: int = Field(default=25 * 1024 * 1024, ge=1024)
    max_image_side: int = Field(default=4096, ge=64, le=16384)
    videos_mb: int = Field(default=2048, ge=1)
