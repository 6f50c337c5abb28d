"""Budget admission: will a request finish within its budget? A pure decision."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prediction:
    wait_s: float
    load_s: float
    infer_s: float

    @property
    def total_s(self) -> float:
        return self.wait_s + self.load_s + self.infer_s


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    predicted_s: float
    reason: str
    retry_after_s: float | None = None


def predict(*, warm: bool, loading: bool, ahead: int, parallel: int, load_s: float,
            infer_s: float) -> Prediction:
    """Queue wait (requests ahead on the same model, served ``parallel`` at a time) + cold
    load (none when warm, half when a load is already under way) + one inference."""
    wait = (ahead / max(1, parallel)) * infer_s
    load = 0.0 if warm else (load_s / 2 if loading else load_s)
    return Prediction(wait, load, infer_s)


def admit(budget_s: float | None, prediction: Prediction,
          given_s: float | None = None) -> Decision:
    """``budget_s``: what is left of the budget ``given_s`` (the same when None)."""
    if budget_s is None:
        return Decision(True, prediction.total_s, "no budget")
    if prediction.total_s <= budget_s:
        return Decision(True, prediction.total_s,
                        f"predicted {prediction.total_s:.2f}s within {budget_s:g}s")
    return Decision(
        False, prediction.total_s,
        f"predicted {prediction.total_s:.2f}s (wait {prediction.wait_s:.2f}s + load "
        f"{prediction.load_s:.2f}s + inference {prediction.infer_s:.2f}s) exceeds "
        + (f"the budget of {budget_s:g}s" if given_s is None or given_s == budget_s else
           f"the {max(0.0, budget_s):.2f}s left of the budget of {given_s:g}s"),
        retry_after_s=max(1.0, prediction.wait_s + prediction.load_s))
