"""The usage ledger: what every finished request used, kept per key in SQLite, summed for
quotas in memory, and answered grouped for reports (``GET /api/v1/usage``)."""

from .clock import BusyShare
from .export import rows_to_csv
from .figures import Figures
from .ledger import LedgerUnavailable, UsageLedger
from .meter import Meter, outcome
from .periods import day_start, hour_of, month_start
from .query import GROUPS, UsageQuery, group_names
from .row import OUTCOMES, SUMMED, UsageRow
from .totals import Spent

__all__ = [
    "GROUPS",
    "OUTCOMES",
    "SUMMED",
    "BusyShare",
    "Figures",
    "Meter",
    "LedgerUnavailable",
    "Spent",
    "UsageLedger",
    "UsageQuery",
    "UsageRow",
    "day_start",
    "group_names",
    "hour_of",
    "month_start",
    "outcome",
    "rows_to_csv",
]
