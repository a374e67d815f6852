"""The real ServerApp logic and ClientApp, in process (no Ray): learning, results, failures."""

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.clientapp import ClientApp

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.data import client_shard
from fedqhd.encoders import heterogeneous_encoder_params
from fedqhd.envs import get_spec, rollout_returns
from fedqhd.learners.fqi import FQILearner
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid

SMALL = dict(env_id="CartPole-v1", hd_dim=500, eval_episodes=5, num_anchors=300)


def _run(tmp_path, n_clients=4, node_configs=None, **kw):
    cfg = RunConfig(output_dir=str(tmp_path), **{**SMALL, **kw})
    grid = InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config(),
                         node_configs=node_configs)
    final, out_dir = run_federation(grid, cfg)
    return final, out_dir, json.loads((out_dir / "results.json").read_text())


def test_shared_encoder_federation_learns_and_writes_results(tmp_path):
    final, out_dir, results = _run(tmp_path, num_server_rounds=8, seed=1)
    assert [r["round"] for r in results["rounds"]] == list(range(1, 9))
    assert results["final"]["return-mean"] == final["return-mean"]
    random_return = rollout_returns("CartPole-v1", lambda o: np.random.randint(2), 20, 0).mean()
    assert final["best-return-mean"] > 3 * random_return
    info = json.loads((out_dir / "run_config.json").read_text())
    assert info["seed"] == 1
    import flwr
    import gymnasium

    assert info["versions"]["flwr"] == flwr.__version__
    assert info["versions"]["numpy"] == np.__version__
    assert info["versions"]["gymnasium"] == gymnasium.__version__
    assert np.load(out_dir / "final_model.npz")["readout"].shape == (500, 2)
    assert (out_dir / "learning_curve.png").exists()


def test_heterogeneous_federation_evaluates_compiled_policies(tmp_path):
    _, _, results = _run(tmp_path, num_server_rounds=2, encoder="heterogeneous")
    last = results["rounds"][-1]
    assert results["strategy"] == "anchor"
    assert last["replies-ok"] == 4 and last["projection-residual"] > 0
    assert np.isfinite(last["return-mean"])


def test_a_failing_client_is_counted_and_the_round_goes_on(tmp_path):
    empty = tmp_path / "no-shards"
    empty.mkdir()
    _, _, results = _run(tmp_path, num_server_rounds=2,
                         node_configs=[{}, {"data-dir": str(empty)}, {}, {}])
    for row in results["rounds"]:
        assert (row["replies-ok"], row["replies-failed"]) == (3, 1)
        assert np.isfinite(row["return-mean"])


def test_same_seed_same_results_with_node_sampling(tmp_path):
    # half the nodes per round: Flower samples them with Python's random, seeded by the run
    a = _run(tmp_path / "a", num_server_rounds=3, seed=5, fraction_train=0.5)[2]["rounds"]
    b = _run(tmp_path / "b", num_server_rounds=3, seed=5, fraction_train=0.5)[2]["rounds"]
    assert all(r["replies-ok"] == 2 for r in a)
    strip = [{k: v for k, v in r.items() if k != "wall-time-s"} for r in a]
    assert strip == [{k: v for k, v in r.items() if k != "wall-time-s"} for r in b]


def test_learner_compiles_a_teacher_in_its_span():
    spec = get_spec("CartPole-v1")
    shard = client_shard("CartPole-v1", "iid", 0, 2, 2, seed=0)
    encoder = heterogeneous_encoder_params(0, 0, 1.0).build(spec.obs_bound)  # D = 500
    learner = FQILearner(shard, encoder, spec.n_actions, ridge=1e-8)
    anchors = np.random.default_rng(0).uniform(-1, 1, (200, 4)) * spec.obs_bound
    teacher = encoder.transform(anchors) @ np.random.default_rng(1).normal(size=(500, 2))
    residual = learner.compile(anchors, teacher)
    assert residual < 1e-4 * np.linalg.norm(teacher)
    np.testing.assert_allclose(learner.q_values(anchors), teacher, atol=1e-4)
    with pytest.raises(ValueError, match="shape"):
        learner.readout = np.zeros((3, 2))


