"""Worker processes the coordinator spawns."""
