"""OpenAI's Realtime API over a pipeline of the box's own models (speech to text, a chat
model, a voice): events, the conversation, turn detection and the session."""

from .events import AUDIO_RATE, EventError, error_event, parse_client_event, server_event
from .session import RealtimeSession
from .turns import SileroTurns, SpeechStarted, SpeechStopped, TurnSegmenter

__all__ = ["AUDIO_RATE", "EventError", "RealtimeSession", "SileroTurns", "SpeechStarted",
           "SpeechStopped", "TurnSegmenter", "error_event", "parse_client_event",
           "server_event"]
