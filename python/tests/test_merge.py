"""flashattn.merge_partial: the union of two partial attention results over disjoint keys, in place
into a float32 accumulator. Against the formula in float64 (rows empty on either side or both, an
empty accumulator holding NaN that must not be read) and against attention over all the keys.
"""
import numpy as np
import pytest

import flashattn
import reference as ref
from tolerances import TOL


def _formula(out_a, lse_a, out_b, lse_b):
    """float64: (out, lse) of the union; rows whose LSE is -inf contribute nothing."""
    la, lb = lse_a.astype(np.float64), lse_b.astype(np.float64)
    m = np.maximum(la, lb)
    safe = np.where(np.isfinite(m), m, 0.0)
    wa = np.where(la == -np.inf, 0.0, np.exp(la - safe))
    wb = np.where(lb == -np.inf, 0.0, np.exp(lb - safe))
    tot = wa + wb
    lse = np.where(tot > 0, safe + np.log(np.where(tot > 0, tot, 1.0)), -np.inf)
    t = lambda w: np.transpose(w, (0, 2, 1))[..., None]  # (B, H, S) -> (B, S, H, 1)
    oa = np.where(t(wa) > 0, out_a.astype(np.float64), 0.0)
    ob = np.where(t(wb) > 0, out_b.astype(np.float64), 0.0)
    out = np.where(t(tot) > 0, (t(wa) * oa + t(wb) * ob) / np.where(t(tot) > 0, t(tot), 1.0), 0.0)
    return out, lse


@pytest.mark.parametrize("part_dtype", [np.float32, np.float16])
def test_matches_the_formula(part_dtype):
    rng = np.random.default_rng()
    B, S, H, D = 2, 11, 3, 24
    acc = rng.uniform(-2, 2, (B, S, H, D)).astype(np.float32)
    part = rng.uniform(-2, 2, (B, S, H, D)).astype(part_dtype)
    lse_acc = rng.uniform(-6, 6, (B, H, S)).astype(np.float32)
    lse_part = rng.uniform(-6, 6, (B, H, S)).astype(np.float32)
    lse_acc[0, 1, :4] = -np.inf            # accumulator empty there: its values are never read
    acc[0, :4, 1] = np.nan
    lse_part[1, 2, 3:6] = -np.inf          # part empty
    lse_acc[1, 0, 7], lse_part[1, 0, 7] = -np.inf, -np.inf  # both empty
    want_out, want_lse = _formula(acc, lse_acc, part, lse_part)
    part_before, lse_part_before = part.copy(), lse_part.copy()
    got_out, got_lse = flashattn.merge_partial(acc, lse_acc, part, lse_part)
    assert got_out is acc and got_lse is lse_acc  # in place
    np.testing.assert_allclose(acc, want_out, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(lse_acc, want_lse, rtol=1e-6, atol=1e-6)
    assert lse_acc[1, 0, 7] == -np.inf and not acc[1, 7, 0].any()
    np.testing.assert_array_equal(part, part_before)
    np.testing.assert_array_equal(lse_part, lse_part_before)


def test_two_key_ranges_equal_one_call():
    """attention over keys [0, 40) and [40, 90), merged, is attention over all 90 (GQA)."""
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 17, 4, 32)).astype(np.float32)
    k = rng.standard_normal((2, 90, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, 90, 2, 32)).astype(np.float32)
    out_a, lse_a = flashattn.attention(q, k[:, :40], v[:, :40], return_lse=True)
    out_b, lse_b = flashattn.attention(q, k[:, 40:], v[:, 40:], return_lse=True)
    acc, lse = flashattn.merge_partial(out_a.copy(), lse_a.copy(), out_b, lse_b)
    want, want_lse = ref.forward(q, k, v)
    np.testing.assert_allclose(acc, want, rtol=TOL["float32"], atol=TOL["float32"])
    np.testing.assert_allclose(lse, want_lse, rtol=TOL["float32"], atol=TOL["float32"])


def test_bad_arguments_name_them_and_write_nothing():
    acc = np.ones((1, 4, 2, 8), np.float32)
    lse = np.zeros((1, 2, 4), np.float32)
    part = np.ones((1, 4, 2, 8), np.float32)
    with pytest.raises(TypeError, match="out_acc"):
        flashattn.merge_partial(acc.astype(np.float16), lse, part, lse.copy())
    with pytest.raises(ValueError, match="part"):
        flashattn.merge_partial(acc, lse, part[:, :3], lse.copy())
    with pytest.raises(ValueError, match="lse_part"):
        flashattn.merge_partial(acc, lse, part, np.zeros((1, 3, 4), np.float32))
    with pytest.raises(ValueError, match="lse_acc"):
        flashattn.merge_partial(acc, lse, part, lse)  # the accumulator's LSE aliases an input
    assert (acc == 1).all() and (lse == 0).all()
