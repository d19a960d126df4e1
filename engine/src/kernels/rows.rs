//! What the products of both block families ([`super::blocks`], [`super::kquants`])
//! share: reading a block's f16 scales, and serving rows of activations in groups that
//! share one pass over a weight row.

use half::f16;

/// The little-endian f16 at byte `at` of a block, as f32.
pub(crate) fn half_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Rows of activations sharing one pass over a weight row.
pub(crate) const GROUP: usize = 4;

/// `f` over `xs` and `out` in groups of up to [`GROUP`] rows.
#[cfg_attr(not(x86_avx2), allow(dead_code))]
pub(crate) fn in_groups<X>(xs: &[X], out: &mut [f32], mut f: impl FnMut(&[X], &mut [f32])) {
    for (x, o) in xs.chunks(GROUP).zip(out.chunks_mut(GROUP)) {
        f(x, o);
    }
}
