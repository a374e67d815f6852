"""Per-client privacy ledger: composed rho, (epsilon, delta), and a hard budget.

zCDP composes by adding rho. Two conversions to (epsilon, delta) are reported:

* ``epsilon_cks`` -- dp-accounting's RDP accountant on a ``ZCDpEvent``
  (the Canonne-Kamath-Steinke conversion, valid for any rho-zCDP mechanism);
* ``epsilon_exact`` -- the exact analytic-Gaussian curve
  ``get_epsilon_gaussian(1/sqrt(2 rho), delta)``, tight when every release is
  Gaussian (composed Gaussians are one Gaussian with the summed rho).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import dp_accounting


class BudgetExceededError(RuntimeError):
    """A release would take the ledger past its configured rho budget."""


def epsilon_cks(rho: float, delta: float) -> float:
    """epsilon for rho-zCDP at ``delta`` via dp-accounting's RDP accountant (CKS)."""
    if rho == 0:
        return 0.0
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(rho))
    return float(acc.get_epsilon(delta))


def epsilon_exact(rho: float, delta: float) -> float:
    """Exact epsilon of a Gaussian mechanism with total rho (analytic Gaussian)."""
    if rho == 0:
        return 0.0
    return float(dp_accounting.get_epsilon_gaussian(1.0 / math.sqrt(2.0 * rho), delta))


@dataclass
class PrivacyLedger:
    """What one client has released, and how much more it may release.

    Parameters
    ----------
    budget_rho : float
        Total zCDP budget; a release taking the total past it is refused.
    delta : float
        delta used when reporting epsilon.
    client_id : str
        Name recorded in the ledger.
    """

    budget_rho: float
    delta: float = 1e-5
    client_id: str = "client"
    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rho_spent(self) -> float:
        return float(sum(e["rho"] for e in self.entries))

    @property
    def rho_left(self) -> float:
        return self.budget_rho - self.rho_spent

    def check(self, rho: float) -> None:
        """Raise :class:`BudgetExceededError` if spending ``rho`` would exceed the budget."""
        if rho < 0:
            raise ValueError("rho must be non-negative")
        if self.rho_spent + rho > self.budget_rho * (1 + 1e-12):
            raise BudgetExceededError(
                f"client {self.client_id!r}: release of rho={rho:g} refused; "
                f"spent {self.rho_spent:g} of budget {self.budget_rho:g} "
                f"(would reach {self.rho_spent + rho:g})"
            )

    def spend(self, rho: float, label: str = "release", **info: Any) -> None:
        """Record a release of ``rho`` after checking the budget."""
        self.check(rho)
        self.entries.append({"label": label, "rho": float(rho), **info})

    def epsilon_cks(self, delta: float | None = None) -> float:
        return epsilon_cks(self.rho_spent, self.delta if delta is None else delta)

    def epsilon_exact(self, delta: float | None = None) -> float:
        return epsilon_exact(self.rho_spent, self.delta if delta is None else delta)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary, including both epsilon conversions."""
        return {
            "client_id": self.client_id,
            "budget_rho": self.budget_rho,
            "rho_spent": self.rho_spent,
            "delta": self.delta,
            "epsilon_cks": self.epsilon_cks(),
            "epsilon_exact_gaussian": self.epsilon_exact(),
            "entries": [dict(e) for e in self.entries],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrivacyLedger:
        return cls(budget_rho=d["budget_rho"], delta=d["delta"], client_id=d["client_id"],
                   entries=[dict(e) for e in d["entries"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
