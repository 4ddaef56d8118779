"""The torch.distributed backend "xla_spawn" under the real launcher: every supported
collective, dtype and op through torch.distributed, bit-identical across ranks; unsupported
operations named in their error; an unmodified DDP script trains with it. Run by CTest
(Python.TorchBackend); skipped when Debian's PyTorch is not installed.
"""

import os
import sys

import pytest

from test_collectives import lines_of, run_job

pytest.importorskip("torch", reason="the torch.distributed backend needs python3-torch")

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH = {"XLA_SPAWN_NO_TORCH": "0"}
DDP_SCRIPT = os.path.join(HERE, "..", "launcher", "torch_ddp.py")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_collective_through_torch_distributed(n):
    result, _ = run_job(n, script=os.path.join(HERE, "replica_torch.py"), env=TORCH)
    assert result.returncode == 0, result.stdout + result.stderr
    digests = {lines_of(result.stdout, k)[-1] for k in range(n)}
    assert len(digests) == 1 and digests.pop().startswith("digest "), result.stdout


def test_an_unmodified_ddp_script_trains_with_the_backend():
    result, _ = run_job(2, script=DDP_SCRIPT, args=["xla_spawn"], env=TORCH)
    assert result.returncode == 0, result.stdout + result.stderr
    for k in range(2):
        assert lines_of(result.stdout, k)[-1].endswith("parameters agree"), result.stdout


def test_a_sub_group_is_refused_with_a_message():
    # What dist.new_group([0]) hands the backend's creator on rank 0 of 2 (new_group itself
    # would leave the non-member waiting in torch's store barrier).
    result, _ = run_job(2, """
        import torch.distributed as dist
        from xla_spawn import _c10d
        try:
            _c10d.create(None, 0, 1, None)
        except RuntimeError as e:
            print("refused:", e, flush=True)
    """, env=TORCH)
    assert result.returncode == 0, result.stdout + result.stderr
    for k in range(2):
        line = lines_of(result.stdout, k)[0]
        assert "the group of rank 0 of 1 is not the job's" in line, line
        assert "only the whole job is supported, not sub-groups" in line, line
