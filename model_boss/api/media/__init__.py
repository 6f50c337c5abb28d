"""The routes of pictures in and clips: OpenAI's image edits and videos, AUTOMATIC1111's
``sdapi`` routes."""
