// The seed corpus of a fuzz target as the sim tests read it (from the source root, the
// tests' working directory).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "sim/fuzz_input.h"

namespace kvtwin::sim {

using Bytes = std::vector<uint8_t>;

inline Bytes ReadBytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Up to `n` corpus entries of the target, in name order (the directory's order is not fixed).
inline std::vector<Bytes> CorpusEntries(FuzzTarget target, size_t n) {
  std::vector<std::filesystem::path> paths;
  const std::filesystem::path dir = std::filesystem::path("fuzz/corpus") / FuzzTargetName(target);
  for (const auto& e : std::filesystem::directory_iterator(dir)) paths.push_back(e.path());
  std::sort(paths.begin(), paths.end());
  if (paths.size() > n) paths.resize(n);
  std::vector<Bytes> out;
  for (const auto& p : paths) out.push_back(ReadBytes(p));
  return out;
}

}  // namespace kvtwin::sim
