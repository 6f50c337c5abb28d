"""The shared box's own routes: keys (:mod:`.keys`) and what they used (:mod:`.usage`)."""
