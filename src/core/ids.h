// Strong ids: integers that must not be swapped silently. Each is an enum class over a
// fixed-width integer; convert explicitly with Raw() where arithmetic is needed.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kvtwin {

enum class LayerId : int32_t {};     // index of a layer in a stack
enum class SeqId : int32_t {};       // a sequence of the multi-sequence cache
enum class ConvId : int32_t {};      // a conversation of a workload
enum class SnapshotId : int64_t {};  // a snapshot handle held by a driver
using TokenId = int32_t;             // a token id (vocabulary entry)

template <typename Id>
constexpr std::underlying_type_t<Id> Raw(Id id) {
  return static_cast<std::underlying_type_t<Id>>(id);
}

}  // namespace kvtwin
