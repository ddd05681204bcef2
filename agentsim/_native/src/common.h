/* Helpers shared by the kernels' sources (not part of the library's interface). */
#ifndef AGENTSIM_COMMON_H
#define AGENTSIM_COMMON_H

#include <stdint.h>
#include <string.h>

/* the bits of a double, and back (memcpy: no aliasing questions; compiled to a move) */
static inline uint64_t as_bits(double d) { uint64_t b; memcpy(&b, &d, 8); return b; }
static inline double as_double(uint64_t b) { double d; memcpy(&d, &b, 8); return d; }

#endif
