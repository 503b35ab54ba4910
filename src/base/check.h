// CHECK for invariants that must hold in release builds; DCHECK for hot loops (debug only).
// A failed check is a bug in gale, never a reaction to outside data: that gets a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

#define GALE_CHECK_FAIL(cond_str)                                                      \
  do {                                                                                 \
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, cond_str);  \
    std::abort();                                                                      \
  } while (0)

#define CHECK(cond)                              \
  do {                                           \
    if (__builtin_expect(!(cond), 0)) GALE_CHECK_FAIL(#cond); \
  } while (0)

#ifdef NDEBUG
#define DCHECK(cond) \
  do {               \
  } while (0)
#else
#define DCHECK(cond) CHECK(cond)
#endif
