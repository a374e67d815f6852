import numpy as np
import pytest

from fedqhd.readout import RidgeFQI, RidgeSystem, greedy_actions, ridge_project


def _direct(phi, y, ridge, proximal, prior):
    """Ridge with a proximal term, solved as one stacked least-squares problem."""
    d = phi.shape[1]
    A = np.vstack([phi, np.sqrt(ridge) * np.eye(d), np.sqrt(proximal) * np.eye(d)])
    b = np.concatenate([y, np.zeros(d), np.sqrt(proximal) * prior])
    return np.linalg.lstsq(A, b, rcond=None)[0]


@pytest.mark.parametrize("n", [8, 60])  # dual form (n < D) and primal form (n >= D)
@pytest.mark.parametrize("proximal", [0.0, 0.7])
def test_ridge_system_equals_direct_least_squares(n, proximal):
    rng = np.random.default_rng(n)
    phi, y, prior = rng.normal(size=(n, 20)), rng.normal(size=n), rng.normal(size=20)
    system = RidgeSystem(phi, ridge=0.3, proximal=proximal)
    assert system.dual == (n < 20)
    np.testing.assert_allclose(system.solve(y, prior), _direct(phi, y, 0.3, proximal, prior),
                               atol=1e-10)


def test_fqi_iteration_equals_per_action_least_squares():
    rng = np.random.default_rng(0)
    n, d, k = 90, 15, 3
    phi, nphi = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    actions, rewards = rng.integers(0, k, n), rng.normal(size=n)
    terminated = rng.random(n) < 0.2
    init, prior = rng.normal(size=(d, k)) * 0.1, rng.normal(size=(d, k))
    fqi = RidgeFQI(phi, actions, rewards, nphi, terminated, k, gamma=0.9, ridge=0.5, proximal=0.2)
    fqi.fit(1, init=init, prior=prior)
    y = rewards + 0.9 * (~terminated) * (nphi @ init).max(axis=1)
    for a in range(k):
        rows = actions == a
        np.testing.assert_allclose(fqi.readout_[:, a], _direct(phi[rows], y[rows], 0.5, 0.2,
                                                               prior[:, a]), atol=1e-10)


def test_truncation_bootstraps_and_termination_does_not():
    # one state, one action, reward 1: terminated -> Q = 1, never terminated -> 1/(1-gamma)
    phi = np.ones((1, 1))
    for terminated, expected in [(True, 1.0), (False, 10.0)]:
        fqi = RidgeFQI(phi, [0], [1.0], phi, [terminated], 1, gamma=0.9, ridge=1e-9)
        fqi.fit(400)
        assert fqi.readout_[0, 0] == pytest.approx(expected, rel=1e-4)


def test_ridge_project_reproduces_a_teacher_in_the_span():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 200))  # m < D: dual form
    T = X @ rng.normal(size=(200, 2))
    W, residual = ridge_project(X, T, ridge=1e-8)
    np.testing.assert_allclose(X @ W, T, atol=1e-5)
    assert residual < 1e-5 * np.linalg.norm(T)
    assert greedy_actions(X, W).tolist() == np.argmax(T, axis=1).tolist()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="ridge"):
        RidgeSystem(np.ones((2, 2)), ridge=0.0)
    with pytest.raises(ValueError, match="actions"):
        RidgeFQI(np.ones((2, 2)), [0, 3], [0, 0], np.ones((2, 2)), [0, 0], n_actions=2)
    fqi = RidgeFQI(np.ones((2, 2)), [0, 1], [0, 0], np.ones((2, 2)), [0, 0], n_actions=2)
    with pytest.raises(ValueError, match="shape"):
        fqi.fit(1, init=np.zeros((3, 2)))
