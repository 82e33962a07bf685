//! Zeroed memory that asks the kernel for transparent huge pages (`MADV_HUGEPAGE`), for the
//! large buffers a forward pass walks: the weights and the KV cache. With 4 KiB pages every
//! KV tile (16 positions of one head: 4 KiB) and every few weight rows is a TLB miss; the
//! kernel's default (`transparent_hugepage=madvise` on Debian) gives huge pages only to memory
//! that asks. Where huge pages are unavailable the advice is ignored and this is plain memory.

use std::io;

/// A page-aligned, zeroed, writable buffer of `len` bytes (an anonymous mapping).
pub struct HugeBuf {
    map: memmap2::MmapMut,
    len: usize,
}

impl HugeBuf {
    pub fn zeroed(len: usize) -> io::Result<Self> {
        // A zero-length mapping is an error; one page stands in for it.
        let map = memmap2::MmapMut::map_anon(len.max(1))?;
        // Advice only: where it fails (no THP support) the pages are ordinary ones.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Self { map, len })
    }

    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> io::Result<Self> {
        let mut buf = Self::zeroed(bytes.len())?;
        buf.as_mut_bytes().copy_from_slice(bytes);
        Ok(buf)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.map[..self.len]
    }

    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
}

/// `len` zeroed f32s in a [`HugeBuf`] (page-aligned, so on a cache line too).
pub struct HugeF32 {
    buf: HugeBuf,
    len: usize,
}

impl HugeF32 {
    pub fn zeroed(len: usize) -> io::Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<f32>())
            .ok_or_else(|| io::Error::other("buffer size overflows"))?;
        Ok(Self {
            buf: HugeBuf::zeroed(bytes)?,
            len,
        })
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: the mapping is page-aligned and holds `4 * len` initialized (zeroed or
        // written) bytes; every bit pattern is a valid f32.
        unsafe { std::slice::from_raw_parts(self.buf.as_bytes().as_ptr().cast::<f32>(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, and `&mut self` borrows the mapping exclusively.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.as_mut_bytes().as_mut_ptr().cast::<f32>(),
                self.len,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_page_aligned_and_writable() {
        let mut f = HugeF32::zeroed(3 << 20).unwrap();
        assert_eq!(f.as_slice().len(), 3 << 20);
        assert_eq!(f.as_slice().as_ptr() as usize % 4096, 0);
        assert!(f.as_slice().iter().all(|&x| x == 0.0));
        f.as_mut_slice()[12345] = 1.5;
        assert_eq!(f.as_slice()[12345], 1.5);
        let b = HugeBuf::copy_of(b"weights").unwrap();
        assert_eq!(b.as_bytes(), b"weights");
        assert_eq!(HugeBuf::zeroed(0).unwrap().as_bytes(), b"");
    }
}
