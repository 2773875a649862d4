#include "model/ref_cache.h"
