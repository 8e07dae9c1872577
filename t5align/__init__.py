"""t5align: attention alignment (encoder softmax temperature) for T5, T5X-compatible."""
import os


def gin_dir() -> str:
  """The folder to pass as `--gin_search_paths`: it holds gin/ (models, runs, t5x files).

  The gin files include each other as 'gin/...' relative to it. It is t5align/gin_search_path,
  whose gin/ is a link to the repository's gin/ folder in a checkout (or an editable install)
  and a copy of it, shipped as package data, in an installed wheel.
  """
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'gin_search_path')
