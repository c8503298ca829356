"""kiln-bench: kiln against eager, Inductor and peer backends.

    kiln-bench [--quick] [--device cpu|cuda] [--groups kernels,blocks,training]
               [--backends eager,inductor,...] [--results DIR] [--install-peers]

Every case runs under every backend in one process (ratios are comparable),
checks its output against eager, and reports the steady-state median time,
the ratio to Inductor and, for kernels, the fraction of the roofline bound
(memory bandwidth and matmul peak measured at the start of the run). Cold
and warm-cache compile times and peak memory come from fresh processes.
"""

__version__ = "0.1.0"
