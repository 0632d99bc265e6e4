// Chained block hashes as interlock/kvhash.py defines them: a block's hash is XXH3-64 (seeded)
// over its parent's hash (8 bytes, little endian) followed by its token ids (uint32, little
// endian). The hash function is the xxhash package's own XXH3_64bits_withSeed, passed in as a
// pointer: this file only takes the per-block Python call away from around it. Little-endian
// hosts only (the caller checks).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t (*xxh3_seeded)(const void *input, size_t length, uint64_t seed);

int64_t kv_hash_chain(void *fn, const uint32_t *ids, int64_t n_blocks, int64_t block_size,
                      uint64_t parent, uint64_t seed, uint64_t *out) {
    xxh3_seeded hash = (xxh3_seeded)fn;
    size_t len = 8 + 4 * (size_t)block_size;
    uint8_t stack[8 + 4 * 256];
    uint8_t *buf = len <= sizeof(stack) ? stack : malloc(len);
    if (buf == NULL) return -1;
    for (int64_t i = 0; i < n_blocks; i++) {
        memcpy(buf, &parent, 8);
        memcpy(buf + 8, ids + i * block_size, 4 * (size_t)block_size);
        parent = hash(buf, len, seed);
        out[i] = parent;
    }
    if (buf != stack) free(buf);
    return n_blocks;
}
