"""The encoders' shared pieces: bucket sizes and the EncoderOutput row order."""

import jax
import numpy as np

from omnijax.preprocess.buckets import length_bucket, length_buckets, pow2_at_least
from omnijax.encoders.output import EncoderOutput


def test_buckets():
    assert [length_bucket(n) for n in (0, 1, 2, 3, 4, 5, 7, 9, 13, 24, 25)] == [1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert length_bucket(5, minimum=16) == 16
    assert length_buckets(64, 16) == (16, 24, 32, 48, 64) and length_buckets(65, 16)[-1] == 96
    assert [pow2_at_least(n) for n in (0, 1, 2, 3, 5, 8)] == [1, 1, 2, 4, 8, 8]


def test_valid_rows_first_keeps_the_order_of_valid_rows():
    valid = np.array([True, True, False, False, True, False, True, False])
    features = np.arange(16, dtype=np.float32).reshape(8, 2)
    out = jax.jit(lambda f, v: EncoderOutput(f, v, (f * 10,)).valid_rows_first())(features, valid)
    np.testing.assert_array_equal(np.asarray(out.valid), [True] * 4 + [False] * 4)
    np.testing.assert_array_equal(np.asarray(out.features)[:4], features[valid])
    np.testing.assert_array_equal(np.asarray(out.extras[0])[:4], features[valid] * 10)
