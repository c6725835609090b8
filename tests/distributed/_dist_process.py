"""One process of a two-process data-parallel job on localhost (issue 7, multi-process).

``tests/distributed/test_distributed.py`` starts two of these with torchrun's variables
(``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``) and 2 simulated CPU
devices each; ``jm.distributed.init()`` joins them into one 4-device job whose
CPU collectives run over gloo. Each process feeds its half of every batch
and runs compiled training steps on a model placed three ways across both
processes: data parallel (``model.to(replicated(mesh))``), FSDP
(``jm.distributed.shard``), and FSDP from a meta-built model
(``to_empty(device=(mesh, rules))`` then ``reset_parameters()``, which must
draw the same weights as an eager build); the trained FSDP model is then
moved again with ``model.to(replicated(mesh))``. It writes the losses and the
final weights to ``OUT.npz`` for the test to compare with one process.

Usage: python tests/distributed/_dist_process.py OUT.npz
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
from _dist_models import as_float, batch, classifier, run_steps  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import jmodule.optim  # noqa: E402

STEPS = 3


def placed(layout, mesh):
    """The classifier seeded with 0, on ``mesh`` as ``layout`` says."""
    jm.manual_seed(0)
    if layout == "meta":
        with jm.device("meta"):
            model = classifier()
        model.to_empty(device=(mesh, dist.fsdp(mesh)))
        assert not any(p.sharding.is_fully_addressable for p in model.parameters())
        for m in model.modules():  # construction order: the eager build's draws
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        return model
    model = classifier()
    if layout == "dp":
        # "cpu" is this process's first device, as in PyTorch; from there (committed arrays)
        # onto the devices of both processes
        model.to("cpu")
        for v in model.state_dict().values():
            assert v.committed and v.devices() == {jax.local_devices()[0]}, v.devices()
        assert model.to(dist.replicated(mesh)) is model
    else:
        dist.shard(model, mesh, dist.fsdp(mesh))
    return model


def train(layout, mesh):
    """Losses and gathered weights after STEPS compiled Adam steps."""
    model = placed(layout, mesh)
    expected = dist.shardings(model, mesh, None if layout == "dp" else dist.fsdp(mesh))
    assert {k: v.sharding for k, v in model.state_dict().items()} == expected
    opt = jm.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch()
    rank, half = dist.get_rank(), len(x) // dist.get_world_size()
    local = (x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half])
    losses, _ = run_steps(model, opt, *dist.shard_batch(local, mesh), steps=STEPS)
    state = {
        f"{layout}/{k}": np.asarray(multihost_utils.process_allgather(v, tiled=True))
        for k, v in model.state_dict().items()
    }
    if layout == "fsdp":  # arrays already spread over both processes, moved by Module.to
        model.to(dist.replicated(mesh))
        for k, v in model.state_dict().items():
            assert v.sharding == dist.replicated(mesh), k
            np.testing.assert_array_equal(np.asarray(v.addressable_data(0)), state[f"fsdp/{k}"])
    return {f"{layout}/loss": np.array([as_float(v) for v in losses]), **state}


def main(out):
    assert dist.get_world_size() == 2 and jax.device_count() == 4, jax.devices()
    # off in a multi-process job: JAX 0.12.1 hangs running cached programs with collectives
    assert jm.compilation_cache_dir() is None, jm.compilation_cache_dir()
    assert len(jax.local_devices()) == 2
    mesh = dist.make_mesh()
    results = {**train("dp", mesh), **train("fsdp", mesh), **train("meta", mesh)}
    np.savez(out, rank=dist.get_rank(), **results)


if __name__ == "__main__":
    main(sys.argv[1])
