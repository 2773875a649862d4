#include "src/cache.h"
