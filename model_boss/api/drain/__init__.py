"""The daemon's drain at the HTTP edge: the gate every request passes while the daemon runs
and stops (:mod:`.gate`), and the uvicorn server whose first SIGTERM or SIGINT starts the
drain and whose second cuts it short (:mod:`.server`). The drain itself (what is refused,
waited for, handed off and cut) is :class:`model_boss.slots.drain.Drain`."""

from .gate import DrainGate, stream_end
from .server import DrainingServer, serve

__all__ = ["DrainGate", "DrainingServer", "serve", "stream_end"]
