//! Paged KV cache memory: per layer, keys and values as `[block, kv_head, slot, row]`, a row
//! being `head_dim` elements in the cache's [`KvDtype`] (see `kv_rows`), so one block of one KV
//! head is a contiguous `[block_size, row]` tile for attention.

use super::kv_rows::{with_kv_row, KvRow};
use crate::huge_pages::HugeBuf;
use crate::kv::KvDtype;
use crate::model::ModelConfig;
use crate::EngineError;

/// How a [`KvCache`] is laid out and backed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvLayout {
    pub block_size: usize,
    pub num_blocks: usize,
    pub dtype: KvDtype,
    /// Back every page now (else pages are backed as blocks are first written).
    pub prefault: bool,
    /// Ask for transparent huge pages.
    pub huge_pages: bool,
}

pub(crate) struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub dtype: KvDtype,
    kv_heads: usize,
    head_dim: usize,
    /// Bytes of one stored row (`head_dim` elements).
    row_bytes: usize,
    /// Per layer: `[num_blocks, kv_heads, block_size, row_bytes]`, page-aligned and on huge
    /// pages where asked and the kernel gives them.
    keys: Vec<HugeBuf>,
    values: Vec<HugeBuf>,
}

impl KvCache {
    /// Bytes one block takes over all layers (keys and values).
    pub(crate) fn bytes_per_block(
        config: &ModelConfig,
        block_size: usize,
        dtype: KvDtype,
    ) -> usize {
        2 * config.num_layers * config.num_kv_heads * block_size * dtype.row_bytes(config.head_dim)
    }

    pub(crate) fn new(config: &ModelConfig, layout: KvLayout) -> Result<Self, EngineError> {
        let KvLayout {
            block_size,
            num_blocks,
            dtype,
            ..
        } = layout;
        if block_size == 0 || num_blocks == 0 {
            return Err(EngineError::InvalidConfig(format!(
                "KV cache needs a non-zero block size and block count (got {block_size}, {num_blocks})"
            )));
        }
        dtype.check_head_dim(config.head_dim)?;
        let row_bytes = dtype.row_bytes(config.head_dim);
        let per_layer = num_blocks
            .checked_mul(config.num_kv_heads * block_size * row_bytes)
            .filter(|n| n.checked_mul(2 * config.num_layers).is_some())
            .ok_or_else(|| {
                EngineError::InvalidConfig(format!("KV cache of {num_blocks} blocks is too large"))
            })?;
        // By default pages are backed as blocks are first written, so resident memory follows
        // the work (llama-server touches its whole cache at start). That the machine can hold
        // all of it is checked now instead, so an oversized cache fails at start, not mid-run
        // (unless memory is taken by others meanwhile: `prefault` reserves it for certain).
        let total = per_layer * 2 * config.num_layers;
        check_memory_available(total, num_blocks)?;
        let layer = || -> Result<HugeBuf, EngineError> {
            let mut cache = HugeBuf::zeroed_with(per_layer, layout.huge_pages).map_err(|e| {
                EngineError::InvalidConfig(format!(
                    "cannot allocate a KV cache of {num_blocks} blocks: {e}"
                ))
            })?;
            if layout.prefault {
                back_every_page(cache.as_mut_bytes());
            }
            Ok(cache)
        };
        Ok(Self {
            block_size,
            num_blocks,
            dtype,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            row_bytes,
            keys: (0..config.num_layers)
                .map(|_| layer())
                .collect::<Result<_, _>>()?,
            values: (0..config.num_layers)
                .map(|_| layer())
                .collect::<Result<_, _>>()?,
        })
    }

    /// Bytes of one stored row.
    pub(crate) fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    fn offset(&self, block: usize, kv_head: usize, slot: usize) -> usize {
        ((block * self.kv_heads + kv_head) * self.block_size + slot) * self.row_bytes
    }

    /// Stores one token's keys and values (`[kv_heads * head_dim]` f32 each) at `(block, slot)`
    /// in the cache's precision.
    pub(crate) fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        with_kv_row!(self.dtype, R => self.write_as::<R>(layer, block, slot, k, v))
    }

    fn write_as<R: KvRow>(
        &mut self,
        layer: usize,
        block: usize,
        slot: usize,
        k: &[f32],
        v: &[f32],
    ) {
        assert_eq!(R::DTYPE, self.dtype);
        let (hd, rb) = (self.head_dim, self.row_bytes);
        for h in 0..self.kv_heads {
            let at = self.offset(block, h, slot);
            R::encode(
                &k[h * hd..(h + 1) * hd],
                &mut self.keys[layer].as_mut_bytes()[at..at + rb],
            );
            R::encode(
                &v[h * hd..(h + 1) * hd],
                &mut self.values[layer].as_mut_bytes()[at..at + rb],
            );
        }
    }

    /// Stored keys and values of one block and KV head: `[block_size, row_bytes]` each.
    pub(crate) fn tile(&self, layer: usize, block: usize, kv_head: usize) -> (&[u8], &[u8]) {
        let at = self.offset(block, kv_head, 0);
        let len = self.block_size * self.row_bytes;
        (
            &self.keys[layer].as_bytes()[at..at + len],
            &self.values[layer].as_bytes()[at..at + len],
        )
    }
}

/// Writes one element per page so the OS backs the whole allocation now. Volatile, because a
/// plain write of the zero already there may be optimised away.
fn back_every_page(cache: &mut [u8]) {
    for i in (0..cache.len()).step_by(4096) {
        // SAFETY: `i < cache.len()`, so the pointer is valid and exclusively borrowed.
        unsafe { std::ptr::write_volatile(cache.as_mut_ptr().add(i), 0) };
    }
}

/// Refuses a cache of `bytes` that the machine could not back now: more than `MemAvailable`
/// plus free swap (`/proc/meminfo`; no check where that file is absent).
fn check_memory_available(bytes: usize, num_blocks: usize) -> Result<(), EngineError> {
    let Some(available) = memory_available() else {
        return Ok(());
    };
    if bytes as u64 > available {
        return Err(EngineError::InvalidConfig(format!(
            "a KV cache of {num_blocks} blocks takes {bytes} bytes; this machine has {available} \
             available: lower --num-kv-blocks or --kv-cache-memory"
        )));
    }
    Ok(())
}

/// `MemAvailable` plus `SwapFree`, in bytes.
fn memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
    };
    Some((kib("MemAvailable:")? + kib("SwapFree:").unwrap_or(0)) * 1024)
}
