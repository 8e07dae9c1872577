"""t5align/calibration/samples.py: calibration inputs that cannot be used are refused naming the
file (and line): a malformed JSONL_FILE line, an input too short for a sample of the length asked.
"""
from __future__ import annotations

import numpy as np
import pytest

from t5align.calibration import samples


@pytest.mark.parametrize('line, message', [
    ('{"inputs": "unterminated, "task": "a"}',
     r'expected a JSON object with an "inputs" string \(Expecting .,. delimiter'),
    ('{"task": "a"}', r'expected a JSON object with an "inputs" string \(.inputs.\)'),
    ('["a list"]', r'expected a JSON object with an "inputs" string'),
    ('{"inputs": ""}', r'"inputs" must be a non-empty string'),
    ('{"inputs": 7}', r'"inputs" must be a non-empty string'),
])
def test_malformed_calibration_jsonl_line_names_file_and_line(tmp_path, line, message):
  jsonl = tmp_path / 'inputs.jsonl'
  jsonl.write_text('{"inputs": "a fine first line", "task": "a"}\n' + line + '\n')
  with pytest.raises(ValueError, match=rf'{jsonl}:2: ' + message):
    samples.jsonl_examples(str(jsonl), lambda text: [3] * len(text.split()), 1, 4)


def test_a_short_calibration_input_names_its_file():
  with pytest.raises(ValueError, match=r'JSONL_FILE data.jsonl has 16 tokens; a sample of length '
                     r'64 needs 63'):
    samples.sample_windows(np.arange(16), 2, 64, eos_id=1, source='JSONL_FILE data.jsonl')
