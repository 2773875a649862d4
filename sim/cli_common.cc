// Helpers shared by the kvtwin commands: parsing, whole-file reads and writes, abort and interrupt
// handling, progress and machine reports.
#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "sim/cli.h"

namespace kvtwin::cli {
namespace {

std::atomic<bool> g_interrupted{false};
char g_abort_reproduce[2048];

extern "C" void OnInterrupt(int /*sig*/) { g_interrupted.store(true); }

// Writes the prepared command with the only async-signal-safe calls it needs, then lets
// the default action end the process.
extern "C" void PrintReproduceOnAbort(int sig) {
  const ssize_t ignored = write(STDERR_FILENO, g_abort_reproduce, std::strlen(g_abort_reproduce));
  (void)ignored;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

bool ParseU64(const std::string& text, uint64_t& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

bool ParseSeeds(const std::string& text, SeedRange& out) {
  const size_t dots = text.find("..");
  if (dots == std::string::npos) {
    if (!ParseU64(text, out.first)) return false;
    out.last = out.first;
    return true;
  }
  return ParseU64(text.substr(0, dots), out.first) && ParseU64(text.substr(dots + 2), out.last) &&
         out.first <= out.last;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "kvtwin: %s\n", message.c_str());
  return 2;
}

std::optional<std::string> ReadWhole(const std::string& path, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": cannot open";
    return std::nullopt;
  }
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) {
    error = path + ": cannot read";
    return std::nullopt;
  }
  return bytes;
}

bool WriteWhole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    written = out && (out << text) && out.flush();
  }
  if (written && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
  std::remove(tmp.c_str());
  return false;
}

void ArmAbortReproduce(const std::string& command) {
  std::snprintf(g_abort_reproduce, sizeof(g_abort_reproduce), "reproduce: %s\n", command.c_str());
  std::signal(SIGABRT, PrintReproduceOnAbort);
}

void InstallInterruptHandler() { std::signal(SIGINT, OnInterrupt); }
const std::atomic<bool>& Interrupted() { return g_interrupted; }

Progress::Progress(std::string what) : what_(std::move(what)), tty_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() {
  if (tty_ && shown_ >= 0) std::fputs("\n", stderr);
}

void Progress::Update(int64_t done) {
  // Every 64th unit: a terminal line costs far more than a small replay step.
  if (!tty_ || done % 64 != 0) return;
  shown_ = done;
  std::fprintf(stderr, "\r%s %lld", what_.c_str(), static_cast<long long>(done));
}

bool ReportFlags::Write(const std::string& command,
                        const std::vector<sim::CaseReport>& cases) const {
  if (!json.empty() && !WriteWhole(json, sim::SummaryJson(command, cases))) {
    Usage("--json: cannot write '" + json + "'");
    return false;
  }
  if (!junit.empty() && !WriteWhole(junit, sim::JunitXml("kvtwin " + command, cases))) {
    Usage("--junit: cannot write '" + junit + "'");
    return false;
  }
  return true;
}

}  // namespace kvtwin::cli
