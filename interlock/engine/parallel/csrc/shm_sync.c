/* Flags of the shared-memory all-reduce (``engine/parallel/comm.py``).

Each rank owns one 64-bit flag, on a cache line of its own: the sequence number of the last
all-reduce whose input it has written. Publishing is a release store (the rank's data is
visible before its flag, on every CPU, x86 or Arm); waiting is acquire loads until every flag
has reached the sequence. The wait spins briefly with a pause, then yields the core (ranks may
outnumber cores), then sleeps in short naps; it gives up after ``timeout_ns`` (a rank that died
or hangs), returning the first rank still behind. */
#include <sched.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() do { } while (0)
#endif

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void shm_publish(int64_t *flag, int64_t seq) { __atomic_store_n(flag, seq, __ATOMIC_RELEASE); }

int64_t shm_wait(const int64_t *flags, int64_t ranks, int64_t stride, int64_t seq, int64_t spins,
                 int64_t timeout_ns) {
    int64_t start = -1;
    for (int64_t r = 0; r < ranks; r++) {
        const int64_t *flag = flags + r * stride;
        int64_t tries = 0;
        while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < seq) {
            tries++;
            if (tries < spins) {
                CPU_RELAX();
                continue;
            }
            if (start < 0) start = now_ns();
            int64_t waited = now_ns() - start;
            if (waited > timeout_ns) return r;
            if (waited < 2000000) {
                sched_yield();
            } else {
                struct timespec nap = {0, 50000};
                nanosleep(&nap, 0);
            }
        }
    }
    return -1;
}
