//! Portable kernels: decode the row once into f32, then one fixed-order 8-lane dot product per
//! token.

use super::{dot, GroupInput, MAX_GROUP};
use crate::model::{dequantize_row, WeightType};

pub(super) fn dot_group(
    dtype: WeightType,
    row: &[u8],
    group: &GroupInput<'_>,
    n: usize,
    out: &mut [f32; MAX_GROUP],
    scratch: &mut Vec<f32>,
) {
    let cols = group.cols;
    scratch.resize(cols, 0.0);
    dequantize_row(dtype, row, scratch);
    for (t, o) in out.iter_mut().enumerate().take(n) {
        *o = dot(scratch, &group.x[t * cols..(t + 1) * cols]);
    }
}
