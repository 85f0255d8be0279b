//! Stats: what a cache holds and what it costs.
use crate::sys;

pub const TIER_SLOTS: usize = sys::KVSDK_TIER_SLOTS;

/// Storage tiers; index `bytes_by_tier` with `Tier::X as usize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Tier {
    Exact = sys::KVSDK_TIER_EXACT as usize,
    Quantized = sys::KVSDK_TIER_QUANTIZED as usize,
    Codebook = sys::KVSDK_TIER_CODEBOOK as usize,
    Merged = sys::KVSDK_TIER_MERGED as usize,
    ValueOnly = sys::KVSDK_TIER_VALUE_ONLY as usize,
    Metadata = sys::KVSDK_TIER_METADATA as usize,
}

/// `kvsdk_cache_stats`; see the header for each field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub n_layers: u32,
    pub tokens: u64,
    pub appended_tokens: u64,
    pub bytes: u64,
    pub bytes_by_tier: [u64; TIER_SLOTS],
    pub full_bytes: u64,
    pub backing_bytes: u64,
    pub budget_bytes: u64,
    pub context_used_bytes: u64,
    pub device_arena_bytes: u64,
    pub device_reserved_bytes: u64,
}

impl CacheStats {
    pub fn from_raw(raw: &sys::kvsdk_cache_stats) -> CacheStats {
        CacheStats {
            n_layers: raw.n_layers,
            tokens: raw.tokens,
            appended_tokens: raw.appended_tokens,
            bytes: raw.bytes,
            bytes_by_tier: raw.bytes_by_tier,
            full_bytes: raw.full_bytes,
            backing_bytes: raw.backing_bytes,
            budget_bytes: raw.budget_bytes,
            context_used_bytes: raw.context_used_bytes,
            device_arena_bytes: raw.device_arena_bytes,
            device_reserved_bytes: raw.device_reserved_bytes,
        }
    }
}

/// `kvsdk_layer_stats`; see the header for each field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    pub layer: u32,
    pub tokens: u64,
    pub tokens_min_head: u64,
    pub tokens_max_head: u64,
    pub appended_tokens: u64,
    pub bytes: u64,
    pub bytes_by_tier: [u64; TIER_SLOTS],
}

impl LayerStats {
    pub fn from_raw(raw: &sys::kvsdk_layer_stats) -> LayerStats {
        LayerStats {
            layer: raw.layer,
            tokens: raw.tokens,
            tokens_min_head: raw.tokens_min_head,
            tokens_max_head: raw.tokens_max_head,
            appended_tokens: raw.appended_tokens,
            bytes: raw.bytes,
            bytes_by_tier: raw.bytes_by_tier,
        }
    }
}
