// Attention over a KIVI-quantized head: rows are dequantized chunk by chunk (at most
// kKiviAttentionChunk tokens of f32 scratch) and fed to OnlineAttention, so the softmax is exact
// over the dequantized rows and the head is never materialised densely.
#pragma once

#include <cstddef>

#include "attention.h"
#include "kivi_store.h"

namespace kvsdk::cpu {

constexpr size_t kKiviAttentionChunk = 256;

// Adds every token of `store` to `attn` (which may also receive other tiers' chunks), dequantizing
// into scratch.k_chunk / v_chunk (grown once, then reused; pass a scratch that is not the one
// `attn` works in, or the same one: only the chunk buffers are used here).
void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn, AttentionScratch& scratch);
// The tokens [first, first + count) of `store` only (append order: quantized, then residual);
// first + count must not exceed store.size().
void kivi_attend_range(const KiviHeadStore& store, size_t first, size_t count,
                       OnlineAttention& attn, AttentionScratch& scratch);
// The same with its own (allocated) chunk buffers.
void kivi_attend(const KiviHeadStore& store, OnlineAttention& attn);

}  // namespace kvsdk::cpu
