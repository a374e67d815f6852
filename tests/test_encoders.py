import numpy as np
import pytest

from fedqhd.encoders import (
    HETEROGENEOUS_DIMS,
    EncoderParams,
    HDEncoder,
    heterogeneous_encoder_params,
    shared_encoder_params,
)

SCALE = np.array([2.4, 3.0, 0.5, 3.5])


def test_same_seed_same_features_and_different_seed_differs():
    X = np.random.default_rng(0).normal(size=(50, 4))
    a = HDEncoder(300, 1.0, SCALE, random_state=7).fit(X).transform(X)
    b = HDEncoder(300, 1.0, SCALE, random_state=7).fit(X[:1]).transform(X)
    c = HDEncoder(300, 1.0, SCALE, random_state=8).fit(X).transform(X)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0.1


def test_inner_products_approximate_rbf_kernel():
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, size=(40, 4)) * SCALE
    enc = HDEncoder(20000, 0.7, SCALE, random_state=0).fit(X)
    phi = enc.transform(X)
    Z = X / SCALE
    kernel = np.exp(-0.7 * ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1))
    assert np.abs(phi @ phi.T - kernel).max() < 0.05


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="scale"):
        HDEncoder(10, 1.0, scale=np.array([1.0, -1.0]), random_state=0).fit(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="bandwidth"):
        HDEncoder(10, 0.0, random_state=0).fit(np.zeros((1, 2)))
    enc = HDEncoder(10, 1.0, random_state=0).fit(np.zeros((1, 3)))
    with pytest.raises(ValueError):
        enc.transform(np.zeros((2, 4)))


def test_heterogeneous_params_follow_the_paper_protocol():
    params = [heterogeneous_encoder_params(3, i, 1.0) for i in range(8)]
    assert [p.hd_dim for p in params] == list(HETEROGENEOUS_DIMS) * 2
    assert all(0.5 <= p.bandwidth <= 1.5 for p in params)
    assert len({p.seed for p in params}) == 8
    assert params[2] == heterogeneous_encoder_params(3, 2, 1.0)
    shared = shared_encoder_params(3, 100, 1.0)
    assert shared == shared_encoder_params(3, 100, 1.0)
    np.testing.assert_array_equal(shared.build(SCALE).omega_, shared.build(SCALE).omega_)


# the encoder follows the estimator protocol without scikit-learn's base classes (whose
# import every ClientApp process would pay), which check_estimator notes with a warning
@pytest.mark.filterwarnings("ignore:Estimator HDEncoder does not inherit:UserWarning")
def test_passes_scikit_learn_estimator_checks():
    from sklearn.utils.estimator_checks import check_estimator

    results = check_estimator(HDEncoder(hd_dim=50, random_state=0), on_fail=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert len(results) > 30 and not failed, failed


def test_works_in_a_scikit_learn_pipeline_and_clones():
    from sklearn.base import clone
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline

    X = np.random.default_rng(0).uniform(-1, 1, size=(200, 2))
    y = np.sin(3 * X[:, 0]) * X[:, 1]
    rff = make_pipeline(HDEncoder(300, 2.0, random_state=0), Ridge(1e-3)).fit(X, y)
    linear = make_pipeline(Ridge(1e-3)).fit(X, y)
    assert rff.score(X, y) > 0.9 > linear.score(X, y)  # nonlinear in the state
    enc = HDEncoder(30, 0.5, scale=np.array([2.0, 3.0]), random_state=4)
    twin = clone(enc).set_params(hd_dim=40)
    assert twin.get_params()["hd_dim"] == 40 and enc.hd_dim == 30
    assert not hasattr(twin, "omega_") and twin.scale is not None
    with pytest.raises(ValueError, match="invalid parameter 'gamma'"):
        enc.set_params(gamma=0.9)
    # built from params (no input checks, no scikit-learn) = fitted: the same projection
    fitted = HDEncoder(30, 0.5, scale=SCALE, random_state=4).fit(np.zeros((1, 4)))
    np.testing.assert_array_equal(EncoderParams(30, 0.5, 4).build(SCALE).omega_,
                                  fitted.omega_)


def test_float32_features_round_each_feature_and_chunking_changes_nothing(monkeypatch):
    # feature-dtype = float32: each feature within 1e-6 of its amplitude sqrt(2/D) of the
    # float64 one (the docstring's claim; 5.1e-7 measured), whatever the block size
    X = np.random.default_rng(2).uniform(-1, 1, size=(3000, 4)) * SCALE
    enc = HDEncoder(500, 1.0, SCALE, random_state=0).fit(X[:1])
    wide, narrow = enc.encode(X), enc.encode(X, np.float32)
    assert narrow.dtype == np.float32 and narrow.shape == wide.shape
    error = np.abs(narrow - wide).max() / np.sqrt(2.0 / 500)
    assert 1e-8 < error < 1e-6  # rounded, not the float64 numbers
    monkeypatch.setattr("fedqhd.encoders.UPCAST_ROWS", 7)  # many blocks, a ragged last one
    np.testing.assert_array_equal(enc.encode(X, np.float32), narrow)
    with pytest.raises(ValueError, match="float64 or float32"):
        enc.encode(X, np.float16)
