/* bf16 <-> fp32 for the C kernels (one definition for every file that includes it, however many
 * of them a translation unit includes): widening is exact; narrowing rounds to nearest even, as
 * torch's conversion does. */
#ifndef FAIRLANE_BF16_H
#define FAIRLANE_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
#endif
