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

// Hash ids as a trace expands them (interlock/mooncake.py, blocks_indices: token j of id h is
// splitmix64's finalizer of h * golden + j, modulo pool_size), hashed as kv_hash_chain does:
// each id gives tokens_per_id tokens, cut into blocks of block_size (a divisor). The token ids
// never reach Python. Returns the number of hashes written, or -1.
static uint64_t trace_token(uint64_t x, uint64_t pool_size) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    x = x ^ (x >> 31);
    return x % pool_size;
}

int64_t trace_hash_chain(void *fn, const uint64_t *hash_ids, int64_t n_ids, int64_t tokens_per_id,
                         uint64_t golden, uint64_t pool_size, int64_t block_size, uint64_t parent,
                         uint64_t seed, uint64_t *out) {
    if (block_size <= 0 || tokens_per_id % block_size || pool_size == 0) return -1;
    uint32_t *tokens = malloc(4 * (size_t)tokens_per_id);
    if (tokens == NULL) return -1;
    int64_t per = tokens_per_id / block_size, done = 0;
    for (int64_t i = 0; i < n_ids; i++) {
        uint64_t base = hash_ids[i] * golden;
        for (int64_t j = 0; j < tokens_per_id; j++) tokens[j] = (uint32_t)trace_token(base + (uint64_t)j, pool_size);
        if (kv_hash_chain(fn, tokens, per, block_size, parent, seed, out + done) < 0) {
            free(tokens);
            return -1;
        }
        done += per;
        parent = out[done - 1];
    }
    free(tokens);
    return done;
}
