"""Encoder self-attention with T5's relative bias, a softmax temperature and row statistics.

reference (the math every implementation shares, and the materialized attention), blockwise
(online softmax over key blocks, pure JAX), pallas_gpu (Triton), pallas_mgpu (Mosaic GPU,
Hopper) and pallas_tpu (Mosaic) fused kernels, dispatch (`self_attention`: which implementation
runs, per device under a mesh). The package imports nothing else of t5align. Import the modules
themselves.
"""
