"""T5 checkpoints of any supported format, loaded strictly: `load_params`.

Formats (one module each): T5X legacy and Orbax, plus the T5X writer (`t5x`), HuggingFace,
plus its writer (`hf`), Mesh-TF (`mesh_tf`); trees, locations and timed remote reads (`store`);
the loader (`load`). Every reader returns the T5X 'params' tree
(t5x/examples/t5/network.py names, kernels `[in, out]`) as a nested dict of numpy arrays in the
stored dtype. `load_params` adds format detection, an explicit dtype policy and a strict check
against `network.param_shapes(config)` that raises one `CheckpointMismatchError` naming every
missing, unexpected and mis-shaped parameter. With a `mesh`, `load_params` returns sharded
`jax.Array`s and reads T5X checkpoints per device slice.

Paths inside the tree are '/'-joined (`encoder/layers_0/attention/query/kernel`).
"""

# The loader and each format module's API, importable as `checkpoints.NAME`.
from t5align.checkpoints.hf import hf_config_hints
from t5align.checkpoints.hf import hf_flax_to_state_dict
from t5align.checkpoints.hf import params_from_hf_state_dict
from t5align.checkpoints.hf import read_hf_checkpoint
from t5align.checkpoints.hf import save_hf_checkpoint
from t5align.checkpoints.load import cast_params
from t5align.checkpoints.load import check_params
from t5align.checkpoints.load import DEFAULT_SOURCE_DTYPES
from t5align.checkpoints.load import detect_format
from t5align.checkpoints.load import embedding_rows
from t5align.checkpoints.load import FORMATS
from t5align.checkpoints.load import infer_config
from t5align.checkpoints.load import load_params
from t5align.checkpoints.load import read_params
from t5align.checkpoints.mesh_tf import params_from_mesh_tf
from t5align.checkpoints.mesh_tf import read_mesh_tf_checkpoint
from t5align.checkpoints.mesh_tf import UNMAPPED
from t5align.checkpoints.store import CheckpointDtypeError
from t5align.checkpoints.store import CheckpointMismatchError
from t5align.checkpoints.store import CheckpointReadError
from t5align.checkpoints.store import flatten_params
from t5align.checkpoints.store import kvstore_spec
from t5align.checkpoints.store import Params
from t5align.checkpoints.store import unflatten_params
from t5align.checkpoints.t5x import adafactor_param_state
from t5align.checkpoints.t5x import read_t5x_checkpoint
from t5align.checkpoints.t5x import read_t5x_orbax_checkpoint
from t5align.checkpoints.t5x import resolve_ts_spec
from t5align.checkpoints.t5x import save_t5x_checkpoint
from t5align.checkpoints.t5x import t5x_checkpoint_paths

__all__ = [
    'CheckpointDtypeError', 'CheckpointMismatchError', 'CheckpointReadError',
    'DEFAULT_SOURCE_DTYPES', 'FORMATS', 'Params', 'UNMAPPED', 'adafactor_param_state',
    'cast_params', 'check_params', 'detect_format', 'embedding_rows', 'flatten_params',
    'hf_config_hints', 'hf_flax_to_state_dict', 'infer_config', 'kvstore_spec', 'load_params',
    'params_from_hf_state_dict', 'params_from_mesh_tf', 'read_hf_checkpoint',
    'read_mesh_tf_checkpoint', 'read_params', 'read_t5x_checkpoint', 'save_hf_checkpoint',
    'read_t5x_orbax_checkpoint', 'resolve_ts_spec', 'save_t5x_checkpoint',
    't5x_checkpoint_paths', 'unflatten_params',
]
