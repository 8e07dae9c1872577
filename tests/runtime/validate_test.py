"""t5align/runtime/validate.py: a temperature outside float32's normal range, or not > 0, is
refused, naming the setting, by the check itself and by the model's config that uses it."""
from __future__ import annotations

import re

import pytest

from t5align import network
from t5align.runtime import validate


@pytest.mark.parametrize('tau', [1e-50, 1e-40, 0.0, -0.5, float('nan'), float('inf'), 1e39])
def test_temperature_outside_float32_or_nonpositive_is_refused(tau):
  with pytest.raises(ValueError, match=r'TEMPERATURE must be finite and > 0, in float32'):
    validate.temperatures(tau, 'TEMPERATURE')
  with pytest.raises(ValueError, match=r'encoder_attention_temperature = .*: expected a '
                                       r'temperature, finite and > 0, in float32 too \(from '
                                       rf'1\.18e-38 to 3\.4e\+38\): .* \({re.escape(repr(tau))} is '
                                       r'not\)\.$'):
    network.T5Config(vocab_size=8, encoder_attention_temperature=tau)
  validate.temperatures([1e-30, 0.5, 3e38])  # Normal float32 values pass.
