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

// One target's corpus, listed.
struct Corpus {
  sim::FuzzTarget target;
  std::vector<std::filesystem::path> paths;
};

// Every corpus in order; appends "name count" per corpus to `counts`, and with `print_each`
// a line per passing corpus. Returns as RunCorpus.
int RunCorpora(const std::vector<Corpus>& corpora, bool print_each, uint64_t& entries,
               std::string& counts) {
  for (const Corpus& c : corpora) {
    if (const int code = RunCorpus(c.target, c.paths, entries); code != 0) return code;
    const char* name = sim::FuzzTargetName(c.target);
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", name, c.paths.size());
    if (print_each) fmt::print("  {:<12} {} entries: pass\n", name, c.paths.size());
  }
  return 0;
}

}  // namespace

int RunBundledCorpora(const std::string& corpus_dir, uint64_t& entries) {
  std::vector<Corpus> corpora;
  for (const sim::FuzzTarget target : sim::AllFuzzTargets()) {
    corpora.push_back(
        {target, CorpusEntries(std::filesystem::path(corpus_dir) / sim::FuzzTargetName(target))});
  }
  std::string counts;
  if (const int code = RunCorpora(corpora, false, entries, counts); code != 0) return code;
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
  std::vector<Corpus> corpora;
  if (!flags.fuzz_target.empty()) {
    const std::optional<sim::FuzzTarget> target = sim::ParseFuzzTarget(flags.fuzz_target);
    if (!target) {
      return Usage(fmt::format("--target: expected one of {}, got '{}'", FuzzTargetList(),
                               flags.fuzz_target));
    }
    corpora.push_back({*target, CorpusEntries(dir)});
  } else {
    for (const sim::FuzzTarget target : sim::AllFuzzTargets()) {
      const fs::path sub = dir / sim::FuzzTargetName(target);
      if (fs::is_directory(sub, ec)) corpora.push_back({target, CorpusEntries(sub)});
    }
    if (corpora.empty()) {
      return Usage(
          fmt::format("--fuzz-corpus: '{}' holds no folder named after a target ({}); "
                      "give --target for a single target's corpus",
                      flags.fuzz_corpus, FuzzTargetList()));
    }
  }
  // A vacuous pass would hide a wrong path in a CI job: no entry at all is an input error.
  if (std::all_of(corpora.begin(), corpora.end(),
                  [](const Corpus& c) { return c.paths.empty(); })) {
    return Usage(fmt::format("--fuzz-corpus: '{}' holds no corpus entries", flags.fuzz_corpus));
  }
  uint64_t entries = 0;
  std::string counts;
  if (const int code = RunCorpora(corpora, !flags.quiet, entries, counts); code != 0) return code;
  fmt::print("PASS: {} fuzz corpus entries ({}), no divergence\n", entries, counts);
  return 0;
}

}  // namespace kvtwin::cli
