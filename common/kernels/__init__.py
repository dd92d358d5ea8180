"""Native CPU kernels, each beside its pure-JAX reference: the C++ sources in cpu/ (built by the package's build
into one shared library here), their JAX side in a module of the op's name.

- narrow_matmul: float32 activations times a weight stored narrow (int8 per output channel, int4 in groups of 32,
  bfloat16), reading the stored bytes directly; the products of decode steps on CPU (common/matmul_policy.py).
"""
