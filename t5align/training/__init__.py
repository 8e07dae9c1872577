"""Training: the loss, the optimizer, the step, train checkpoints, the train log, the export and
fine-tuning's seqio batches. `jobs.TrainJob` runs them (`python -m t5align.train`).

By level, each module importing only those before it: `loss` (cross entropy and token accuracy),
`optim` (`OptimizerConfig`: AdamW or Adafactor with a learning-rate schedule), `step`
(`train_step`, jitted), `state` (checkpoint_N/ with train_state_N.msgpack: save, list, restore,
prune), `train_log` (train_log.jsonl), `export` (the final weights with their vocabulary, and
training.json), `data` (`SeqioBatches`: a seqio task's 'train' split, cut as seqio cuts it). The
package re-exports their API.
"""
from t5align.training.data import SeqioBatches
from t5align.training.data import trim
from t5align.training.export import export
from t5align.training.export import training_record
from t5align.training.loss import cross_entropy
from t5align.training.optim import LEARNING_RATE_SCHEDULES
from t5align.training.optim import OPTIMIZERS
from t5align.training.optim import OptimizerConfig
from t5align.training.state import checkpoint_steps
from t5align.training.state import prune
from t5align.training.state import restore_checkpoint
from t5align.training.state import save_checkpoint
from t5align.training.state import train_state_path
from t5align.training.step import train_step
from t5align.training.train_log import logged_training
from t5align.training.train_log import logged_trimming

__all__ = [
    'LEARNING_RATE_SCHEDULES', 'OPTIMIZERS', 'OptimizerConfig', 'SeqioBatches',
    'checkpoint_steps', 'cross_entropy', 'export', 'logged_training', 'logged_trimming',
    'prune', 'restore_checkpoint', 'save_checkpoint', 'train_state_path', 'train_step', 'trim',
    'training_record',
]
