"""The warning for a box anyone on its network may drive: listening beyond the loopback
with no key."""

from __future__ import annotations

import ipaddress

from ...settings import Settings


def exposure_warning(settings: Settings) -> str | None:
    """The warning for a coordinator that listens beyond loopback with no key set."""
    if settings.user_keys_set or settings.admin_api_key or _loopback(settings.host):
        return None
    return (f"listening on {settings.host or 'every address'} without API keys: anyone who "
            "can reach this port can run models, change the configuration, take GPU leases "
            "and pull models; set api_keys (or api_key) and admin_api_key")


def _loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address
