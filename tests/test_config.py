import tomllib
from pathlib import Path

import pytest

from fedqhd.config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_defaults_are_the_run_config_defaults():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert RunConfig.from_run_config(table) == RunConfig()
    assert set(table) == set(RunConfig().to_run_config())


def test_no_federations_table_in_pyproject():
    assert "federations" not in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]


@pytest.mark.parametrize("key, value, fragment", [
    ("gamma", 1.0, "'gamma' = 1.0 is invalid: expected a number in [0.0, 1.0)"),
    ("env-id", "Pong-v5", "'env-id' = 'Pong-v5' is invalid: expected a registered env id: "
     "unknown env id 'Pong-v5'"),
    ("num-server-rounds", 0, "'num-server-rounds' = 0 is invalid: expected an integer in [1,"),
    ("ridge", 0.0, "'ridge' = 0.0 is invalid"),
    ("hd-dim", "big", "'hd-dim' = 'big' has type str, expected int"),
    ("fraction-train", 0, "'fraction-train' = 0.0 is invalid"),
])
def test_bad_values_name_the_key_and_the_valid_range(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({key: value})
    assert fragment in str(err.value)


def test_unknown_keys_and_inconsistent_combinations_are_refused():
    with pytest.raises(ConfigError, match="unknown run-config key.*'num-rounds'"):
        RunConfig.from_run_config({"num-rounds": 3})
    with pytest.raises(ConfigError, match="'strategy' = 'avg' needs 'encoder' = 'shared'"):
        RunConfig.from_run_config({"strategy": "avg", "encoder": "heterogeneous"})
    with pytest.raises(ConfigError, match="epsilon-min"):
        RunConfig.from_run_config({"epsilon-min": 0.9, "epsilon-max": 0.5})
    # an anchor file is named by its path in anchor-source; the key and value of old are gone
    with pytest.raises(ConfigError, match="'anchor-source'.*the path of a .npy or .npz"):
        RunConfig.from_run_config({"anchor-source": "file"})
    with pytest.raises(ConfigError, match=r"'anchor-file' \(merged: give the file's path as "
                                          r"'anchor-source'\)"):
        RunConfig.from_run_config({"anchor-file": "a.npy"})
    assert RunConfig.from_run_config({"anchor-source": "my/a.npz"}).anchor_source == "my/a.npz"


def test_ints_are_accepted_for_floats_and_strategy_auto_resolves():
    cfg = RunConfig.from_run_config({"ridge": 1, "encoder": "heterogeneous"})
    assert cfg.ridge == 1.0 and isinstance(cfg.ridge, float)
    assert cfg.resolved_strategy == "anchor"
    assert RunConfig().resolved_strategy == "avg"


def test_the_learner_names_of_the_config_are_the_registry_s():
    from fedqhd.config import LEARNERS
    from fedqhd.learners import learner_names

    assert LEARNERS == learner_names()


def test_a_learner_s_own_checks_come_with_parse_run_config():
    from fedqhd.learners import parse_run_config

    cfg = RunConfig.from_run_config({"learner": "pool"})  # the config's own keys: fine
    assert cfg.learner == "pool"
    with pytest.raises(ConfigError, match="'learner' = 'pool' needs 'env-id'"):
        parse_run_config({"learner": "pool"})
    assert parse_run_config({"ridge": 1}) == RunConfig(ridge=1.0)
