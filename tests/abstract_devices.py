"""Targets for lowering without the hardware: an abstract mesh of one GPU.

Lowering for CUDA on a CPU host reads the GPU to compile for (its compute capability, 9.0 for an
H100) from the abstract mesh in effect; jax >= 0.11 refuses without one. Shared by the tests that
lower the Pallas GPU kernels (attention_test, pallas_mgpu_test).
"""
import jax


def abstract_gpu(device_kind: str = 'NVIDIA H100', num_cores: int = 132):
  """Context: an abstract mesh ('data': 1) of one GPU of `device_kind` (default sm_90)."""
  device = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=num_cores,
                                       platform='gpu')
  return jax.sharding.use_abstract_mesh(
      jax.sharding.AbstractMesh((1,), ('data',), abstract_device=device))
