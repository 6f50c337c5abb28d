"""``prompt_cache_key``: a session's requests kept on one llama.cpp slot where it can be.

llama.cpp's server keeps each of its ``parallel`` slots' last prompt in its KV cache
(``cache_prompt``, on by default) and takes the request's ``id_slot`` to run it on that slot
(it waits for that slot when busy). Left to itself it gives a request the idle slot whose
cache shares the longest prefix with it; two sessions with the same long system prompt then
take each other's slots and each loses the rest of its cache. With a key, model-boss names
the slot: a key seen before goes back to its slot when that slot is free; a new key gets
the free slot given to a key longest ago. When the key's slot is busy (another session,
or a request without a key whose slot llama.cpp chose), none is named and llama.cpp picks:
nobody waits behind another session. One model with one slot (``parallel: 1``) has nothing
to choose; the key only asks for ``cache_prompt``.

The pure part (:class:`SlotAffinity`) counts what it handed out; the requests give their
slot back when they end, however they end (``WorkerCall.settled``).
"""

from __future__ import annotations

from collections import OrderedDict

REMEMBERED_KEYS = 4096  # the keys a worker remembers (least recently used forgotten first)


class SlotAffinity:
    """Slot choice for one worker of ``slots`` parallel slots (see the module)."""

    def __init__(self, slots: int, remembered: int = REMEMBERED_KEYS) -> None:
        self.slots = slots
        self.remembered = remembered
        self._keys: OrderedDict[str, int] = OrderedDict()
        self._busy = [0] * slots  # requests running on each slot, as handed out here
        self._given = [0] * slots  # when each slot was last given (a counter)
        self._clock = 0
        self.loose = 0  # requests running without a slot named: llama.cpp chose theirs

    def take(self, key: str | None) -> int | None:
        """The slot for a request with ``key`` (held until :meth:`give_back`), or None:
        llama.cpp picks (call :meth:`give_back` with None all the same)."""
        slot = self._choose(key) if key and self.slots > 1 else None
        if slot is None:
            self.loose += 1
            return None
        if key is not None:
            self._keys[key] = slot
            self._keys.move_to_end(key)
            while len(self._keys) > self.remembered:
                self._keys.popitem(last=False)
        self._clock += 1
        self._given[slot] = self._clock
        self._busy[slot] += 1
        return slot

    def _choose(self, key: str) -> int | None:
        if self.loose:  # a slot llama.cpp chose is running: a named one may be it
            return None
        slot = self._keys.get(key)
        if slot is not None:
            return None if self._busy[slot] else slot
        taken = set(self._keys.values())
        free = [s for s in range(self.slots) if not self._busy[s]]
        # a slot no remembered key holds first, then the one given longest ago
        return min(free, key=lambda s: (s in taken, self._given[s]), default=None)

    def give_back(self, slot: int | None) -> None:
        """A request handed ``slot`` by :meth:`take` ended."""
        if slot is None:
            self.loose = max(0, self.loose - 1)
        else:
            self._busy[slot] = max(0, self._busy[slot] - 1)

    def slot_of(self, key: str) -> int | None:
        """The slot ``key`` was last given (None: never, or forgotten)."""
        return self._keys.get(key)
