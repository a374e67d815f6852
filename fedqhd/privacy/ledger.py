"""Per-client privacy ledger: composed rho, (epsilon, delta), and a hard budget.

zCDP composes by adding rho. Two conversions to (epsilon, delta) are reported:

* ``epsilon_cks`` -- dp-accounting's RDP accountant on a ``ZCDpEvent``
  (the Canonne-Kamath-Steinke conversion, valid for any rho-zCDP mechanism);
* ``epsilon_exact`` -- the exact analytic-Gaussian curve
  ``get_epsilon_gaussian(1/sqrt(2 rho), delta)``, tight when every release is
  a continuous Gaussian (composed Gaussians are one Gaussian with the summed rho).
  It is NOT valid for OpenDP's discrete Gaussian, whose privacy curve differs
  slightly (it under-reports: 28.374 vs 28.397 at rho = 10).

:meth:`PrivacyLedger.epsilon` reports the epsilon valid for the noise actually
used, read from the entries' ``noise`` labels: the exact Gaussian curve when
every release is a continuous Gaussian, OpenDP's own privacy map
(``make_zCDP_to_approxDP`` of its discrete Gaussian at the composed rho) when
every release is OpenDP's discrete Gaussian, and CKS (valid for any
rho-zCDP mechanism) otherwise.

Every conversion assumes noise nobody else can draw again. Noise seeded from a run
config (an entry with ``reproducible: true``) is regenerable by whoever holds that
config, who subtracts it and reads the exact counts: such a release protects nothing,
and the ledger reports it as what it is, ``epsilon = inf`` (conversion ``regenerable``)
in every epsilon it gives, also the CKS and exact-Gaussian ones. Its rho is still
charged to the budget (the budget counts what was spent, not what it bought).
In JSON (ledger files, ``results.json``) an infinite epsilon is Python's ``Infinity``
token, which :func:`json.loads` reads back as ``float("inf")``; Flower's ``MetricRecord``
carries ``inf`` as it is (a protobuf double).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


class BudgetExceededError(RuntimeError):
    """A release would take the ledger past its configured rho budget."""


def epsilon_cks(rho: float, delta: float) -> float:
    """epsilon for rho-zCDP at ``delta`` via dp-accounting's RDP accountant (CKS)."""
    if rho == 0:
        return 0.0
    import dp_accounting

    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(rho))
    return float(acc.get_epsilon(delta))


def epsilon_exact(rho: float, delta: float) -> float:
    """Exact epsilon of a Gaussian mechanism with total rho (analytic Gaussian)."""
    if rho == 0:
        return 0.0
    import dp_accounting

    return float(dp_accounting.get_epsilon_gaussian(1.0 / math.sqrt(2.0 * rho), delta))


#: noise labels whose samples are continuous Gaussians (exact Gaussian curve valid)
CONTINUOUS_GAUSSIAN_PREFIXES = ("numpy",)
#: noise labels of OpenDP's discrete Gaussian (OpenDP's privacy map)
OPENDP_DISCRETE_PREFIXES = ("opendp-discrete-gaussian",)


def epsilon_opendp(rho: float, delta: float) -> float:
    """epsilon at ``delta`` of OpenDP's discrete Gaussian with total rho, by OpenDP's own map.

    Composed discrete Gaussians of total rho are ``rho``-zCDP; OpenDP converts
    with ``make_zCDP_to_approxDP`` (the conversion it certifies for its own
    mechanism). The measurement below is that discrete Gaussian at sensitivity 1
    and scale ``1 / sqrt(2 rho)``, i.e. exactly rho-zCDP. Where OpenDP's map overflows
    (rho beyond about 10^4), CKS's epsilon is returned: valid for every rho-zCDP release,
    and never below OpenDP's (4 % above it at rho 10^4).
    """
    if rho == 0:
        return 0.0
    import opendp.prelude as dp

    dp.enable_features("contrib")
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int),
                              scale=1.0 / math.sqrt(2.0 * rho))
    try:
        return float(dp.c.make_zCDP_to_approxDP(meas).map(1).epsilon(delta))
    except dp.OpenDPException as exc:
        if exc.variant != "Overflow":
            raise
        return epsilon_cks(rho, delta)


