"""Writes upstream.json: NVIDIA/RULER's prompt strings and task arguments, read from its files.

constants.py (TASKS) and template.py (Templates['base']) are imported; niah.py,
variable_tracking.py and qa.py are parsed for their string assignments (needle, haystack,
DOCUMENT_PROMPT); synthetic.yaml is loaded; DEPTHS is evaluated with niah.py's expression.
Usage: python extract_constants.py RULER_ROOT OUT_JSON
"""
import ast
import importlib.util
import json
import pathlib
import sys

import numpy as np
import yaml


def _module(path: pathlib.Path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _strings(path: pathlib.Path, names: set[str]) -> dict[str, list[str]]:
  found = {}
  for node in ast.walk(ast.parse(path.read_text())):
    if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)):
      for target in node.targets:
        if isinstance(target, ast.Name) and target.id in names:
          found.setdefault(target.id, []).append(node.value.value)
  return found


def main(root: pathlib.Path, out: pathlib.Path):
  synthetic = root / 'scripts' / 'data' / 'synthetic'
  niah = _strings(synthetic / 'niah.py', {'needle', 'haystack'})
  vt = _strings(synthetic / 'variable_tracking.py', {'haystack'})
  qa = _strings(synthetic / 'qa.py', {'DOCUMENT_PROMPT'})
  depths = np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)
  data = {
      'TASKS': _module(synthetic / 'constants.py').TASKS,
      'base_template': _module(root / 'scripts' / 'data' / 'template.py').Templates['base'],
      'needle': niah['needle'][0],
      'noise': next(h for h in niah['haystack'] if h.startswith('The grass')),
      'vt_noise': next(h for h in vt['haystack'] if h.startswith('The grass')),
      'document_prompt': qa['DOCUMENT_PROMPT'][0],
      'depths': [int(d) for d in depths],
      'synthetic_yaml': yaml.safe_load((root / 'scripts' / 'synthetic.yaml').read_text()),
  }
  data['synthetic_order'] = list(data['synthetic_yaml'])  # the file's order (keys get sorted)
  out.write_text(json.dumps(data, indent=1, sort_keys=True) + '\n')


if __name__ == '__main__':
  main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
