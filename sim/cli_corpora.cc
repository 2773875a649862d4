// `kvtwin run`'s corpus stage, and `kvtwin replay --fuzz-corpus DIR` for any corpus (the
// mutant gate's fast stage runs the bundled ones this way): every seed-corpus entry of every fuzz
// target (fuzz/corpus/NAME/) run in lock step as that target runs it. Why in the main job:
// libFuzzer kept each entry for reaching code nothing before it reached (an eviction order, an
// offset at a window or snapshot boundary, a rare speculation split), so the corpora reach states
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
#include <utility>
#include <vector>

#include "sim/cli.h"
#include "sim/fuzz_input.h"

namespace kvtwin::cli {

namespace {

// The regular files of `dir`, sorted (libFuzzer names entries by content hash, so the order
// is stable across clones). A missing folder reads as empty; the callers decide.
std::vector<std::filesystem::path> CorpusEntries(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file()) paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Every entry of one target's corpus in a fresh session. 0 pass, 1 divergence (reported),
// 2 unreadable entry.
int RunCorpus(sim::FuzzTarget target, const std::vector<std::filesystem::path>& paths,
              uint64_t& entries) {
  const std::string name = sim::FuzzTargetName(target);
  for (const std::filesystem::path& p : paths) {
    std::string error;
    const std::optional<std::string> read = ReadWhole(p.string(), error);
    if (!read) return Usage(error);
    const std::string& bytes = *read;
    const std::string reproduce =
        fmt::format("kvtwin replay --fuzz-input {} --target {}", p.string(), name);
    ArmAbortReproduce(reproduce);
    sim::FuzzSession session(target);
    const sim::FuzzRun run = session.Run(reinterpret_cast<const uint8_t*>(bytes.data()),
                                         bytes.size(), /*record_trace=*/false);
    ++entries;
    if (run.divergence) {
      fmt::print("FAIL fuzz corpus entry {} (target {}): {}\n{}\nreproduce: {}\n", p.string(), name,
                 run.divergence_kind, *run.divergence, reproduce);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int RunBundledCorpora(const std::string& corpus_dir, uint64_t& entries) {
  std::string counts;
  for (const sim::FuzzTarget target : sim::AllFuzzTargets()) {
    const std::vector<std::filesystem::path> paths =
        CorpusEntries(std::filesystem::path(corpus_dir) / sim::FuzzTargetName(target));
    if (const int code = RunCorpus(target, paths, entries); code != 0) return code;
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", sim::FuzzTargetName(target),
                          paths.size());
  }
  fmt::print("  fuzz corpora   {} entries ({}): pass\n", entries, counts);
  std::fflush(stdout);
  return 0;
}

int ReplayFuzzCorpus(const ReplayFlags& flags) {
  namespace fs = std::filesystem;
  if (!flags.files.empty()) return Usage("replay: --fuzz-corpus takes no trace files");
  if (!flags.fuzz_input.empty())
    return Usage("replay: give --fuzz-corpus or --fuzz-input, not both");
  const fs::path dir(flags.fuzz_corpus);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Usage(fmt::format("--fuzz-corpus: '{}' is not a directory", flags.fuzz_corpus));
  }
  // With --target, DIR is that target's corpus (libFuzzer's layout); without, one folder
  // per target (fuzz/corpus's layout), of which at least one must exist.
  std::vector<std::pair<sim::FuzzTarget, fs::path>> corpora;
  if (!flags.fuzz_target.empty()) {
    const std::optional<sim::FuzzTarget> target = sim::ParseFuzzTarget(flags.fuzz_target);
    if (!target) {
      return Usage(fmt::format("--target: expected one of {}, got '{}'", FuzzTargetList(),
                               flags.fuzz_target));
    }
    corpora.emplace_back(*target, dir);
  } else {
    for (const sim::FuzzTarget target : sim::AllFuzzTargets()) {
      const fs::path sub = dir / sim::FuzzTargetName(target);
      if (fs::is_directory(sub, ec)) corpora.emplace_back(target, sub);
    }
    if (corpora.empty()) {
      return Usage(
          fmt::format("--fuzz-corpus: '{}' holds no folder named after a target ({}); "
                      "give --target for a single target's corpus",
                      flags.fuzz_corpus, FuzzTargetList()));
    }
  }
  // A vacuous pass would hide a wrong path in a CI job: no entry at all is an input error.
  std::vector<std::vector<fs::path>> listed;
  size_t listed_entries = 0;
  for (const auto& corpus : corpora) {
    listed.push_back(CorpusEntries(corpus.second));
    listed_entries += listed.back().size();
  }
  if (listed_entries == 0) {
    return Usage(fmt::format("--fuzz-corpus: '{}' holds no corpus entries", flags.fuzz_corpus));
  }
  uint64_t entries = 0;
  std::string counts;
  for (size_t i = 0; i < corpora.size(); ++i) {
    const sim::FuzzTarget target = corpora[i].first;
    const std::vector<fs::path>& paths = listed[i];
    if (const int code = RunCorpus(target, paths, entries); code != 0) return code;
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", sim::FuzzTargetName(target),
                          paths.size());
    if (!flags.quiet) {
      fmt::print("  {:<12} {} entries: pass\n", sim::FuzzTargetName(target), paths.size());
    }
  }
  fmt::print("PASS: {} fuzz corpus entries ({}), no divergence\n", entries, counts);
  return 0;
}

}  // namespace kvtwin::cli
