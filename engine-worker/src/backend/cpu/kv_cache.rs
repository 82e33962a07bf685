//! Paged KV cache memory: per layer, keys and values as `[block, kv_head, slot, head_dim]` f32,
//! so one block of one KV head is a contiguous `[block_size, head_dim]` tile for attention.

use crate::huge_pages::HugeF32;
use crate::model::ModelConfig;
use crate::EngineError;

pub(crate) struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Per layer: `[num_blocks, kv_heads, block_size, head_dim]`, page-aligned (with
    /// `head_dim` a multiple of 16, every key and value row attention loads is on a cache line)
    /// and on huge pages where the kernel gives them: a block's tile is one 4 KiB page.
    keys: Vec<HugeF32>,
    values: Vec<HugeF32>,
}

impl KvCache {
    /// Bytes one block takes over all layers (keys and values).
    pub(crate) fn bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim * 4
    }

    /// A cache of `num_blocks` blocks; `prefault` backs every page now (else pages are backed
    /// as blocks are first written).
    pub(crate) fn new(
        config: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        prefault: bool,
    ) -> Result<Self, EngineError> {
        if block_size == 0 || num_blocks == 0 {
            return Err(EngineError::InvalidConfig(format!(
                "KV cache needs a non-zero block size and block count (got {block_size}, {num_blocks})"
            )));
        }
        let per_layer = num_blocks
            .checked_mul(config.num_kv_heads * block_size * config.head_dim)
            .filter(|n| n.checked_mul(8 * config.num_layers).is_some())
            .ok_or_else(|| {
                EngineError::InvalidConfig(format!("KV cache of {num_blocks} blocks is too large"))
            })?;
        // By default pages are backed as blocks are first written, so resident memory follows
        // the work (llama-server touches its whole cache at start). That the machine can hold
        // all of it is checked now instead, so an oversized cache fails at start, not mid-run
        // (unless memory is taken by others meanwhile: `prefault` reserves it for certain).
        let total = per_layer * 8 * config.num_layers;
        check_memory_available(total, num_blocks)?;
        let layer = || -> Result<HugeF32, EngineError> {
            let mut cache = HugeF32::zeroed(per_layer).map_err(|e| {
                EngineError::InvalidConfig(format!(
                    "cannot allocate a KV cache of {num_blocks} blocks: {e}"
                ))
            })?;
            if prefault {
                back_every_page(cache.as_mut_slice());
            }
            Ok(cache)
        };
        Ok(Self {
            block_size,
            num_blocks,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            keys: (0..config.num_layers)
                .map(|_| layer())
                .collect::<Result<_, _>>()?,
            values: (0..config.num_layers)
                .map(|_| layer())
                .collect::<Result<_, _>>()?,
        })
    }

    fn offset(&self, block: usize, kv_head: usize, slot: usize) -> usize {
        ((block * self.kv_heads + kv_head) * self.block_size + slot) * self.head_dim
    }

    /// Stores one token's keys and values (`[kv_heads * head_dim]` each) at `(block, slot)`.
    pub(crate) fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for h in 0..self.kv_heads {
            let at = self.offset(block, h, slot);
            self.keys[layer].as_mut_slice()[at..at + hd].copy_from_slice(&k[h * hd..(h + 1) * hd]);
            self.values[layer].as_mut_slice()[at..at + hd]
                .copy_from_slice(&v[h * hd..(h + 1) * hd]);
        }
    }

    /// Keys and values of one block and KV head: `[block_size, head_dim]` each.
    pub(crate) fn tile(&self, layer: usize, block: usize, kv_head: usize) -> (&[f32], &[f32]) {
        let at = self.offset(block, kv_head, 0);
        let len = self.block_size * self.head_dim;
        (
            &self.keys[layer].as_slice()[at..at + len],
            &self.values[layer].as_slice()[at..at + len],
        )
    }
}

/// Writes one element per page so the OS backs the whole allocation now. Volatile, because a
/// plain write of the zero already there may be optimised away.
fn back_every_page(cache: &mut [f32]) {
    const FLOATS_PER_PAGE: usize = 4096 / std::mem::size_of::<f32>();
    for i in (0..cache.len()).step_by(FLOATS_PER_PAGE) {
        // SAFETY: `i < cache.len()`, so the pointer is valid, aligned and exclusively borrowed.
        unsafe { std::ptr::write_volatile(cache.as_mut_ptr().add(i), 0.0) };
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