def test_dynamics_skew_clients_learn_and_evaluate_in_their_own_physics(tmp_path):
    shards = [client_shard("CartPole-v1", "dynamics-skew", i, 3, 2, seed=0) for i in range(3)]
    lengths = {s.metadata["dynamics"]["length"] for s in shards}
    assert len(lengths) == 3
    _, _, results = _run(tmp_path, n_clients=3, num_server_rounds=1, encoder="heterogeneous",
                         partition="dynamics-skew", episodes_per_client=2)
    assert results["rounds"][0]["replies-ok"] == 3
    assert np.isfinite(results["rounds"][0]["return-mean"])


def test_a_client_evaluates_in_its_own_dynamics():
    from flwr.app import Context, RecordDict

    from fedqhd.learners.fqi import LEARNER, greedy_return, node_learner
    from fedqhd.strategies import contract as C

    cfg = RunConfig(partition="dynamics-skew", episodes_per_client=3, hd_dim=300,
                    eval_episodes=5, encoder="heterogeneous")
    pid = 0
    context = Context(run_id=7, node_id=1, node_config={"partition-id": pid, "num-partitions": 3},
                      state=RecordDict(), run_config=cfg.to_run_config())
    learner, shard = node_learner(context, cfg)
    learner.train(10)
    readout = learner.readout.copy()
    dynamics = shard.metadata["dynamics"]
    assert dynamics  # this client's physics differ from stock CartPole
    metrics = LEARNER.evaluate(context, cfg, {C.READOUT: readout})
    own = greedy_return(cfg, learner.encoder, readout, party=pid, dynamics=dynamics)
    stock = greedy_return(cfg, learner.encoder, readout, party=pid)
    assert metrics[C.RETURN_MEAN] == pytest.approx(own.mean())
    assert own.mean() != pytest.approx(stock.mean())  # physics that matter to this policy


def _failing_in_training() -> ClientApp:
    """fedqhd's ClientApp, except that it raises in every train message."""
    app = ClientApp()

    @app.train()
    def train(msg, context):
        raise RuntimeError("this client fails in training every round")

    @app.evaluate()
    def evaluate(msg, context):
        return client_app(msg, context)

    return app


@pytest.mark.parametrize("encoder, key", [("shared", "readout"), ("heterogeneous", "teacher")])
def test_a_client_failing_every_round_costs_what_its_absence_costs(tmp_path, encoder, key):
    # the global model of 4 clients, one failing in training every round, is the model of
    # the 3 others alone (shards 0..2 of the same 4-client federation): a failed reply
    # moves no weight cap, latest-reply memory, ADMM consensus or teacher
    cfg = RunConfig(output_dir=str(tmp_path), num_server_rounds=3, seed=3, encoder=encoder,
                    **SMALL)
    models = []
    for apps, node_configs in (([client_app] * 3 + [_failing_in_training()], None),
                               ([client_app] * 3, [{"num-partitions": 4}] * 3)):
        grid = InProcessGrid(apps, run_config=cfg.to_run_config(), node_configs=node_configs)
        final, out_dir = run_federation(grid, cfg)
        rows = json.loads((out_dir / "results.json").read_text())["rounds"]
        assert [r["replies-ok"] for r in rows] == [3, 3, 3]
        assert [r["replies-failed"] for r in rows] == [len(apps) - 3] * 3
        assert sum(r["replies-rejected"] for r in rows) == 0
        models.append(np.load(out_dir / "final_model.npz")[key])
    assert np.abs(models[0]).max() > 0
    np.testing.assert_allclose(models[0], models[1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("torn", ["learning_curve.png", "final_model.npz"])
def test_a_run_that_cannot_write_its_outputs_says_failed(tmp_path, monkeypatch, torn):
    """A full disk while the plot (or the model) is written: the run raises, results.json
    says failed with the error, and neither file is left half written."""
    import errno

    import fedqhd.files

    real = fedqhd.files.atomic_write

    def full_disk(path, data, *args, **kwargs):
        if Path(path).name == torn:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(fedqhd.files, "atomic_write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        _run(tmp_path, num_server_rounds=1)
    (results,) = tmp_path.glob("*/*/results.json")
    final = json.loads(results.read_text())["final"]
    assert final["status"] == "failed"
    assert final["reason"] == ("writing the run's outputs failed: OSError: [Errno 28] No space "
                               "left on device")
    assert not (results.parent / torn).exists()
