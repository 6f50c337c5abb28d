"""Pulls: a model fetched from the hub into ``models_dir`` (:mod:`.download`: the source named
and its files fetched, :mod:`.folder`: which files of a folder repository), and the pulls and
removals running in the daemon (:mod:`.running`)."""

from .running import Pull, Pulls

__all__ = ["Pull", "Pulls"]
