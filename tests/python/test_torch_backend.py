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


@pytest.mark.parametrize("register", ["1", "0"])
def test_a_tensor_all_reduced_again_goes_zero_copy_and_is_let_go_when_dropped(register):
    # Its storage is registered at the second all_reduce (its pages then map the job's
    # segment), the results stay right, and once only the backend holds the storage the next
    # all_reduce deregisters it: no mapping of the segment is left over. With
    # XLA_SPAWN_REGISTER_TENSORS=0 nothing is registered.
    result, _ = run_job(2, """
        import torch
        import torch.distributed as dist
        import xla_spawn

        def segment_mappings():
            return sum("xla-spawn" in line for line in open("/proc/self/maps"))

        def maps_segment(t):
            at = t.data_ptr() + 8192
            for line in open("/proc/self/maps"):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= at < hi:
                    return "xla-spawn" in line

        dist.init_process_group("xla_spawn")
        rank = dist.get_rank()
        dist.all_reduce(torch.ones(4))
        before = segment_mappings()
        t = torch.zeros(1 << 18)
        shared = []
        for step in range(3):
            t.fill_(rank + step)
            dist.all_reduce(t)
            assert torch.equal(t, torch.full_like(t, 1 + 2 * step)), (step, t[:4])
            shared.append(maps_segment(t))
        del t
        dist.all_reduce(torch.ones(4))
        print("shared", shared, "left over", segment_mappings() - before, flush=True)
        dist.destroy_process_group()
    """, env={**TORCH, "XLA_SPAWN_REGISTER_TENSORS": register})
    assert result.returncode == 0, result.stdout + result.stderr
    shared = "[False, True, True]" if register == "1" else "[False, False, False]"
    for k in range(2):
        assert lines_of(result.stdout, k)[-1] == f"shared {shared} left over 0", result.stdout


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


def test_ctrl_c_inside_a_torch_collective_raises_keyboard_interrupt():
    # Rank 1 never calls: without the wait's signal check rank 0 would sit out the 60 s
    # collective timeout. torch hands the handler's exception on as it is (python_error).
    result, _ = run_job(2, """
        import signal, threading, time
        import torch, torch.distributed as dist
        import xla_spawn
        dist.init_process_group("xla_spawn")
        dist.barrier()
        if dist.get_rank() == 0:
            main = threading.main_thread().ident
            threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT)).start()
            try:
                dist.all_reduce(torch.ones(4))
            except KeyboardInterrupt:
                print("KeyboardInterrupt", flush=True)
        else:
            time.sleep(3)
    """, env=TORCH, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines_of(result.stdout, 0) == ["KeyboardInterrupt"], result.stdout + result.stderr


def test_a_reduce_scatter_list_of_other_sizes_is_refused_naming_the_tensor():
    # The list used to be joined and cut into equal chunks: inputs of 3 and 5 elements for an
    # output of 4 were reduced across the ranks' borders, silently.
    result, _ = run_job(2, """
        import torch, torch.distributed as dist
        import xla_spawn
        dist.init_process_group("xla_spawn")
        try:
            dist.reduce_scatter(torch.zeros(4), [torch.ones(3), torch.ones(5)])
            print("reduced", flush=True)
        except RuntimeError as e:
            print("refused:", str(e).splitlines()[0], flush=True)
    """, env=TORCH, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    for k in range(2):
        assert lines_of(result.stdout, k) == [
            "refused: xla_spawn backend: reduce_scatter input 0 must have the output's 4 "
            "elements of Float; got 3 of Float"], result.stdout
