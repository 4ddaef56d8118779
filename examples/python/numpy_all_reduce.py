"""Each replica fills an array from its ordinal; one all-reduce sums them in place; each checks
the job's total. The xla_spawn module on NumPy arrays, nothing else.

    xla-spawn -n 4 -- python3 examples/python/numpy_all_reduce.py
"""

import sys

import numpy as np

import xla_spawn as xs

ordinal, n = xs.get_ordinal(), xs.world_size()
data = xs.alloc_buffer(1 << 20, np.float32)  # in the shared-memory arena: reduced without copies
data[:] = ordinal + 1
xs.all_reduce(data, xs.REDUCE_SUM)
want = n * (n + 1) / 2
if not np.all(data == want):
    sys.exit(f"ordinal {ordinal}: sum {data[0]} instead of {want}")
print(f"ordinal {ordinal} of {n}: sum {data[0]:.0f}")
del data
