//! Weight matrices that stay in their stored (possibly quantized) form, borrowed from a file
//! mapping or an owned buffer.

use std::sync::{Arc, OnceLock};

use super::dtype::{dequantize_row, WeightType};

/// The bytes a weight lives in, shared by every tensor cut from it.
#[derive(Clone)]
pub enum Blob {
    /// A copy on huge pages (GGUF files, see `huge_pages`).
    Huge(Arc<crate::huge_pages::HugeBuf>),
    Mmap(Arc<memmap2::Mmap>),
    Owned(Arc<Vec<u8>>),
}

impl Blob {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Blob::Huge(h) => h.as_bytes(),
            Blob::Mmap(m) => m,
            Blob::Owned(v) => v,
        }
    }
}

/// A row-major matrix `[rows, cols]`: row `r` is output feature `r`, its `cols` elements are
/// contiguous (ggml's and PyTorch's `[out_features, in_features]` agree on this).
#[derive(Clone)]
pub struct WeightMatrix {
    pub name: String,
    pub dtype: WeightType,
    pub rows: usize,
    pub cols: usize,
    blob: Blob,
    offset: usize,
    /// [`Self::block_scales`], made on first use and shared by clones.
    scales: Arc<OnceLock<Vec<f32>>>,
}

impl std::fmt::Debug for WeightMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WeightMatrix({} {} [{}, {}])",
            self.name, self.dtype, self.rows, self.cols
        )
    }
}

impl WeightMatrix {
    /// `None` when the range `offset..offset + rows * row_bytes` is not inside the blob or
    /// `cols` is not a whole number of blocks.
    pub fn new(
        name: &str,
        dtype: WeightType,
        rows: usize,
        cols: usize,
        blob: Blob,
        offset: usize,
    ) -> Option<Self> {
        let (block_elems, _) = dtype.block_layout();
        if !cols.is_multiple_of(block_elems) {
            return None;
        }
        let len = rows.checked_mul(dtype.row_bytes(cols))?;
        let end = offset.checked_add(len)?;
        (end <= blob.bytes().len()).then(|| Self {
            name: name.to_owned(),
            dtype,
            rows,
            cols,
            blob,
            offset,
            scales: Arc::default(),
        })
    }

    /// A matrix over a buffer of its own.
    pub fn owned(
        name: &str,
        dtype: WeightType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Option<Self> {
        Self::new(name, dtype, rows, cols, Blob::Owned(Arc::new(data)), 0)
    }

    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols)
    }

    /// All rows' bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.blob.bytes()[self.offset..self.offset + self.rows * self.row_bytes()]
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }

    /// The blocks' f16 scales (and, for Q4_1, minimums) as f32, [`WeightType::scales_per_block`]
    /// per block in row-major block order; empty for unscaled types. Made on first use: SIMD
    /// kernels broadcast them straight from memory, where converting each block's f16 would
    /// cost shuffle-port work on every pass over the weights. The values are exact (every f16
    /// is an f32), so kernels compute the same as from the stored bytes.
    pub fn block_scales(&self) -> &[f32] {
        self.scales.get_or_init(|| {
            let per_block = self.dtype.scales_per_block();
            let (_, block_bytes) = self.dtype.block_layout();
            if per_block == 0 {
                return Vec::new();
            }
            self.bytes()
                .chunks_exact(block_bytes)
                .flat_map(|block| {
                    (0..per_block).map(move |i| {
                        half::f16::from_le_bytes([block[2 * i], block[2 * i + 1]]).to_f32()
                    })
                })
                .collect()
        })
    }

    /// Decodes row `r` into `out` (`cols` elements).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        dequantize_row(self.dtype, self.row(r), out);
    }

    /// The whole matrix as f32 (tests and reference paths only).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, chunk) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, chunk);
        }
        out
    }
}
