"""One process of a two-process checkpoint save and load on localhost (multi-host ``jm.save``).

``tests/distributed/test_distributed.py`` starts two of these with torchrun's variables
(``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``) and 2 simulated CPU
devices each. Both train the classifier, sharded FSDP-style over the 4
devices of both processes, for two compiled Adam steps, then both call
``jm.save`` with the same path: each writes only its own shards. Both load it
back onto a sharding across both processes (replicated and a different
FSDP split) and compare it with what was saved, gathered. Process 0 writes
the gathered saved values to ``OUT.npz`` for the test to compare with a
single-process ``jm.load``.

Usage: python tests/distributed/_dist_ckpt_process.py CKPT OUT.npz
"""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jmodule as jm
import jmodule.distributed as dist

dist.init()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _dist_models import batch, classifier, run_steps  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import jmodule.checkpoint  # noqa: E402
import jmodule.optim  # noqa: E402


def gathered(tree):
    """``tree``'s arrays as numpy arrays holding every process's part, keyed by path."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {
        jax.tree_util.keystr(path): np.asarray(multihost_utils.process_allgather(x, tiled=True))
        if isinstance(x, jax.Array) and not x.is_fully_addressable
        else np.asarray(x)
        for path, x in leaves
    }


def main(ckpt, out):
    assert dist.get_world_size() == 2 and jax.device_count() == 4, jax.devices()
    mesh = dist.make_mesh()
    jm.manual_seed(0)
    model = classifier()
    dist.shard(model, mesh, dist.fsdp(mesh))
    opt = jm.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch(16)
    rank, half = dist.get_rank(), len(x) // 2
    local = (x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half])
    run_steps(model, opt, *dist.shard_batch(local, mesh), steps=2)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}
    spread = [
        v
        for v in jax.tree_util.tree_leaves(state)
        if isinstance(v, jax.Array) and not v.is_fully_addressable
    ]
    assert any(not v.sharding.is_fully_replicated for v in spread), "nothing is sharded"
    saved = gathered(state)

    jm.save(state, ckpt)
    assert os.path.isdir(ckpt)
    with pytest.raises(jm.serialization.CheckpointExistsError, match="already exists"):
        jm.save(state, ckpt)  # every process raises, none hangs
    jm.save(state, ckpt, overwrite=True)
    manager = jm.checkpoint.CheckpointManager(ckpt + "-steps", async_=True)
    with pytest.raises(NotImplementedError, match=r"async_=True\) cannot save in a job"):
        manager.save(0, state)

    # the synchronous manager: every process saves, process 0 keeps max_to_keep
    manager = jm.checkpoint.CheckpointManager(ckpt + "-sync", max_to_keep=2, async_=False)
    for step in range(3):
        manager.save(step, state)
        assert manager.all_steps() == list(range(max(0, step - 1), step + 1))
    # restored with no map_location: each process gets a whole copy on its own device
    restored_tree = manager.restore()
    for leaf in jax.tree_util.tree_leaves(restored_tree):
        if isinstance(leaf, jax.Array):
            assert leaf.devices() == {jax.local_devices()[0]}
    restored = gathered(restored_tree)
    assert restored.keys() == saved.keys()
    for key, want in saved.items():
        np.testing.assert_array_equal(restored[key], want, err_msg=key)

    replicated = NamedSharding(mesh, PartitionSpec())
    columns = NamedSharding(mesh, PartitionSpec(None, mesh.axis_names[0]))
    as_saved = {f"model.{k}": v.sharding for k, v in model.state_dict().items()}
    # split along dimension 1, across the saved (dimension 0) shards: verification
    # gathers those regions
    split = {
        f"model.{k}": columns
        for k, v in model.state_dict().items()
        if v.ndim == 2 and v.shape[1] % 4 == 0 and v.shape[0] % 4 == 0
    }
    assert split
    for per_key in ({}, as_saved, split):
        loaded = jm.load(ckpt, map_location=(replicated, per_key))
        assert loaded["epoch"] == 3
        for leaf in jax.tree_util.tree_leaves(loaded):
            if isinstance(leaf, jax.Array):
                assert not leaf.is_fully_addressable
        for k, s in per_key.items():
            assert loaded["model"][k.removeprefix("model.")].sharding == s, k
        got = gathered(loaded)
        assert got.keys() == saved.keys()
        for key, want in saved.items():
            np.testing.assert_array_equal(got[key], want, err_msg=key)
    if rank == 0:
        np.savez(out, **saved)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
