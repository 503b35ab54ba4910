// What one pipeline hop costs on this machine's transport: under `mpirun -np 2`, rank 0 sends
// messages of each size to rank 1 through the Communicator (the path pipeline stages use: owned
// nonblocking sends, probe-and-receive with the polling backoff) and rank 1 sends them back;
// prints the median one-way time (half a round trip) and the bandwidth per size, and writes JSON.
//   mpirun -np 2 build/dist_bench [--out file.json] [--reps N]
// Pick the transport with Open MPI's variables: OMPI_MCA_btl=self,vader (shared memory) or
// OMPI_MCA_btl=self,tcp (TCP over loopback).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dist/communicator.h"

int main(int argc, char** argv) {
  std::string out = "dist_bench.json";
  int reps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(10, std::atoi(argv[i + 1]));
  }
  auto world = gale::dist::MpiWorld();
  if (!world.ok()) {
    std::fprintf(stderr, "dist_bench: %s\n", world.status().ToString().c_str());
    return 1;
  }
  gale::dist::Communicator& comm = **world;
  if (comm.size() != 2) {
    std::fprintf(stderr, "dist_bench: run it with mpirun -np 2\n");
    return 1;
  }
  const gale::dist::Wait wait{std::chrono::milliseconds(60000), nullptr};
  // 8 B (a step's header), one token's residual row for dims 2048..16384 (f32), 64 tokens of 4096.
  const std::vector<size_t> sizes = {8, 8192, 16384, 32768, 65536, 262144, 1048576};
  std::string json = "{\"transport\": \"" + std::string(std::getenv("OMPI_MCA_btl") ? std::getenv("OMPI_MCA_btl") : "default") +
                     "\", \"sizes\": [";
  if (comm.rank() == 0) std::printf("%10s %14s %12s\n", "bytes", "one-way (us)", "GB/s");
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = sizes[k];
    std::vector<double> us;
    for (int r = 0; r < reps + 10; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      if (comm.rank() == 0) {
        if (!comm.Send(1, 7, std::vector<uint8_t>(n, 1)).ok() || !comm.Recv(1, 7, wait).ok()) return 1;
      } else {
        auto m = comm.Recv(0, 7, wait);
        if (!m.ok() || !comm.Send(0, 7, std::move(m).value()).ok()) return 1;
      }
      const double dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 10) us.push_back(dt / 2);
    }
    std::sort(us.begin(), us.end());
    const double median = us[us.size() / 2];
    if (comm.rank() == 0) {
      std::printf("%10zu %14.1f %12.3f\n", n, median, n / median / 1e3);
      json += (k ? ", " : "") + std::string("{\"bytes\": ") + std::to_string(n) + ", \"one_way_us\": " + std::to_string(median) + "}";
    }
  }
  if (!comm.Flush(wait).ok()) return 1;
  if (comm.rank() == 0) {
    json += "]}\n";
    std::ofstream(out) << json;
    std::printf("wrote %s\n", out.c_str());
  }
  gale::dist::MpiFinalize();
  return 0;
}