def conversion_for(noise_labels: list[str]) -> str:
    """Which epsilon conversion is valid for releases with these noise labels."""
    if noise_labels and all(n.startswith(CONTINUOUS_GAUSSIAN_PREFIXES) for n in noise_labels):
        return "exact-gaussian"
    if noise_labels and all(n.startswith(OPENDP_DISCRETE_PREFIXES) for n in noise_labels):
        return "opendp"
    return "cks"


_CONVERSIONS = {"exact-gaussian": epsilon_exact, "opendp": epsilon_opendp, "cks": epsilon_cks}


#: the conversion of a ledger with a regenerable release: no privacy, epsilon = inf
REGENERABLE = "regenerable"


def regenerable(entry: dict[str, Any]) -> bool:
    """Whether a release's noise can be drawn again (seeded from a known seed)."""
    return bool(entry.get("reproducible", False))


def epsilon_by(conversion: str, rho: float, delta: float) -> float:
    """epsilon(delta) of total ``rho`` by a named conversion (see :func:`conversion_for`)."""
    if conversion == REGENERABLE:
        return math.inf
    return _CONVERSIONS[conversion](rho, delta)


#: the delta a run reports epsilon at (the issue's and the literature's 1e-5); rho is what a
#: ledger composes, so ``fedqhd privacy ledgers --delta`` answers for any other
REPORTED_DELTA = 1e-5


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
    delta: float = REPORTED_DELTA
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

    @property
    def regenerable(self) -> bool:
        """Whether any release's noise can be regenerated (then every epsilon is inf)."""
        return any(regenerable(e) for e in self.entries)

    def _epsilon(self, conversion: str, delta: float | None) -> float:
        return epsilon_by(REGENERABLE if self.regenerable else conversion, self.rho_spent,
                          self.delta if delta is None else delta)

    def epsilon_cks(self, delta: float | None = None) -> float:
        """epsilon(delta) by CKS; inf with a regenerable release."""
        return self._epsilon("cks", delta)

    def epsilon_exact(self, delta: float | None = None) -> float:
        """epsilon(delta) of the exact Gaussian curve; inf with a regenerable release."""
        return self._epsilon("exact-gaussian", delta)

    @property
    def conversion(self) -> str:
        """The epsilon conversion valid for every release so far (see module docstring)."""
        if self.regenerable:
            return REGENERABLE
        return conversion_for([str(e.get("noise", "")) for e in self.entries])

    def epsilon(self, delta: float | None = None) -> float:
        """epsilon(delta) by the conversion valid for the noise actually used."""
        return self._epsilon(self.conversion, delta)

    def epsilon_by_noise(self, delta: float | None = None) -> dict[str, dict[str, Any]]:
        """Per noise source: rho spent with it, the valid conversion and its epsilon."""
        dlt = self.delta if delta is None else delta
        out: dict[str, dict[str, Any]] = {}
        for label in dict.fromkeys(str(e.get("noise", "")) for e in self.entries):
            mine = [e for e in self.entries if str(e.get("noise", "")) == label]
            rho = float(sum(e["rho"] for e in mine))
            conv = (REGENERABLE if any(regenerable(e) for e in mine)
                    else conversion_for([label]))
            out[label] = {"rho": rho, "conversion": conv, "epsilon": epsilon_by(conv, rho, dlt)}
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary, including both epsilon conversions."""
        return {
            "client_id": self.client_id,
            "budget_rho": self.budget_rho,
            "rho_spent": self.rho_spent,
            "delta": self.delta,
            "epsilon_cks": self.epsilon_cks(),
            "epsilon_exact_gaussian": self.epsilon_exact(),
            "epsilon": self.epsilon(),
            "epsilon_conversion": self.conversion,
            "noise_regenerable": self.regenerable,
            "epsilon_by_noise": self.epsilon_by_noise(),
            "entries": [dict(e) for e in self.entries],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PrivacyLedger:
        return cls(budget_rho=d["budget_rho"], delta=d["delta"], client_id=d["client_id"],
                   entries=[dict(e) for e in d["entries"]])

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
