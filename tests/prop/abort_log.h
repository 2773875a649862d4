// AbortLog: the running rapidcheck case, kept where a SIGABRT handler can print it. A
// KV_CHECK abort ends the process, so rapidcheck cannot shrink or even show the case;
// this prints its header and commands (unshrunk) on the way out. Single-threaded.
#pragma once

#include <unistd.h>

#include <csignal>
#include <string>

namespace kvtwin::sim::prop {

class AbortLog {
 public:
  // Starts a case: `what` names the commands ("op", "request"), `header` the case.
  static void Begin(const std::string& what, const std::string& header) {
    static const bool installed = [] { return std::signal(SIGABRT, OnAbort) != SIG_ERR; }();
    (void)installed;
    Text() = "prop case running at the abort (unshrunk, the last " + what + " aborted): " + header +
             "\n";
  }
  static void Note(const std::string& line) { Text() += "  " + line + "\n"; }

 private:
  static std::string& Text() {
    static std::string text;
    return text;
  }
  static void OnAbort(int) {
    const std::string& t = Text();
    (void)!write(STDERR_FILENO, t.data(), t.size());
    std::signal(SIGABRT, SIG_DFL);  // abort() then ends the process as usual
  }
};

}  // namespace kvtwin::sim::prop
