// Giving freed heap memory back to the system. glibc's malloc keeps what a burst freed (a large
// request body, a costly grammar, many sequences' buffers) in its arenas; a server that idles at
// tens of MB should not stay at hundreds after one burst. Callers say when a burst is over.
#pragma once

namespace gale {

// Returns the free memory at the top and inside every malloc arena to the system
// (malloc_trim). Costs up to a few ms on a large heap: call it where a thread has nothing else
// to do (the engine going idle) or after work that freed much.
void ReleaseFreeMemory();

}  // namespace gale
