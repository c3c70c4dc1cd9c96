/* bf16 <-> fp32 for hyspec's C kernels: a bf16 is the top half of an fp32, so widening is exact;
 * narrowing rounds to nearest even, as torch's Tensor.to(torch.bfloat16) does, and keeps NaN a NaN. */
#ifndef HYSPEC_BF16_H
#define HYSPEC_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}
#endif
