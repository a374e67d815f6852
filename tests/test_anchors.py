import numpy as np
import pytest

from fedqhd.anchors import load_anchors, make_anchors
from fedqhd.envs import get_spec


def test_sources_give_m_states_of_the_right_width_deterministically():
    for source in ("rollouts", "uniform"):
        a = make_anchors(source, "CartPole-v1", 300, seed=3)
        assert a.shape == (300, 4) and np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, make_anchors(source, "CartPole-v1", 300, seed=3))
        assert not np.array_equal(a, make_anchors(source, "CartPole-v1", 300, seed=4))
    bound = get_spec("CartPole-v1").obs_bound
    assert np.all(np.abs(make_anchors("uniform", "CartPole-v1", 100, 0)) <= bound)


def test_anchor_file_is_validated(tmp_path):
    good = tmp_path / "a.npy"
    np.save(good, np.zeros((5, 4)))
    assert make_anchors(str(good), "CartPole-v1", 0, 0).shape == (5, 4)
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"wrong.npy: expected shape \(m, 4\)"):
        load_anchors(wrong, "CartPole-v1")
    nan = tmp_path / "nan.npy"
    np.save(nan, np.full((2, 4), np.nan))
    with pytest.raises(ValueError, match="nan.npy: values must be finite"):
        load_anchors(nan, "CartPole-v1")
    with pytest.raises(ValueError, match="missing.npy: cannot read"):
        load_anchors(tmp_path / "missing.npy", "CartPole-v1")


def test_a_run_takes_its_anchors_from_the_file_anchor_source_names(tmp_path):
    from fedqhd.config import RunConfig
    from fedqhd.learners import fqi

    path = tmp_path / "mine.npz"
    mine = np.random.default_rng(0).uniform(-1, 1, size=(7, 4))
    np.savez(path, anchors=mine)
    cfg = RunConfig.from_run_config({"encoder": "heterogeneous", "anchor-source": str(path)})
    plan = fqi.anchor_plan(cfg)
    assert plan.run_info["anchors-shape"] == [7, 4]
    np.testing.assert_array_equal(plan.strategy.anchors, mine)
