#include "src/cache.h"

namespace kvtwin {

const char* CacheKindName(CacheKind kind) {
  switch (kind) {
    case CacheKind::kFullKv:
      return "kv";
    case CacheKind::kRotating:
      return "rotating";
    case CacheKind::kRecurrent:
      return "recurrent";
  }
  return "unknown";
}

}  // namespace kvtwin
