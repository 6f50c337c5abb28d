"""The daemon's own life: ``model-boss serve`` started (:mod:`.start`: settings, the app, the
collector, the log) and served by a uvicorn whose first signal drains and whose second cuts
the drain short (:mod:`.server`). The drain itself (what is refused, waited for, handed off
and cut) is :class:`model_boss.slots.drain.Drain`; its gate at the HTTP edge is
:mod:`model_boss.api.middleware.drain`."""
