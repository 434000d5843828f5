// wgmma shared-memory matrix descriptors with the 128-byte swizzle (docs/hopper-sm90.md §2),
// host and device: the kernels build them (ptx.cuh includes this), tests/kernels/test_smem_desc.cpp checks
// the stepped form against the direct one on the CPU.
#pragma once

#include <cstdint>

#include "cuda/sm90/primitives/hd.hpp"

namespace flashattn::cuda::sm90::ptx {

// Start address (bits 0–13), leading byte offset (16–29), stride byte offset (32–45), each in
// 16-byte units; swizzle mode 128B (bit 62). base_offset is always 0: tiles are written by TMA,
// whose swizzle is anchored to absolute addresses. Held as two 32-bit halves, for issue loops that
// step through a tile: the low half (start address, LBO) is formed once per tile and each step adds
// its byte offset / 16 to it; the high half (SBO, swizzle) is a constant. Exact while the start
// address field (14 bits) does not overflow: shared addresses stay below 256 KiB. Formed per step
// from the address (mask, shift, OR), each wgmma of the d64 causal loop costs 5 uniform
// instructions; as a 32-bit add, 1.
struct SmemDescSw128 {
  uint32_t lo, hi;
  FLASHATTN_HD SmemDescSw128(uint32_t addr, uint32_t lbo, uint32_t sbo)
      : lo(((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16)), hi(((sbo & 0x3FFFF) >> 4) | (1u << 30)) {}
  // The descriptor `bytes` (a multiple of 16) further on.
  FLASHATTN_HD uint64_t at(uint32_t bytes) const { return (static_cast<uint64_t>(hi) << 32) | (lo + (bytes >> 4)); }
};
// The descriptor of the tile at addr, formed from the address (the backward's issue loops).
FLASHATTN_HD uint64_t smem_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return SmemDescSw128(addr, lbo, sbo).at(0);
}

}  // namespace flashattn::cuda::sm90::ptx
