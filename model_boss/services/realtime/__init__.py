"""OpenAI's Realtime API over a pipeline of the box's own models (speech to text, a chat
model, a voice): events, the conversation, turn detection, the session and the open sessions."""

from .events import AUDIO_RATE, EventError, error_event, parse_client_event, server_event
from .session import RealtimeSession
from .sessions import OpenSessions
from .turns import SileroTurns, SpeechStarted, SpeechStopped, TurnSegmenter

__all__ = ["AUDIO_RATE", "EventError", "OpenSessions", "RealtimeSession", "SileroTurns",
           "SpeechStarted", "SpeechStopped", "TurnSegmenter", "error_event", "parse_client_event",
           "server_event"]
