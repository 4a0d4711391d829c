"""Two processes on this machine (`jax.distributed.initialize` on localhost,
gloo CPU collectives, 4 host devices each) run one sharded PPO update on an
(8,1,1) mesh spanning both, and match one process with 8 devices.

Each process holds half of the rollout threads and builds the global batch
from its own rows (`jax.make_array_from_process_local_data`); both issue the
same compiled call.  This file runs itself as the worker processes.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

# One xdist worker runs every test of this module (`--dist loadgroup`, scripts/test.sh): its module
# fixture, minutes of training or of subprocesses, is then set up once per suite, not once per worker.
pytestmark = [pytest.mark.xdist_group("sharding_multiprocess"), pytest.mark.long]

REPO = pathlib.Path(__file__).resolve().parents[1]
THREADS, STEPS = 8, 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, devices: int, out: pathlib.Path):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, __file__, str(out), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc, timeout=600) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    assert proc.returncode == 0, output[-4000:]
    return output


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both processes' records (they also save a checkpoint together), then
    the one-process record (which also restores that checkpoint)."""
    out = tmp_path_factory.mktemp("multiprocess")
    port = _free_port()
    for proc in [_launch(["multi", port, rank], 4, out) for rank in (0, 1)]:
        _finish(proc)
    _finish(_launch(["single"], 8, out))
    return {name: json.loads((out / f"{name}.json").read_text()) for name in ("multi0", "multi1", "single")}


def test_two_processes_match_one_process_with_eight_devices(runs):
    """Metrics within 1e-6 absolute plus 1e-5 relative and parameters within
    1e-6: the same 8-device program, its all-reduces run over gloo between
    processes instead of within one, reducing in another order (measured
    2026-11-23: metrics 1.2e-7, parameters 2.2e-7 apart)."""
    ref = runs["single"]
    for rank in (0, 1):
        got = runs[f"multi{rank}"]
        assert got["process_count"] == 2 and got["local_devices"] == 4 and got["global_devices"] == 8
        for key, value in ref["metrics"].items():
            assert abs(got["metrics"][key] - value) <= 1e-6 + 1e-5 * abs(value), key
        for name, value in ref["params"].items():
            np.testing.assert_allclose(np.asarray(got["params"][name]), np.asarray(value), rtol=0, atol=1e-6,
                                       err_msg=name)
    assert ref["change"] > 1e-3


def test_checkpoint_of_two_processes_resumes_in_one(runs):
    """The train state saved by both processes together (Orbax, collective)
    restores bit-exactly in one process, on one device and on an (8,1,1)
    mesh of its own 8 devices, on the target's shardings."""
    assert runs["single"]["restored"] == {"one_device": {"equal": True, "on_target": True},
                               "dp8": {"equal": True, "on_target": True}}


def _worker(out: pathlib.Path, mode: str, port: int | None = None, rank: int | None = None) -> None:
    import jax

    if mode == "multi":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                                   initialization_timeout=120)
    jax.config.update("jax_default_matmul_precision", "highest")
    import jax.numpy as jnp
    from flax import nnx
    from jax.experimental import multihost_utils

    from poad_jax import parallel as dist

    from poad_jax.agent import sharded_update as sharded
    from poad_jax.run.config import learner_config
    from poad_jax.agent.learner import init_train_state
    from poad_jax.agent.methods import make_method
    from poad_jax.models.tiny import tiny_random_model
    from poad_jax.core.critic_config import CriticConfig
    from poad_jax.core.policy import ValueHead, split_policy
    from poad_jax.agent.experience import behaviour_statistics, make_token_batch
    from tests.test_sharding import _synthetic_rollout

    model, _ = tiny_random_model(hidden_size=40)
    graph, frozen, params = split_policy(model, ValueHead(40, CriticConfig(hidden_sizes=(48,)), rngs=nnx.Rngs(1)))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    params = jax.tree.unflatten(treedef, [np.asarray(x + 0.05 * jax.random.normal(k, x.shape, x.dtype))
                                          for x, k in zip(leaves, keys)])
    frozen = jax.tree.map(np.asarray, frozen)
    before = jax.tree.map(np.copy, params)
    method = make_method("poad", 0.95)
    arrays, next_arrays = _synthetic_rollout(model.config.vocab_size)
    mesh = dist.make_mesh(8, 1, 1)
    config = learner_config(gamma=0.95, temperature=1.0, num_minibatches=2, accumulation_steps=2, epochs=2, actor_lr=1e-2,
                           critic_lr=1e-2, target_kl=float("inf"))
    fr, pr = sharded.shard_policy(frozen, params, mesh)  # identical host values on every process

    def global_rows(tree):
        """This process's threads (thread-major rows) -> global arrays split over the mesh."""
        count, index = jax.process_count(), jax.process_index()

        def one(x):
            local = np.split(np.asarray(x), count)[index]
            return jax.make_array_from_process_local_data(dist.batch_shardings(x, mesh), local, np.shape(x))
        return jax.tree.map(one, tree)

    rows, next_rows = global_rows(arrays), global_rows(next_arrays)
    stats = behaviour_statistics(graph, fr, pr, pr["head"], rows, next_rows, method=method, temperature=1.0,
                                 critic_kind="head")
    batch = make_token_batch(rows, stats)
    update, _ = sharded.jit_sharded_update(graph, method, config, mesh)
    state = sharded.init_sharded_train_state(pr, config, jax.random.key(0), mesh)
    state, metrics = update(state, fr, batch)
    gathered = multihost_utils.process_allgather(state.params, tiled=True) if mode == "multi" else \
        jax.device_get(state.params)
    flat = {dist.sharding.path_string(p): np.asarray(x).tolist()
            for p, x in jax.tree_util.tree_flatten_with_path(gathered)[0]}
    change = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in
                 zip(jax.tree.leaves(gathered), jax.tree.leaves(before)))
    record = {
        "metrics": {k: float(np.asarray(v.addressable_data(0))) for k, v in metrics.items()},
        "params": flat, "change": change, "process_count": jax.process_count(),
        "local_devices": jax.local_device_count(), "global_devices": jax.device_count(),
    }
    from poad_jax.run import checkpoint as checkpoint_lib

    if mode == "multi":
        writer = checkpoint_lib.RunCheckpointer(out / "multi_run")
        writer.save(1, state, {"update": 1})
        writer.close()
    elif (out / "multi_run").is_dir():
        saved = json.loads((out / "multi0.json").read_text())["params"]
        record["restored"] = {}
        for target, target_mesh in (("one_device", None), ("dp8", mesh)):
            template = init_train_state(jax.tree.map(jnp.asarray, params), config, jax.random.key(5))
            if target_mesh is not None:
                template = sharded.shard_train_state(template, target_mesh)
            reader = checkpoint_lib.RunCheckpointer(out / "multi_run", create=False)
            restored, _ = reader.restore(template)
            reader.close()
            got = {dist.sharding.path_string(p): np.asarray(x) for p, x in
                   jax.tree_util.tree_flatten_with_path(restored.params)[0]}
            record["restored"][target] = {
                "equal": all(np.array_equal(got[k], np.asarray(v, np.float32)) for k, v in saved.items()),
                "on_target": all(a.sharding.is_equivalent_to(b.sharding, np.ndim(a)) for a, b in
                                 zip(jax.tree.leaves(restored), jax.tree.leaves(template))),
            }
    name = f"multi{rank}" if mode == "multi" else "single"
    (out / f"{name}.json").write_text(json.dumps(record))
    if mode == "multi":
        jax.distributed.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _worker(pathlib.Path(sys.argv[1]), sys.argv[2], *(int(a) for a in sys.argv[3:]))
