import json

import jax
import pytest
from jax.sharding import PartitionSpec as P

from tests.built_once import built_once
from tests.subprocess_json import ROOT, run_python
from tfm.job import parallel

# A few float32 ulps of a parameter of size ~1: sharded reductions add in a different order (and
# multidevice_steps.py's Adam eps keeps its first step from amplifying that).
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def eight_device_results(tmp_path_factory):
    """The 8-device steps' comparisons, computed once for the session (a ~75 s process) and read
    by every pytest-xdist worker that runs a test of this module."""

    def build(directory):
        results = run_python([str(ROOT / "tests" / "multidevice_steps.py")], timeout=600)
        (directory / "results.json").write_text(json.dumps(results))

    directory = built_once(tmp_path_factory, "eight-device-steps", build)
    return json.loads((directory / "results.json").read_text())


@pytest.mark.parametrize("strategy", ["data", "fsdp", "tensor"])
@pytest.mark.parametrize("dropout", ["0.0", "0.1"])
def test_sharded_step_equals_single_device_step(eight_device_results, strategy, dropout):
    result = eight_device_results[f"{strategy}_dropout{dropout}"]
    assert result["max_abs_diff"] <= TOLERANCE, result
    if strategy == "data":
        assert result["sharded_leaves"] == 0
    else:
        assert result["sharded_leaves"] > 0


def test_pmap_equals_jit(eight_device_results):
    assert eight_device_results["pmap_dropout0.0"]["max_abs_diff"] <= TOLERANCE


def test_tensor_rules_split_heads_and_d_ff():
    mesh = parallel.make_mesh(1, devices=jax.devices()[:1])

    def spec(names, shape, strategy="tensor"):
        path = tuple(jax.tree_util.DictKey(n) for n in names)
        return parallel.parameter_spec(path, shape, strategy, mesh)

    assert spec(["encoder_0", "self_attention", "query", "kernel"], (32, 4, 8)) == P(
        None, "model", None
    )
    assert spec(["encoder_0", "self_attention", "out", "kernel"], (4, 8, 32)) == P(
        "model", None, None
    )
    assert spec(["encoder_0", "feed_forward", "inner", "kernel"], (32, 64)) == P(None, "model")
    assert spec(["encoder_0", "feed_forward", "outer", "kernel"], (64, 32)) == P("model", None)
    assert spec(["embedding", "embedding"], (64, 32), "data") == P(None, None)
    with pytest.raises(ValueError, match="parallelism"):
        spec(["x"], (2,), "zero3")


@pytest.mark.parametrize(
    "name, value",
    [("TFM_HEARTBEAT_TIMEOUT", "1m"), ("TFM_NUM_PROCESSES", "0"), ("TFM_PROCESS_ID", "-1")],
)
def test_a_bad_cluster_variable_is_named_before_jax_is_touched(monkeypatch, name, value):
    monkeypatch.setenv("TFM_COORDINATOR", "127.0.0.1:9")
    monkeypatch.setenv(name, value)
    before = jax.config.jax_cpu_collectives_implementation
    with pytest.raises(ValueError, match=rf"^environment variable {name}='{value}': "):
        parallel.initialize_distributed()
    assert jax.config.jax_cpu_collectives_implementation == before


@pytest.mark.parametrize("cluster", [dict(SLURM_JOB_ID="7"), dict(TFM_COORDINATOR="10.0.0.1:9")])
def test_the_heartbeat_timeout_reaches_jax_on_every_cluster(monkeypatch, cluster):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
    for name, value in cluster.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TFM_HEARTBEAT_TIMEOUT", "17")
    before = jax.config.jax_cpu_collectives_implementation
    try:
        parallel.initialize_distributed()
    finally:
        jax.config.update("jax_cpu_collectives_implementation", before)
    assert len(calls) == 1 and calls[0]["heartbeat_timeout_seconds"] == 17
