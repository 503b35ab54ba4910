// Giving freed heap memory back to the system. glibc's malloc keeps what a burst freed (a large
// request body, a costly grammar, many sequences' buffers) in its arenas; a server that idles at
// tens of MB should not stay at hundreds after one burst. Callers say when a burst is over.
#pragma once

namespace gale {

// Returns the free memory at the top and inside every malloc arena to the system
// (malloc_trim). Costs up to a few ms on a large heap: call it where a thread has nothing else
// to do (the engine going idle) or after work that freed much.
void ReleaseFreeMemory();

// For a server: every allocation of 1 MiB or more gets a mapping of its own, given back when it
// is freed. glibc otherwise raises that threshold after each large free (up to 32 MiB), so request
// bodies, prompts and token lists of a burst land in the arenas among small live allocations,
// where malloc_trim cannot return them (six 7 MB prompts left ~50 MB behind, varying run to run;
// with this, nothing). Engine throughput measured the same (gale bench, pp512 and tg64).
void KeepLargeAllocationsMapped();

}  // namespace gale
