"""Ollama's API as a service: its request schemas, the translation to and from the OpenAI
shape the serving service speaks, NDJSON streaming, and the model listings (tags, ps, show)."""
