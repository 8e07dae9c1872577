"""Attention masks against hand-written 0/1 matrices (as t5x's layers_test does).

Rows are query positions, columns key positions; 1 = may attend.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from t5align.attention import reference
from t5align import layers


def test_make_decoder_mask_unpacked_is_causal_and_drops_padding():
  tokens = jnp.array([[6, 7, 3, 0], [9, 0, 0, 0]])
  got = layers.make_decoder_mask(tokens, jnp.float32)
  expected = np.array([
      [[1, 0, 0, 0],
       [1, 1, 0, 0],
       [1, 1, 1, 0],
       [0, 0, 0, 0]],
      [[1, 0, 0, 0],
       [0, 0, 0, 0],
       [0, 0, 0, 0],
       [0, 0, 0, 0]],
  ], np.float32)[:, None]
  assert got.shape == (2, 1, 4, 4) and got.dtype == jnp.float32
  np.testing.assert_array_equal(got, expected)


def test_make_decoder_mask_packed_stays_inside_each_segment():
  tokens = jnp.array([[5, 6, 7, 8, 9, 0]])
  segments = jnp.array([[1, 1, 2, 2, 2, 0]])
  got = layers.make_decoder_mask(tokens, jnp.bfloat16, decoder_segment_ids=segments)
  expected = np.array([
      [1, 0, 0, 0, 0, 0],
      [1, 1, 0, 0, 0, 0],
      [0, 0, 1, 0, 0, 0],
      [0, 0, 1, 1, 0, 0],
      [0, 0, 1, 1, 1, 0],
      [0, 0, 0, 0, 0, 0],
  ], np.float32)[None, None]
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32), expected)


def test_make_attention_mask_multiply_and_equal():
  query, key = jnp.array([[1, 1, 0]]), jnp.array([[1, 0, 1, 1]])
  np.testing.assert_array_equal(layers.make_attention_mask(query, key), np.array([[[
      [1, 0, 1, 1],
      [1, 0, 1, 1],
      [0, 0, 0, 0]]]], np.float32))
  q_seg, k_seg = jnp.array([[1, 2, 2]]), jnp.array([[2, 1, 2, 3]])
  np.testing.assert_array_equal(layers.make_attention_mask(q_seg, k_seg, jnp.equal), np.array([[[
      [0, 1, 0, 0],
      [1, 0, 1, 0],
      [1, 0, 1, 0]]]], np.float32))


def test_combine_masks_is_elementwise_and_skips_none():
  a = jnp.array([[1, 1, 0], [0, 1, 1]], jnp.float32)
  b = jnp.array([[1, 0, 1], [0.5, 1, 0]], jnp.float32)  # Any non-zero counts as allowed.
  got = layers.combine_masks(a, None, b, dtype=jnp.int32)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, [[1, 0, 0], [0, 1, 0]])
  np.testing.assert_array_equal(layers.combine_masks(None, a), a)
  assert layers.combine_masks(None, None) is None


def test_mask_from_ids_equal_nonpad_segments():
  q_ids = jnp.array([[1, 1, 2, 0]])
  k_ids = jnp.array([[1, 2, 2, 0, 1]])
  got = reference.mask_from_ids(q_ids, k_ids)
  expected = np.array([
      [1, 0, 0, 0, 1],
      [1, 0, 0, 0, 1],
      [0, 1, 1, 0, 0],
      [0, 0, 0, 0, 0],
  ], bool)[None, None]
  assert got.shape == (1, 1, 4, 5) and got.dtype == jnp.bool_
  np.testing.assert_array_equal(got, expected)
