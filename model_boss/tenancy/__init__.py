"""Who may ask and what they used: keys (identity, scope, limits) and the usage ledger
(rows, the meter, reports)."""
