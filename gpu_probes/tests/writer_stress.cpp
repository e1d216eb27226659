/* Several producer threads submit numbered records to one Writer (with its
 * writer thread running) through a small queue, as concurrent driver callbacks
 * would.  Prints "submitted kept dropped" per the producers' own counts; the
 * test then checks the file against them.
 *
 *   writer_stress OUT.bin THREADS RECORDS_PER_THREAD QUEUE_CAPACITY
 */
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "writer.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s OUT.bin THREADS RECORDS QUEUE\n", argv[0]);
        return 2;
    }
    const int threads = std::atoi(argv[2]);
    const uint64_t per = std::strtoull(argv[3], nullptr, 10);
    gp::Writer::Options o;
    o.backend = GP_BACKEND_SYNTHETIC;
    o.pid = 1;
    o.queue_capacity = std::strtoull(argv[4], nullptr, 10);
    std::string err;
    auto w = gp::Writer::open(argv[1], o, gp::Clocks::now(), &err);
    if (!w) {
        std::fprintf(stderr, "writer_stress: %s\n", err.c_str());
        return 1;
    }
    std::atomic<uint64_t> kept{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (uint64_t i = 0; i < per; ++i) {
                /* CLOCK_SYNC carries (thread, sequence) so the test can check per-thread order. */
                gp_clock_sync c{(uint64_t)t, i, 0, 0, 0};
                if (w->submit(gp::Rec(GP_REC_CLOCK_SYNC, (uint64_t)t + 1).put(c))) kept.fetch_add(1);
            }
        });
    for (auto &t : ts) t.join();
    w->close();
    std::printf("%llu %llu %llu\n", (unsigned long long)(threads * per), (unsigned long long)kept.load(),
                (unsigned long long)w->dropped());
    return 0;
}
