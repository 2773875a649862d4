// `kvtwin run`'s corpus stage: every seed-corpus entry of every fuzz target
// (fuzz/corpus/NAME/) run in lock step as that target runs it. Why in the main job: libFuzzer
// kept each entry for reaching code nothing before it reached (an eviction order, an offset
// at a window or snapshot boundary, a rare speculation split), so the corpora reach states
// the seeded sweeps may not, and a release build runs all of them in well under a second.
// Method: a fresh FuzzSession per entry, so each entry gets RunFuzzInput's checks (a reused
// session re-checks attention only after doubling runs of a shape), without its trace; the
// reproduce line is the `kvtwin replay --fuzz-input` command that turns the entry into a
// trace for `kvtwin shrink`.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "sim/cli.h"
#include "sim/fuzz_input.h"

namespace kvtwin::cli {

int RunBundledCorpora(const std::string& corpus_dir, uint64_t& entries) {
  namespace fs = std::filesystem;
  std::string counts;
  for (const sim::FuzzTarget target : sim::AllFuzzTargets()) {
    const std::string name = sim::FuzzTargetName(target);
    std::vector<fs::path> paths;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(fs::path(corpus_dir) / name, ec)) {
      if (entry.is_regular_file()) paths.push_back(entry.path());
    }
    std::sort(paths.begin(), paths.end());
    for (const fs::path& p : paths) {
      std::string error;
      const std::optional<std::string> read = ReadWhole(p.string(), error);
      if (!read) return Usage(error);
      const std::string& bytes = *read;
      const std::string reproduce =
          fmt::format("kvtwin replay --fuzz-input {} --target {}", p.string(), name);
      ArmAbortReproduce(reproduce);
      sim::FuzzSession session(target);
      const sim::FuzzRun run =
          session.Run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                      /*record_trace=*/false);
      ++entries;
      if (run.divergence) {
        fmt::print("FAIL fuzz corpus entry {} (target {}): {}\n{}\nreproduce: {}\n", p.string(),
                   name, run.divergence_kind, *run.divergence, reproduce);
        return 1;
      }
    }
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", name, paths.size());
  }
  fmt::print("  fuzz corpora   {} entries ({}): pass\n", entries, counts);
  std::fflush(stdout);
  return 0;
}

}  // namespace kvtwin::cli
