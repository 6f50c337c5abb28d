"""Keys as tenants: who a request is (:mod:`.identity`), the keys the box takes
(:mod:`.store`, :mod:`.record`), and what a key, and each end user under it, may do
(:mod:`.policy`, :mod:`.windows`, :mod:`.end_users`)."""

from .end_users import EndUserAdmission, EndUserSpentReader
from .exposure import exposure_warning
from .identity import (
    Identity,
    end_user_label,
    identity_of,
    sees,
    with_identity,
)
from .policy import (
    MinuteReading,
    floored_priority,
    kind_in_scope,
    minute_left,
    model_in_scope,
    refusal,
)
from .record import KeyRecord, hash_secret
from .store import ADMIN_KEY_NAME, SHARED_KEY_NAME, KeyNotFound, KeyStore
from .windows import MinuteWindows

__all__ = ["ADMIN_KEY_NAME", "SHARED_KEY_NAME", "EndUserAdmission", "EndUserSpentReader",
           "Identity", "KeyNotFound",
           "KeyRecord", "KeyStore", "MinuteReading", "MinuteWindows",
           "end_user_label", "exposure_warning", "floored_priority", "hash_secret", "identity_of",
           "kind_in_scope", "minute_left", "model_in_scope", "refusal", "sees", "with_identity"]
