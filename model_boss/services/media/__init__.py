"""Requests whose answers or uploads are media: images made by diffusion pipelines (and the
files their URLs name), audio uploaded for transcription."""
