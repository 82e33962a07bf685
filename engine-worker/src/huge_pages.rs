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
        Self::zeroed_with(len, true)
    }

    /// As [`HugeBuf::zeroed`], asking for huge pages only when `huge`.
    pub fn zeroed_with(len: usize, huge: bool) -> io::Result<Self> {
        // A zero-length mapping is an error; one page stands in for it.
        let map = memmap2::MmapMut::map_anon(len.max(1))?;
        // Advice only: where it fails (no THP support) the pages are ordinary ones.
        #[cfg(target_os = "linux")]
        if huge {
            let _ = map.advise(memmap2::Advice::HugePage);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_page_aligned_and_writable() {
        for huge in [true, false] {
            let mut f = HugeBuf::zeroed_with(3 << 20, huge).unwrap();
            assert_eq!(f.as_bytes().len(), 3 << 20);
            assert_eq!(f.as_bytes().as_ptr() as usize % 4096, 0);
            assert!(f.as_bytes().iter().all(|&x| x == 0));
            f.as_mut_bytes()[12345] = 15;
            assert_eq!(f.as_bytes()[12345], 15);
        }
        let b = HugeBuf::copy_of(b"weights").unwrap();
        assert_eq!(b.as_bytes(), b"weights");
        assert_eq!(HugeBuf::zeroed(0).unwrap().as_bytes(), b"");
    }
}
