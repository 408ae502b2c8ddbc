/* geode native runtime: the index check a chain runs before a kernel that reads memory
   at indices it does not check itself (a fused Gather's).

   It has the kernel entry ABI (call.c), so a chain runs it as one of its members:
     ptrs[0]  the indices, C-contiguous, signed or unsigned integers of 1, 2, 4 or 8 bytes
     recs     ndim, itemsize, shape[0], ..., shape[ndim - 1] of the indices
     ints     dim (the size of the axis they index), unsigned (1: the indices are unsigned)
   Returns 0 when every index lies in [-dim, dim) (unsigned: [0, dim)), 1 when one does
   not (the caller names it: it reads the indices again), 2 for another item size. */

#include <stdint.h>

#include "call.h"

#define RANGE(T, U)                                                                          \
    do {                                                                                     \
        if (unsigned_) {                                                                     \
            const U *p = (const U *)ptrs[0];                                                 \
            U hi = 0;                                                                        \
            for (int64_t i = 0; i < n; i++)                                                  \
                hi = p[i] > hi ? p[i] : hi;                                                  \
            return n > 0 && (dim <= 0 || (uint64_t)hi >= (uint64_t)dim) ? 1 : 0;             \
        }                                                                                    \
        const T *p = (const T *)ptrs[0];                                                     \
        T lo = 0, hi = 0;                                                                    \
        for (int64_t i = 0; i < n; i++) {                                                    \
            lo = p[i] < lo ? p[i] : lo;                                                      \
            hi = p[i] > hi ? p[i] : hi;                                                      \
        }                                                                                    \
        return n > 0 && ((int64_t)lo < -dim || (int64_t)hi >= dim) ? 1 : 0;                  \
    } while (0)

int32_t geode_check_indices(void **ptrs, const int64_t *recs, const int64_t *ints)
{
    const int64_t ndim = recs[0], itemsize = recs[1];
    int64_t n = 1;
    for (int64_t d = 0; d < ndim; d++)
        n *= recs[2 + d];
    const int64_t dim = ints[0];
    const int unsigned_ = ints[1] != 0;
    switch (itemsize) {
    case 1:
        RANGE(int8_t, uint8_t);
    case 2:
        RANGE(int16_t, uint16_t);
    case 4:
        RANGE(int32_t, uint32_t);
    case 8:
        RANGE(int64_t, uint64_t);
    default:
        return 2;
    }
}
