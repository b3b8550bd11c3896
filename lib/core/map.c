/* map.c - the one hash map of libckpt (open addressing, linear probing, at
 * most half full) and FNV-1a, the one string hash.  A map holds no copy of
 * its keys: a BYTES map borrows them, a U64 map keeps the integer in the
 * slot, a HASHED map asks the caller to compare.  Slot order is never
 * shown: callers that list entries keep their own array in their order. */
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

struct ckpt_map_slot {
    uint64_t hash; /* the key's hash; a U64 map's key itself */
    size_t val;    /* the value + 1; 0 for an empty slot */
};

struct ckpt_map_key {
    const void *p;
    size_t len;
};

#define FNV_PRIME 1099511628211ull

uint64_t ckpt_fnv1a_add(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * FNV_PRIME;
    return h;
}

uint64_t ckpt_fnv1a(const void *p, size_t n)
{
    return ckpt_fnv1a_add(CKPT_FNV1A_BASIS, p, n);
}

/* FNV-1a over the bytes with ASCII letters as lower case */
static uint64_t fnv1a_nocase(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = CKPT_FNV1A_BASIS;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (b[i] >= 'A' && b[i] <= 'Z' ? b[i] - 'A' + 'a' : b[i])) * FNV_PRIME;
    return h;
}

/* The slot to start at: Fibonacci hashing, the top bits of the hash times
 * 2^64/phi, in which every bit of the hash counts (FNV-1a's low bits depend
 * on the input's low bits only) and consecutive integer keys, the common
 * U64 keys, fall apart without colliding. */
static size_t home(uint64_t h, size_t mask)
{
    return (size_t)((h * 0x9e3779b97f4a7c15ull) >> __builtin_clzll((unsigned long long)mask));
}

void ckpt_map_init(ckpt_map *m, ckpt_map_keys keys)
{
    memset(m, 0, sizeof *m);
    m->keys = keys;
}

void ckpt_map_release(ckpt_map *m)
{
    free(m->slots);
    free(m->names);
    ckpt_map_init(m, m->keys);
}

static bool bytes_keys(const ckpt_map *m)
{
    return m->keys == CKPT_MAP_BYTES || m->keys == CKPT_MAP_BYTES_NOCASE;
}

static bool same_bytes(const ckpt_map *m, size_t i, const void *key, size_t len)
{
    const struct ckpt_map_key *k = &m->names[i];
    if (k->len != len)
        return false;
    if (m->keys == CKPT_MAP_BYTES)
        return memcmp(k->p, key, len) == 0;
    const uint8_t *a = k->p, *b = key;
    for (size_t j = 0; j < len; j++) {
        uint8_t x = a[j] >= 'A' && a[j] <= 'Z' ? a[j] - 'A' + 'a' : a[j];
        uint8_t y = b[j] >= 'A' && b[j] <= 'Z' ? b[j] - 'A' + 'a' : b[j];
        if (x != y)
            return false;
    }
    return true;
}

/* What a lookup compares: one of a BYTES key, a U64 key (the hash alone),
 * or the caller's comparison of a HASHED key. */
typedef struct probe {
    uint64_t hash;
    const void *key;
    size_t len;
    bool (*same)(const void *probe, size_t val);
    const void *arg;
} probe;

/* The lookups below are inlined into each public function with KEYS a
 * constant where it is one (U64, HASHED): the integer maps, a pickle's memo,
 * run the lean loop. */
#define INLINE static inline __attribute__((always_inline))

/* The slot holding P's key, or the empty slot where it would go. */
INLINE size_t find(const ckpt_map *m, const probe *p, ckpt_map_keys keys)
{
    size_t mask = m->cap - 1, i = home(p->hash, mask);
    for (;; i = (i + 1) & mask) {
        const struct ckpt_map_slot *s = &m->slots[i];
        if (!s->val)
            return i;
        if (s->hash != p->hash)
            continue;
        if (keys == CKPT_MAP_U64 ||
            (keys == CKPT_MAP_HASHED ? p->same(p->arg, s->val - 1)
                                     : same_bytes(m, i, p->key, p->len)))
            return i;
    }
}

