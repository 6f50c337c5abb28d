"""The command line, one module per command group: ``serve``, ``ps`` with its table and
``status`` (``ps``), its watch (``watch``) and cluster view (``cluster``), the models'
``load | unload | pin | unpin | pull | rm | reload`` (``models``), ``config``, ``leases``,
``keys``, ``usage``, ``launch`` and ``simulate``. Each declares its commands one way
(``command``); every command asks the daemon through one client (``client``); ``dispatch``
runs the one the parser (``parser``) picks."""

from .dispatch import main

__all__ = ["main"]
