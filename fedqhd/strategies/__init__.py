"""Flower strategies that aggregate Q-functions in function space.

Import them into any Flower ServerApp::

    from fedqhd.strategies import FedQHDAvg, FedQHDAnchor, FedQHDExact, PrivacyScreen

and the FedQHD paper's baselines ``FedQHDIndependent`` (no aggregation),
``FedQHDTruncate`` (truncate-and-average of readouts of different shapes) and
``FedQHDPooled`` (the pooled-data oracle of the online protocol, from sufficient
statistics). Private FedQHD averages noisy readouts: ``FedQHDAvg`` behind
``PrivacyScreen``.

The message contract (record names, array keys, metric keys) is in
:mod:`fedqhd.strategies.contract` and in the README.
"""

from . import contract
from .anchor import FedQHDAnchor
from .avg import FedQHDAvg
from .exact import FedQHDExact
from .independent import FedQHDIndependent
from .pooled import FedQHDPooled
from .private import PrivacyScreen
from .truncate import FedQHDTruncate

__all__ = ["FedQHDAnchor", "FedQHDAvg", "FedQHDExact", "FedQHDIndependent", "FedQHDPooled",
           "FedQHDTruncate", "PrivacyScreen", "contract"]
