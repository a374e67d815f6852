"""Flower strategies that aggregate Q-functions in function space.

Import them into any Flower ServerApp::

    from fedqhd.strategies import FedQHDAvg, FedQHDAnchor, FedQHDExact, PrivacyScreen

The message contract (record names, array keys, metric keys) is in
:mod:`fedqhd.strategies.contract` and in the README.
"""

from . import contract
from .anchor import FedQHDAnchor
from .avg import FedQHDAvg
from .exact import FedQHDExact
from .private import PrivacyScreen

__all__ = ["FedQHDAnchor", "FedQHDAvg", "FedQHDExact", "PrivacyScreen", "contract"]
