"""A spy on the online app's clients, for tests that follow what each one acted and fitted
with, round by round."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from fedqhd.learners import fqi_online
from fedqhd.learners.base import partition
from fedqhd.learners.fqi_online import FQIOnline
from fedqhd.online import OnlineClient


def spy_clients(monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict, dict]:
    """Per partition id, in round order: the readout each client collected with, its fit's
    ``init`` and the readout and transitions its fit ended with."""
    acted, starts, fitted = defaultdict(list), defaultdict(list), defaultdict(list)
    node = {}
    real_round, real_collect, real_fit = FQIOnline._round, fqi_online.collect, OnlineClient.fit

    def round_(self, context, cfg, arrays, evaluate_first):  # train, evaluate_and_train
        node["pid"] = partition(context)[0]
        return real_round(self, context, cfg, arrays, evaluate_first)

    def collect(client, *args, **kwargs):
        acted[node["pid"]].append(client.readout.copy())
        return real_collect(client, *args, **kwargs)

    def fit(self, sweeps, init=None, prior=None):
        starts[node["pid"]].append(None if init is None else np.array(init))
        out = real_fit(self, sweeps, init, prior)
        fitted[node["pid"]].append((self.readout.copy(), self.n_transitions))
        return out

    monkeypatch.setattr(FQIOnline, "_round", round_)
    monkeypatch.setattr(fqi_online, "collect", collect)
    monkeypatch.setattr(OnlineClient, "fit", fit)
    return acted, starts, fitted
