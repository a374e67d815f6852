"""The scale model of docs/scale.md: its in-process measurement and its arithmetic."""

from __future__ import annotations

import pytest

from fedqhd.studies.scale_model import Model, Point, calibrate, fit, measure_in_child


def _point(clients: int, server: float, cached: bool = True, client: float = 0.002) -> Point:
    return Point(env_id="CartPole-v1", dim=500, n_actions=2, clients=clients, rounds=3,
                 cached=cached, client_s=client, server_s_per_round=server,
                 message_bytes=8128.0, reply_bytes=8128.0,
                 node_bytes=1e6 if cached else 0.0, wall_s=1.0)


def test_measure_counts_the_messages_bytes_and_both_cache_paths() -> None:
    hit = measure_in_child("CartPole-v1", 500, 6, rounds=4)
    build = measure_in_child("CartPole-v1", 500, 6, rounds=4, cached=False)
    # a train message carries the global readout, its reply the client's: D x |A| float64
    for p in (hit, build):
        assert 500 * 2 * 8 <= p.message_bytes <= 500 * 2 * 8 + 256
        assert 500 * 2 * 8 <= p.reply_bytes <= 500 * 2 * 8 + 256
        assert p.client_s > 0 and p.server_s_per_round > 0
    assert hit.node_bytes > 500 * 8  # at least the encoded shard's rows
    assert build.node_bytes == 0.0  # learner-cache-mib = 0: nothing kept
    # a rebuild encodes the shard again: 2-2.6x the CPU of a hit on an idle machine. CPU
    # times of a few ms a message wander on a loaded one (a hit measured 1.3-3.3 ms beside
    # other jobs), so two more pairs are measured before this fails
    ratios = [build.client_s / hit.client_s]
    while ratios[-1] <= 1.5 and len(ratios) < 3:
        ratios.append(measure_in_child("CartPole-v1", 500, 6, rounds=4, cached=False).client_s
                      / measure_in_child("CartPole-v1", 500, 6, rounds=4).client_s)
    assert ratios[-1] > 1.5, ratios


def test_fit_takes_the_server_slope_and_fixed_part_from_two_sizes() -> None:
    model = fit(_point(20, 0.2 + 20 * 1e-3), _point(80, 0.2 + 80 * 1e-3),
                _point(20, 0.25, cached=False, client=0.01))
    assert model.s_app == pytest.approx(1e-3)
    assert model.t_fixed == pytest.approx(0.2)
    assert model.c_hit == pytest.approx(0.002) and model.c_build == pytest.approx(0.01)
    with pytest.raises(ValueError, match="two different"):
        fit(_point(20, 0.3), _point(20, 0.3), _point(20, 0.3, cached=False))


def test_round_time_hit_rate_and_the_server_bound() -> None:
    model = Model(c_hit=0.002, c_build=0.010, node_bytes=1e6, cache_bytes=1e9,
                  s_app=0.0005, t_fixed=0.1, reply_bytes=32e3)
    assert model.hit_rate(500) == 1.0 and model.hit_rate(10_000) == pytest.approx(0.1)
    # 10,000 clients: 10 % hit -> 9.2 ms a message; 2 actors: 46 s, the server 5.1 s
    assert model.round_s(10_000, 2) == pytest.approx(10_000 * 0.0092 / 2)
    # sharing 2 cores with the server's process: both CPU loads on the same cores
    assert model.round_s(10_000, 2, cores=2) == pytest.approx(
        (10_000 * 0.0092 + 10_000 * 0.0005 + 0.1) / 2)
    # enough actors and the server's process sets the pace
    assert model.round_s(10_000, 1000) == pytest.approx(10_000 * 0.0005 + 0.1)
    assert model.server_bound_cpus(10_000) == pytest.approx(0.0092 / 0.0005)
    assert model.server_reply_memory(10 ** 6) == pytest.approx(32e9)
    model.utilisation = 0.5  # a round that reaches half the CPU bound takes twice as long
    assert model.round_s(10_000, 2) == pytest.approx(10_000 * 0.0092)


def test_calibrate_charges_the_cluster_runs_later_rounds_beyond_the_model() -> None:
    model = Model(c_hit=0.002, c_build=0.010, node_bytes=1e6, cache_bytes=1e12,
                  s_app=0.0005, t_fixed=0.1)
    # later rounds of 1000 messages: actors 2 ms (the model) + 1 ms each, the server's
    # process 2.6 ms; 3.5 s each, where the 2 shared cores allow (3.0 + 2.6) / 2 = 2.8 s
    run = {"round-s": [9.0, 3.5, 3.5],
           "round-cpu-s": [{"ray::ClientAppActor": 20.0, "flwr-simulation": 9.0},
                           {"ray::ClientAppActor": 3.0, "flwr-simulation": 2.6},
                           {"ray::ClientAppActor": 3.0, "flwr-simulation": 2.6}]}
    calibrate(model, 1000, run, cpus=2, cores=2)
    assert model.c_flower == pytest.approx(0.001)
    assert model.s_flower == pytest.approx(0.0026 - 0.0005 - 0.1 / 1000)
    assert model.utilisation == pytest.approx(2.8 / 3.5)
    assert model.round_s(1000, 2, cores=2) == pytest.approx(3.5)  # reproduces its run
    with pytest.raises(ValueError, match="at least two rounds"):
        calibrate(model, 1000, {"round-s": [9.0], "round-cpu-s": [{}]}, cpus=2, cores=2)
