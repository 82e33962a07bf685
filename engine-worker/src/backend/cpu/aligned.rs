//! f32 memory that starts on a cache line. The SIMD kernels read activations and KV tiles in
//! 32- and 64-byte loads; from a `Vec<f32>` (16-byte aligned) such loads span two lines, which
//! doubled the per-token cost of a step's row-dot kernels (Q4_1 1536×576, 8 tokens: 0.93–1.23
//! against 0.61 ns per block per token).

/// One cache line of f32s; a `Vec` of them starts on a line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct CacheLine([f32; FLOATS_PER_LINE]);

const FLOATS_PER_LINE: usize = 16;

/// An owned, zeroed f32 buffer that starts on a cache line.
pub(crate) struct LineBuf {
    lines: Vec<CacheLine>,
    len: usize,
}

impl LineBuf {
    pub(crate) fn zeroed(len: usize) -> Self {
        Self {
            lines: vec![CacheLine([0.0; FLOATS_PER_LINE]); len.div_ceil(FLOATS_PER_LINE)],
            len,
        }
    }

    /// A copy of `x`.
    fn copy_of(x: &[f32]) -> Self {
        let mut buf = Self::zeroed(x.len());
        buf.as_mut_slice().copy_from_slice(x);
        buf
    }

    pub(crate) fn as_slice(&self) -> &[f32] {
        // SAFETY: `CacheLine` is `repr(C)` around `[f32; 16]` (size 64, no padding), so `lines`
        // holds `16 * lines.len() >= len` initialized, contiguous f32s.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, and `&mut self` borrows the lines exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

/// A slice that starts on a cache line: the input itself when it does, else a copy (a step's
/// input is a few KiB per token, next to megabytes of weights read per call).
pub(crate) enum LineAligned<'a> {
    Borrowed(&'a [f32]),
    Copied(LineBuf),
}

impl<'a> LineAligned<'a> {
    pub(crate) fn new(x: &'a [f32]) -> Self {
        if (x.as_ptr() as usize).is_multiple_of(std::mem::align_of::<CacheLine>()) {
            LineAligned::Borrowed(x)
        } else {
            LineAligned::Copied(LineBuf::copy_of(x))
        }
    }

    pub(crate) fn as_slice(&self) -> &[f32] {
        match self {
            LineAligned::Borrowed(x) => x,
            LineAligned::Copied(buf) => buf.as_slice(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LineAligned, LineBuf};

    fn on_a_line(x: &[f32]) -> bool {
        (x.as_ptr() as usize).is_multiple_of(64)
    }

    #[test]
    fn an_input_is_handed_on_a_cache_line_with_the_same_values() {
        let backing: Vec<f32> = (0..200).map(|i| i as f32 * 0.5).collect();
        for offset in 0..16 {
            let x = &backing[offset..offset + 150];
            let aligned = LineAligned::new(x);
            assert!(on_a_line(aligned.as_slice()), "offset {offset}");
            assert_eq!(aligned.as_slice(), x);
        }
    }

    #[test]
    fn a_line_buffer_is_zeroed_writable_and_exactly_as_long_as_asked() {
        for len in [0, 1, 15, 16, 17, 1000] {
            let mut buf = LineBuf::zeroed(len);
            assert!(on_a_line(buf.as_slice()) || len == 0);
            assert_eq!(buf.as_slice().len(), len);
            assert!(buf.as_slice().iter().all(|v| *v == 0.0));
            for (i, v) in buf.as_mut_slice().iter_mut().enumerate() {
                *v = i as f32;
            }
            assert!(buf
                .as_slice()
                .iter()
                .enumerate()
                .all(|(i, v)| *v == i as f32));
        }
    }
}
