// The kvtwin command line (main.cc wires CLI11 to these). Exit codes (STYLE §5.7): 0 pass,
// 1 divergence, 2 usage or input error (one line "kvtwin: FILE:LINE: /pointer: reason" or
// "kvtwin: --flag: reason", nothing written), 130 interrupted (after a valid partial
// summary), 134 a KV_CHECK abort (after the reproduce line). Every failure ends with a
// one-line reproduce command. Progress goes to stderr, only when it is a terminal.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sim/multi_seq_run.h"
#include "sim/replay.h"
#include "sim/report.h"
#include "sim/requests.h"
#include "sim/run.h"

namespace kvtwin::cli {

struct SeedRange {
  uint64_t first = 0, last = 0;
};
// "A..B" or "A" -> an inclusive range; false on anything else.
bool ParseSeeds(const std::string& text, SeedRange& out);
bool ParseU64(const std::string& text, uint64_t& out);
// Prints "kvtwin: <message>" to stderr; returns 2.
int Usage(const std::string& message);
// A file's bytes, or nullopt with `error` set to "PATH: cannot open" / "PATH: cannot read".
std::optional<std::string> ReadWhole(const std::string& path, std::string& error);
// Writes through a temporary name and a rename: a reader never sees half a file.
bool WriteWhole(const std::string& path, const std::string& text);
// A KV_CHECK abort (exit 134) prints "reproduce: <command>" first.
void ArmAbortReproduce(const std::string& command);

// SIGINT sets the flag; long loops stop after the current unit and summarize.
void InstallInterruptHandler();
const std::atomic<bool>& Interrupted();

// A progress line on stderr ("\r<what> N") when stderr is a terminal; quiet otherwise.
class Progress {
 public:
  explicit Progress(std::string what);
  ~Progress();  // ends the line
  void Update(int64_t done);

 private:
  std::string what_;
  bool tty_ = false;
  int64_t shown_ = -1;
};

// Machine outputs shared by the commands that run cases.
struct ReportFlags {
  std::string json, junit;
  // Writes the requested reports; false (after a message) when one cannot be written.
  bool Write(const std::string& command, const std::vector<sim::CaseReport>& cases) const;
};

struct RequestsFlags {
  std::string seeds = "1..20";
  std::string dot;
  std::string save;  // write the last seed's run as a trace
  bool dump = false;
};

struct SweepFlags {
  std::string seeds = "1..100", shard;
  std::string save_failing;  // directory for the failing seed's trace
  ReportFlags reports;
};

struct MultiSeqFlags {
  std::string seeds = "1..100";
  std::string conv = "as-specified";  // or "ideal"
  int64_t steps = 400;
  bool huge = false;
  ReportFlags reports;
};

struct ReplayFlags {
  std::vector<std::string> files;
  sim::ReplayOptions options;
  ReportFlags reports;
  bool quiet = false;
  // --coverage: each file's driver coverage by counter name (what "reaches" can claim).
  bool coverage = false;
  // --reach COUNTER[=N]: claims every file's replay must meet, beside its header's.
  std::vector<std::string> reach;
  // --fuzz-input FILE --target NAME [--save TRACE]: a libFuzzer input (a crash artifact or
  // a corpus entry) decoded as that target does, written as a trace and replayed.
  std::string fuzz_input, fuzz_target, save;
  // --fuzz-corpus DIR [--target NAME]: every entry of a corpus as `kvtwin run`'s corpus
  // stage runs it (a fresh session each, no trace written); DIR holds one folder per target
  // (fuzz/corpus's layout), or with --target is that target's corpus.
  std::string fuzz_corpus;
};

struct GenFlags {
  std::string kind = "requests";  // requests | ops | multiseq
  uint64_t seed = 1;
  std::string out;
  sim::RequestOptions requests;
  sim::RunOptions ops;
  sim::MultiSeqRunOptions multiseq;  // its steps: --steps when given
};

struct ShrinkFlags {
  std::string in, out, name = "minimized";
  int64_t max_replays = 20000;
  // --keep-reach COUNTER[=N]: coverage the minimum must keep up to its divergence; written as
  // the shrunk trace's "reaches".
  std::vector<std::string> keep_reach;
};

struct ExplainFlags {
  std::string file, dot;
  int64_t at = 0;
  sim::ReplayOptions options;
};

struct ImportFlags {
  std::string in, out;
  sim::MooncakeOptions mooncake;
  sim::TraceHeader setup;
};

int RunBundled(uint64_t root_seed, int64_t seeds_per_config, int64_t steps);
// The fuzz targets' seed corpora under `corpus_dir` (NAME/ per target), each entry in a fresh
// session; counts them into `entries`. 0 pass, 1 divergence (reported), 2 unreadable entry.
int RunBundledCorpora(const std::string& corpus_dir, uint64_t& entries);
// Windows of the recorded Mooncake trace at `path` at its recorded block size (prompts of
// thousands of tokens), counted into `files` and `events`; true when they pass or when there
// is no file at `path` (a clone outside the workspace), which it says.
bool RunProductionTrace(const std::string& path, uint64_t& files, uint64_t& events);
int Sweep(const sim::RunOptions& options, const SweepFlags& flags);
int Requests(sim::RequestOptions options, const RequestsFlags& flags);
int Replay(const ReplayFlags& flags);
int ReplayFuzzInput(const ReplayFlags& flags);
int ReplayFuzzCorpus(const ReplayFlags& flags);
// "kv, rotating, ...": the fuzz targets' names, for usage errors.
std::string FuzzTargetList();
int MultiSeq(const MultiSeqFlags& flags);
int Gen(const GenFlags& flags);
int Import(const ImportFlags& flags);
int Shrink(const ShrinkFlags& flags);
int Explain(const ExplainFlags& flags);

}  // namespace kvtwin::cli