/* CAP slots (a power of two), the entries moved by their stored hashes. */
static int resize(ckpt_map *m, size_t cap)
{
    if (cap > SIZE_MAX / sizeof(struct ckpt_map_slot) ||
        cap > SIZE_MAX / sizeof(struct ckpt_map_key))
        return -1;
    struct ckpt_map_slot *slots = calloc(cap, sizeof *slots);
    struct ckpt_map_key *names = bytes_keys(m) ? calloc(cap, sizeof *names) : NULL;
    if (!slots || (bytes_keys(m) && !names)) {
        free(slots);
        free(names);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].val)
            continue;
        size_t j = home(m->slots[i].hash, cap - 1);
        while (slots[j].val)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
        if (names)
            names[j] = m->names[i];
    }
    free(m->slots);
    free(m->names);
    m->slots = slots;
    m->names = names;
    m->cap = cap;
    return 0;
}

int ckpt_map_reserve(ckpt_map *m, size_t n)
{
    size_t cap = m->cap ? m->cap : 16;
    while (n > cap / 2) { /* at most half full: short probes */
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    return cap == m->cap ? 0 : resize(m, cap);
}

INLINE bool get(const ckpt_map *m, const probe *p, ckpt_map_keys keys, size_t *val)
{
    if (!m->count)
        return false;
    size_t i = find(m, p, keys);
    if (!m->slots[i].val)
        return false;
    if (val)
        *val = m->slots[i].val - 1;
    return true;
}

INLINE int put(ckpt_map *m, const probe *p, ckpt_map_keys keys, size_t val, bool replace,
               size_t *found)
{
    if (val == SIZE_MAX || (!m->cap && ckpt_map_reserve(m, 1) < 0))
        return -1;
    size_t i = find(m, p, keys);
    if (m->slots[i].val) {
        if (found)
            *found = m->slots[i].val - 1;
        if (replace)
            m->slots[i].val = val + 1;
        return 1;
    }
    if (m->count + 1 > m->cap / 2) {
        if (ckpt_map_reserve(m, m->count + 1) < 0)
            return -1;
        i = find(m, p, keys);
    }
    m->slots[i].hash = p->hash;
    m->slots[i].val = val + 1;
    if (m->names) {
        m->names[i].p = p->key;
        m->names[i].len = p->len;
    }
    m->count++;
    return 0;
}

static probe bytes_probe(const ckpt_map *m, const void *key, size_t len)
{
    probe p = {.key = key, .len = len};
    p.hash = m->keys == CKPT_MAP_BYTES_NOCASE ? fnv1a_nocase(key, len) : ckpt_fnv1a(key, len);
    return p;
}

bool ckpt_map_get(const ckpt_map *m, const void *key, size_t len, size_t *val)
{
    probe p = bytes_probe(m, key, len);
    return get(m, &p, m->keys, val);
}

int ckpt_map_put(ckpt_map *m, const void *key, size_t len, size_t val, size_t *found)
{
    probe p = bytes_probe(m, key, len);
    return put(m, &p, m->keys, val, false, found);
}

int ckpt_map_set(ckpt_map *m, const void *key, size_t len, size_t val)
{
    probe p = bytes_probe(m, key, len);
    return put(m, &p, m->keys, val, true, NULL);
}

bool ckpt_map_get_u64(const ckpt_map *m, uint64_t key, size_t *val)
{
    probe p = {.hash = key};
    return get(m, &p, CKPT_MAP_U64, val);
}

int ckpt_map_put_u64(ckpt_map *m, uint64_t key, size_t val, size_t *found)
{
    probe p = {.hash = key};
    return put(m, &p, CKPT_MAP_U64, val, false, found);
}

int ckpt_map_set_u64(ckpt_map *m, uint64_t key, size_t val)
{
    probe p = {.hash = key};
    return put(m, &p, CKPT_MAP_U64, val, true, NULL);
}

bool ckpt_map_get_hashed(const ckpt_map *m, uint64_t hash,
                         bool (*same)(const void *arg, size_t val), const void *arg,
                         size_t *val)
{
    probe p = {.hash = hash, .same = same, .arg = arg};
    return get(m, &p, CKPT_MAP_HASHED, val);
}

int ckpt_map_put_hashed(ckpt_map *m, uint64_t hash, bool (*same)(const void *arg, size_t val),
                        const void *arg, size_t val, size_t *found)
{
    probe p = {.hash = hash, .same = same, .arg = arg};
    return put(m, &p, CKPT_MAP_HASHED, val, false, found);
}
